"""Garbage collection on a bookie: ledgers deleted from metadata are removed from
storage, and so are closed ledgers whose ensembles no longer name this bookie (auto-
recovery or decommissioning moved its copies elsewhere); then entry logs with a low
live ratio are compacted.

Order matters for safety: the bookie lists its own ledgers *before* it lists the
ledgers in metadata. A ledger the bookie stores was created in metadata before its
first entry reached the bookie, so if it is missing from a later metadata listing it
was deleted, never "not created yet".

A ledger no longer naming this bookie is removed only when it is CLOSED and not under
re-replication. A replication worker copies entries to its target *before* it swaps
the target into the ensemble, and the ledger's under-replicated record exists from
before the copy until after the swap; the bookie reads the under-replicated records
after its own listing and before the ledgers, so a copy in progress is never mistaken
for garbage (a copy abandoned by a dead worker becomes garbage once the ledger is no
longer under-replicated). The ledger metadata's JSON layout is read here directly
(``state`` and ``fragments[].bookies``, see ledger/metadata.py): bookie/ may not import
ledger/.
"""

from __future__ import annotations

import asyncio
import json
import logging

from bookie.config import GcConfig
from bookie.ledger_storage import LedgerStorage
from common.errors import MagnetarError
from metadata import keys
from metadata.store import MetadataStore

log = logging.getLogger(__name__)


def _closed_without(value: bytes, bookie_id: str) -> bool:
    """True when stored ledger metadata is CLOSED and none of its fragments names
    ``bookie_id``. Anything unreadable counts as False (keep the entries)."""
    try:
        doc = json.loads(value)
        if doc.get("state") != "CLOSED":
            return False
        return all(bookie_id not in fragment["bookies"] for fragment in doc["fragments"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return False


async def collect_once(store: MetadataStore, storage: LedgerStorage, config: GcConfig,
                       bookie_id: str | None = None) -> dict[str, int]:
    local = storage.ledger_ids()
    if bookie_id is None:
        records = await store.get_prefix(keys.LEDGERS, keys_only=True)
        replicating: set[int] = set()
    else:
        replicating = {keys.under_replicated_ledger_id(record.key)
                       for record in await store.get_prefix(keys.UNDER_REPLICATED, keys_only=True)}
        records = await store.get_prefix(keys.LEDGERS)
    known = {keys.ledger_id_from_key(record.key) for record in records}
    doomed = sorted(local - known)
    moved: list[int] = []
    if bookie_id is not None:
        for record in records:
            ledger_id = keys.ledger_id_from_key(record.key)
            if ledger_id in local and ledger_id not in replicating and _closed_without(record.value, bookie_id):
                moved.append(ledger_id)
    if doomed:
        await storage.delete_ledgers(doomed)
        log.info("deleted ledgers removed from storage: count=%d ledger_ids=%s", len(doomed), doomed[:20])
    if moved:
        await storage.delete_ledgers(moved)
        log.info("ledgers no longer on this bookie removed from storage: count=%d ledger_ids=%s",
                 len(moved), moved[:20])
    logs, reclaimed = await storage.compact(config.compaction_live_ratio_min, config.compaction_bytes_per_round_max)
    return {"ledgers_deleted": len(doomed), "ledgers_moved": len(moved), "logs_compacted": logs,
            "bytes_reclaimed": reclaimed}


async def run_gc(store: MetadataStore, storage: LedgerStorage, config: GcConfig,
                 trigger: asyncio.Event, bookie_id: str | None = None) -> None:
    """Runs a collection every interval, or at once when ``trigger`` is set."""
    while True:
        try:
            async with asyncio.timeout(config.interval_s):
                await trigger.wait()
        except TimeoutError:
            pass
        trigger.clear()
        try:
            await collect_once(store, storage, config, bookie_id)
        except MagnetarError as error:
            log.warning("garbage collection round failed: error=%s", error)
