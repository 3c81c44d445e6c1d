"""The metadata store on a real etcd, through its v3 gRPC API (the ``aetcd`` client).

Theory of operation:
- One ``aetcd.Client`` per store (over TLS with ``config.tls``: metadata/etcd_tls.py).
  Every call is bounded by ``call_timeout_s``; callers never see aetcd's or gRPC's types. Errors that say the endpoint did not answer
  (unavailable, timeout, a torn stream) become ``MetadataUnavailable`` (retriable);
  errors that say etcd refused the request itself (too large, bad argument, no
  permission) become non-retriable errors, and a lease etcd does not know becomes
  ``MetadataLeaseExpired`` (``_ERRORS_BY_CODE``).
- With several endpoints the store talks to one; when a call finds it unavailable the
  next call goes to the next endpoint (etcd forwards writes to the leader itself). Only
  the client that failed is replaced: calls still in flight on an old client that fail
  later must not close the fresh one.
- Transactions go straight to the KV stub so that the response header's revision
  (the new version of every key written) reaches the caller.
- Reads, and transactions whose keys do not overlap, asked for in the same turn of the
  event loop go to etcd as one transaction (metadata/etcd_batches.py: what is sent,
  and why each caller still gets exactly its own answer). A grpc.aio call costs ~100 µs
  of CPU whatever it carries; a broker loading a bundle makes thousands side by side.
- Each lease has a keep-alive task refreshing it every ttl/3, at most every
  ``_LEASE_REFRESH_INTERVAL_S_MAX`` (half a second); after a failed refresh
  it retries after a short backoff instead of a whole interval, and each refresh is
  bounded by ttl/5, so one slow or failed call does not use up the margin before the
  owners fence themselves. ``refreshed_at`` is the time the refresh was *sent*: etcd
  restarted the TTL at some point after that, so the owners' reckoning errs early,
  never late. When refreshes have failed for longer than the TTL, or etcd says the
  lease is unknown, the lease is lost: its ``lost`` event is set and the task ends.
  Owners watch that event. The refreshes run on a thread with its own event loop and
  etcd connection (``_LeaseThread``), so a saturated event loop (a flood of hostile
  frames) does not let a live process's lease lapse.
- A watch re-establishes itself after a broken stream from the revision after the
  last event it delivered, so no event is missed across an etcd restart; if that
  history was compacted it yields a ``reset`` event instead. A watch gives up (and
  raises MetadataUnavailable from its iterator) after ``watch_reconnect_s_max`` of
  failing to reconnect.
- Each watch has its own connection to etcd, so its own watch stream. aetcd credits a
  "created" reply to whichever creation is pending on the stream, and gives up on a
  creation after ``call_timeout_s`` while its request is still on the way: on a
  shared stream, a late reply (etcd restarting, or this process stalled) made the
  watch of one prefix receive another prefix's events and lose its own, for good
  (seen after etcd outages: a broker's assignment mirror heard the owner records'
  events and its bookie registry the leader key's; bundles were left unowned, and a
  broker's view of who owns what went stale). On a stream of its own, a
  late reply can only be for the same prefix and revision, and is credited to the
  watch's next try (so a creation that timed out keeps its stream). The connection is
  closed (bounded by ``call_timeout_s``) when the stream fails or the iteration ends,
  and after a failure the next one goes to the next endpoint.
- A call whose channel is closed under it (the store moved to the next endpoint and
  closes the old client while other calls are still in flight on it) gets a
  ``CancelledError`` from grpc.aio although nobody cancelled its task: the channel's
  close cancels its calls "locally", and grpc.aio reports that as a cancellation. Passed
  on, the callers took it for their own cancellation: in issue 32's partitions run the
  leader's loop and the load reporter ended silently after an etcd majority loss (two
  bundles without an owner for 8+ minutes), and a rollover ended with its appends
  queued, so a topic close waited on them for ever. ``_call`` turns a CancelledError
  that no cancellation of the calling task explains into ``MetadataUnavailable``.
- Stopping a watch must not depend on the cancellation reaching it. aetcd waits for
  etcd's "created" reply with ``asyncio.wait_for``, which on Python 3.11 returns the
  result instead of raising when the reply and the cancellation land in the same loop
  iteration (CPython gh-86296): the cancellation is swallowed, and the iterating task
  would then wait on a quiet prefix for ever (a prefix cache's close hung so). So a
  freshly opened watch is dropped at once when its task has a cancellation pending or
  the watch was closed meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence

import aetcd
import aetcd.exceptions
import aetcd.rpc as etcd_rpc
import aetcd.utils

from common.errors import ConfigError, InvalidArgument, MagnetarError, MetadataLeaseExpired, MetadataUnavailable
from metadata.etcd_batches import TurnBatches, disjoint_groups
from metadata.etcd_tls import CredentialFiles, EtcdTlsConfig, SecureClient
from runtime.tasks import TaskSet, cancel_and_wait, log_failure
from metadata.store import Compare, Delete, Lease, MetadataStore, Put, Record, Watch, WatchEvent

log = logging.getLogger(__name__)


# What a gRPC status from etcd means: (the error callers get, whether the endpoint is
# to blame and the next call should try another). Transport failures and a server in
# trouble (restarting, electing a leader, a stream reset) are retriable elsewhere; a
# refused request (too large, a duplicate key in one transaction, bad auth) fails the
# same way everywhere, so it is not retriable and keeps the endpoint. Codes not listed
# count as transport failures: retrying a refused request wastes a call, treating a
# transport failure as final would fail an operation that could have succeeded.
_StatusCode = etcd_rpc.StatusCode
_ERRORS_BY_CODE: dict[object, tuple[type[MagnetarError], bool]] = {
    _StatusCode.UNAVAILABLE: (MetadataUnavailable, True),
    _StatusCode.DEADLINE_EXCEEDED: (MetadataUnavailable, True),
    _StatusCode.CANCELLED: (MetadataUnavailable, True),         # the channel was closed under the call
    _StatusCode.UNKNOWN: (MetadataUnavailable, True),           # e.g. "Stream removed"
    _StatusCode.INTERNAL: (MetadataUnavailable, True),          # e.g. a reset HTTP/2 stream
    _StatusCode.RESOURCE_EXHAUSTED: (MetadataUnavailable, False),   # etcd's "too many requests"
    _StatusCode.NOT_FOUND: (MetadataLeaseExpired, False),       # etcd's "requested lease not found"
    _StatusCode.INVALID_ARGUMENT: (InvalidArgument, False),     # too large, duplicate key, ...
    _StatusCode.OUT_OF_RANGE: (InvalidArgument, False),         # e.g. a lease TTL too large
    _StatusCode.FAILED_PRECONDITION: (InvalidArgument, False),
    _StatusCode.ALREADY_EXISTS: (InvalidArgument, False),
    _StatusCode.UNIMPLEMENTED: (InvalidArgument, False),
    _StatusCode.PERMISSION_DENIED: (ConfigError, False),        # the operator's credentials
    _StatusCode.UNAUTHENTICATED: (ConfigError, False),
}

# Lease refreshes come at least this often, whatever the TTL: an owner rides through an
# etcd outage only while the lease cannot have expired, counted from the last refresh
# etcd confirmed (bundles/config.py, fence_fraction), so the older that refresh was when
# etcd went away, the shorter the outage it survives. At ttl/3 (3.3 s for the brokers'
# 10 s) a third of the TTL could be used up before the outage even began; at half a
# second at most that is. Two small calls per lease per second are nothing to etcd.
_LEASE_REFRESH_INTERVAL_S_MAX = 0.5
# The first retry after a failed lease refresh comes this soon, doubling up to the
# refresh interval: a single lost reply should cost a fraction of a second, not ttl/3.
_LEASE_RETRY_S_MIN = 0.1
# A lease refresh is bounded by ttl/5 (one slow call must leave time for retries before
# the owners fence themselves at ``fence_fraction`` of the TTL), but never below this:
# etcd answers in milliseconds, and a bound shorter than a scheduling hiccup would fail
# refreshes that were fine.
_LEASE_REFRESH_TIMEOUT_S_MIN = 0.2


def _txn_keys(request: etcd_rpc.TxnRequest) -> set[bytes]:
    """Every key a transaction compares or writes."""
    keys = {compare.key for compare in request.compare}
    for operation in request.success:
        which = operation.WhichOneof("request")
        keys.add(getattr(operation, which).key)
    return keys


def _translate(error: BaseException) -> tuple[MagnetarError, bool]:
    """An aetcd / gRPC / timeout error as (our error, whether the endpoint is to blame)."""
    if isinstance(error, TimeoutError):
        return MetadataUnavailable(f"etcd call timed out: {error}"), True
    cause = error if isinstance(error, etcd_rpc.AioRpcError) else error.__cause__
    if isinstance(cause, etcd_rpc.AioRpcError):
        error_class, endpoint_failed = _ERRORS_BY_CODE.get(cause.code(), (MetadataUnavailable, True))
        return error_class(f"etcd call failed: {cause.code().name}: {cause.details()}"), endpoint_failed
    # aetcd's own connection errors (and any it raises without a gRPC status).
    return MetadataUnavailable(f"etcd call failed: {type(error).__name__}: {error}"), True


@dataclass(frozen=True)
class EtcdStoreConfig:
    endpoints: tuple[tuple[str, int], ...]
    root: str = "/magnetar/standalone"
    # A metadata call that takes longer than this is treated as etcd being away. etcd
    # answers in milliseconds on loopback; 5 s leaves room for a leader election.
    call_timeout_s: float = 5.0
    # Reads in flight at once (see EtcdStore._read); more wait their turn.
    reads_in_flight_max: int = 256
    # Reconnecting watches retry for this long before giving up on etcd.
    watch_reconnect_s_max: float = 120.0
    # TLS toward etcd (metadata/etcd_tls.py); off unless a file is given.
    tls: EtcdTlsConfig = EtcdTlsConfig()
    # Lease refreshes on a thread with an event loop and an etcd connection of their
    # own (_LeaseThread), so a lease lives as long as the process and etcd do, however
    # busy the process's event loop is (as a ZooKeeper session's heartbeats run on the
    # client's own threads). Off: refreshed on the caller's loop (unit tests' fakes).
    lease_thread: bool = True

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ConfigError("metadata endpoints must not be empty")
        if not self.root.startswith("/") or self.root.endswith("/"):
            raise ConfigError("metadata root must start with '/' and not end with '/'")
        if not 0 < self.call_timeout_s <= 60:
            raise ConfigError("call_timeout_s must be in (0, 60]")


def parse_metadata_url(url: str, *, root: str = "/magnetar/standalone",
                       tls: EtcdTlsConfig = EtcdTlsConfig()) -> EtcdStoreConfig:
    """``etcd://host:port[,host:port...][/root]`` → EtcdStoreConfig."""
    scheme = "etcd://"
    if not url.startswith(scheme):
        raise ConfigError(f"metadata url must start with {scheme}: {url!r}")
    rest = url[len(scheme):]
    hosts_part, slash, path = rest.partition("/")
    if slash and path:
        root = "/" + path.rstrip("/")
    endpoints: list[tuple[str, int]] = []
    for item in hosts_part.split(","):
        host, colon, port_text = item.strip().rpartition(":")
        if not colon or not host or not port_text.isdigit():
            raise ConfigError(f"metadata endpoint must be host:port: {item!r}")
        endpoints.append((host, int(port_text)))
    return EtcdStoreConfig(endpoints=tuple(endpoints), root=root, tls=tls)


class _ConnectionClosed(Exception):
    """A call ended by the close of its channel (grpc.aio raises CancelledError then)."""


def _cancellation_pending() -> bool:
    """True if the running task was asked to cancel and that request is still pending
    (not raised yet, or swallowed by a wait_for on the way: see the module docstring)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _EtcdWatch(Watch):
    def __init__(self, store: "EtcdStore", prefix: str, start_version: int) -> None:
        self._store = store
        self._prefix = prefix
        self._next_revision = start_version + 1 if start_version > 0 else 0
        self._closed = False
        # This watch's own connection, and so its own watch stream (module docstring);
        # replaced after every failure, on the next endpoint.
        self._client: aetcd.Client | None = None
        self._endpoint_index = store._endpoint_index

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _open(self):
        if self._store._closed:
            raise MetadataUnavailable("metadata store is closed")
        if self._client is None:
            self._client = self._store._new_client(self._endpoint_index)
        client = self._client
        key = self._store._full(self._prefix).encode()
        return await client.watch(
            key,
            range_end=aetcd.utils.prefix_range_end(key),
            start_revision=self._next_revision or None,
        )

    async def _drop_client(self, *, failed: bool) -> None:
        """Closes this watch's connection (its stream, and etcd's watches on it with
        it), bounded: aetcd's shutdown queues on the stream's bounded request queue.
        After a failure the next connection goes to the next endpoint."""
        client, self._client = self._client, None
        if failed:
            self._endpoint_index += 1
        if client is None:
            return
        try:
            async with asyncio.timeout(self._store.config.call_timeout_s):
                await client.close()
        except Exception as error:  # a dead stream, or no answer in time: the connection is gone either way
            log.debug("closing a watch connection failed: prefix=%s error=%r", self._prefix, error)

    async def _events(self) -> AsyncIterator[WatchEvent]:
        deadline: float | None = None
        backoff_s = 0.1
        try:
            while not self._closed:
                try:
                    watch = await self._open()
                except aetcd.exceptions.RevisionCompactedError as error:
                    await self._drop_client(failed=False)
                    self._next_revision = error.compacted_revision
                    yield WatchEvent(kind="reset", key=self._prefix)
                    continue
                except (aetcd.exceptions.ClientError, asyncio.TimeoutError) as error:
                    if not isinstance(error, aetcd.exceptions.WatchTimeoutError):
                        await self._drop_client(failed=True)
                    # else: etcd is slow to answer, and its late reply to this creation
                    # will be credited to the next one on the same stream: keep it.
                    deadline = deadline or time.monotonic() + self._store.config.watch_reconnect_s_max
                    if time.monotonic() > deadline:
                        raise MetadataUnavailable(f"watch on {self._prefix} lost etcd: {error}")
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, 2.0)
                    continue
                deadline = None
                backoff_s = 0.1
                if self._closed:
                    return
                if _cancellation_pending():
                    # aetcd's wait for the "created" reply swallowed our cancellation
                    # (module docstring): honour it here, or we would wait for ever.
                    raise asyncio.CancelledError()
                try:
                    async for event in watch:
                        kv = event.kv
                        revision = kv.mod_revision
                        self._next_revision = revision + 1
                        kind = "put" if event.kind == aetcd.rtypes.EventKind.PUT else "delete"
                        yield WatchEvent(
                            kind=kind,
                            key=self._store._relative(kv.key.decode()),
                            value=bytes(kv.value),
                            version=revision,
                        )
                except aetcd.exceptions.RevisionCompactedError as error:
                    await self._drop_client(failed=False)
                    self._next_revision = error.compacted_revision
                    yield WatchEvent(kind="reset", key=self._prefix)
                except (aetcd.exceptions.ClientError, etcd_rpc.AioRpcError) as error:
                    if self._closed:
                        return
                    log.warning("metadata watch broken, reconnecting: prefix=%s error=%s",
                                self._prefix, error)
                    await self._drop_client(failed=True)
                    await asyncio.sleep(backoff_s)
                else:
                    await self._drop_client(failed=False)   # the stream ended: open a fresh one
        finally:
            # However the iteration ends (closed, cancelled, failed for good), its
            # connection goes, and with it etcd's watch.
            await self._drop_client(failed=False)

    async def close(self) -> None:
        self._closed = True
        await self._drop_client(failed=False)


class EtcdStore(MetadataStore):
    def __init__(self, config: EtcdStoreConfig) -> None:
        self.config = config
        self._endpoint_index = 0
        self._client: aetcd.Client | None = None
        self._keepalive_tasks: dict[int, asyncio.Task[None]] = {}
        # Closes of clients whose endpoint failed (at most one per rotation): awaited
        # by close.
        self._tasks = TaskSet("etcd store")
        # Reads whose caller was cancelled, finishing on their own (see _read): each
        # ends within call_timeout_s, so they are as many as reads cancelled in that
        # time; close cancels the rest.
        self._shielded_reads: set[asyncio.Task] = set()
        # grpc goes on with a unary call whose caller was cancelled until it ends, so
        # without this bound a peer that sends lookups and hangs up, again and again,
        # piles up calls (and memory) without limit: issue 13's live fuzz.
        self._read_slots = asyncio.Semaphore(config.reads_in_flight_max)
        # Reads, and transactions, of one turn of the loop go to etcd together
        # (metadata/etcd_batches.py).
        self._read_batches: TurnBatches = TurnBatches(self._send_reads, self._spawn_read)
        self._write_batches: TurnBatches = TurnBatches(self._send_transactions, self._spawn_read)
        # Started with the first lease (config.lease_thread); closed by close.
        self._lease_thread: _LeaseThread | None = None
        self._closed = False
        # TLS: the PEM files, read now (a wrong path fails here) and again per connection.
        self._credential_files = CredentialFiles(config.tls) if config.tls.enabled else None

    # --- connection -------------------------------------------------------------------

    async def _client_now(self) -> aetcd.Client:
        if self._closed:
            raise MetadataUnavailable("metadata store is closed")
        if self._client is None:
            self._client = self._new_client(self._endpoint_index)
        return self._client

    def _new_client(self, endpoint_index: int) -> aetcd.Client:
        host, port = self.config.endpoints[endpoint_index % len(self.config.endpoints)]
        secure = self._credential_files is not None
        client_class = functools.partial(SecureClient, credentials=self._credential_files.credentials()) \
            if secure else aetcd.Client
        return client_class(
            host=host,
            port=port,
            timeout=self.config.call_timeout_s,
            connect_wait_timeout=int(self.config.call_timeout_s),
            options={
                # etcd caps values at 1.5 MiB; leave headroom for range replies.
                "grpc.max_receive_message_length": 64 * 1024 * 1024,
                "grpc.keepalive_time_ms": 10_000,
                "grpc.keepalive_timeout_ms": 5_000,
                # Reconnect soon after etcd comes back. gRPC's default back-off (1 s,
                # growing 1.6-fold to 2 min) reconnected 3 s after a 7 s outage had
                # ended, and a lease refresh only succeeds on a connected channel: that
                # wait came out of the margin the owners have before they fence. A
                # connection attempt every 0.3 s to a down etcd costs nothing.
                "grpc.initial_reconnect_backoff_ms": 100,
                "grpc.min_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": 300,
            },
        )

    def _rotate_endpoint(self, failed: aetcd.Client) -> None:
        """Moves to the next endpoint after ``failed`` did not answer, unless that
        happened already: calls in flight on an old client fail one after another,
        and only the first may close a client (its own). The old client is closed in
        the background; calls still running on it fail and are retried by their
        callers."""
        if len(self.config.endpoints) <= 1 or self._client is not failed:
            return
        self._endpoint_index = (self._endpoint_index + 1) % len(self.config.endpoints)
        self._client = None
        if not self._tasks.closed:
            self._tasks.spawn(failed.close(), name="close-failed-etcd-client")

    def _full(self, key: str) -> str:
        assert key.startswith("/"), key
        return self.config.root + key

    def _relative(self, full_key: str) -> str:
        assert full_key.startswith(self.config.root), (full_key, self.config.root)
        return full_key[len(self.config.root):]

    async def _call(self, coroutine_factory, *, timeout_s: float | None = None):
        client = await self._client_now()
        try:
            async with asyncio.timeout(timeout_s or self.config.call_timeout_s):
                try:
                    return await coroutine_factory(client)
                except asyncio.CancelledError:
                    if _cancellation_pending():
                        raise   # ours (the timeout above) or the caller's: a real cancellation
                    # Nobody cancelled this task: grpc.aio raises a fresh CancelledError from
                    # every call still in flight on a channel that is closed (its close
                    # cancels them "locally"), here the client _rotate_endpoint replaced.
                    # Passed on, it looked like a cancellation to the caller: the leader's
                    # rounds and the load reporter ended without a word, a rollover ended
                    # with its appends queued for ever (module docstring). It is a failed
                    # call on a dead connection: retriable, like any other.
                    raise _ConnectionClosed() from None
        except _ConnectionClosed:
            raise MetadataUnavailable("etcd call failed: its connection was closed under it") from None
        except (aetcd.exceptions.ClientError, etcd_rpc.AioRpcError, TimeoutError) as error:
            translated, endpoint_failed = _translate(error)
            if endpoint_failed:
                self._rotate_endpoint(client)
            raise translated from None

    async def _read(self, read: tuple[str, object]):
        """A read (``("get", full key)`` or ``("range", RangeRequest)``), sent with the
        other reads of this turn of the loop (metadata/etcd_batches.py) and
        shielded from its caller's cancellation. grpc.aio keeps ~16 KiB for good for
        every unary call cancelled while in flight (a broker whose clients hang up with
        lookups pending grew by that much per lookup: issue 13's live fuzz), so a read
        whose caller is cancelled is left to finish (or time out) by itself and its
        result dropped. A read changes nothing, so finishing it is harmless. A read
        holds one of ``reads_in_flight_max`` slots until its reply came."""
        await self._read_slots.acquire()   # a caller cancelled here never starts its read
        future = self._read_batches.submit(read)
        future.add_done_callback(self._read_done)
        return await asyncio.shield(future)

    def _read_done(self, future: asyncio.Future) -> None:
        self._read_slots.release()
        if not future.cancelled():
            future.exception()   # retrieved: the caller has it, or it is gone and wants none

    def _spawn_read(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._shielded_reads.add(task)
        task.add_done_callback(self._shielded_reads.discard)

    async def _send_reads(self, reads: Sequence[tuple[str, object]]) -> list:
        """The replies to ``reads``, in order (an exception for a read that failed):
        one read alone as its own call, several as one read-only transaction. A
        transaction etcd or gRPC refuses for its size is sent again read by read."""
        if len(reads) == 1:
            kind, value = reads[0]
            if kind == "get":
                return [await self._call(lambda c: c.get(value))]
            return [await self._call(functools.partial(self._range_call, value))]
        request = etcd_rpc.TxnRequest(success=[
            etcd_rpc.RequestOp(request_range=value if kind == "range" else etcd_rpc.RangeRequest(key=value))
            for kind, value in reads])

        async def run(client: aetcd.Client):
            await client.connect()
            return await client.kvstub.Txn(request, timeout=self.config.call_timeout_s, metadata=client.metadata)

        try:
            reply = await self._call(run)
        except (InvalidArgument, MetadataUnavailable) as error:
            if isinstance(error, MetadataUnavailable) and "RESOURCE_EXHAUSTED" not in str(error):
                raise
            alone = await asyncio.gather(*(self._send_reads([read]) for read in reads), return_exceptions=True)
            return [outcome if isinstance(outcome, BaseException) else outcome[0] for outcome in alone]
        replies: list = []
        for (kind, _value), response in zip(reads, reply.responses):
            found = response.response_range
            replies.append(found if kind == "range" else (found.kvs[0] if found.count >= 1 and found.kvs else None))
        return replies

    async def _range_call(self, request: etcd_rpc.RangeRequest, client: aetcd.Client):
        await client.connect()
        return await client.kvstub.Range(request, timeout=self.config.call_timeout_s, metadata=client.metadata)

    # --- key/value ----------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        full = self._full(key).encode()
        result = await self._read(("get", full))
        if result is None:
            return None
        return Record(key, bytes(result.value), result.mod_revision, result.create_revision,
                      result.lease)

    async def _range(self, prefix: str, limit: int, keys_only: bool):
        full = self._full(prefix).encode()
        request = etcd_rpc.RangeRequest(
            key=full,
            range_end=aetcd.utils.prefix_range_end(full),
            limit=limit,
            keys_only=keys_only,
            sort_order=etcd_rpc.RangeRequest.ASCEND,
            sort_target=etcd_rpc.RangeRequest.KEY,
        )

        response = await self._read(("range", request))
        records = [
            Record(self._relative(kv.key.decode()), bytes(kv.value), kv.mod_revision,
                   kv.create_revision, kv.lease)
            for kv in response.kvs
        ]
        return records, int(response.header.revision)

    async def get_prefix(self, prefix: str, *, limit: int = 0, keys_only: bool = False) -> list[Record]:
        records, _revision = await self._range(prefix, limit, keys_only)
        return records

    async def get_prefix_at(self, prefix: str) -> tuple[list[Record], int]:
        return await self._range(prefix, 0, False)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        revision = await self.transaction([], [Put(key, value, lease.lease_id if lease else 0)])
        assert revision is not None
        return revision

    async def delete(self, key: str) -> bool:
        full = self._full(key).encode()
        return bool(await self._call(lambda c: c.delete(full)))

    async def delete_prefix(self, prefix: str) -> int:
        full = self._full(prefix).encode()
        response = await self._call(lambda c: c.delete_prefix(full))
        return int(getattr(response, "deleted", 0))

    async def transaction(
        self, compares: Sequence[Compare], operations: Sequence[Put | Delete]
    ) -> int | None:
        compare_messages = [
            etcd_rpc.Compare(
                key=self._full(c.key).encode(),
                result=etcd_rpc.Compare.EQUAL,
                target=etcd_rpc.Compare.MOD,
                mod_revision=c.version,
            )
            for c in compares
        ]
        success = []
        for operation in operations:
            if isinstance(operation, Put):
                success.append(etcd_rpc.RequestOp(request_put=etcd_rpc.PutRequest(
                    key=self._full(operation.key).encode(),
                    value=operation.value,
                    lease=operation.lease_id,
                )))
            else:
                success.append(etcd_rpc.RequestOp(request_delete_range=etcd_rpc.DeleteRangeRequest(
                    key=self._full(operation.key).encode(),
                )))
        request = etcd_rpc.TxnRequest(compare=compare_messages, success=success, failure=[])
        # Sent with the other transactions of this turn of the loop (etcd_batches.py).
        # Not shielded: a caller cancelled now leaves its write's outcome unknown, as a
        # caller cancelled while the write is on the way always did.
        return await self._write_batches.submit(request)

    async def _send_transaction(self, request: etcd_rpc.TxnRequest) -> int | None:
        async def run(client: aetcd.Client):
            await client.connect()
            return await client.kvstub.Txn(request, timeout=self.config.call_timeout_s,
                                           metadata=client.metadata)

        response = await self._call(run)
        if not response.succeeded:
            return None
        return int(response.header.revision)

    async def _send_transactions(self, requests: Sequence[etcd_rpc.TxnRequest]) -> list:
        """The outcomes of ``requests`` (a revision, None for a compare that failed, or
        the error), in order: those whose keys do not overlap go as one transaction
        (``disjoint_groups``; the groups one after the other)."""
        if len(requests) == 1:
            return [await self._send_transaction(requests[0])]
        outcomes: list = [None] * len(requests)
        groups = disjoint_groups([(_txn_keys(r), len(r.compare), len(r.success)) for r in requests])

        async def send(group: list[int]) -> None:
            try:
                results = await self._send_group([requests[i] for i in group])
            except Exception as error:  # noqa: BLE001 (handed to each caller of the group)
                results = [error] * len(group)
            for index, result in zip(group, results):
                outcomes[index] = result

        for group in groups:    # in order: calls on one key are applied as they were asked
            await send(group)
        return outcomes

    async def _send_group(self, requests: list[etcd_rpc.TxnRequest]) -> list:
        if len(requests) > 1:
            combined = etcd_rpc.TxnRequest(compare=[c for r in requests for c in r.compare],
                                           success=[o for r in requests for o in r.success], failure=[])
            try:
                revision = await self._send_transaction(combined)
            except MetadataUnavailable as error:
                if "RESOURCE_EXHAUSTED" not in str(error):
                    raise   # etcd away: the outcome of each is unknown, as it would be alone
                revision = None   # refused for its size: each alone, below
            except MagnetarError:
                revision = None   # refused as a whole (too large, a lease unknown): each alone
            if revision is not None:
                return [revision] * len(requests)
        alone = await asyncio.gather(*(self._send_transaction(r) for r in requests), return_exceptions=True)
        return list(alone)

    # --- leases --------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        asked_at = time.monotonic()   # etcd starts the TTL after this, so it is a safe origin
        granted = await self._call(lambda c: c.lease(ttl_s))
        lease = Lease(lease_id=granted.id, ttl_s=ttl_s, refreshed_at=asked_at)
        loop = asyncio.get_running_loop()
        task: asyncio.Future[None]
        if self.config.lease_thread:
            if self._lease_thread is None:
                self._lease_thread = await asyncio.to_thread(_LeaseThread, self.config)
            # ``lost`` belongs to this loop: the thread sets it through the loop.
            task = asyncio.wrap_future(self._lease_thread.keep(
                lease, on_lost=lambda: loop.call_soon_threadsafe(lease.lost.set)))
        else:
            task = loop.create_task(self._keep_alive(lease))
        self._keepalive_tasks[lease.lease_id] = task
        task.add_done_callback(lambda _t, lease_id=lease.lease_id: self._keepalive_tasks.pop(lease_id, None))
        task.add_done_callback(functools.partial(log_failure, owner="etcd store lease keep-alive"))
        return lease

    async def _keep_alive(self, lease: Lease, on_lost: Callable[[], None] | None = None) -> None:
        # Refresh at a third of the TTL so that two refreshes may fail before expiry.
        interval_s = max(min(lease.ttl_s / 3.0, _LEASE_REFRESH_INTERVAL_S_MAX), 0.2)
        refresh_timeout_s = min(self.config.call_timeout_s, max(lease.ttl_s / 5.0, _LEASE_REFRESH_TIMEOUT_S_MIN))
        last_success = lease.refreshed_at
        delay_s = interval_s
        failures = 0
        try:
            while not self._closed:
                await asyncio.sleep(delay_s)
                asked_at = time.monotonic()
                try:
                    reply = await self._call(lambda c: c.refresh_lease(lease.lease_id), timeout_s=refresh_timeout_s)
                except MetadataLeaseExpired:
                    log.warning("lease lost (unknown to etcd): lease_id=%x", lease.lease_id)
                    return
                except MagnetarError as error:
                    if time.monotonic() - last_success > lease.ttl_s:
                        log.warning("lease lost (etcd unreachable past its ttl): lease_id=%x error=%s",
                                    lease.lease_id, error)
                        return
                    failures += 1
                    delay_s = min(_LEASE_RETRY_S_MIN * 2 ** (failures - 1), interval_s)
                    if failures == 1:
                        log.warning("lease refresh failed, retrying: lease_id=%x error=%s", lease.lease_id, error)
                    continue
                if reply is None or reply.TTL <= 0:
                    log.warning("lease lost (expired in etcd): lease_id=%x", lease.lease_id)
                    return
                if failures:
                    log.info("lease refreshed again: lease_id=%x failures=%d", lease.lease_id, failures)
                failures = 0
                delay_s = interval_s
                last_success = asked_at
                lease.refreshed_at = asked_at
        finally:
            if on_lost is not None:
                on_lost()
            else:
                lease.lost.set()

    async def revoke_lease(self, lease: Lease) -> None:
        await cancel_and_wait(self._keepalive_tasks.pop(lease.lease_id, None))
        lease.lost.set()
        try:
            await self._call(lambda c: c.revoke_lease(lease.lease_id))
        except (MetadataUnavailable, MetadataLeaseExpired):
            # Unreachable: the lease will expire by itself within its TTL. Unknown: gone already.
            pass

    # --- watches ---------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
        return _EtcdWatch(self, prefix, start_version)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._keepalive_tasks.values()) + list(self._shielded_reads)
        await cancel_and_wait(*tasks)
        if self._lease_thread is not None:
            await asyncio.to_thread(self._lease_thread.close)
            self._lease_thread = None
        await self._tasks.join(timeout_s=self.config.call_timeout_s)
        await self._tasks.close()
        client, self._client = self._client, None
        if client is not None:
            await client.close()


class _LeaseThread:
    """A thread with its own event loop and its own EtcdStore (its own etcd connection)
    that refreshes the leases it is given. A process whose event loop is saturated (a
    broker flooded by a hostile client) still answers etcd in time, so its lease, and
    the ownership held under it, does not lapse because of load; a process that is
    gone or cut off from etcd still loses it."""

    def __init__(self, config: EtcdStoreConfig) -> None:
        self._config = dataclasses.replace(config, lease_thread=False)
        self._loop = asyncio.new_event_loop()
        self._store: EtcdStore | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="etcd-lease-keepalive", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise MetadataUnavailable("the lease keep-alive thread did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._store = EtcdStore(self._config)
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def keep(self, lease: Lease, *, on_lost: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Refreshes ``lease`` until it is lost (``on_lost`` is called, from this
        thread) or the returned future is cancelled."""
        assert self._store is not None
        return asyncio.run_coroutine_threadsafe(self._store._keep_alive(lease, on_lost), self._loop)

    def close(self, timeout_s: float = 10.0) -> None:
        """Blocking: closes the thread's store, stops its loop, joins it."""
        if self._store is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._store.close(), self._loop).result(timeout_s)
            except (concurrent.futures.TimeoutError, MagnetarError) as error:
                log.warning("closing the lease keep-alive thread's store failed: error=%r", error)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
