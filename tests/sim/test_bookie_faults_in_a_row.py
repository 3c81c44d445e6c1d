"""Bookie faults and the next ledger (seeded simulation, virtual time, simulated bookies
that stay registered while cut off from the writer).

Proves: a bookie that just failed an add is not chosen for the next ledger while others
are enough (the client's quarantine, ledger/quarantine.py). Before, a rollover during
the cut picked it three times in four (four bookies, E=3), and that ledger's adds
waited one more add timeout.
"""
from __future__ import annotations

import asyncio
import random

from ledger.config import LedgerClientConfig
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.memory_store import MemoryStore
from tests.sim.bookie import JournalFaults, SimBookie
from tests.sim.clock import run_virtual
from tests.sim.network import NetworkFaults
from tests.sim.scenario import _client

ADD_TIMEOUT_S = 2.0


async def _ensemble_after_a_cut(seed: int) -> tuple[str, tuple[str, ...]]:
    rng = random.Random(seed)
    net = NetworkFaults(random.Random(rng.getrandbits(64)), drop_rate=0.0, delay_spike_rate=0.0)
    journal_faults = JournalFaults(random.Random(rng.getrandbits(64)), fsync_error_rate=0.0)
    store = MemoryStore()
    bookies: dict[str, SimBookie] = {}
    for index in range(4):
        bookie_id = f"bookie-{index}"
        bookie = bookies[bookie_id] = SimBookie(bookie_id, random.Random(rng.getrandbits(64)), journal_faults,
                                                lambda *_: None)
        bookie.start()
        record = BookieRecord(bookie_id, bookie_id, bookie_id, False, 10**12, 2 * 10**12, 0.5, "sim", 0)
        await store.put(keys.bookie(bookie_id), record.encode())
    config = LedgerClientConfig(add_timeout_s=ADD_TIMEOUT_S, read_timeout_s=2.0, control_timeout_s=2.0)
    writer = _client("writer", store, bookies, net, config, random.Random(rng.getrandbits(64)))
    await writer.start()
    try:
        handle = await writer.create_ledger(3, 2, 2)
        cut = handle.metadata.current_ensemble[0]
        net.partitioned.add(("writer", cut))
        futures = [await handle.submit(b"e%d" % i) for i in range(10)]
        assert await asyncio.gather(*futures) == list(range(10))
        assert handle.ensemble_changes == 1
        # Still cut, still registered: the next ledger (a managed ledger's rollover, a
        # cursor's ledger) is made of the three others.
        following = await writer.create_ledger(3, 2, 2)
        ensemble = following.metadata.current_ensemble
        net.partitioned.clear()
        await handle.close()
        await following.close()
        return cut, ensemble
    finally:
        await writer.close()


def test_a_bookie_that_just_failed_is_not_chosen_for_the_next_ledger():
    for seed in range(6):
        cut, ensemble = run_virtual(_ensemble_after_a_cut(seed))
        assert cut not in ensemble, (seed, cut, ensemble)
