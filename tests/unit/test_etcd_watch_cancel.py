"""Cancelling an etcd watch (metadata/etcd_store.py: _EtcdWatch) at the aetcd edge.

What it proves: a task iterating a watch that is cancelled while the watch is being
created ends cancelled, even when the creation swallows the cancellation (Python 3.11's
asyncio.wait_for, inside aetcd's add_callback, returns its result and drops a
cancellation that arrives at the same moment), and the watch's own connection (each
watch has one) is closed, which ends etcd's watch with it. The
bug: the watch went on, the task stayed "cancelling" forever, and the owner's
cancel_and_wait (PrefixCache.close, so LedgerClient.close) hung; integration tests
hung at teardown about one run in three on a loaded machine. Also: closing a watch
whose connection's close never answers returns within call_timeout_s.

How: EtcdStore with aetcd.Client replaced by a fake whose ``watch`` swallows a
cancellation the way wait_for's race does; no sockets.
"""

from __future__ import annotations

import asyncio

import aetcd
import pytest

from metadata.etcd_store import EtcdStore, EtcdStoreConfig


class FakeWatch:
    def __init__(self) -> None:
        self.cancelled = False

    def __aiter__(self):
        return self._events()

    async def _events(self):
        await asyncio.Event().wait()
        yield None  # pragma: no cover

    async def cancel(self) -> None:
        self.cancelled = True


class SwallowingClient:
    """``watch`` waits for ``release`` and, if cancelled meanwhile, returns anyway."""

    creating_event: asyncio.Event
    watches: list[FakeWatch] = []
    clients: list["SwallowingClient"] = []

    def __init__(self, host: str, port: int, **_options) -> None:
        self.creating_event = SwallowingClient.creating_event
        self.closed = False
        SwallowingClient.clients.append(self)

    async def watch(self, key, range_end=None, start_revision=None):
        self.creating_event.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass     # the result "arrived" together with the cancellation
        watch = FakeWatch()
        SwallowingClient.watches.append(watch)
        return watch

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def swallowing(monkeypatch):
    SwallowingClient.creating_event = asyncio.Event()
    SwallowingClient.watches = []
    SwallowingClient.clients = []
    monkeypatch.setattr(aetcd, "Client", SwallowingClient)
    return SwallowingClient


async def test_a_cancellation_swallowed_while_the_watch_is_created_still_ends_the_task(swallowing):
    """The iterating task is cancelled during watch creation; it ends cancelled within
    a second and the connection the watch was created on is closed."""
    store = EtcdStore(EtcdStoreConfig(endpoints=(("etcd", 2379),), root="/test", call_timeout_s=5.0, lease_thread=False))

    async def follow() -> None:
        async for _event in store.watch_prefix("/bookies"):
            pass

    task = asyncio.ensure_future(follow())
    await asyncio.wait_for(swallowing.creating_event.wait(), 5)
    task.cancel()
    done, _pending = await asyncio.wait([task], timeout=1.0)
    assert task in done, "the watch swallowed the cancellation and went on"
    assert task.cancelled()
    assert len(swallowing.watches) == 1
    assert [c.closed for c in swallowing.clients] == [True]
    await store.close()


async def test_closing_a_watch_whose_cancel_never_answers_is_bounded(monkeypatch):
    """Closing aetcd's client on a dead stream may never return; close gives up after
    call_timeout_s."""
    store = EtcdStore(EtcdStoreConfig(endpoints=(("etcd", 2379),), root="/test", call_timeout_s=0.2, lease_thread=False))
    watch = store.watch_prefix("/bookies")

    class Hanging:
        async def close(self) -> None:
            await asyncio.Event().wait()

    watch._client = Hanging()      # the watch's own connection (set by its iterator)
    await asyncio.wait_for(watch.close(), 2.0)
