"""The client's bookie registry (ledger/bookie_registry.py), built on the prefix mirror
(metadata/prefix_cache.py), over the in-memory store (etcd's revisions and watches).

What it proves:
- after start it holds exactly the registered bookies, decoded; it follows new
  registrations, updates (read-only) and removals; ``writable`` leaves read-only
  bookies out and ``address_of`` falls back to the id of an unknown bookie;
- a malformed record is left out (with a warning) and does not stop the registry;
- ``refresh`` catches up with a bookie the watch has not delivered (a lagging watch):
  it starts a new mirror and stops the old one (its watch closed); when the mirror
  already agrees with the store, refresh keeps it (no new watch);
- after close it follows nothing.

How: asyncio tests; the store delivers events synchronously into queues, so a bounded
number of loop turns suffices. A store subclass can blind its first watch (it delivers
nothing) to stand for a watch that lags.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

from ledger.bookie_registry import BookieRegistry
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.memory_store import MemoryStore
from metadata.store import Watch, WatchEvent

YIELDS_MAX = 200


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(YIELDS_MAX):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _record(bookie_id: str, *, read_only: bool = False, address: str | None = None) -> BookieRecord:
    return BookieRecord(bookie_id, address or f"{bookie_id}.host:3181", f"{bookie_id}.host:8000", read_only,
                        10**9, 2 * 10**9, 0.5, "test", 1)


def _ids(records) -> list[str]:
    return sorted(record.bookie_id for record in records)


class _BlindWatch(Watch):
    """Delivers nothing until closed (a watch that lags far behind)."""

    def __init__(self, inner: Watch) -> None:
        self._inner = inner
        self.closed = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        await self.closed.wait()
        return
        yield  # an async generator

    async def close(self) -> None:
        self.closed.set()
        await self._inner.close()


class _CountingStore(MemoryStore):
    """Counts watches; with ``blind_first`` the first watch delivers nothing."""

    def __init__(self, *, blind_first: bool = False) -> None:
        super().__init__()
        self.watches: list[Watch] = []
        self._blind_first = blind_first

    def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
        watch = super().watch_prefix(prefix, start_version=start_version)
        if prefix != keys.BOOKIES:
            return watch   # the decommissioning marks' mirror: not what these tests count
        if self._blind_first and not self.watches:
            watch = _BlindWatch(watch)
        self.watches.append(watch)
        return watch


async def test_start_mirrors_and_follows_registrations():
    """Existing bookies are there after start; a new one, a read-only update and a
    removal are followed; writable() and address_of() agree with the records."""
    store = MemoryStore()
    await store.put(keys.bookie("b1"), _record("b1").encode())
    await store.put(keys.bookie("b2"), _record("b2", address="10.0.0.2:3181").encode())
    registry = BookieRegistry(store)
    await registry.start()
    try:
        assert _ids(registry.all()) == ["b1", "b2"]
        assert registry.get("b2") == _record("b2", address="10.0.0.2:3181")
        assert registry.address_of("b2") == "10.0.0.2:3181"
        assert registry.address_of("unknown:3181") == "unknown:3181"
        registry.changed.clear()
        await store.put(keys.bookie("b3"), _record("b3").encode())
        await _until(lambda: registry.get("b3") is not None)
        assert registry.changed.is_set()
        await store.put(keys.bookie("b1"), _record("b1", read_only=True).encode())
        await _until(lambda: registry.get("b1").read_only)
        assert _ids(registry.writable()) == ["b2", "b3"]
        await store.delete(keys.bookie("b2"))
        await _until(lambda: registry.get("b2") is None)
        assert _ids(registry.all()) == ["b1", "b3"]
        assert registry.address_of("b2") == "b2"
    finally:
        await registry.close()


async def test_a_malformed_record_is_left_out(caplog):
    """A record that does not decode is not a bookie (with a warning); a good record
    under the same key later makes it one."""
    store = MemoryStore()
    await store.put(keys.bookie("bad"), b"{not json")
    await store.put(keys.bookie("b1"), _record("b1").encode())
    registry = BookieRegistry(store)
    with caplog.at_level(logging.WARNING, logger="ledger.bookie_registry"):
        await registry.start()
    try:
        assert _ids(registry.all()) == ["b1"]
        assert "ignoring bad bookie record" in caplog.text
        await store.put(keys.bookie("b1"), b"[]")
        await _until(lambda: registry.get("b1") is None)
        await store.put(keys.bookie("bad"), _record("bad").encode())
        await _until(lambda: registry.get("bad") is not None)
        assert _ids(registry.all()) == ["bad"]
    finally:
        await registry.close()


async def test_refresh_catches_up_with_a_lagging_watch():
    """The first watch delivers nothing: a bookie registered after start is unknown
    until refresh, which starts a new mirror (a second watch) and closes the blind
    one; later changes arrive through the new watch."""
    store = _CountingStore(blind_first=True)
    await store.put(keys.bookie("b1"), _record("b1").encode())
    registry = BookieRegistry(store)
    await registry.start()
    try:
        await store.put(keys.bookie("b2"), _record("b2").encode())
        await _settle()
        assert _ids(registry.all()) == ["b1"]          # the watch lags
        await registry.refresh()
        assert _ids(registry.all()) == ["b1", "b2"]
        assert len(store.watches) == 2
        assert store.watches[0].closed.is_set()
        await store.put(keys.bookie("b3"), _record("b3").encode())
        await _until(lambda: registry.get("b3") is not None)
    finally:
        await registry.close()


async def test_refresh_keeps_a_mirror_that_agrees_with_the_store():
    """Nothing changed: refresh lists the bookies, finds the mirror current, and keeps
    it (no second watch)."""
    store = _CountingStore()
    await store.put(keys.bookie("b1"), _record("b1").encode())
    registry = BookieRegistry(store)
    await registry.start()
    try:
        await store.put(keys.bookie("b2"), _record("b2").encode())
        await _until(lambda: registry.get("b2") is not None)
        for _ in range(3):
            await registry.refresh()
        assert len(store.watches) == 1
        assert _ids(registry.all()) == ["b1", "b2"]
    finally:
        await registry.close()


async def test_close_stops_following():
    """After close, registrations and removals leave the registry as it was; closing
    twice is harmless and refresh after close does nothing."""
    store = _CountingStore()
    await store.put(keys.bookie("b1"), _record("b1").encode())
    registry = BookieRegistry(store)
    await registry.start()
    await registry.close()
    await store.put(keys.bookie("b2"), _record("b2").encode())
    await store.delete(keys.bookie("b1"))
    await _settle()
    assert _ids(registry.all()) == ["b1"]
    watches = len(store.watches)
    await registry.refresh()
    assert len(store.watches) == watches
    assert _ids(registry.all()) == ["b1"]
    await registry.close()


async def test_decommissioning_bookies_are_never_writable():
    """A bookie marked for decommissioning stays known (readable) but leaves
    writable(); removing the mark makes it writable again."""
    store = MemoryStore()
    for bookie_id in ("b1", "b2"):
        await store.put(keys.bookie(bookie_id), _record(bookie_id).encode())
    registry = BookieRegistry(store)
    await registry.start()
    try:
        await store.put(keys.decommissioned("b1"), b"{}")
        await _until(lambda: _ids(registry.writable()) == ["b2"])
        assert registry.get("b1") is not None and registry.decommissioned() == {"b1"}
        await store.delete(keys.decommissioned("b1"))
        await _until(lambda: _ids(registry.writable()) == ["b1", "b2"])
    finally:
        await registry.close()
