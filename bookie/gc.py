"""Garbage collection on a bookie: ledgers deleted from metadata are removed from
storage, then entry logs with a low live ratio are compacted.

Order matters for safety: the bookie lists its own ledgers *before* it lists the
ledgers in metadata. A ledger the bookie stores was created in metadata before its
first entry reached the bookie, so if it is missing from a later metadata listing it
was deleted, never "not created yet".
"""

from __future__ import annotations

import asyncio
import logging

from bookie.config import GcConfig
from bookie.ledger_storage import LedgerStorage
from common.errors import MagnetarError
from metadata import keys
from metadata.store import MetadataStore

log = logging.getLogger(__name__)


async def collect_once(store: MetadataStore, storage: LedgerStorage, config: GcConfig) -> dict[str, int]:
    local = storage.ledger_ids()
    records = await store.get_prefix(keys.LEDGERS, keys_only=True)
    known = {keys.ledger_id_from_key(record.key) for record in records}
    doomed = sorted(local - known)
    if doomed:
        await storage.delete_ledgers(doomed)
        log.info("deleted ledgers removed from storage: count=%d ledger_ids=%s", len(doomed), doomed[:20])
    logs, reclaimed = await storage.compact(config.compaction_live_ratio_min, config.compaction_bytes_per_round_max)
    return {"ledgers_deleted": len(doomed), "logs_compacted": logs, "bytes_reclaimed": reclaimed}


async def run_gc(store: MetadataStore, storage: LedgerStorage, config: GcConfig,
                 trigger: asyncio.Event) -> None:
    """Runs a collection every interval, or at once when ``trigger`` is set."""
    while True:
        try:
            async with asyncio.timeout(config.interval_s):
                await trigger.wait()
        except TimeoutError:
            pass
        trigger.clear()
        try:
            await collect_once(store, storage, config)
        except MagnetarError as error:
            log.warning("garbage collection round failed: error=%s", error)
