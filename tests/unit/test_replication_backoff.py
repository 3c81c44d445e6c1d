"""A ledger the replication worker cannot finish yet (no bookie left to copy to) is
tried again after a back-off that doubles up to RETRY_DELAY_S_MAX, not every round:
one WARNING and one metadata read a minute instead of one a second, for as long as the
cluster lacks bookies (a 3-bookie standalone that lost one, with ledgers on all three).
Once it can be finished, or its record is gone, the back-off is forgotten."""

from __future__ import annotations

import random

from ledger.bookie_registry import BookieRegistry
from ledger.config import AutoRecoveryConfig, LedgerClientConfig
from ledger.context import LedgerContext
from ledger.metadata import Fragment, LedgerMetadata, LedgerState
from ledger.replication import RETRY_DELAY_S_MAX, ReplicationWorker
from ledger.under_replication import UnderReplicatedRecord
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.memory_store import MemoryStore


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _cluster_missing_a_bookie() -> MemoryStore:
    """Ledger 7 on a, b and c (3 copies); c is gone and only a and b are registered."""
    store = MemoryStore()
    for bookie_id in ("a", "b"):
        await store.put(keys.bookie(bookie_id), BookieRecord(bookie_id, bookie_id, bookie_id, False, 1 << 30, 1 << 31, 0.5, "test", 0).encode())
    metadata = LedgerMetadata(7, 3, 3, 2, LedgerState.CLOSED, (Fragment(0, ("a", "b", "c")),), last_entry_id=9)
    await store.put(keys.ledger(7), metadata.encode())
    await store.put(keys.under_replicated(7), UnderReplicatedRecord(7, [0], ["c"]).encode())
    return store


async def test_a_ledger_that_cannot_be_finished_backs_off_doubling_to_the_limit():
    store = await _cluster_missing_a_bookie()
    clock = _Clock()
    config = AutoRecoveryConfig()
    registry = BookieRegistry(store)
    await registry.start()
    context = LedgerContext(store, registry, None, LedgerClientConfig(), random.Random(1))  # type: ignore[arg-type]
    worker = ReplicationWorker(context, config, "w", clock=clock)
    try:
        attempts_at = []
        for _ in range(600):                 # ten minutes of rounds, a second apart
            failures = worker.stats.failures
            await worker.run_round()
            if worker.stats.failures > failures:
                attempts_at.append(clock.now)
            clock.now += 1.0
        gaps = [later - earlier for earlier, later in zip(attempts_at, attempts_at[1:])]
        # 1, 2, 4, ... 32 s, then once a minute: 15 attempts in ten minutes, not 600.
        assert gaps == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0] + [RETRY_DELAY_S_MAX] * 8, gaps
        assert config.worker_interval_s == 1.0
        assert await store.get(keys.under_replicated(7)) is not None    # still recorded, not given up

        # The record is gone (the ledger was deleted, or another worker finished it):
        # its back-off is forgotten, a new record is tried at once.
        await store.delete(keys.under_replicated(7))
        await worker.run_round()
        await store.put(keys.under_replicated(7), UnderReplicatedRecord(7, [0], ["c"]).encode())
        failures = worker.stats.failures
        await worker.run_round()
        assert worker.stats.failures == failures + 1
    finally:
        await worker.close()
        await registry.close()
