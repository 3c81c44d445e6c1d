"""Admin REST about the bookies, for operators and the console:

    GET /admin/v2/bookies/all     Pulsar's BookiesClusterInfo {"bookies": [{"bookieId": id}, ...]},
                                  each entry with Magnetar's fields beside: "address",
                                  "readOnly", "freeBytes", "totalBytes", "diskUsageRatio",
                                  "version", "startedAtMs" (from the bookies' leased
                                  registrations: a bookie that is down is not listed)
    GET /admin/v2/bookies/underReplicatedLedgers
                                  (Magnetar) {"count": n, "ledgers": [first 1,000 ids]}: ledgers
                                  the auto-recovery auditor recorded as under-replicated

Both need a superuser when authorization is on (paths without a tenant).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.keys import SERVICE
from metadata import keys
from metadata.bookie_record import BookieRecord

# Ledger ids listed by underReplicatedLedgers (the count is always whole).
UNDER_REPLICATED_LISTED_MAX = 1000

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get("/admin/v2/bookies/all")
async def all_bookies(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    store = service.store
    bookies = []
    for record in await store.get_prefix(keys.BOOKIES):
        bookie = BookieRecord.decode(record.value)
        bookies.append({"bookieId": bookie.bookie_id, "address": bookie.address,
                        "readOnly": bookie.read_only, "freeBytes": bookie.free_bytes,
                        "totalBytes": bookie.total_bytes, "diskUsageRatio": bookie.disk_usage_ratio,
                        "version": bookie.version, "startedAtMs": bookie.started_at_ms})
    return web.json_response({"bookies": sorted(bookies, key=lambda b: b["bookieId"])})


@routes.get("/admin/v2/bookies/underReplicatedLedgers")
async def under_replicated(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    store = service.store
    records = await store.get_prefix(keys.UNDER_REPLICATED, keys_only=True)
    ledger_ids = sorted(keys.under_replicated_ledger_id(r.key) for r in records)
    return web.json_response({"count": len(ledger_ids), "ledgers": ledger_ids[:UNDER_REPLICATED_LISTED_MAX]})
