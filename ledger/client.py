"""The ledger client: create, open (with or without recovery), read, delete and list
ledgers. One per process; it owns the bookie registry and the bookie connection pool.

    client = LedgerClient(store, LedgerClientConfig())
    await client.start()
    handle = await client.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    entry_id = await handle.add(b"payload")
    await handle.close()
    reader = await client.open_ledger(handle.ledger_id, recovery=False)
    entries = await reader.read(0, entry_id)
"""

from __future__ import annotations

import logging
import random
import time
from typing import Sequence

from ledger.bookie_client import BookieClientPool
from ledger.bookie_registry import BookieRegistry
from ledger.config import LedgerClientConfig
from ledger.context import LedgerContext
from common.errors import NoSuchLedger, NotEnoughBookies
from ledger.handle import WriteHandle
from ledger.ledger_ids import LedgerIdAllocator
from ledger.metadata import Fragment, LedgerMetadata, LedgerState, VersionedMetadata, validate_quorums
from ledger.placement import choose_ensemble
from ledger.quarantine import BookieQuarantine
from ledger.reader import LedgerReader
from ledger.recovery import recover_ledger
from metadata import keys
from metadata.store import Compare, Delete, MetadataStore
from common.histograms import LatencyStages

log = logging.getLogger(__name__)


class LedgerClient:
    def __init__(self, store: MetadataStore, config: LedgerClientConfig | None = None,
                 rng: random.Random | None = None, *, stages: LatencyStages | None = None) -> None:
        self.config = config or LedgerClientConfig()
        self.store = store
        self.registry = BookieRegistry(store)
        # Stage histograms of the process (LEDGER_STAGES at least), or None: not timed.
        self.stages = stages
        self.pool = BookieClientPool(self.config, self.registry.address_of, stages=stages,
                                     add_address_of=self.registry.add_address_of)
        self.context = LedgerContext(store, self.registry, self.pool, self.config, rng or random.Random(),
                                     BookieQuarantine(self.config.bookie_quarantine_s))
        # Ledger ids: concurrent creations of this process share one compare-and-swap.
        self.ledger_ids = LedgerIdAllocator(store)

    async def start(self) -> None:
        await self.registry.start()

    def hold_flushes(self) -> bool:
        """Queued adds wait for ``flush_adds`` (``BookieClientPool.hold_flushes``)."""
        return self.pool.hold_flushes()

    def flush_adds(self) -> None:
        """Sends queued adds now, ending a hold (``BookieClientPool.flush_adds``)."""
        self.pool.flush_adds()

    async def close(self) -> None:
        await self.registry.close()
        await self.pool.close()

    async def create_ledger(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                            custom: dict[str, str] | None = None) -> WriteHandle:
        validate_quorums(ensemble_size, write_quorum_size, ack_quorum_size)
        writable = self.registry.writable()
        if len(writable) < ensemble_size:
            # The watch may lag a bookie that registered a moment ago: look once more.
            await self.registry.refresh()
            writable = self.registry.writable()
        if len(writable) < ensemble_size:
            raise NotEnoughBookies(ensemble_size, len(writable))
        ensemble = choose_ensemble(writable, ensemble_size, self.context.rng,
                                   avoid=self.context.quarantine.members())
        ledger_id = await self.ledger_ids.next_id()
        metadata = LedgerMetadata(
            ledger_id=ledger_id, ensemble_size=ensemble_size, write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size, state=LedgerState.OPEN,
            fragments=(Fragment(0, ensemble),), created_ms=int(time.time() * 1000), custom=dict(custom or {}))
        version = await self.store.create(keys.ledger(ledger_id), metadata.encode())
        log.info("ledger created: ledger_id=%d ensemble=%s quorums=%d/%d/%d",
                 ledger_id, list(ensemble), ensemble_size, write_quorum_size, ack_quorum_size)
        return WriteHandle(self.context, VersionedMetadata(metadata, version))

    async def open_ledger(self, ledger_id: int, *, recovery: bool) -> LedgerReader:
        """A reader. With ``recovery`` an unclosed ledger is fenced and closed first (its
        writer's later adds fail); without, an open ledger is read up to what its
        bookies report as confirmed."""
        if recovery:
            versioned = await recover_ledger(self.context, ledger_id)
        else:
            versioned = await self.context.read_metadata(ledger_id)
        return LedgerReader(versioned.metadata, self.pool, self.config)

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return (await self.context.read_metadata(ledger_id)).metadata

    async def delete_ledger(self, ledger_id: int) -> None:
        """Removes the metadata; the bookies drop the entries at their next GC."""
        deleted = await self.store.delete(keys.ledger(ledger_id))
        if not deleted:
            raise NoSuchLedger(ledger_id)
        log.info("ledger deleted: ledger_id=%d", ledger_id)

    async def delete_ledger_if(self, ledger_id: int, compares: Sequence[Compare]) -> bool:
        """Removes the metadata as ``delete_ledger`` does (the bookies drop the entries
        at their next GC), but only if every compare holds, in one transaction: the
        ledger's own metadata version among them. False (nothing deleted) when one did
        not hold."""
        key = keys.ledger(ledger_id)
        assert any(compare.key == key and compare.version > 0 for compare in compares), \
            "a guarded delete names the version of the metadata it deletes"
        if await self.store.transaction(list(compares), [Delete(key)]) is None:
            return False
        log.info("ledger deleted: ledger_id=%d", ledger_id)
        return True

    async def list_ledgers(self) -> list[int]:
        records = await self.store.get_prefix(keys.LEDGERS, keys_only=True)
        return [keys.ledger_id_from_key(record.key) for record in records]
