"""The client side of one bookie's gRPC service, and the pool of them.

Theory of operation:
- All ledgers a process writes share one add stream per bookie. ``add`` only queues
  the entry and returns a future; what is queued is packed (up to
  ``batch_entries_max`` / ``batch_bytes_max``) into one stream message, so under load
  many entries travel per message while an idle writer still sends at once. On gRPC's
  AddEntries stream a sender task packs and writes and a receiver task reads replies;
  on the bookie's add socket (``add_transport`` "socket") there is no task per stream:
  the adds of one loop turn are packed by a callback at the next
  (``_flush_to_socket``), or at once when the caller says the adds that arrived
  together are queued (``BookieClientPool.flush_adds``: a broker connection at the end
  of a read, which holds the pool from the read's start, ``hold_flushes``, so that its
  adds schedule no turn at all), and replies are read by the connection's own callbacks
  (ledger/add_socket_connection.py), which resolve the futures as the bytes arrive.
- The bookie answers each message with one reply, in order, so replies are matched to
  futures first-in first-out (no per-entry lookup).
- When the stream breaks, or its oldest unanswered batch is older than
  ``add_timeout_s``, every pending future fails with BookieUnavailable/AddTimeout and
  the stream is dropped; the next add opens a new one. The write handle reacts to those
  failures with an ensemble change.
- Reads, fences and last-add-confirmed are unary calls with deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass

import grpc

from protocol.bookie_rpc import error_code_from_metadata
from protocol.proto import bookie_pb2, bookie_pb2_grpc
from ledger.config import LedgerClientConfig
from runtime.eager_future import new_eager_future
from common.errors import (
    AddTimeout,
    AuthenticationFailed,
    AuthorizationDenied,
    BookieUnavailable,
    ConfigError,
    MagnetarError,
    SecurityError,
    error_for_code,
)
from common.histograms import LatencyStages
from runtime.tasks import TaskSet
from runtime.tls import TlsConfig, client_context, file_stamp
from ledger.add_socket_connection import AddSocketConnection

log = logging.getLogger(__name__)

# How often the pool looks at the credential files for a change (a stat per file).
CREDENTIALS_CHECK_S = 5.0
# How often a retiring client looks whether its adds were answered.
_RETIRE_POLL_S = 0.05

# How long a write that failed INTERNAL waits for the bookie to say whether it refuses
# this client's credentials (one Info call; a live bookie answers in milliseconds).
_REFUSAL_PROBE_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class BookieLedgerState:
    last_add_confirmed: int
    last_entry_id: int
    fenced: bool


@dataclass(frozen=True, slots=True)
class BookieReadResult:
    entry_id: int
    entry: bytes | None
    error: MagnetarError | None


def _read_file(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    """TLS toward bookies: their CA (trust file; the system's when empty) and, for
    mutual TLS, this client's certificate."""
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=_read_file(tls.trust_certs_file) if tls.trust_certs_file else None,
            private_key=_read_file(tls.key_file) if tls.key_file else None,
            certificate_chain=_read_file(tls.cert_file) if tls.cert_file else None)
    except OSError as error:
        raise ConfigError(f"cannot read the bookie TLS files: {error}") from None


def _error_from_rpc(bookie_id: str, error: grpc.aio.AioRpcError) -> MagnetarError:
    return _error_from_status(bookie_id, error.code(), error.details(), error.trailing_metadata())


def _error_from_status(bookie_id: str, status: grpc.StatusCode, details: str | None, trailing_metadata
                       ) -> MagnetarError:
    code = error_code_from_metadata(trailing_metadata)
    if code is not None:
        return error_for_code(code, details or "")
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return AddTimeout(f"bookie {bookie_id} did not answer in time")
    # A bookie refusing this client's credentials (bookie/security.py) is not a failed
    # bookie: every bookie with the same settings refuses them, so the writer must not
    # spend its ensemble changes on it (ledger/handle.py fails at once).
    if status == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationFailed(f"bookie {bookie_id} refused this client's credentials "
                                    f"(UNAUTHENTICATED): {details}")
    if status == grpc.StatusCode.PERMISSION_DENIED:
        return AuthorizationDenied(f"bookie {bookie_id} refused this client's role "
                                   f"(PERMISSION_DENIED): {details}")
    return BookieUnavailable(bookie_id, f"{status.name}: {details}")


class _AddStream:
    """One add stream (gRPC's AddEntries call, or an add socket connection); replaced
    wholesale when it breaks."""

    def __init__(self, call) -> None:
        self.call = call
        # Batches sent and not yet answered: (send time, futures in request order).
        self.inflight: collections.deque[tuple[float, list[asyncio.Future[None]]]] = collections.deque()
        # With stage timing: time.perf_counter() of each in-flight batch's write, in order.
        self.written_at: collections.deque[float] = collections.deque()
        self.broken: MagnetarError | None = None
        # gRPC: the task reading the call's replies. The add socket: the task connecting.
        self.receiver: asyncio.Task[None] | None = None
        # When the oldest in-flight batch is next looked at for its age (both transports).
        self.timer: asyncio.TimerHandle | None = None


# The stages this module times (common/histograms.LatencyStages), for the broker's
# /metrics: an add queued until its stream message is written (the sender's wait), and
# that message written until the bookie's reply to it is read (gRPC both ways + the
# bookie's own add, journal fdatasync included).
LEDGER_STAGES = ("bookie_add_send_wait", "bookie_add_round_trip")


class FlushesDue(set):
    """The pool's bookie clients whose add-socket flush is due (``flush_adds`` runs
    them), and whether a caller holds them (``BookieClientPool.hold_flushes``): then that
    caller flushes at the end of what it is handling, and an add asks for no turn."""

    held = False


class _FlushByHolder:
    """Stands for a flush the holder of the pool's hold runs (flush_adds): nothing is
    scheduled, so there is nothing to cancel."""

    def cancel(self) -> None:
        pass


_FLUSH_BY_HOLDER = _FlushByHolder()


class BookieClient:
    def __init__(self, bookie_id: str, address: str, config: LedgerClientConfig, *,
                 stages: LatencyStages | None = None, add_address: str = "",
                 flush_due: "FlushesDue | None" = None) -> None:
        self.bookie_id = bookie_id
        # The pool's set of clients whose add-socket flush is scheduled (it may run them
        # sooner: BookieClientPool.flush_adds); None: alone, the scheduled turn only.
        self._flush_due = flush_due
        # The add socket adds go to (config.add_transport "socket" and the bookie has
        # one); empty: adds on gRPC.
        self.add_address = add_address if config.add_transport == "socket" else ""
        self._stages = stages
        self.address = address
        self.config = config
        options = [
            ("grpc.max_receive_message_length", config.grpc_message_bytes_max),
            ("grpc.max_send_message_length", config.grpc_message_bytes_max),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            # Reconnect quickly after a bookie restarts (default backoff grows to 120 s).
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        if config.bookie_tls_enabled:
            self._channel = grpc.aio.secure_channel(address, _channel_credentials(config.bookie_tls), options=options)
        else:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        # The service token, on every call (bookie/security.py); None without one.
        token = _read_file(config.bookie_auth_token_file).decode("ascii").strip() \
            if config.bookie_auth_token_file else ""
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._token = token
        self._stub = bookie_pb2_grpc.BookieStub(self._channel)
        # (message, future, entry bytes, time.perf_counter() when queued)
        self._queue: list[tuple[bookie_pb2.AddEntry, asyncio.Future[None], int, float]] = []
        self._queued_event = asyncio.Event()
        self._stream: _AddStream | None = None
        # The sender (one at a time) and the receiver of each stream (a broken stream's
        # receiver ends by itself): cancelled and awaited by close.
        self._tasks = TaskSet(f"bookie client {bookie_id}")
        self._sender: asyncio.Task[None] | None = None
        # The add socket: the queued adds' flush, scheduled for the next loop turn (or
        # _FLUSH_BY_HOLDER: left to the holder of the pool's hold, flush_adds).
        self._flush_handle: asyncio.Handle | _FlushByHolder | None = None
        self._closed = False

    # --- adds ------------------------------------------------------------------------------

    def add(self, ledger_id: int, entry_id: int, entry: bytes, *, recovery: bool = False) -> asyncio.Future[None]:
        """Queues an add; the future resolves when the bookie fsynced it, or fails with
        the bookie's error (LedgerFenced, BookieReadOnly...) or BookieUnavailable."""
        # Eager: the write handle hears of the reply in the callback that read it.
        future: asyncio.Future[None] = new_eager_future()
        if self._closed:
            future.set_exception(BookieUnavailable(self.bookie_id, "client closed"))
            return future
        message = bookie_pb2.AddEntry(ledger_id=ledger_id, entry_id=entry_id, entry=entry, recovery=recovery)
        self._queue.append((message, future, len(entry), time.perf_counter()))
        if self.add_address:
            # The add socket: what this turn queues leaves in one request at the next,
            # or sooner when the caller says the adds that arrived together are queued;
            # under the pool's hold that caller is sure to say so, and no turn is asked
            # for (a turn asked for and cancelled still costs the loop one more turn).
            if self._flush_handle is None:
                due = self._flush_due
                if due is not None and due.held:
                    self._flush_handle = _FLUSH_BY_HOLDER
                else:
                    self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_to_socket)
                if due is not None:
                    due.add(self)
            return future
        self._queued_event.set()
        if self._sender is None or self._sender.done():
            self._sender = self._tasks.spawn(self._send_loop(), name=f"add-sender {self.bookie_id}")
        return future

    def _take_batch(self) -> tuple[list[bookie_pb2.AddEntry], list[asyncio.Future[None]]]:
        """The oldest queued adds, within the request's bounds, taken off the queue
        (those whose callers gave up are dropped)."""
        batch: list[bookie_pb2.AddEntry] = []
        futures: list[asyncio.Future[None]] = []
        size = 0
        taken = 0
        stages = self._stages
        now = time.perf_counter()
        for message, future, entry_size, queued_at in self._queue:
            if batch and (len(batch) >= self.config.batch_entries_max
                          or size + entry_size > self.config.batch_bytes_max):
                break
            taken += 1
            if future.done():
                continue  # the caller gave up on it
            batch.append(message)
            futures.append(future)
            size += entry_size
            if stages is not None:
                stages.observe("bookie_add_send_wait", now - queued_at)
        del self._queue[:taken]
        return batch, futures

    def _track(self, stream: _AddStream, futures: list[asyncio.Future[None]]) -> None:
        stream.inflight.append((time.monotonic(), futures))
        if self._stages is not None:
            stream.written_at.append(time.perf_counter())

    # --- gRPC's add stream: a sender task and a receiver task per stream ----------------------

    async def _send_loop(self) -> None:
        while not self._closed:
            if not self._queue:
                self._queued_event.clear()
                try:
                    async with asyncio.timeout(self.config.add_timeout_s):
                        await self._queued_event.wait()
                except TimeoutError:
                    self._check_timeouts()
                    if not self._queue and (self._stream is None or not self._stream.inflight):
                        return  # idle: the next add starts a new sender
                    continue
            batch, futures = self._take_batch()
            if not batch:
                continue
            stream = self._stream_now()
            self._track(stream, futures)
            self._arm_timer(stream)
            try:
                # Bounded by the add timeout as well: whatever holds a write (flow control,
                # a new stream waiting for its headers to go, or a slot among the
                # connection's streams), the sender is never held longer than the batch
                # it writes may wait.
                async with asyncio.timeout(self.config.add_timeout_s):
                    await stream.call.write(bookie_pb2.AddRequest(entries=batch, replies_may_merge=True))
            except TimeoutError:
                if stream.broken is None:
                    self._time_out(stream)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if stream.broken is None or (task is not None and task.cancelling()):
                    raise
                # The add timeout broke the stream (cancelled its call) while this write
                # waited (a bookie that stopped reading: flow control holds the write);
                # grpc.aio reports the call's local cancellation as CancelledError.
                # Not this task's cancellation: the queue goes on a new stream.
            except grpc.aio.AioRpcError as error:
                # The call ended (the bookie refused it, or it broke): its status says which.
                self._break(stream, await self._write_failure(error))
            except (grpc.aio.UsageError, asyncio.InvalidStateError) as error:
                self._break(stream, BookieUnavailable(self.bookie_id, f"add stream write failed: {error}"))
            self._check_timeouts()

    async def _write_failure(self, error: grpc.aio.AioRpcError) -> MagnetarError:
        """The error of an add call that failed (seen by its writer or its reader). A write racing the bookie's refusal of the
        call (bookie/security.py aborts it at once) fails INTERNAL in gRPC's core, and
        the call's own status (UNAUTHENTICATED / PERMISSION_DENIED) is lost; a refused
        writer must not pass for a failed bookie, so an INTERNAL failure asks the bookie
        once (Info, with the same credentials) whether it refuses them."""
        failure = _error_from_rpc(self.bookie_id, error)
        if error.code() != grpc.StatusCode.INTERNAL:
            return failure
        try:
            async with asyncio.timeout(_REFUSAL_PROBE_WAIT_S):
                await self.info()
        except SecurityError as refused:
            return refused
        except (TimeoutError, MagnetarError):
            pass
        return failure

    def _stream_now(self) -> _AddStream:
        stream = self._stream
        if stream is None or stream.broken is not None:
            stream = self._stream = _AddStream(self._stub.AddEntries(metadata=self._metadata))
            # Ends when the stream breaks; cancelled by close() otherwise.
            stream.receiver = self._tasks.spawn(self._receive_loop(stream), name=f"add-receiver {self.bookie_id}")
        return stream

    async def _receive_loop(self, stream: _AddStream) -> None:
        try:
            while True:
                response = await stream.call.read()
                if response is grpc.aio.EOF:
                    self._break(stream, BookieUnavailable(self.bookie_id, "add stream closed by bookie"))
                    return
                if not self._settle_reply(stream, response.results):
                    return
        except grpc.aio.AioRpcError as error:
            # The reader can see a refused call's INTERNAL before its writer does.
            if stream.broken is None:
                try:
                    failure = await self._write_failure(error)
                except asyncio.CancelledError:
                    self._break(stream, BookieUnavailable(self.bookie_id, "client closed"))
                    raise
                self._break(stream, failure)
        except asyncio.CancelledError:
            self._break(stream, BookieUnavailable(self.bookie_id, "client closed"))
            raise

    # --- the add socket: driven by the loop's callbacks, no task per stream ----------------

    def flush_now(self) -> None:
        """Runs a scheduled add-socket flush now instead of at its turn."""
        handle = self._flush_handle
        if handle is not None:
            handle.cancel()
            self._flush_to_socket()

    def _flush_to_socket(self) -> None:
        """Packs what is queued into requests on the socket's connection (one is opened
        when there is none), while its transport takes them."""
        self._flush_handle = None
        if self._flush_due is not None:
            self._flush_due.discard(self)
        while self._queue and not self._closed:
            stream = self._socket_stream_now()
            if not stream.call.writable:
                return      # resume_writing calls again
            batch, futures = self._take_batch()
            if not batch:
                continue
            self._track(stream, futures)
            stream.call.send(bookie_pb2.AddRequest(entries=batch, replies_may_merge=True))
            self._arm_timer(stream)

    def _socket_stream_now(self) -> _AddStream:
        stream = self._stream
        if stream is not None and stream.broken is None:
            return stream
        config = self.config

        def on_reply(response: bookie_pb2.AddResponse) -> None:
            self._settle_reply(stream, response.results)

        def on_writable() -> None:
            if self._stream is stream and self._flush_handle is None and self._queue:
                self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_to_socket)

        connection = AddSocketConnection(
            self.bookie_id, self.add_address, token=self._token, message_bytes_max=config.grpc_message_bytes_max,
            welcome_timeout_s=config.read_timeout_s,
            ssl_context=client_context(config.bookie_tls) if config.bookie_tls_enabled else None,
            on_reply=on_reply, on_failure=lambda error: self._break(stream, error), on_writable=on_writable)
        stream = self._stream = _AddStream(connection)
        # Ends by itself (connected, failed or timed out); cancelled by close().
        stream.receiver = self._tasks.spawn(connection.connect(), name=f"add-socket-connect {self.bookie_id}")
        return stream

    def _arm_timer(self, stream: _AddStream) -> None:
        """Makes sure the stream's oldest in-flight batch is looked at when it would be
        past the add timeout. A timer of its own, on both transports: on gRPC the sender
        looked only after each write and after an idle wait of the whole timeout, so an
        add that had waited 4.9 s when the last add came in was noticed 5 s later, not
        0.1 s (a paused bookie stalled its writers 10 s, not 5; the sender, held in a
        write by flow control, did not look at all)."""
        if stream.timer is None and stream.broken is None:
            stream.timer = asyncio.get_running_loop().call_later(
                self.config.add_timeout_s, self._on_stream_timer, stream)

    def _on_stream_timer(self, stream: _AddStream) -> None:
        """Breaks the stream when its oldest in-flight batch waited past the add
        timeout; else looks again when that batch would."""
        stream.timer = None
        if stream.broken is not None or not stream.inflight:
            return
        oldest_sent, _ = stream.inflight[0]
        left = oldest_sent + self.config.add_timeout_s - time.monotonic()
        if left <= 0:
            self._time_out(stream)
            return
        stream.timer = asyncio.get_running_loop().call_later(left, self._on_stream_timer, stream)

    def _settle_reply(self, stream: _AddStream, results) -> bool:
        """Resolves the futures of the batches one reply answers: its results, in
        order, belong to the oldest unanswered batches, each taking as many as it has
        entries (a bookie answers one batch per reply, or several in one when the
        requests let it). A reply that does not end on a batch's last entry is checked
        before anything is resolved: it breaks the stream (False) and fails them all."""
        count = len(results)
        batches = 0
        covered = 0
        for _sent, futures in stream.inflight:
            if covered >= count:
                break
            covered += len(futures)
            batches += 1
        if count == 0 or covered != count:
            self._break(stream, BookieUnavailable(
                self.bookie_id, f"add reply with {count} results does not fit the batches in flight"))
            return False
        index = 0
        for _ in range(batches):
            _sent, futures = stream.inflight.popleft()
            if stream.written_at:
                assert self._stages is not None
                self._stages.observe("bookie_add_round_trip", time.perf_counter() - stream.written_at.popleft(),
                                     len(futures))
            for future, result in zip(futures, results[index:index + len(futures)]):
                if future.done():
                    continue
                if result.error_code == 0:
                    future.set_result(None)
                else:
                    future.set_exception(error_for_code(result.error_code, result.error_message))
            index += len(futures)
        return True

    def _check_timeouts(self) -> None:
        stream = self._stream
        if stream is None or not stream.inflight:
            return
        oldest_sent, _ = stream.inflight[0]
        if time.monotonic() - oldest_sent > self.config.add_timeout_s:
            self._time_out(stream)

    def _time_out(self, stream: _AddStream) -> None:
        """The bookie left an add unanswered past the timeout: the stream breaks, and the
        adds still queued for it fail with the same error instead of going on a new
        stream to a bookie that does not answer (behind a write held by flow control,
        each batch would have waited a timeout of its own in turn)."""
        error = AddTimeout(f"bookie {self.bookie_id} did not answer an add within {self.config.add_timeout_s}s")
        queued, self._queue = self._queue, []
        for _message, future, _size, _queued_at in queued:
            if not future.done():
                future.set_exception(error)
        self._break(stream, error)

    def _break(self, stream: _AddStream, error: MagnetarError) -> None:
        if stream.broken is None:
            stream.broken = error
            if self._closed and not stream.inflight:
                # Our own close with nothing in flight: not a break, nothing to report
                # (it read as a failure at the end of every successful shell run).
                log.debug("add stream closed: bookie_id=%s", self.bookie_id)
            else:
                log.info("add stream broken: bookie_id=%s error=%s in_flight=%d", self.bookie_id, error,
                         len(stream.inflight))
            if isinstance(stream.call, AddSocketConnection):
                stream.call.close()
            else:
                stream.call.cancel()
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        stream.written_at.clear()
        while stream.inflight:
            _sent, futures = stream.inflight.popleft()
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        if self._stream is stream:
            self._stream = None
        if self.add_address and self._queue and not self._closed and self._flush_handle is None:
            # Adds still queued (the broken connection was not taking more) go on a new one.
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_to_socket)

    # --- unary calls ----------------------------------------------------------------------

    async def read(self, ledger_id: int, entry_ids: list[int], response_bytes_max: int) -> list[BookieReadResult]:
        request = bookie_pb2.ReadRequest(ledger_id=ledger_id, entry_ids=entry_ids,
                                         response_bytes_max=response_bytes_max)
        try:
            response = await self._stub.ReadEntries(request, timeout=self.config.read_timeout_s,
                                                     metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _error_from_rpc(self.bookie_id, error) from None
        return [
            BookieReadResult(r.entry_id, r.entry if r.error_code == 0 else None,
                             None if r.error_code == 0 else error_for_code(r.error_code, r.error_message))
            for r in response.results
        ]

    async def _ledger_call(self, method, ledger_id: int) -> BookieLedgerState:
        try:
            response = await method(bookie_pb2.LedgerRequest(ledger_id=ledger_id),
                                    timeout=self.config.control_timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _error_from_rpc(self.bookie_id, error) from None
        if response.error_code:
            raise error_for_code(response.error_code, response.error_message)
        return BookieLedgerState(response.last_add_confirmed, response.last_entry_id, response.fenced)

    async def fence(self, ledger_id: int) -> BookieLedgerState:
        return await self._ledger_call(self._stub.Fence, ledger_id)

    async def read_last_add_confirmed(self, ledger_id: int) -> BookieLedgerState:
        return await self._ledger_call(self._stub.ReadLastAddConfirmed, ledger_id)

    async def info(self) -> bookie_pb2.InfoResponse:
        try:
            return await self._stub.Info(bookie_pb2.InfoRequest(), timeout=self.config.control_timeout_s,
                                        metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _error_from_rpc(self.bookie_id, error) from None

    @property
    def busy(self) -> bool:
        """Adds queued or awaiting their reply."""
        return bool(self._queue) or (self._stream is not None and bool(self._stream.inflight))

    async def retire(self) -> None:
        """Closes once its adds are answered (at most the add timeout) and its other
        calls had the read timeout to finish: the pool replaced it (new credentials)
        and sends nothing more through it."""
        deadline = time.monotonic() + self.config.add_timeout_s
        try:
            while self.busy and time.monotonic() < deadline:
                await asyncio.sleep(_RETIRE_POLL_S)
        except asyncio.CancelledError:
            await self.close()          # the pool is closing: no grace
            raise
        await self.close(grace_s=self.config.read_timeout_s)

    async def close(self, *, grace_s: float | None = None) -> None:
        self._closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._flush_due is not None:
            self._flush_due.discard(self)
        error = BookieUnavailable(self.bookie_id, "client closed")
        for _message, future, _size, _queued_at in self._queue:
            if not future.done():
                future.set_exception(error)
        self._queue.clear()
        stream = self._stream
        if stream is not None:
            self._break(stream, error)
        try:
            await self._tasks.close()
        finally:
            await self._channel.close(grace=grace_s)


def _credential_stamp(config: LedgerClientConfig) -> tuple:
    """What the files a client presents to bookies look like now (TLS certificate,
    key and CA; the service token): a change means new credentials."""
    paths = [config.bookie_auth_token_file] if config.bookie_auth_token_file else []
    if config.bookie_tls_enabled:
        paths += config.bookie_tls.files()
    return file_stamp(paths)


class BookieClientPool:
    """One BookieClient per bookie id, created on first use. Addresses come from the
    registry (a bookie id is its address unless it registered another)."""

    def __init__(self, config: LedgerClientConfig, address_of, *, stages: LatencyStages | None = None,
                 clock=time.monotonic, add_address_of=lambda bookie_id: "") -> None:
        self._config = config
        self._stages = stages
        self._address_of = address_of
        self._add_address_of = add_address_of
        self._clients: dict[str, BookieClient] = {}
        # Clients with an add-socket flush due (each removes itself when it flushes or
        # closes): what flush_adds runs at once.
        self._flush_due = FlushesDue()
        # Closes of stale clients (a bookie that re-registered at another address, or
        # credentials that changed): one per replaced client; awaited by close.
        self._tasks = TaskSet("bookie client pool")
        # Credentials rotate without a restart: the files are looked at (at most every
        # CREDENTIALS_CHECK_S) and, when they changed, every client is replaced by one
        # that reads them again; the old ones finish their calls, then close.
        self._clock = clock
        self._stamp = _credential_stamp(config)
        self._stamp_checked = clock()
        self.credential_changes = 0

    def _check_credentials(self) -> None:
        now = self._clock()
        if now - self._stamp_checked < CREDENTIALS_CHECK_S:
            return
        self._stamp_checked = now
        stamp = _credential_stamp(self._config)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        self.credential_changes += 1
        replaced, self._clients = list(self._clients.values()), {}
        log.info("bookie client credentials changed, new channels from now on: clients_replaced=%d changes=%d",
                 len(replaced), self.credential_changes)
        for client in replaced:
            self._tasks.spawn(client.retire(), name=f"retire {client.bookie_id}")

    def get(self, bookie_id: str) -> BookieClient:
        self._check_credentials()
        client = self._clients.get(bookie_id)
        address = self._address_of(bookie_id)
        add_address = self._add_address_of(bookie_id) if self._config.add_transport == "socket" else ""
        if client is not None and (client.address != address or client.add_address != add_address):
            # The bookie re-registered elsewhere; drop the stale channel.
            self._tasks.spawn(client.close(), name=f"close-stale {bookie_id}")
            client = None
        if client is None:
            client = self._clients[bookie_id] = BookieClient(bookie_id, address, self._config, stages=self._stages,
                                                             add_address=add_address, flush_due=self._flush_due)
        return client

    def hold_flushes(self) -> bool:
        """Until the next ``flush_adds``, adds queued on add sockets wait for it and
        schedule no flush of their own for the next loop turn. For a caller that will
        call ``flush_adds`` when it has handled what arrived together (a broker
        connection, around a read; in a ``finally``): the adds leave as they did, and
        the loop is spared the turn each flush scheduled and cancelled cost it. True
        when this call began the hold; False when one was already held."""
        if self._flush_due.held:
            return False
        self._flush_due.held = True
        return True

    def flush_adds(self) -> None:
        """Sends the adds queued on add sockets now rather than at the next loop turn,
        and ends a hold (``hold_flushes``). For a caller that has just handled the last of
        what arrived together (a broker connection at the end of a read): a lone entry
        does not wait a turn, and the entries of one read still leave in one request
        per bookie."""
        self._flush_due.held = False
        if self._flush_due:
            for client in list(self._flush_due):
                client.flush_now()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
        # Stale clients finish closing (each bounded by its channel's close), then any
        # still closing is cancelled.
        await self._tasks.join(timeout_s=self._config.control_timeout_s)
        await self._tasks.close()
