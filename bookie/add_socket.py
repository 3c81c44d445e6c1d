"""The add socket: the bookie's add stream on a plain asyncio connection (issue 16).

Why: measured per durable add (docs/performance.md, step 5), gRPC aio's per-message
completion callbacks were more than half of the bookie's event-loop CPU and the largest
item of the broker's; a length-prefixed stream read and written by the event loop
itself (protocol/add_socket.py) answers the same AddRequests with the same code
(``BookieServicer``: admit, journal, reply after the fdatasync, replies merged)
without them. gRPC stays the bookie's API: reads, fences, LAC and info, and adds for
writers that do not use this.

Theory of operation: one connection per writer process (the ledger client's add
stream), served by a protocol object driven by the loop's callbacks, not by a task: a
request is journaled in the same turn its bytes arrive (when the journal and the write
cache have room; else an admission task waits for room with reading paused, and the
requests behind it wait in order), and its reply is written by the callback of its
journal future (docs/performance.md, step 8: fewer loop turns and Python frames per
add than a stream reader, a queue and an answering task). The writer's first message is
an ``AddSocketHello`` with its service token; with authentication on, the token is
checked as gRPC's interceptor checks it (``TokenInterceptor.check_token``: the same key,
rotated the same way, the same roles) and a refusal is an ``AddSocketWelcome`` with
AuthenticationFailed or AuthorizationDenied, then the close. The hello must come within
``hello_timeout_s``. Then requests are read (each at most ``message_bytes_max``: a
longer announced length, or bytes that do not parse, end that connection only) and the
replies written in order. Bounded: reading pauses while ``STREAM_BATCHES_IN_FLIGHT_MAX``
batches are unanswered (as on gRPC), while an admission waits for room, and while the
transport's buffer is over its high-water mark (the writer does not read its replies),
so a slow writer bounds what the bookie holds for it. With TLS configured the socket
serves TLS with the bookie's certificate (and requires client certificates when the
gRPC port does).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from typing import Callable, cast

import grpc

from bookie.server import STREAM_BATCHES_IN_FLIGHT_MAX, BookieServicer, PendingBatch, add_items
from runtime.eager_future import call_when_done
from common.errors import AuthenticationFailed, AuthorizationDenied, MagnetarError, MalformedFrame
from runtime.tasks import log_failure
from protocol.add_socket import MessageDecoder, encode_message, parse
from protocol.proto import bookie_pb2

log = logging.getLogger(__name__)

# A writer that connects must say who it is within this long.
HELLO_TIMEOUT_S = 10.0
# Writers are brokers and auto-recovery workers (one connection each): far fewer than
# this; past it a new connection is closed at once.
CONNECTIONS_MAX = 1024

TokenCheck = Callable[[str], "tuple[grpc.StatusCode, str] | None"]

# Why a connection's reading is paused (it resumes when none is left).
_PAUSED_IN_FLIGHT = "batches in flight"
_PAUSED_ADMISSION = "waiting for room"
_PAUSED_WRITES = "replies not read"


def _settled(batch: PendingBatch) -> bool:
    return batch.future is None or batch.future.done()


class AddSocketServer:
    def __init__(self, servicer: BookieServicer, *, message_bytes_max: int, token_check: TokenCheck | None = None,
                 ssl_context: ssl.SSLContext | None = None, hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        self.servicer = servicer
        self.message_bytes_max = message_bytes_max
        self.token_check = token_check
        self._ssl_context = ssl_context
        self.hello_timeout_s = hello_timeout_s
        self._server: asyncio.Server | None = None
        # The open connections, owned here: closed by close().
        self.connections: set[_AddConnection] = set()
        self.connections_total = 0
        self.refused_total = 0

    async def start(self, host: str, port: int) -> int:
        """Listens; returns the port (``port`` 0: a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _AddConnection(self), host, port, ssl=self._ssl_context)
        return self._server.sockets[0].getsockname()[1]

    def refusal(self, token: str) -> bookie_pb2.AddSocketWelcome | None:
        if self.token_check is None:
            return None
        refused = self.token_check(token)
        if refused is None:
            return None
        status, reason = refused
        error: MagnetarError = AuthorizationDenied(reason) if status == grpc.StatusCode.PERMISSION_DENIED \
            else AuthenticationFailed(reason)
        return bookie_pb2.AddSocketWelcome(error_code=error.code, error_message=error.message)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        admissions = [c.admission for c in self.connections if c.admission is not None]
        for connection in list(self.connections):
            connection.abort()
        for admission in admissions:
            admission.cancel()
        await asyncio.gather(*admissions, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


class _AddConnection(asyncio.Protocol):
    """One writer's add stream (see the module docstring)."""

    def __init__(self, server: AddSocketServer) -> None:
        self._server = server
        self._servicer = server.servicer
        self._node = server.servicer.node
        self._decoder = MessageDecoder(server.message_bytes_max)
        self._transport: asyncio.Transport | None = None
        self._peer: object = None
        self._hello_timer: asyncio.TimerHandle | None = None
        self._welcomed = False
        self._closed = False
        # Batches journaled (or refused) and not yet answered, in arrival order.
        self._unanswered: collections.deque[PendingBatch] = collections.deque()
        # Requests read while an admission waits for room: taken in order after it.
        self._waiting: collections.deque[tuple[bookie_pb2.AddRequest, float]] = collections.deque()
        self._admission: asyncio.Task[None] | None = None
        self._paused: set[str] = set()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's, or uvloop's (runtime/event_loop.py), which is not a
        # subclass of asyncio.Transport (an isinstance check here refused every connection).
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._peer = transport.get_extra_info("peername")
        server = self._server
        if len(server.connections) >= CONNECTIONS_MAX:
            server.refused_total += 1
            log.warning("add socket connection refused: connections=%d (the limit)", len(server.connections))
            self._closed = True
            transport.abort()
            return
        server.connections.add(self)
        server.connections_total += 1
        self._hello_timer = asyncio.get_running_loop().call_later(server.hello_timeout_s, self._on_hello_timeout)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._decoder.feed(data)
        # The journal's writer is not woken by each request's append: it is started
        # (or woken) once, when the read's requests are all journaled.
        self._node.hold_journal()
        try:
            while not self._closed:
                body = self._decoder.next_body()
                if body is None:
                    break
                if self._welcomed:
                    self._on_request(parse(bookie_pb2.AddRequest, body))
                else:
                    self._on_hello(parse(bookie_pb2.AddSocketHello, body))
        except MalformedFrame as error:
            log.info("add socket closed: peer=%s reason=%s", self._peer, error)
            self.abort()
        finally:
            # This read's requests are journaled: an idle journal writes them now rather
            # than after its writer's loop turns (the requests of one read share a group).
            self._node.start_journal_now()

    def eof_received(self) -> bool:
        if self._decoder.buffered_bytes:
            log.info("add socket closed: peer=%s reason=closed inside a message", self._peer)
        return False     # the transport closes itself

    def pause_writing(self) -> None:
        self._pause(_PAUSED_WRITES)

    def resume_writing(self) -> None:
        self._resume(_PAUSED_WRITES)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self._closed:
            log.info("add socket connection lost: peer=%s error=%r", self._peer, exc)
        self._closed = True
        self._server.connections.discard(self)
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if self._admission is not None:
            self._admission.cancel()
            self._admission = None
        # Journaled adds stay journaled; nobody is left to answer.
        self._waiting.clear()
        self._unanswered.clear()

    @property
    def admission(self) -> asyncio.Task[None] | None:
        """The task waiting for room for this connection's next request, if any."""
        return self._admission

    def abort(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    # --- the hello --------------------------------------------------------------------------

    def _on_hello_timeout(self) -> None:
        self._hello_timer = None
        if not self._welcomed and not self._closed:
            log.info("add socket closed: peer=%s reason=no hello within %ss", self._peer,
                     self._server.hello_timeout_s)
            self.abort()

    def _on_hello(self, hello: bookie_pb2.AddSocketHello) -> None:
        assert self._transport is not None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        refusal = self._server.refusal(hello.token)
        # Logged before the answer is written: the writer may act on it at once.
        if refusal is None:
            self._welcomed = True
            log.info("add socket writer connected: peer=%s", self._peer)
            self._transport.write(encode_message(bookie_pb2.AddSocketWelcome()))
            return
        self._server.refused_total += 1
        log.info("add socket refused: peer=%s error_code=%d reason=%s", self._peer, refusal.error_code,
                 refusal.error_message)
        self._transport.write(encode_message(refusal))
        self._closed = True
        self._transport.close()     # after the refusal is written

    # --- requests ---------------------------------------------------------------------------

    def _on_request(self, request: bookie_pb2.AddRequest) -> None:
        arrived = time.perf_counter()
        if self._admission is not None or self._waiting:
            self._waiting.append((request, arrived))     # behind an admission that waits
            return
        self._take(request, arrived)

    def _take(self, request: bookie_pb2.AddRequest, arrived: float) -> None:
        """Journals a request now, or starts the admission that waits for room."""
        items = add_items(request)
        if not self._node.admits_now(items):
            self._pause(_PAUSED_ADMISSION)
            self._admission = asyncio.get_running_loop().create_task(self._admit(request, items, arrived),
                                                                     name="add socket admission")
            self._admission.add_done_callback(lambda task: log_failure(task, owner=f"add socket {self._peer}"))
            return
        self._queue(self._servicer.submit_batch(request, items, arrived))

    async def _admit(self, request: bookie_pb2.AddRequest, items: list, arrived: float) -> None:
        batch = await self._servicer.admitted_batch(request, items, arrived)
        self._admission = None
        if self._closed:
            return
        self._queue(batch)
        while self._waiting and self._admission is None and not self._closed:
            self._take(*self._waiting.popleft())
        if self._admission is None:
            self._resume(_PAUSED_ADMISSION)

    def _queue(self, batch: PendingBatch) -> None:
        self._unanswered.append(batch)
        if len(self._unanswered) >= STREAM_BATCHES_IN_FLIGHT_MAX:
            self._pause(_PAUSED_IN_FLIGHT)
        if batch.future is None:
            self._answer()
        else:
            call_when_done(batch.future, self._on_durable)

    # --- replies ----------------------------------------------------------------------------

    def _on_durable(self, future: asyncio.Future[None]) -> None:
        if self._closed:
            if not future.cancelled():
                future.exception()      # retrieved: nobody is left to answer
            return
        self._answer()

    def _answer(self) -> None:
        """Writes the replies of the settled batches at the head, in order; batches that
        let replies merge and are settled together share one reply."""
        unanswered = self._unanswered
        servicer = self._servicer
        while unanswered and _settled(unanswered[0]) and not self._closed:
            durable_at = time.perf_counter()
            batch = unanswered.popleft()
            results = servicer.settled_results(batch, on_add_socket=True)
            merged = 1
            while batch.replies_may_merge and unanswered and unanswered[0].replies_may_merge \
                    and _settled(unanswered[0]):
                results.extend(servicer.settled_results(unanswered.popleft(), on_add_socket=True))
                merged += 1
            assert self._transport is not None
            self._transport.write(encode_message(bookie_pb2.AddResponse(results=results)))
            servicer.count_reply(batch, durable_at, merged)
        if len(unanswered) < STREAM_BATCHES_IN_FLIGHT_MAX:
            self._resume(_PAUSED_IN_FLIGHT)

    # --- reading paused / resumed -------------------------------------------------------------

    def _pause(self, reason: str) -> None:
        if not self._paused and self._transport is not None and not self._closed:
            self._transport.pause_reading()
        self._paused.add(reason)

    def _resume(self, reason: str) -> None:
        if reason not in self._paused:
            return
        self._paused.discard(reason)
        if not self._paused and self._transport is not None and not self._closed:
            self._transport.resume_reading()
