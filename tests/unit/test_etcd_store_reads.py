"""EtcdStore reads whose callers are cancelled (issue 13's live-fuzz memory growth).

What it proves: grpc goes on with a call whose caller was cancelled, so reads in flight
are bounded by ``reads_in_flight_max`` even when their callers are cancelled again and
again (before the fix every cancelled lookup left a call running, without limit), and a
cancelled caller that was still waiting for a slot never starts its read.

How: an EtcdStore whose ``_call`` is replaced by a fake read that waits on a gate and
counts how many run at once; no etcd is needed.
"""

from __future__ import annotations

import asyncio

from metadata.etcd_store import EtcdStore, EtcdStoreConfig


async def test_cancelled_reads_stay_bounded():
    store = EtcdStore(EtcdStoreConfig(endpoints=(("127.0.0.1", 1),), reads_in_flight_max=8))
    gate = asyncio.Event()
    running = started = peak = 0

    async def fake_call(coroutine_factory, *, timeout_s=None):
        nonlocal running, started, peak
        running += 1
        started += 1
        peak = max(peak, running)
        try:
            await gate.wait()
            return None
        finally:
            running -= 1

    store._call = fake_call
    callers = [asyncio.ensure_future(store.get(f"/topic-{i}")) for i in range(1000)]
    await asyncio.sleep(0.01)
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    assert peak == 8 and started == 8   # the other 992 never started a read
    gate.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert running == 0 and not store._shielded_reads
    assert await store.get("/after") is None   # the slots were given back
