"""The etcd store's client handling (metadata/etcd_store.py), at the aetcd edge.

What it proves:
- endpoint rotation replaces only the client that failed: a call still in flight on an
  old client that fails after the store moved on leaves the fresh client (and the
  calls running on it) alone; the bug closed whatever client was current;
- errors are translated by what they mean: transport failures are MetadataUnavailable
  and move to the next endpoint; a refused request (INVALID_ARGUMENT) is a
  non-retriable InvalidArgument and an unknown lease (NOT_FOUND) MetadataLeaseExpired,
  and neither moves endpoints;
- lease keep-alive: ``refreshed_at`` is when the refresh was sent, not when its reply
  came (etcd restarted the TTL somewhere in between, so the later time overstates the
  lease's life); after a failed refresh the next comes after a short backoff, not a
  whole ttl/3 interval; a refresh that hangs is given up after ttl/5, not after the
  general call timeout, and the lease survives both;
- watches stop when their task is cancelled, also when the cancellation lands in the
  same loop iteration as etcd's "created" reply (aetcd waits for it with
  ``asyncio.wait_for``, which swallows such a cancellation on Python 3.11; the iterating
  task then waited on a quiet prefix for ever, and a prefix cache's close with it); an
  iteration that ends by cancellation closes its etcd connection (and so its watch);
  and two watches never see each other's keys when etcd answers a watch creation
  later than the client waits (each watch has its own stream: on a shared one aetcd
  credited the late reply to the other watch's creation).

How: EtcdStore with ``aetcd.Client`` replaced by a scripted fake (no sockets); gRPC
errors are real ``grpc.aio.AioRpcError`` instances. The keep-alive tests run on real
time with a 3 s TTL (1 s interval) and bound only what the fixes changed, with wide
margins for a loaded machine.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import aetcd
import aetcd.rpc as etcd_rpc
import aetcd.watcher
import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from common.errors import InvalidArgument, MetadataLeaseExpired, MetadataUnavailable
from metadata.etcd_store import EtcdStore, EtcdStoreConfig


def _rpc_error(code: grpc.StatusCode, details: str = "") -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details=details)


class FakeClient:
    """Stands in for aetcd.Client. ``script`` is shared by every client: each call takes
    the next step, an async function (client) -> result."""

    made: list["FakeClient"] = []
    script: list = []

    def __init__(self, host: str, port: int, **_options) -> None:
        self.endpoint = (host, port)
        self.closed = False
        FakeClient.made.append(self)

    async def _next(self):
        step = FakeClient.script.pop(0)
        return await step(self)

    async def get(self, key: bytes):
        return await self._next()

    async def lease(self, ttl: int):
        return SimpleNamespace(id=7, TTL=ttl)

    async def refresh_lease(self, lease_id: int):
        return await self._next()

    async def revoke_lease(self, lease_id: int) -> None:
        return None

    async def watch(self, key: bytes, range_end=None, start_revision=None):
        # As aetcd's Watcher.add_callback: wait for etcd's "created" reply with
        # asyncio.wait_for (the tests set ``created`` when they want it to arrive).
        await asyncio.wait_for(FakeClient.created.wait(), 5.0)
        watch = FakeWatch()
        FakeClient.watches.append(watch)
        return watch

    async def close(self) -> None:
        self.closed = True


class FakeWatch:
    """An etcd watch on a prefix nobody writes: no events until cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    def __aiter__(self):
        return self._events()

    async def _events(self):
        await self.cancelled.wait()
        return
        yield

    async def cancel(self) -> None:
        self.cancelled.set()


@pytest.fixture
def fake_clients(monkeypatch):
    FakeClient.made = []
    FakeClient.script = []
    FakeClient.created = asyncio.Event()
    FakeClient.watches = []
    monkeypatch.setattr(aetcd, "Client", FakeClient)
    return FakeClient


def _store(endpoints: int = 2) -> EtcdStore:
    return EtcdStore(EtcdStoreConfig(endpoints=tuple(("etcd", 2379 + i) for i in range(endpoints)),
                                     root="/test", call_timeout_s=5.0, lease_thread=False))


# --- endpoints -----------------------------------------------------------------------------------

async def _ticks(count: int = 20) -> None:
    """Lets the event loop run every ready callback a few rounds (a read is a task of its
    own, started a tick or two after its caller asked)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def _until(condition, ticks_max: int = 200) -> None:
    for _ in range(ticks_max):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_a_late_failure_on_an_old_client_does_not_close_the_new_one(fake_clients):
    """Calls 1 and 2 run on client A. Call 1 fails (A is dropped, B is next); call 3
    starts on B; then call 2 fails on A. B must stay open and current, and call 3 must
    complete on it."""
    store = _store(2)
    fail_1, fail_2, answer_3 = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def failing(event: asyncio.Event):
        async def step(_client):
            await event.wait()
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
        return step

    async def answering(_client):
        await answer_3.wait()
        return None

    fake_clients.script = [failing(fail_1), failing(fail_2), answering]
    # Asked in different turns of the loop: reads of one turn would go as one call
    # (metadata/etcd_batches.py), and this needs two calls in flight.
    call_1 = asyncio.create_task(store.get("/k"))
    await _until(lambda: len(fake_clients.script) == 2)
    call_2 = asyncio.create_task(store.get("/k"))
    await _until(lambda: len(fake_clients.script) == 1)      # calls 1 and 2 started, on A
    client_a = store._client
    fail_1.set()
    with pytest.raises(MetadataUnavailable):
        await call_1
    call_3 = asyncio.create_task(store.get("/k"))
    await _until(lambda: not fake_clients.script)            # call 3 started, on B
    client_b = store._client
    assert client_b is not None and client_b is not client_a
    fail_2.set()
    with pytest.raises(MetadataUnavailable):
        await call_2
    await _ticks()
    assert store._client is client_b
    assert not client_b.closed
    assert client_a.closed
    answer_3.set()
    assert await call_3 is None
    await store.close()


@pytest.mark.parametrize("code, expected, moves", [
    (grpc.StatusCode.UNAVAILABLE, MetadataUnavailable, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, MetadataUnavailable, True),
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument, False),     # e.g. request too large
    (grpc.StatusCode.NOT_FOUND, MetadataLeaseExpired, False),       # requested lease not found
])
async def test_errors_are_translated_by_meaning(fake_clients, code, expected, moves):
    """Only transport failures are retriable MetadataUnavailable and change endpoints;
    a refused request keeps its own, non-retriable type and the endpoint."""
    store = _store(2)

    async def fail(_client):
        raise _rpc_error(code, "etcdserver: something")

    fake_clients.script = [fail]
    with pytest.raises(expected) as raised:
        await store.get("/k")
    assert type(raised.value) is expected
    assert raised.value.retriable == (expected is not InvalidArgument)
    await asyncio.sleep(0)                         # the dropped client closes in the background
    first = fake_clients.made[0]
    assert (store._client is None) == moves
    assert first.closed == moves
    assert store._endpoint_index == (1 if moves else 0)
    await store.close()


async def test_aetcd_wrapped_errors_are_translated_by_their_grpc_status(fake_clients):
    """aetcd wraps gRPC errors in its own (InvalidArgumentError from INVALID_ARGUMENT):
    the status underneath decides."""
    store = _store(2)

    async def fail(_client):
        try:
            raise _rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
        except AioRpcError as error:
            raise aetcd.exceptions.InvalidArgumentError(error.details()) from error

    fake_clients.script = [fail]
    with pytest.raises(InvalidArgument):
        await store.get("/k")
    assert store._endpoint_index == 0 and not fake_clients.made[0].closed
    await store.close()


# --- lease keep-alive ----------------------------------------------------------------------------------

async def test_refreshed_at_is_when_the_refresh_was_sent(fake_clients):
    """A refresh whose reply takes 0.2 s: refreshed_at is the moment it was sent."""
    store = _store(1)
    sent: list[float] = []
    replied = asyncio.Event()

    async def slow_reply(_client):
        sent.append(time.monotonic())
        await asyncio.sleep(0.2)
        replied.set()
        return SimpleNamespace(TTL=3)

    async def hang(_client):
        await asyncio.Event().wait()

    fake_clients.script = [slow_reply, hang]
    lease = await store.grant_lease(3)
    await asyncio.wait_for(replied.wait(), 3.0)
    await asyncio.sleep(0.01)
    assert sent[0] - 0.05 < lease.refreshed_at <= sent[0]       # not sent[0] + 0.2, the reply
    assert not lease.is_lost
    await store.revoke_lease(lease)
    await store.close()


async def test_a_failed_refresh_is_retried_after_a_short_backoff(fake_clients):
    """TTL 3 s (refresh every 1 s). The first refresh fails; the retry comes within half
    a second, not a whole interval later, and confirms the lease."""
    store = _store(1)
    calls: list[float] = []
    confirmed = asyncio.Event()

    async def fail(_client):
        calls.append(time.monotonic())
        raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "connection reset")

    async def succeed(_client):
        calls.append(time.monotonic())
        confirmed.set()
        return SimpleNamespace(TTL=3)

    async def hang(_client):
        await asyncio.Event().wait()

    fake_clients.script = [fail, succeed, hang]
    lease = await store.grant_lease(3)
    await asyncio.wait_for(confirmed.wait(), 4.0)
    assert calls[1] - calls[0] < 0.5, calls
    assert calls[1] - 0.05 < lease.refreshed_at <= calls[1]
    assert not lease.is_lost
    await store.revoke_lease(lease)
    await store.close()


async def test_a_hung_refresh_is_given_up_after_a_fifth_of_the_ttl(fake_clients):
    """TTL 3 s: a refresh that never answers is abandoned after 0.6 s (ttl/5) and
    retried soon after, instead of after the 5 s call timeout."""
    store = _store(1)
    calls: list[float] = []
    confirmed = asyncio.Event()

    async def hang_once(_client):
        calls.append(time.monotonic())
        await asyncio.Event().wait()

    async def succeed(_client):
        calls.append(time.monotonic())
        confirmed.set()
        return SimpleNamespace(TTL=3)

    async def hang(_client):
        await asyncio.Event().wait()

    fake_clients.script = [hang_once, succeed, hang]
    lease = await store.grant_lease(3)
    await asyncio.wait_for(confirmed.wait(), 5.0)
    assert 0.5 < calls[1] - calls[0] < 1.5, calls
    assert not lease.is_lost
    await store.revoke_lease(lease)
    await store.close()


async def test_a_lease_unknown_to_etcd_is_lost_at_once(fake_clients):
    """NOT_FOUND from a refresh means etcd dropped the lease: lost, no retries."""
    store = _store(1)

    async def unknown(_client):
        raise _rpc_error(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")

    fake_clients.script = [unknown]
    lease = await store.grant_lease(3)
    await asyncio.wait_for(lease.lost.wait(), 3.0)
    assert fake_clients.script == []
    await store.close()


# --- watches -------------------------------------------------------------------------------------------

async def test_a_cancellation_arriving_with_the_watch_reply_still_stops_the_watch(fake_clients):
    """The task iterating a watch is cancelled in the very loop iteration in which
    etcd's "created" reply arrives. aetcd's wait_for then returns the new watch instead
    of raising (Python 3.11), so the cancellation never reaches our code as an
    exception. The iteration must end all the same (cancelled), within a bound, and
    cancel the etcd watch it was given. It hung for ever before: the teardown hang of
    test_not_enough_bookies (a prefix cache closing right after it started)."""
    store = _store(1)
    watch = store.watch_prefix("/bookies/")

    async def follow() -> None:
        async for _event in watch:
            pass

    task = asyncio.create_task(follow())
    for _ in range(5):
        await asyncio.sleep(0)            # the task now waits for the "created" reply
    assert not task.done()
    fake_clients.created.set()            # the reply and the cancellation, in one iteration
    task.cancel()
    done, _pending = await asyncio.wait([task], timeout=2.0)
    assert task in done, "the watch's task went on waiting after it was cancelled"
    assert task.cancelled()
    assert [client.closed for client in fake_clients.made] == [True]   # and etcd's watch with it
    await watch.close()
    await store.close()


async def test_a_cancelled_iteration_closes_its_etcd_watch(fake_clients):
    """A watch iterated until its task is cancelled (the usual way a prefix cache
    stops) leaves no etcd watch behind: its connection is closed."""
    store = _store(1)
    fake_clients.created.set()
    watch = store.watch_prefix("/bookies/")

    async def follow() -> None:
        async for _event in watch:
            pass

    task = asyncio.create_task(follow())
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(fake_clients.watches) == 1 and not task.done()
    task.cancel()
    done, _pending = await asyncio.wait([task], timeout=2.0)
    assert task in done and task.cancelled()
    assert [client.closed for client in fake_clients.made] == [True]
    await watch.close()
    await store.close()


class FakeWatchService:
    """etcd's Watch service at the gRPC edge. Each stream is one Watch call; a create
    request gets the next watch id, and its "created" reply comes at once, except for
    the first ``slow_replies`` ones, which come ``reply_delay_s`` later (etcd just
    restarted, or this process stalled); ``put`` sends an event to every live watch
    whose range holds the key, on its own stream, as etcd does."""

    def __init__(self, reply_delay_s: float, slow_replies: int) -> None:
        self.reply_delay_s = reply_delay_s
        self.slow_replies = slow_replies
        self.streams: list["_FakeWatchStream"] = []
        self.replies_pending = 0
        self._next_watch_id = 1
        self._revision = 100

    def new_watch_id(self) -> int:
        watch_id = self._next_watch_id
        self._next_watch_id += 1
        return watch_id

    def put(self, key: bytes, value: bytes = b"v") -> None:
        self._revision += 1
        for stream in self.streams:
            stream.deliver(key, value, self._revision)

    def close(self) -> None:
        for stream in self.streams:
            stream.reader.cancel()


class _FakeWatchStream:
    def __init__(self, service: FakeWatchService, requests) -> None:
        self.service = service
        self.responses: asyncio.Queue = asyncio.Queue()
        self.watches: dict[int, tuple[bytes, bytes]] = {}   # watch id -> [key, range_end)
        self.reader = asyncio.get_running_loop().create_task(self._read(requests))

    async def _read(self, requests) -> None:
        async for request in requests:
            if request.HasField("create_request"):
                create = request.create_request
                self.service.replies_pending += 1
                delay_s = self.service.reply_delay_s if self.service.slow_replies > 0 else 0.0
                self.service.slow_replies -= 1
                asyncio.get_running_loop().call_later(delay_s, self._created, self.service.new_watch_id(),
                                                      create.key, create.range_end)
            elif request.HasField("cancel_request"):
                self.watches.pop(request.cancel_request.watch_id, None)
        self.responses.put_nowait(None)

    def _created(self, watch_id: int, key: bytes, range_end: bytes) -> None:
        self.service.replies_pending -= 1
        self.watches[watch_id] = (key, range_end)
        self.responses.put_nowait(etcd_rpc.WatchResponse(watch_id=watch_id, created=True))

    def deliver(self, key: bytes, value: bytes, revision: int) -> None:
        for watch_id, (start, end) in list(self.watches.items()):
            if start <= key < end:
                kv = etcd_rpc.KeyValue(key=key, value=value, mod_revision=revision, create_revision=revision)
                self.responses.put_nowait(etcd_rpc.WatchResponse(
                    watch_id=watch_id, events=[etcd_rpc.Event(type=etcd_rpc.Event.PUT, kv=kv)]))

    def __aiter__(self):
        return self

    async def __anext__(self):
        response = await self.responses.get()
        if response is None:
            raise StopAsyncIteration
        return response


class _FakeWatchStub:
    def __init__(self, service: FakeWatchService) -> None:
        self._service = service

    def Watch(self, requests, metadata=None):   # noqa: N802 (gRPC's name)
        stream = _FakeWatchStream(self._service, requests)
        self._service.streams.append(stream)
        return stream


class _FakeChannel:
    async def close(self) -> None:
        pass


class WatchingClient(aetcd.Client):
    """The real aetcd client and watch machinery (aetcd.watcher.Watcher), connected to
    FakeWatchService instead of a gRPC channel."""

    service: FakeWatchService

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        self.channel = _FakeChannel()
        self._watcher = aetcd.watcher.Watcher(_FakeWatchStub(self.service), timeout=self._timeout)
        self._connected.set()


@pytest.fixture
def slow_watch_service(monkeypatch):
    service = FakeWatchService(reply_delay_s=0.3, slow_replies=2)
    WatchingClient.service = service
    monkeypatch.setattr(aetcd, "Client", WatchingClient)
    yield service
    service.close()


async def test_a_late_reply_to_a_timed_out_watch_never_reaches_another_watch(slow_watch_service):
    """Two prefixes are watched while etcd answers the first two watch creations after
    0.3 s, past the 0.2 s the client waits (and before it gave up on the next creation),
    and later ones at once. aetcd credits any "created" reply to whichever creation is
    pending on its stream, and gives up on one that timed out while its request is
    still on the way: when all watches share one stream, the late reply for /a/ lands on
    the watch of /b/ (and /b/'s on /a/'s). Each watch must see exactly its own keys: a
    broker whose owner mirror hears the assignments' events (seen in the etcd-outage
    runs) serves bundles it no longer owns and never takes the ones given to it."""
    service = slow_watch_service
    store = EtcdStore(EtcdStoreConfig(endpoints=(("etcd", 2379),), root="/test", call_timeout_s=0.2, lease_thread=False))
    seen: dict[str, list[str]] = {"/a/": [], "/b/": []}

    async def follow(prefix: str) -> None:
        async for event in store.watch_prefix(prefix):
            seen[prefix].append(event.key)

    followers = [asyncio.create_task(follow("/a/")), asyncio.create_task(follow("/b/"))]
    async with asyncio.timeout(5.0):
        while service.replies_pending or sum(len(s.watches) for s in service.streams) < 2:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    service.put(b"/test/a/1")
    service.put(b"/test/b/1")
    deadline = time.monotonic() + 2.0
    while len(seen["/a/"]) + len(seen["/b/"]) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)                      # nothing else may arrive
    assert seen == {"/a/": ["/a/1"], "/b/": ["/b/1"]}, "a watch saw another prefix's keys, or missed its own"
    for task in followers:
        task.cancel()
    await asyncio.gather(*followers, return_exceptions=True)
    await store.close()
