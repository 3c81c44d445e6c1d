"""Claims of Spark read plans (spark/plan_guard.py): which Spark SQL execution ran a
plan first, kept where every executor of a Spark cluster reaches it (the metadata
store, through any broker), so no machine-local state decides which rows a task reads.

    PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/spark-plans/{token}
        body {"execution": "<the Spark SQL execution id>"}
        → {"execution": "<the execution that claimed the token first>"}

The first PUT of a token creates ``/spark-plans/<token>`` (compare-and-swap: the key
must not exist); every later one answers what the first stored. A claim lives on a
lease of ``CLAIM_TTL_S`` (seven days; a lease is shared by the claims of an hour, so one
lives between 7 days less an hour and 7 days); the Spark source never asks about a plan
older than its claim window (one day), so an expired claim is never mistaken for none.
Authorization: as the topic's manifest (the tenant's admins), the first topic of the
read naming the tenant.
"""

from __future__ import annotations

import json
import logging
import re
import time

from aiohttp import web

from broker.admin.common import json_body
from broker.service import BrokerService
from common.errors import InvalidArgument, MetadataKeyExists, MetadataLeaseExpired
from metadata import keys
from metadata.store import Lease

log = logging.getLogger(__name__)

CLAIM_TTL_S = 7 * 86400
LEASE_RENEW_S = 3600
TOKEN = re.compile(r"^[0-9]{13}-[0-9a-f]{32}$")
EXECUTION_BYTES_MAX = 128


def add_routes(app: web.Application, service: BrokerService) -> None:
    store = service.store
    current: list[tuple[Lease, float]] = []      # the shared lease and when it was granted

    async def lease() -> Lease:
        if current and time.monotonic() - current[0][1] < LEASE_RENEW_S:
            return current[0][0]
        granted = await store.grant_lease(CLAIM_TTL_S)
        current[:] = [(granted, time.monotonic())]
        return granted

    async def claim(request: web.Request) -> web.Response:
        token = request.match_info["token"]
        if not TOKEN.match(token):
            raise InvalidArgument("a plan token is <13-digit planning time ms>-<32 hex digits>")
        body = await json_body(request, required=True)
        execution = body.get("execution") if isinstance(body, dict) else None
        if not isinstance(execution, str) or not execution or len(execution.encode()) > EXECUTION_BYTES_MAX:
            raise InvalidArgument(f'body must be {{"execution": "<1 to {EXECUTION_BYTES_MAX} bytes>"}}')
        key = keys.spark_plan(token)
        for attempt in range(2):
            try:
                await store.create(key, json.dumps({"execution": execution}).encode(), lease=await lease())
                return web.json_response({"execution": execution})
            except MetadataKeyExists:
                break
            except MetadataLeaseExpired:
                current.clear()                  # granted long ago and gone: a new one, once
                if attempt:
                    raise
        record = await store.get(key)
        if record is None:                       # expired between the two calls: only if ancient
            raise InvalidArgument(f"plan {token} has no claim and cannot be claimed again")
        return web.json_response({"execution": json.loads(record.value)["execution"]})

    app.router.add_put("/admin/v2/persistent/{tenant}/{namespace}/{topic}/spark-plans/{token}", claim)
