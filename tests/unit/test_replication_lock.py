"""The replication worker's per-ledger lock (ledger/replication.py) over the in-memory
store: while one worker holds a ledger's lock a second one leaves the ledger alone; a
worker that dies mid-copy (its lease expires) frees the ledger for another; the rate
limiter makes a worker wait in proportion to the bytes it copies."""

from __future__ import annotations

import random

from ledger.config import AutoRecoveryConfig, LedgerClientConfig
from ledger.context import LedgerContext
from ledger.replication import RateLimiter, ReplicationWorker
from metadata import keys
from metadata.memory_store import MemoryStore


def _worker(store: MemoryStore, name: str) -> ReplicationWorker:
    context = LedgerContext(store, None, None, LedgerClientConfig(), random.Random(1))  # type: ignore[arg-type]
    return ReplicationWorker(context, AutoRecoveryConfig(), name)


async def test_a_held_lock_keeps_a_second_worker_off_until_its_lease_expires():
    store = MemoryStore()
    first, second = _worker(store, "first"), _worker(store, "second")
    lease = await first._held_lease()
    await store.create(keys.replication_lock(7), b"first", lease=lease)    # first is mid-copy
    assert await second.replicate_locked(7) is False
    assert second.stats.lock_contended == 1
    store.expire_lease(lease)                                              # first died
    assert await store.get(keys.replication_lock(7)) is None
    # No record and no metadata: the ledger was deleted meanwhile; the lock is taken
    # and released again.
    assert await second.replicate_locked(7) is False
    assert await store.get(keys.replication_lock(7)) is None
    await second.close()


async def test_rate_limiter_waits_for_the_bytes_beyond_the_rate():
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(1000, clock=lambda: now[0], sleep=sleep)
    await limiter.acquire(1000)      # one second's worth is in the bucket
    assert slept == []
    await limiter.acquire(500)
    assert slept == [0.5]
    now[0] += 10                     # idle: the bucket refills to one second, not ten
    await limiter.acquire(1500)
    assert slept[-1] == 0.5
