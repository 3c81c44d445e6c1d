"""The add timeout against a real bookie that stops answering (SIGSTOP: its TCP
connections stay open, so only the timeout notices).

Proves: an add a stalled bookie does not answer fails with AddTimeout about
``add_timeout_s`` after it was sent, however long other adds keep arriving for that
bookie meanwhile (the sender used to look only after each write and after an idle wait
of the whole timeout, so adds arriving until just before the timeout pushed the failure
to nearly twice the timeout: a paused bookie stalled the hosts workload 10 s, not 5);
a write held by flow control (a bookie that reads nothing) no longer keeps the
timeout from firing, and the adds queued behind it fail with it; and a writer whose
ensemble holds the stalled bookie, with a spare to replace it, goes on within about one
add timeout. About 16 s in all.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

from common.entry import encode_entry
from common.errors import AddTimeout
from ledger.bookie_client import BookieClient
from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from metadata import open_store

ADD_TIMEOUT_S = 2.0
LEDGER_ID = 1


def _entry(entry_id: int) -> bytes:
    return encode_entry(LEDGER_ID, entry_id, entry_id - 1, 100 * (entry_id + 1), b"x" * 100)
# What the event loop, the bookie client and a loaded machine may add to the timeout.
SLACK_S = 1.0


async def test_add_timeout_counts_from_the_oldest_add_not_the_last(cluster):
    (bookie,) = await cluster.start_bookies(1)
    client = BookieClient(bookie.bookie_id, bookie.address, LedgerClientConfig(add_timeout_s=ADD_TIMEOUT_S))
    try:
        await asyncio.wait_for(client.add(LEDGER_ID, 0, _entry(0)), 10)   # the stream is up
        os.kill(bookie.process.pid, signal.SIGSTOP)
        try:
            sent_at = time.monotonic()
            futures = []
            failed_at: list[float] = []
            entry_id = 1
            # Adds keep coming for 90 % of the timeout, then stop.
            while time.monotonic() - sent_at < 0.9 * ADD_TIMEOUT_S:
                future = client.add(LEDGER_ID, entry_id, _entry(entry_id))
                future.add_done_callback(lambda _f: failed_at.append(time.monotonic()))
                futures.append(future)
                entry_id += 1
                await asyncio.sleep(0.05)
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 3 * ADD_TIMEOUT_S)
        finally:
            os.kill(bookie.process.pid, signal.SIGCONT)
        assert all(isinstance(result, AddTimeout) for result in results), results[:3]
        first_failure_s = min(failed_at) - sent_at
        assert ADD_TIMEOUT_S - 0.1 <= first_failure_s <= ADD_TIMEOUT_S + SLACK_S, \
            f"the first add failed {first_failure_s:.2f}s after it was sent; the add timeout is {ADD_TIMEOUT_S}s"
        # Resumed, the bookie takes adds again on a new stream.
        await asyncio.wait_for(client.add(LEDGER_ID, entry_id, _entry(entry_id)), 10)
    finally:
        await client.close()


async def test_writer_goes_on_within_one_add_timeout_of_a_stalled_bookie(cluster):
    """E=3 Qw=2 Qa=2 on four bookies, entries submitted at 40/s with at most 70 of them
    uncompleted (a producer's pending limit: 1.75 s of them): one bookie of the
    ensemble stops; the longest time without a completed entry stays within one add
    timeout (plus slack), and every entry completes in order."""
    bookies = await cluster.start_bookies(4)
    store = open_store(cluster.metadata_url)
    client = LedgerClient(store, LedgerClientConfig(add_timeout_s=ADD_TIMEOUT_S), rng=random.Random(7))
    await client.start()
    try:
        handle = await client.create_ledger(3, 2, 2)
        victim_id = handle.metadata.current_ensemble[1]
        victim = next(b for b in bookies if b.bookie_id == victim_id)
        completed_at: list[float] = []
        futures: list[asyncio.Future[int]] = []

        async def submit(count: int) -> None:
            for _ in range(count):
                if len(futures) >= 70:
                    await futures[-70]      # the pending limit
                future = await handle.submit(b"e%d" % len(futures))
                future.add_done_callback(lambda _f: completed_at.append(time.monotonic()))
                futures.append(future)
                await asyncio.sleep(0.025)

        await submit(40)
        await asyncio.gather(*futures)
        os.kill(victim.process.pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            await asyncio.wait_for(submit(int(40 * 2.5 * ADD_TIMEOUT_S)), 6 * ADD_TIMEOUT_S)
            assert await asyncio.wait_for(asyncio.gather(*futures), 3 * ADD_TIMEOUT_S) == list(range(len(futures)))
        finally:
            os.kill(victim.process.pid, signal.SIGCONT)
        times = [stopped_at] + sorted(t for t in completed_at if t >= stopped_at)
        longest = max(later - earlier for earlier, later in zip(times, times[1:]))
        assert handle.ensemble_changes >= 1
        assert longest <= ADD_TIMEOUT_S + SLACK_S, \
            f"no entry completed for {longest:.2f}s; the add timeout is {ADD_TIMEOUT_S}s"
        await handle.close()
    finally:
        await client.close()
        await store.close()


async def test_add_timeout_when_flow_control_holds_the_write(cluster):
    """79 entries of 1 MB for a stopped bookie: the bookie reads nothing, so HTTP/2 flow
    control and the socket buffers hold the sender in its write. Every add (the written
    batch and those still queued behind it) fails with AddTimeout about one timeout
    after it was queued; the sender, which looked at the timeout only between writes,
    used to wait for gRPC's keep-alive to kill the connection (10 s + 5 s)."""
    (bookie,) = await cluster.start_bookies(1)
    client = BookieClient(bookie.bookie_id, bookie.address, LedgerClientConfig(add_timeout_s=ADD_TIMEOUT_S))
    payload = b"x" * (1000 * 1024)
    try:
        await asyncio.wait_for(client.add(LEDGER_ID, 0, _entry(0)), 10)
        os.kill(bookie.process.pid, signal.SIGSTOP)
        try:
            queued_at = time.monotonic()
            futures = [client.add(LEDGER_ID, entry_id,
                                  encode_entry(LEDGER_ID, entry_id, entry_id - 1, entry_id * len(payload), payload))
                       for entry_id in range(1, 80)]
            done_at: list[float] = []
            for future in futures:
                future.add_done_callback(lambda _f: done_at.append(time.monotonic()))
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
        finally:
            os.kill(bookie.process.pid, signal.SIGCONT)
        assert all(isinstance(result, AddTimeout) for result in results), results[:3]
        last_failure_s = max(done_at) - queued_at
        assert last_failure_s <= ADD_TIMEOUT_S + SLACK_S, \
            f"the last add failed {last_failure_s:.2f}s after it was queued; the add timeout is {ADD_TIMEOUT_S}s"
        await asyncio.wait_for(client.add(LEDGER_ID, 80, _entry(80)), 10)
    finally:
        await client.close()
