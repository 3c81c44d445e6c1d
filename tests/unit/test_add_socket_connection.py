"""The bookie's add socket connection (bookie/add_socket.py), driven without sockets.

What it proves: after the hello, requests are journaled as their bytes arrive and
answered in order by their journal futures' callbacks, batches durable together sharing
one reply when they let replies merge; a request that must wait for room pauses reading
and the requests read behind it wait in order; reading pauses at
STREAM_BATCHES_IN_FLIGHT_MAX unanswered batches and while the transport's buffer is full,
and resumes after; a refused hello is answered with its refusal and closed; no hello in
time, a length past the bound and bytes that are not a request each abort the connection;
a connection lost with batches unanswered writes nothing more; closing the server cancels
and awaits an admission that waits for room.

How: the real protocol object over a recording transport, with a node whose journal
futures and admission the test drives, and the real BookieServicer.
"""

from __future__ import annotations

import asyncio
import struct

import grpc

from bookie.add_socket import AddSocketServer, _AddConnection
from bookie.server import STREAM_BATCHES_IN_FLIGHT_MAX, BookieServicer
from common.errors import AuthorizationDenied, LedgerFenced
from protocol.add_socket import MessageDecoder, encode_message, parse
from protocol.proto import bookie_pb2


class _Node:
    """Accepts every add; each batch's durability is a future the test resolves; room
    is there unless ``room`` is cleared (then admission waits for it)."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []
        self.room = asyncio.Event()
        self.room.set()
        self.admitted: list[int] = []
        # How many batches had been journaled at each start_journal_now call.
        self.started_at: list[int] = []
        # How many batches had been journaled at each hold_journal call.
        self.held_at: list[int] = []

    def hold_journal(self) -> None:
        self.held_at.append(len(self.futures))

    def start_journal_now(self) -> None:
        self.started_at.append(len(self.futures))

    def admits_now(self, items) -> bool:
        return self.room.is_set()

    async def admit(self, items) -> None:
        await self.room.wait()

    def submit_adds(self, items):
        self.admitted.extend(item.entry_id for item in items)
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return [None] * len(items), future


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.reading = True
        self.closed = False
        self.aborted = False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5000) if name == "peername" else default

    def write(self, data) -> None:
        assert not self.closed
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed


def _connection(node: _Node, *, token_check=None, hello_timeout_s: float = 10.0):
    server = AddSocketServer(BookieServicer(node), message_bytes_max=1 << 20, token_check=token_check,
                             hello_timeout_s=hello_timeout_s)
    connection = _AddConnection(server)
    transport = _Transport()
    connection.connection_made(transport)
    return server, connection, transport


def _request(first: int, count: int, *, merge: bool = True) -> bytes:
    return encode_message(bookie_pb2.AddRequest(
        entries=[bookie_pb2.AddEntry(ledger_id=7, entry_id=first + i, entry=b"x") for i in range(count)],
        replies_may_merge=merge))


def _messages(transport: _Transport) -> list[bytes]:
    decoder = MessageDecoder(1 << 20)
    decoder.feed(bytes(transport.written))
    bodies = []
    while (body := decoder.next_body()) is not None:
        bodies.append(body)
    return bodies


def _replies(transport: _Transport) -> list[list[tuple[int, int]]]:
    """The AddResponses written after the welcome: per reply, (entry id, error code)."""
    welcome, *rest = _messages(transport)
    assert parse(bookie_pb2.AddSocketWelcome, welcome).error_code == 0
    return [[(r.entry_id, r.error_code) for r in parse(bookie_pb2.AddResponse, body).results] for body in rest]


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_requests_are_journaled_as_they_arrive_and_answered_in_order():
    node = _Node()
    _, connection, transport = _connection(node)
    stream = encode_message(bookie_pb2.AddSocketHello(token="")) + _request(0, 2) + _request(2, 1) + _request(3, 1)
    for start in range(0, len(stream), 5):        # however the bytes arrive
        connection.data_received(stream[start:start + 5])
    assert node.admitted == [0, 1, 2, 3], "journaled in the turn the bytes came, no task between"
    node.futures[1].set_result(None)              # the second is durable first: it waits for the first
    await _turns()
    assert _replies(transport) == []
    node.futures[0].set_result(None)
    node.futures[2].set_exception(LedgerFenced("fenced meanwhile"))
    await _turns()
    assert _replies(transport) == [[(0, 0), (1, 0), (2, 0), (3, LedgerFenced.code)]], "one merged reply"
    # A writer that does not let replies merge gets one reply per request.
    connection.data_received(_request(4, 1, merge=False) + _request(5, 1, merge=False))
    node.futures[3].set_result(None)
    node.futures[4].set_result(None)
    await _turns()
    assert _replies(transport)[1:] == [[(4, 0)], [(5, 0)]]


async def test_the_journal_is_told_to_write_once_a_read_s_requests_are_journaled():
    """At the end of each read, after all its requests were journaled (so they can share
    a group), the node is asked to start an idle journal's write (start_journal_now); a
    read that completes no request asks too (it is cheap: nothing is queued then)."""
    node = _Node()
    _, connection, _transport = _connection(node)
    connection.data_received(encode_message(bookie_pb2.AddSocketHello(token="")))
    connection.data_received(_request(0, 1) + _request(1, 2) + _request(3, 1))
    assert node.started_at[-1] == 3 and len(node.started_at) == 2
    head = _request(4, 1)
    connection.data_received(head[:3])
    connection.data_received(head[3:])
    assert node.started_at[-2:] == [3, 4]


async def test_a_request_waiting_for_room_holds_the_ones_behind_it_in_order():
    node = _Node()
    _, connection, transport = _connection(node)
    connection.data_received(encode_message(bookie_pb2.AddSocketHello()) + _request(0, 1))
    node.room.clear()
    connection.data_received(_request(1, 1) + _request(2, 1))
    assert node.admitted == [0] and not transport.reading
    node.room.set()
    await _turns()
    assert node.admitted == [0, 1, 2] and transport.reading
    for future in node.futures:
        future.set_result(None)
    await _turns()
    assert [entry for reply in _replies(transport) for entry, _ in reply] == [0, 1, 2]


async def test_reading_pauses_at_the_in_flight_bound_and_while_replies_are_not_read():
    node = _Node()
    _, connection, transport = _connection(node)
    connection.data_received(encode_message(bookie_pb2.AddSocketHello()))
    connection.data_received(b"".join(_request(i, 1) for i in range(STREAM_BATCHES_IN_FLIGHT_MAX)))
    assert not transport.reading
    node.futures[0].set_result(None)
    await _turns()
    assert transport.reading
    connection.pause_writing()
    assert not transport.reading
    connection.resume_writing()
    assert transport.reading


async def test_a_refused_hello_is_answered_then_closed():
    def refuse(token: str):
        return (grpc.StatusCode.PERMISSION_DENIED, f"role of {token!r} may not add") if token != "ok" else None

    node = _Node()
    server, connection, transport = _connection(node, token_check=refuse)
    connection.data_received(encode_message(bookie_pb2.AddSocketHello(token="other")) + _request(0, 1))
    (answer,) = _messages(transport)
    assert parse(bookie_pb2.AddSocketWelcome, answer).error_code == AuthorizationDenied.code
    assert transport.closed and not transport.aborted and node.admitted == [] and server.refused_total == 1


async def test_bad_input_aborts_only_that_connection():
    node = _Node()
    _, late, late_transport = _connection(node, hello_timeout_s=0.01)
    await asyncio.sleep(0.05)
    assert late_transport.aborted, "no hello in time"
    _, long, long_transport = _connection(node)
    long.data_received(encode_message(bookie_pb2.AddSocketHello()) + struct.pack(">I", (1 << 20) + 1))
    assert long_transport.aborted, "a length past the bound, refused before its body"
    _, garbage, garbage_transport = _connection(node)
    garbage.data_received(encode_message(bookie_pb2.AddSocketHello()) + struct.pack(">I", 3) + b"\xff\xff\xff")
    assert garbage_transport.aborted and node.admitted == []
    _, good, good_transport = _connection(node)
    good.data_received(encode_message(bookie_pb2.AddSocketHello()) + _request(9, 1))
    node.futures[-1].set_result(None)
    await _turns()
    assert _replies(good_transport) == [[(9, 0)]]


async def test_a_lost_connection_writes_nothing_more():
    node = _Node()
    server, connection, transport = _connection(node)
    connection.data_received(encode_message(bookie_pb2.AddSocketHello()) + _request(0, 1))
    connection.connection_lost(ConnectionResetError())
    written = bytes(transport.written)
    node.futures[0].set_exception(LedgerFenced("after the writer left"))   # retrieved, not reported
    await _turns()
    assert bytes(transport.written) == written and connection not in server.connections


async def test_closing_the_server_ends_a_waiting_admission():
    node = _Node()
    server, connection, transport = _connection(node)
    connection.data_received(encode_message(bookie_pb2.AddSocketHello()))
    node.room.clear()
    connection.data_received(_request(0, 1))
    admission = connection.admission
    assert admission is not None and not admission.done()
    await server.close()
    assert admission.cancelled() and transport.aborted and node.admitted == []
