"""The metadata store contract, run against both implementations: the real etcd (a
server process started for the session) and the in-memory store. Proves get/put,
create-if-absent, compare-and-swap on versions, prefix listings, counters, leases that
take their keys with them, and watches that deliver every change in order."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import MetadataKeyExists, MetadataUnavailable, MetadataVersionConflict
from metadata import open_store
from metadata.memory_store import MemoryStore
from metadata.store import Compare, Delete, Put


@pytest.fixture(params=["etcd", "memory"])
async def store(request, metadata_url):
    store = open_store(metadata_url) if request.param == "etcd" else MemoryStore()
    yield store
    await store.close()


async def test_put_get_delete(store):
    """A put is read back with a version; delete removes it and reports existence."""
    assert await store.get("/a") is None
    version = await store.put("/a", b"1")
    record = await store.get("/a")
    assert record is not None and record.value == b"1" and record.version == version
    assert await store.delete("/a") is True
    assert await store.delete("/a") is False
    assert await store.get("/a") is None


async def test_create_only_if_absent(store):
    """create fails with MetadataKeyExists when the key exists."""
    await store.create("/c", b"x")
    with pytest.raises(MetadataKeyExists):
        await store.create("/c", b"y")
    assert (await store.get("/c")).value == b"x"


async def test_compare_and_set(store):
    """Only the writer holding the current version wins; version 0 means absent."""
    first = await store.compare_and_set("/k", b"v1", expected_version=0)
    with pytest.raises(MetadataVersionConflict):
        await store.compare_and_set("/k", b"other", expected_version=0)
    second = await store.compare_and_set("/k", b"v2", expected_version=first)
    assert second > first
    with pytest.raises(MetadataVersionConflict):
        await store.compare_and_set("/k", b"stale", expected_version=first)
    assert (await store.get("/k")).value == b"v2"
    with pytest.raises(MetadataVersionConflict):
        await store.compare_and_delete("/k", expected_version=first)
    await store.compare_and_delete("/k", expected_version=second)
    assert await store.get("/k") is None


async def test_multi_key_transaction_is_atomic(store):
    """A transaction applies all operations or none."""
    version = await store.put("/t/a", b"1")
    assert await store.transaction([Compare("/t/a", version)], [Put("/t/b", b"2"), Delete("/t/a")]) is not None
    assert await store.get("/t/a") is None and (await store.get("/t/b")).value == b"2"
    assert await store.transaction([Compare("/t/a", version)], [Put("/t/c", b"3")]) is None
    assert await store.get("/t/c") is None


async def test_prefix_listing_in_key_order(store):
    """get_prefix returns keys under the prefix only, sorted; keys_only drops values."""
    for key in ["/p/b", "/p/a", "/p/c", "/q/a", "/pp"]:
        await store.put(key, key.encode())
    records = await store.get_prefix("/p/")
    assert [r.key for r in records] == ["/p/a", "/p/b", "/p/c"]
    assert [r.value for r in records] == [b"/p/a", b"/p/b", b"/p/c"]
    assert [r.value for r in await store.get_prefix("/p/", keys_only=True)] == [b"", b"", b""]
    assert len(await store.get_prefix("/p/", limit=2)) == 2
    listing, revision = await store.get_prefix_at("/p/")
    assert len(listing) == 3 and revision >= max(r.version for r in listing)
    assert await store.delete_prefix("/p/") == 3
    assert await store.get_prefix("/p/") == []


async def test_counter_increments_under_concurrency(store):
    """Concurrent increments each get a distinct value (compare-and-swap loop)."""
    values = await asyncio.gather(*(store.increment("/counter") for _ in range(20)))
    assert sorted(values) == list(range(1, 21))


async def test_watch_sees_changes_in_order_and_from_revision(store):
    """A watch delivers puts and deletes in revision order; one started at a past
    revision replays what happened after it."""
    _, start_revision = await store.get_prefix_at("/w/")
    watch = store.watch_prefix("/w/")
    events = []

    async def collect():
        async for event in watch:
            events.append(event)
            if len(events) == 3:
                return

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.2)
    await store.put("/w/1", b"a")
    await store.put("/w/2", b"b")
    await store.delete("/w/1")
    async with asyncio.timeout(10):
        await task
    await watch.close()
    assert [(e.kind, e.key) for e in events] == [("put", "/w/1"), ("put", "/w/2"), ("delete", "/w/1")]
    assert events[0].value == b"a"
    assert events[0].version < events[1].version < events[2].version

    replay = store.watch_prefix("/w/", start_version=start_revision)
    replayed = []
    async with asyncio.timeout(10):
        async for event in replay:
            replayed.append((event.kind, event.key))
            if len(replayed) == 3:
                break
    await replay.close()
    assert replayed == [("put", "/w/1"), ("put", "/w/2"), ("delete", "/w/1")]


async def test_lease_keys_vanish_on_revoke(store):
    """Keys put under a lease disappear when the lease is revoked."""
    lease = await store.grant_lease(5)
    await store.put("/leased/x", b"1", lease=lease)
    await store.create("/leased/y", b"2", lease=lease)
    assert len(await store.get_prefix("/leased/")) == 2
    await store.revoke_lease(lease)
    assert lease.is_lost
    assert await store.get_prefix("/leased/") == []


async def test_etcd_lease_expires_without_keepalive(metadata_url):
    """In etcd, a lease nobody keeps alive expires after its TTL and takes its keys
    (what happens to a crashed bookie's registration)."""
    store = open_store(metadata_url)
    try:
        lease = await store.grant_lease(2)
        await store.put("/dead/x", b"1", lease=lease)
        # Stop the keep-alive as a crashed process would.
        store._keepalive_tasks[lease.lease_id].cancel()
        await asyncio.sleep(0.1)
        deadline = asyncio.get_running_loop().time() + 15
        while await store.get("/dead/x") is not None:
            assert asyncio.get_running_loop().time() < deadline, "lease did not expire"
            await asyncio.sleep(0.25)
    finally:
        await store.close()


async def test_unreachable_etcd_is_a_retriable_error():
    """Talking to a port where no etcd runs fails fast with MetadataUnavailable."""
    from tests.cluster import free_port

    store = open_store(f"etcd://127.0.0.1:{free_port()}/x")
    try:
        with pytest.raises(MetadataUnavailable):
            await store.get("/a")
    finally:
        await store.close()


async def test_a_lease_outlives_a_blocked_event_loop(metadata_url):
    """The event loop blocked for twice the lease's TTL (a broker saturated by a flood
    of frames): the lease is refreshed on the store's own thread meanwhile, so it is
    not lost and a key under it is still there (before, refreshes ran on the blocked
    loop: etcd expired the lease and the broker fenced itself under the live fuzz).
    Revoked, the key goes at once; and a store closed with a lease leaves no thread."""
    import threading
    import time

    store = open_store(metadata_url)
    try:
        lease = await store.grant_lease(2)
        await store.put("/lease-held", b"x", lease=lease)
        time.sleep(4.5)                      # the loop does nothing for 4.5 s
        await asyncio.sleep(0.1)
        assert not lease.is_lost
        assert time.monotonic() - lease.refreshed_at < 2
        assert await store.get("/lease-held") is not None
        await store.revoke_lease(lease)
        assert await store.get("/lease-held") is None
        await store.grant_lease(2)
    finally:
        await store.close()
    assert not [t for t in threading.enumerate() if t.name == "etcd-lease-keepalive"]
