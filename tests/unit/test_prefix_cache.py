"""The local mirror of an etcd prefix (metadata/prefix_cache.py), over the in-memory
store (metadata/memory_store.py), which keeps etcd's revisions, history and watch
semantics and so is a fair stand-in for etcd here.

What it proves: after start the mirror holds exactly the prefix's records; it follows
puts, deletes, multi-key transactions and lease expiry, with the store's versions and
create versions; changes made between the initial listing and the watch's start are
neither missed nor applied twice; keys outside the prefix (look-alikes included) are
never mirrored; the listener sees each change once with the old and new record; a
failing listener does not stop the mirror; when the watch breaks, or reports that
history was compacted, the mirror reloads and reports exactly the keys that appeared,
changed or vanished meanwhile, then keeps following; after close it follows nothing.

How: asyncio tests (the project's pytest-asyncio auto mode). Waiting is bounded: the
store delivers events synchronously into queues, so a few yields to the loop suffice;
the helper gives up after 200 yields. The one pause in the code under test (before a
reload) is set to 0.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

import pytest

from common.errors import MetadataUnavailable
from metadata import prefix_cache
from metadata.memory_store import MemoryStore
from metadata.prefix_cache import PrefixCache
from metadata.store import Compare, Delete, Put, Record, Watch, WatchEvent

PREFIX = "/things/"
# Yields to the event loop before a wait gives up (each yield lets every ready task run).
YIELDS_MAX = 200


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(YIELDS_MAX):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _settle() -> None:
    """Lets every task run until nothing is left to do (for asserting that something
    did not happen)."""
    for _ in range(20):
        await asyncio.sleep(0)


def _view(records) -> dict[str, tuple[bytes, int, int]]:
    """What the mirror must agree with the store on (lease ids are not in watch events,
    so they are not compared)."""
    return {r.key: (r.value, r.version, r.create_version) for r in records}


async def _in_sync(store: MemoryStore, cache: PrefixCache) -> bool:
    return _view(cache.records.values()) == _view(await store.get_prefix(PREFIX))


class _Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, bytes | None, bytes | None]] = []

    def __call__(self, key: str, old: Record | None, new: Record | None) -> None:
        self.changes.append((key, old.value if old else None, new.value if new else None))


@pytest.fixture
def no_reload_pause(monkeypatch):
    monkeypatch.setattr(prefix_cache, "_RELOAD_PAUSE_S", 0.0)


async def test_start_mirrors_the_existing_records_and_reports_them():
    """The initial listing is the mirror, and each record is reported as new."""
    store = MemoryStore()
    await store.put(PREFIX + "a", b"1")
    await store.put(PREFIX + "b", b"2")
    await store.put("/other/c", b"3")
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        assert await _in_sync(store, cache)
        assert set(cache.records) == {PREFIX + "a", PREFIX + "b"}
        assert sorted(recorder.changes) == [(PREFIX + "a", None, b"1"), (PREFIX + "b", None, b"2")]
        assert cache.revision == (await store.get_prefix_at(PREFIX))[1]
        assert cache.changed.is_set()
    finally:
        await cache.close()


async def test_follows_puts_updates_and_deletes_with_the_stores_versions():
    """Each change arrives once, in order, with the store's version and create version."""
    store = MemoryStore()
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        created = await store.put(PREFIX + "k", b"v1")
        await _until(lambda: PREFIX + "k" in cache.records)
        updated = await store.put(PREFIX + "k", b"v2")
        await _until(lambda: cache.get(PREFIX + "k").value == b"v2")
        record = cache.get(PREFIX + "k")
        assert (record.version, record.create_version) == (updated, created)
        assert await _in_sync(store, cache)
        await store.delete(PREFIX + "k")
        await _until(lambda: PREFIX + "k" not in cache.records)
        assert cache.get(PREFIX + "k") is None
        recreated = await store.put(PREFIX + "k", b"v3")
        await _until(lambda: PREFIX + "k" in cache.records)
        assert cache.get(PREFIX + "k").create_version == recreated   # a new key, a new creation
        assert await _in_sync(store, cache)
        assert recorder.changes == [(PREFIX + "k", None, b"v1"), (PREFIX + "k", b"v1", b"v2"),
                                    (PREFIX + "k", b"v2", None), (PREFIX + "k", None, b"v3")]
        assert cache.revision == recreated
    finally:
        await cache.close()


async def test_follows_transactions_delete_prefix_and_lease_expiry():
    """Several keys changed at one revision, a prefix deleted, a lease's keys dropped
    by its expiry: the mirror ends equal to the store each time."""
    store = MemoryStore()
    cache = PrefixCache(store, PREFIX)
    try:
        await cache.start()
        await store.transaction([Compare(PREFIX + "x", 0)],
                                [Put(PREFIX + "x", b"1"), Put(PREFIX + "y", b"2"), Put("/elsewhere", b"3")])
        await _until(lambda: len(cache.records) == 2)
        assert await _in_sync(store, cache)
        await store.transaction([], [Delete(PREFIX + "x"), Put(PREFIX + "z", b"4")])
        await _until(lambda: set(cache.records) == {PREFIX + "y", PREFIX + "z"})
        lease = await store.grant_lease(10)
        await store.put(PREFIX + "leased-1", b"L", lease=lease)
        await store.put(PREFIX + "leased-2", b"L", lease=lease)
        await _until(lambda: PREFIX + "leased-2" in cache.records)
        store.expire_lease(lease)
        await _until(lambda: PREFIX + "leased-1" not in cache.records and PREFIX + "leased-2" not in cache.records)
        assert await _in_sync(store, cache)
        await store.delete_prefix(PREFIX)
        await _until(lambda: not cache.records)
        assert await _in_sync(store, cache)
    finally:
        await cache.close()


async def test_changes_between_listing_and_watch_are_applied_exactly_once():
    """start() lists, then starts the follower task; a put made before that task first
    runs must still arrive (the watch starts at the listing's revision), and only once."""
    store = MemoryStore()
    await store.put(PREFIX + "before", b"0")
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        await store.put(PREFIX + "racing", b"1")       # the follower task has not run yet
        await store.put(PREFIX + "before", b"changed")
        await _until(lambda: PREFIX + "racing" in cache.records and cache.get(PREFIX + "before").value == b"changed")
        await _settle()
        assert recorder.changes == [(PREFIX + "before", None, b"0"), (PREFIX + "racing", None, b"1"),
                                    (PREFIX + "before", b"0", b"changed")]
        assert await _in_sync(store, cache)
    finally:
        await cache.close()


async def test_keys_outside_the_prefix_are_never_mirrored():
    """Look-alike keys ("/things" without the slash, "/things-2/...", "/thing/...") stay out."""
    store = MemoryStore()
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        for key in ("/things", "/things-2/a", "/thing/a", "/other/things/a", "things/a"):
            await store.put(key, b"x")
        await store.put(PREFIX + "mine", b"y")
        await _until(lambda: PREFIX + "mine" in cache.records)
        await _settle()
        assert set(cache.records) == {PREFIX + "mine"}
        assert [key for key, _, _ in recorder.changes] == [PREFIX + "mine"]
    finally:
        await cache.close()


async def test_a_failing_listener_does_not_stop_the_mirror(caplog):
    """A listener that raises is logged; later changes still arrive and are mirrored."""
    calls: list[str] = []

    def listener(key: str, old: Record | None, new: Record | None) -> None:
        calls.append(key)
        raise RuntimeError("listener bug")

    store = MemoryStore()
    cache = PrefixCache(store, PREFIX, listener)
    try:
        with caplog.at_level(logging.ERROR, logger="metadata.prefix_cache"):
            await cache.start()
            await store.put(PREFIX + "a", b"1")
            await store.put(PREFIX + "b", b"2")
            await _until(lambda: PREFIX + "b" in cache.records)
        assert calls == [PREFIX + "a", PREFIX + "b"]
        assert await _in_sync(store, cache)
        assert "listener failed" in caplog.text
    finally:
        await cache.close()


async def test_close_stops_following():
    """After close, puts and deletes leave the mirror as it was."""
    store = MemoryStore()
    cache = PrefixCache(store, PREFIX)
    await cache.start()
    await store.put(PREFIX + "a", b"1")
    await _until(lambda: PREFIX + "a" in cache.records)
    await cache.close()
    await store.put(PREFIX + "b", b"2")
    await store.delete(PREFIX + "a")
    await _settle()
    assert set(cache.records) == {PREFIX + "a"}
    await cache.close()          # closing twice is harmless


# --- broken and compacted watches ---------------------------------------------------------------

# Putting this key blinds the cache's first watch (see _InterruptedWatch).
BLIND_KEY = PREFIX + "~blind"


class _InterruptedWatch(Watch):
    """Passes the real watch's events through until it meets BLIND_KEY; from then on it
    delivers nothing until released, and then fails (etcd lost) or reports that history
    was compacted (a ``reset`` event), as a real watch may after an outage."""

    def __init__(self, inner: Watch, release: asyncio.Event, outcome: str) -> None:
        self._inner = inner
        self._release = release
        self._outcome = outcome

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        async for event in self._inner:
            if event.key != BLIND_KEY:
                yield event
                continue
            await self._release.wait()
            if self._outcome == "fail":
                raise MetadataUnavailable("etcd went away")
            yield WatchEvent("reset", PREFIX)
            return

    async def close(self) -> None:
        await self._inner.close()


class _InterruptingStore(MemoryStore):
    """A MemoryStore whose first watch is interrupted; later watches are the real ones."""

    def __init__(self, outcome: str) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.watches_opened = 0
        self._outcome = outcome

    def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
        watch = super().watch_prefix(prefix, start_version=start_version)
        self.watches_opened += 1
        if self.watches_opened == 1:
            return _InterruptedWatch(watch, self.release, self._outcome)
        return watch


@pytest.mark.parametrize("outcome", ["fail", "reset"])
async def test_after_an_interrupted_watch_the_reload_reports_exactly_what_changed(outcome: str, no_reload_pause,
                                                                                   caplog):
    """While the watch is blind, keys appear, change and vanish, and one stays the same.
    The reload reports the changed ones (with old and new values) and not the
    unchanged one; then the mirror follows new changes through a fresh watch."""
    store = _InterruptingStore(outcome)
    for key in ("same", "changes", "vanishes"):
        await store.put(PREFIX + key, b"old")
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        recorder.changes.clear()
        await store.put(BLIND_KEY, b"")
        await store.put(PREFIX + "appears", b"new")
        await store.put(PREFIX + "changes", b"new")
        await store.delete(PREFIX + "vanishes")
        await _settle()
        assert set(cache.records) == {PREFIX + "same", PREFIX + "changes", PREFIX + "vanishes"}   # blind
        assert recorder.changes == []
        with caplog.at_level(logging.WARNING, logger="metadata.prefix_cache"):
            store.release.set()
            await _until(lambda: store.watches_opened >= 2)
            await _settle()
        assert sorted(recorder.changes) == [(PREFIX + "appears", None, b"new"), (PREFIX + "changes", b"old", b"new"),
                                            (PREFIX + "vanishes", b"old", None), (BLIND_KEY, None, b"")]
        assert await _in_sync(store, cache)
        if outcome == "fail":
            assert "reloading" in caplog.text
        recorder.changes.clear()
        await store.put(PREFIX + "later", b"x")
        await _until(lambda: PREFIX + "later" in cache.records)
        await _settle()
        assert recorder.changes == [(PREFIX + "later", None, b"x")]
        assert await _in_sync(store, cache)
    finally:
        await cache.close()


async def test_a_reload_does_not_report_unchanged_leased_keys(no_reload_pause):
    """Owner, assignment and transfer keys are leased. A key learned through the watch
    and unchanged since must not be reported again by the reload after a broken watch
    (listeners act on each report: a repeated transfer or assignment would be handled
    twice)."""
    store = _InterruptingStore("fail")
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        lease = await store.grant_lease(10)
        await store.put(PREFIX + "owner", b"b1", lease=lease)
        await _until(lambda: PREFIX + "owner" in cache.records)
        recorder.changes.clear()
        await store.put(BLIND_KEY, b"")
        store.release.set()
        await _until(lambda: store.watches_opened >= 2)
        await _settle()
        assert recorder.changes == [(BLIND_KEY, None, b"")]
        assert await _in_sync(store, cache)
    finally:
        await cache.close()


async def test_a_watch_started_in_compacted_history_makes_the_mirror_reload():
    """The in-memory store itself reports a reset when a watch starts before its oldest
    kept event (like etcd after compaction). Driven here through a store whose history
    holds two events: the cache's first watch is made to start too early."""

    class _ShortHistoryStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.first_watch = True

        def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
            if self.first_watch:
                # As if the cache had listed long ago: events since then were compacted.
                self.first_watch = False
                while len(self._history) > 1:
                    self._history.popleft()
            return super().watch_prefix(prefix, start_version=start_version)

    store = _ShortHistoryStore()
    recorder = _Recorder()
    cache = PrefixCache(store, PREFIX, recorder)
    try:
        await cache.start()
        for index in range(5):
            await store.put(PREFIX + f"k{index}", b"v")     # before the follower's first watch
        await _until(lambda: len(cache.records) == 5)
        await _settle()
        assert await _in_sync(store, cache)
        assert sorted(key for key, _, _ in recorder.changes) == [PREFIX + f"k{i}" for i in range(5)]
    finally:
        await cache.close()

