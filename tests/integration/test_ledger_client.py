"""The ledger client against real bookie processes and a real etcd.

Proves: ledgers are created with ensembles from registered bookies, written with
striping and quorums, closed and read back; a second client's recovery fences the
ledger so the first writer's next add fails with LedgerFenced and the recovered ledger
ends at the last acknowledged entry (also with adds in flight during recovery); a
writer survives a bookie's kill -9 by an ensemble change; deleted ledgers vanish.
"""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from common.errors import LedgerClosed, LedgerFenced, NoSuchLedger, NotEnoughBookies
from ledger.metadata import LedgerState
from ledger.quorum import write_set
from metadata import keys, open_store


@pytest.fixture
async def make_client(cluster):
    made = []

    async def make(**config) -> LedgerClient:
        store = open_store(cluster.metadata_url)
        client = LedgerClient(store, LedgerClientConfig(**config), rng=random.Random(len(made)))
        await client.start()
        made.append((client, store))
        return client

    yield make
    for client, store in made:
        await client.close()
        await store.close()


async def test_write_close_read_delete(cluster, make_client):
    """E=3 Qw=2 Qa=2: 1000 entries are acknowledged in order, the ledger closes at the
    last one, each entry lives on exactly its write set, and deletion removes it."""
    await cluster.start_bookies(3)
    client = await make_client()
    handle = await client.create_ledger(3, 2, 2, custom={"owner": "test"})
    futures = [await handle.submit(f"entry-{i}".encode()) for i in range(1000)]
    assert await asyncio.gather(*futures) == list(range(1000))
    versioned = await handle.close()
    assert versioned.metadata.state == LedgerState.CLOSED and versioned.metadata.last_entry_id == 999
    assert versioned.metadata.length_bytes == sum(len(f"entry-{i}") for i in range(1000))
    with pytest.raises(LedgerClosed):
        await handle.add(b"late")

    reader = await client.open_ledger(handle.ledger_id, recovery=False)
    entries = await reader.read(0, 999)
    assert [bytes(e.payload) for e in entries] == [f"entry-{i}".encode() for i in range(1000)]
    assert reader.metadata.custom == {"owner": "test"}

    ensemble = reader.metadata.current_ensemble
    for index, bookie_id in enumerate(ensemble):
        stored = await client.pool.get(bookie_id).read(handle.ledger_id, list(range(1000)), 1 << 24)
        held = {r.entry_id for r in stored if r.entry is not None}
        expected = {e for e in range(1000) if index in write_set(e, 3, 2)}
        assert held == expected, f"bookie {index} holds the wrong stripe"

    await client.delete_ledger(handle.ledger_id)
    with pytest.raises(NoSuchLedger):
        await client.open_ledger(handle.ledger_id, recovery=False)


async def test_not_enough_bookies(cluster, make_client):
    """Asking for a larger ensemble than there are writable bookies fails clearly."""
    await cluster.start_bookies(2)
    client = await make_client()
    with pytest.raises(NotEnoughBookies):
        await client.create_ledger(3, 2, 2)


async def test_recovery_fences_the_first_writer(cluster, make_client):
    """After client B recovers the ledger, client A's next add fails with LedgerFenced,
    A cannot close it, and the ledger ends exactly at A's last acknowledged entry."""
    await cluster.start_bookies(3)
    writer = await make_client()
    recoverer = await make_client()
    handle = await writer.create_ledger(3, 2, 2)
    for i in range(100):
        assert await handle.add(b"a%d" % i) == i
    reader = await recoverer.open_ledger(handle.ledger_id, recovery=True)
    assert reader.metadata.state == LedgerState.CLOSED
    assert reader.metadata.last_entry_id == 99
    with pytest.raises(LedgerFenced):
        await handle.add(b"after-fence")
    with pytest.raises(LedgerFenced):
        await handle.close()
    entries = await reader.read(0, 99)
    assert [bytes(e.payload) for e in entries] == [b"a%d" % i for i in range(100)]
    # Recovering again is a no-op on a closed ledger.
    again = await recoverer.open_ledger(handle.ledger_id, recovery=True)
    assert again.metadata.last_entry_id == 99


async def test_recovery_while_adds_are_in_flight(cluster, make_client):
    """Recovery during a stream of adds: every entry the writer saw acknowledged is in
    the recovered ledger, which ends at or after the last acknowledgement (entries that
    reached the bookies unacknowledged may be kept, never lost ones), and nothing is
    acknowledged to the writer after the fence."""
    await cluster.start_bookies(3)
    writer = await make_client()
    recoverer = await make_client()
    handle = await writer.create_ledger(3, 2, 2)
    acked: list[int] = []
    fenced = asyncio.Event()

    async def write_forever():
        entry_id = 0
        while True:
            try:
                future = await handle.submit(b"p%d" % entry_id)
            except LedgerFenced:
                fenced.set()
                return
            future.add_done_callback(lambda f: acked.append(f.result()) if not f.exception() else fenced.set())
            entry_id += 1
            if entry_id % 50 == 0:
                await asyncio.sleep(0)

    task = asyncio.create_task(write_forever())
    while len(acked) < 2000:
        await asyncio.sleep(0.01)
    reader = await recoverer.open_ledger(handle.ledger_id, recovery=True)
    last = reader.metadata.last_entry_id
    async with asyncio.timeout(30):
        await fenced.wait()
    task.cancel()
    acked_at_end = sorted(acked)
    assert acked_at_end == list(range(len(acked_at_end))), "acknowledgements out of order"
    assert acked_at_end[-1] <= last, (acked_at_end[-1], last)
    entries = await reader.read(0, last)
    assert [bytes(e.payload) for e in entries] == [b"p%d" % i for i in range(last + 1)]


async def test_ensemble_change_on_bookie_kill(cluster, make_client):
    """kill -9 of one bookie while writing with E=3 Qw=2 Qa=2 and a spare bookie: the
    writer replaces it, never fails an add, and every entry reads back."""
    bookies = await cluster.start_bookies(4)
    client = await make_client()
    handle = await client.create_ledger(3, 2, 2)
    futures = []
    victim_id = handle.metadata.current_ensemble[1]
    victim = next(b for b in bookies if b.bookie_id == victim_id)
    for i in range(6000):
        futures.append(await handle.submit(b"e%d" % i))
        if i == 2000:
            await futures[1500]  # some entries confirmed, many still in flight
            victim.kill9()
    assert await asyncio.gather(*futures) == list(range(6000))
    assert handle.ensemble_changes >= 1
    versioned = await handle.close()
    assert len(versioned.metadata.fragments) >= 2
    assert victim_id not in versioned.metadata.current_ensemble
    reader = await client.open_ledger(handle.ledger_id, recovery=False)
    entries = await reader.read(0, 5999)
    assert [bytes(e.payload) for e in entries] == [b"e%d" % i for i in range(6000)]


async def test_tailing_reader_sees_confirmed_entries(cluster, make_client):
    """A reader of a ledger still being written reads up to the last-add-confirmed the
    bookies report, which trails the writer by at most the entries in flight."""
    await cluster.start_bookies(3)
    writer = await make_client()
    tail = await make_client()
    handle = await writer.create_ledger(2, 2, 2)
    for i in range(101):
        await handle.add(b"t%d" % i)
    reader = await tail.open_ledger(handle.ledger_id, recovery=False)
    confirmed = await reader.read_last_add_confirmed()
    # Entry 100 carried last_add_confirmed 99; the bookies know no more than that.
    assert confirmed == 99
    assert [bytes(e.payload) for e in await reader.read(0, confirmed)] == [b"t%d" % i for i in range(100)]
    await handle.close()


async def test_ledger_ids_come_from_an_etcd_counter(cluster, make_client):
    """Ledger ids are unique across concurrent creators, and metadata lives in etcd."""
    await cluster.start_bookies(2)
    first, second = await make_client(), await make_client()
    handles = await asyncio.gather(*(c.create_ledger(2, 2, 1) for c in (first, second) for _ in range(5)))
    ids = [h.ledger_id for h in handles]
    assert len(set(ids)) == 10
    store = open_store(cluster.metadata_url)
    try:
        for ledger_id in ids:
            assert await store.get(keys.ledger(ledger_id)) is not None
    finally:
        await store.close()


async def test_stalled_bookie_without_spare_is_retried(cluster, make_client, caplog):
    """E=Qw=Qa=2 on exactly two bookies: one stalls (SIGSTOP) long enough for adds to
    time out, and there is no spare to replace it. Since it is still registered, the
    writer retries it instead of failing; once it resumes, every add completes in
    order and the ledger reads back whole. That the retry happened (and is not just
    adds that never timed out) is read from the client's log, which runs in this
    process: the handle logs each retry of the same bookies."""
    import os
    import signal

    caplog.set_level(logging.INFO, logger="ledger.handle")
    bookies = await cluster.start_bookies(2)
    client = await make_client(add_timeout_s=1.0)
    handle = await client.create_ledger(2, 2, 2)
    for i in range(100):
        await handle.add(b"x%d" % i)
    stalled = bookies[0]
    os.kill(stalled.process.pid, signal.SIGSTOP)
    try:
        futures = [await handle.submit(b"x%d" % i) for i in range(100, 200)]
        await asyncio.sleep(2.5)
    finally:
        os.kill(stalled.process.pid, signal.SIGCONT)
    assert await asyncio.gather(*futures) == list(range(100, 200))
    assert handle.ensemble_changes == 0
    retries = [record for record in caplog.records if record.name == "ledger.handle"
               and record.getMessage().startswith("retrying the same bookies (no replacement available): "
                                                  f"ledger_id={handle.ledger_id} ")]
    assert retries, "the stalled bookie was never retried"
    assert all(stalled.bookie_id in record.getMessage() for record in retries)
    await handle.close()
    reader = await client.open_ledger(handle.ledger_id, recovery=False)
    assert [bytes(e.payload) for e in await reader.read(0, 199)] == [b"x%d" % i for i in range(200)]
