"""The writer's side of the add socket (ledger/add_socket_connection.py and the socket
path of ledger/bookie_client.py) against a scripted bookie on a loopback socket.

Proves that: the adds queued in one loop turn leave in one request, after the hello,
and a reply (one per request, or one merged for several) resolves its adds' futures in
order in the turn its bytes are read; a hello refused with an authentication error
fails the adds with that error (a refused writer is not a failed bookie) and the next
add opens a new connection; the bookie closing with adds in flight, a reply that is not
an AddResponse, a length past the bound, no welcome in time and no reply within the add
timeout each fail exactly the adds in flight (BookieUnavailable / AddTimeout) and the
next add works again; adds queued while the transport's buffer is over its high-water
mark wait until it drains; close fails what is queued and in flight and leaves no task.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from runtime import write_batch
from runtime.eager_future import call_when_done
from common.errors import AddTimeout, AuthenticationFailed, BookieUnavailable
from ledger.bookie_client import BookieClient, BookieClientPool
from ledger.config import LedgerClientConfig
from protocol.add_socket import MessageDecoder, encode_message, parse
from protocol.proto import bookie_pb2


class ScriptedBookie:
    """An add socket speaking the framing, answering as each test says: every request
    answered at once with successes unless ``hold`` is set (then kept in ``held``)."""

    def __init__(self) -> None:
        self.refuse: int = 0                   # an error code for the hello's welcome
        self.welcome = True
        self.hold = False
        self.held: list[tuple[asyncio.StreamWriter, bookie_pb2.AddRequest]] = []
        self.requests: list[bookie_pb2.AddRequest] = []
        self.hellos: list[str] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.handlers: list[asyncio.Task] = []
        self.got_request = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handlers.append(asyncio.current_task())
        self.writers.append(writer)
        try:
            await self._answer(reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = MessageDecoder(1 << 20)
        hello_seen = False
        while data := await reader.read(65536):
            decoder.feed(data)
            while (body := decoder.next_body()) is not None:
                if not hello_seen:
                    hello_seen = True
                    self.hellos.append(parse(bookie_pb2.AddSocketHello, body).token)
                    if self.refuse:
                        writer.write(encode_message(bookie_pb2.AddSocketWelcome(error_code=self.refuse,
                                                                                error_message="no")))
                        return
                    if self.welcome:
                        writer.write(encode_message(bookie_pb2.AddSocketWelcome()))
                    continue
                request = parse(bookie_pb2.AddRequest, body)
                self.requests.append(request)
                self.got_request.set()
                if self.hold:
                    self.held.append((writer, request))
                else:
                    writer.write(encode_message(answer(request)))
        writer.close()

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        await asyncio.wait_for(asyncio.gather(*self.handlers, return_exceptions=True), 5)
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


def answer(*requests: bookie_pb2.AddRequest) -> bookie_pb2.AddResponse:
    return bookie_pb2.AddResponse(results=[bookie_pb2.AddResult(ledger_id=e.ledger_id, entry_id=e.entry_id)
                                           for request in requests for e in request.entries])


@pytest.fixture
async def bookie():
    scripted = ScriptedBookie()
    scripted.address = await scripted.start()
    yield scripted
    await scripted.close()


@pytest.fixture
async def make_client(bookie):
    """Bookie clients toward the scripted bookie, closed after the test."""
    made: list[BookieClient] = []

    def make(**config) -> BookieClient:
        settings = dict(add_transport="socket", add_timeout_s=5.0, read_timeout_s=5.0)
        settings.update(config)
        # The gRPC address is never dialled: adds go to the add socket, and these tests read nothing.
        made.append(BookieClient("bookie-1", "127.0.0.1:1", LedgerClientConfig(**settings),
                                 add_address=bookie.address))
        return made[-1]

    yield make
    for client in made:
        await client.close()


async def test_one_turns_adds_leave_in_one_request_and_replies_resolve_in_order(bookie, make_client) -> None:
    client = make_client()
    first = [client.add(7, entry_id, b"x" * 10) for entry_id in range(3)]
    await asyncio.gather(*first)
    assert bookie.hellos == [""]
    assert [[e.entry_id for e in r.entries] for r in bookie.requests] == [[0, 1, 2]]
    assert bookie.requests[0].replies_may_merge

    # Two requests answered by one merged reply: both batches resolve, in order.
    bookie.hold = True
    bookie.got_request.clear()
    second = [client.add(7, 3, b"y")]
    await bookie.got_request.wait()
    bookie.got_request.clear()
    third = [client.add(7, 4, b"z"), client.add(7, 5, b"z")]
    await bookie.got_request.wait()
    assert [len(r.entries) for _w, r in bookie.held] == [1, 2]
    writer = bookie.held[0][0]
    writer.write(encode_message(answer(*(r for _w, r in bookie.held))))
    await asyncio.gather(*second, *third)
    assert len(bookie.writers) == 1          # one connection all along


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []

    def writelines(self, buffers) -> None:
        self.calls.append(list(buffers))

    def is_closing(self) -> bool:
        return False


async def test_what_one_read_of_replies_causes_is_written_once(bookie, make_client) -> None:
    """Replies read together are handled in one write batch (runtime/write_batch.py): the
    writes their adds' eager callbacks make to one transport (a broker's receipts and
    dispatch to a client) leave in one write when the read is handled."""
    client = make_client()
    await client.add(7, 0, b"w")                       # connected and welcomed
    bookie.hold = True
    adds = []
    for entry_ids in ([1], [2, 3]):                    # two requests
        bookie.got_request.clear()
        adds += [client.add(7, entry_id, b"x") for entry_id in entry_ids]
        await bookie.got_request.wait()
    out = RecordingTransport()
    for add in adds:
        call_when_done(add, lambda f: write_batch.write(out, [f"done {f.result()}".encode()]))
    # Their two replies in one write (one socket read).
    (writer, first), (_writer, second) = bookie.held
    writer.write(encode_message(answer(first)) + encode_message(answer(second)))
    await asyncio.wait_for(asyncio.gather(*adds), 5)
    assert out.calls == [[b"done None", b"done None", b"done None"]]


async def test_the_pool_s_flush_adds_sends_what_is_queued_in_the_same_turn(bookie) -> None:
    """flush_adds sends the adds queued so far at once, in one request: an add queued
    after it in the same turn leaves in a request of its own at the next turn (without
    flush_adds the three would share one request, the test above). Once sent, nothing
    is left due."""
    config = LedgerClientConfig(add_transport="socket", add_timeout_s=5.0, read_timeout_s=5.0)
    pool = BookieClientPool(config, lambda bookie_id: "127.0.0.1:1", add_address_of=lambda bookie_id: bookie.address)
    try:
        client = pool.get("bookie-1")
        await client.add(3, 0, b"a")                       # connected and welcomed
        flushed = [client.add(3, 1, b"b"), client.add(3, 2, b"c")]
        pool.flush_adds()
        later = client.add(3, 3, b"d")
        await asyncio.wait_for(asyncio.gather(*flushed, later), 5)
        assert [[e.entry_id for e in r.entries] for r in bookie.requests] == [[0], [1, 2], [3]]
        pool.flush_adds()                                  # nothing queued: nothing sent
        await asyncio.sleep(0.01)
        assert len(bookie.requests) == 3
        assert not pool._flush_due
    finally:
        await pool.close()


async def test_adds_under_the_pool_s_hold_wait_for_its_flush_and_schedule_no_turn(bookie) -> None:
    """Under hold_flushes an add schedules no flush for the next turn (a broker read's
    adds leave at its end, flush_adds, which ends the hold): turns pass and nothing is
    sent; flush_adds sends them in one request; after it adds schedule their turn
    again. A second hold_flushes inside a hold is not the holder's."""
    config = LedgerClientConfig(add_transport="socket", add_timeout_s=5.0, read_timeout_s=5.0)
    pool = BookieClientPool(config, lambda bookie_id: "127.0.0.1:1", add_address_of=lambda bookie_id: bookie.address)
    try:
        client = pool.get("bookie-1")
        await client.add(3, 0, b"a")                       # connected and welcomed
        assert pool.hold_flushes() is True
        assert pool.hold_flushes() is False
        held = [client.add(3, 1, b"b"), client.add(3, 2, b"c")]
        assert not isinstance(client._flush_handle, asyncio.Handle)
        for _ in range(5):
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert len(bookie.requests) == 1 and not any(f.done() for f in held)
        pool.flush_adds()
        await asyncio.wait_for(asyncio.gather(*held), 5)
        later = client.add(3, 3, b"d")                     # no hold: its own turn
        assert isinstance(client._flush_handle, asyncio.Handle)
        await asyncio.wait_for(later, 5)
        assert [[e.entry_id for e in r.entries] for r in bookie.requests] == [[0], [1, 2], [3]]
        assert not pool._flush_due
    finally:
        await pool.close()


async def test_a_refused_hello_fails_the_adds_with_the_refusal_and_the_next_add_reconnects(
        bookie, make_client) -> None:
    client = make_client()
    bookie.refuse = AuthenticationFailed("x").code
    with pytest.raises(AuthenticationFailed):
        await client.add(1, 0, b"a")
    bookie.refuse = 0
    await client.add(1, 1, b"b")
    assert len(bookie.hellos) == 2


async def test_the_bookie_closing_fails_the_adds_in_flight_and_the_next_add_reconnects(
        bookie, make_client) -> None:
    client = make_client()
    bookie.hold = True
    pending = client.add(1, 0, b"a")
    await bookie.got_request.wait()
    bookie.held[0][0].close()
    with pytest.raises(BookieUnavailable, match="closed"):
        await pending
    bookie.hold = False
    await client.add(1, 1, b"b")
    assert len(bookie.writers) == 2


@pytest.mark.parametrize("reply, reason", [
    (struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff", "not a AddResponse"),
    (struct.pack(">I", 1 << 30), "exceeds"),
])
async def test_a_bad_reply_fails_the_adds_in_flight(bookie, reply: bytes, reason: str, make_client) -> None:
    client = make_client()
    bookie.hold = True
    pending = client.add(1, 0, b"a")
    await bookie.got_request.wait()
    bookie.held[0][0].write(reply)
    with pytest.raises(BookieUnavailable, match=reason):
        await pending


async def test_no_welcome_in_time_fails_the_adds(bookie, make_client) -> None:
    client = make_client(read_timeout_s=0.3)
    bookie.welcome = False
    bookie.hold = True
    with pytest.raises(BookieUnavailable, match="no welcome in time"):
        await asyncio.wait_for(client.add(1, 0, b"a"), 5)


async def test_no_reply_within_the_add_timeout_fails_the_adds_in_flight(bookie, make_client) -> None:
    client = make_client(add_timeout_s=0.3)
    bookie.hold = True
    started = asyncio.get_running_loop().time()
    with pytest.raises(AddTimeout):
        await asyncio.wait_for(client.add(1, 0, b"a"), 5)
    assert asyncio.get_running_loop().time() - started < 2.0
    bookie.hold = False
    await client.add(1, 1, b"b")


async def test_adds_wait_while_the_transport_is_over_its_high_water_mark(bookie, make_client) -> None:
    client = make_client()
    await client.add(1, 0, b"a")
    connection = client._stream.call
    connection.pause_writing()
    waiting = client.add(1, 1, b"b")
    await asyncio.sleep(0.05)
    assert not waiting.done() and len(bookie.requests) == 1 and client.busy
    connection.resume_writing()
    await waiting
    assert len(bookie.requests) == 2


async def test_close_fails_what_is_queued_and_in_flight_and_leaves_no_task(bookie, make_client) -> None:
    client = make_client()
    bookie.hold = True
    in_flight = client.add(1, 0, b"a")
    await bookie.got_request.wait()
    queued = client.add(1, 1, b"b")
    before = asyncio.all_tasks()
    await client.close()
    for future in (in_flight, queued):
        with pytest.raises(BookieUnavailable, match="client closed"):
            await future
    assert not any("add-socket" in task.get_name() for task in asyncio.all_tasks())
    assert asyncio.all_tasks() <= before
