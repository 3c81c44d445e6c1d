"""Write coalescing on the broker's client connections (broker/connection.py) and the
order in which a confirmed append wakes readers and settles receipts
(broker/managed_ledger.py).

What it proves: the first frame written in a turn of the event loop reaches the
transport at once (a lone receipt waits for nothing); the frames written after it in
the same turn reach it together, in one hand-over, in order, when the turn ends; held
back frames past WRITE_COALESCE_BYTES are handed over at once (so the transport's
high-water mark still pauses writers); close() hands over what was held back before
closing; a connection that was lost drops what it held back; the broker counts frames
and sends (in /metrics). A confirmed append wakes the readers waiting for entries before
it settles the appends' receipts, so their callbacks run in that order in the next turn
(the dispatch does not wait behind the receipts), and the receipts and failures still
settle in append order.

How: a real ServerConnection over a recording transport (tests/unit/test_broker_connection.py),
a real ManagedLedger over FakeLedgerClient.
"""

from __future__ import annotations

import asyncio

from broker import connection as connection_module
from broker.connection import WRITE_COALESCE_BYTES
from common.position import Position
from metadata.memory_store import MemoryStore
from protocol import commands
from protocol.codec import NEED_DATA, CommandDecoder
from protocol.proto import pulsar_api_pb2 as pb
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_connection import Client as _Client
from tests.unit.test_broker_connection import FakeTransport, connected
from tests.unit.test_managed_ledger import TIMEOUT_S, opened

T = pb.BaseCommand


class Client(_Client):
    def peek(self) -> list[pb.BaseCommand]:
        """What reached the transport so far, without sending what is held back."""
        decoder = CommandDecoder(frame_bytes_max=self.connection.config.frame_bytes_max)
        decoder.feed(bytes(self.transport.written))
        out = []
        while (frame := decoder.next_command()) is not NEED_DATA:
            out.append(frame.command)
        return out


class CountingTransport(FakeTransport):
    """Records each hand-over (write or writelines) as one send."""

    def __init__(self, protocol) -> None:
        super().__init__(protocol)
        self.sends = 0

    def write(self, data) -> None:
        self.sends += 1
        super().write(data)

    def writelines(self, buffers) -> None:
        self.sends += 1
        super().writelines(buffers)


async def counting_client():
    service, client = await connected()
    transport = CountingTransport(client.connection)
    client.connection.transport = transport
    client.transport = transport
    client._read = 0
    await asyncio.sleep(0)          # the turn of CONNECTED ends: the next write opens a turn
    return service, client, transport


async def test_a_turns_first_frame_leaves_at_once_and_the_rest_in_one_send_in_order():
    service, client, transport = await counting_client()
    connection = client.connection
    frames_before, sends_before = service.write_counters.frames, service.write_counters.sends
    for request_id in range(5):
        connection.write_command(commands.success(request_id))
    assert transport.sends == 1, "the first frame waits for nothing"
    assert [a.success.request_id for a in Client(connection, transport).peek()] == [0]
    await asyncio.sleep(0)
    assert transport.sends == 2, "the other four leave together when the turn ends"
    answers = client.answers()
    assert [(a.type, a.success.request_id) for a in answers] == [(T.SUCCESS, i) for i in range(5)]
    # The next turn starts afresh: its first frame leaves at once.
    connection.write_command(commands.pong())
    assert transport.sends == 3
    assert [a.type for a in client.answers()] == [T.PONG]
    await asyncio.sleep(0)
    assert transport.sends == 3, "nothing was held back"
    assert service.write_counters.frames - frames_before == 6
    assert service.write_counters.sends - sends_before == 3
    transport.close()
    await service.close()


async def test_frames_past_the_bound_leave_at_once():
    service, client, transport = await counting_client()
    connection = client.connection
    big = b"x" * (WRITE_COALESCE_BYTES // 2)
    connection.write_buffers([b"head"])
    connection.write_buffers([big])
    assert transport.sends == 1
    connection.write_buffers([big])          # the held-back frames reach the bound
    assert transport.sends == 2 and bytes(transport.written) == b"head" + big + big
    connection.write_buffers([b"tail"])
    assert transport.sends == 2
    await asyncio.sleep(0)
    assert transport.sends == 3 and bytes(transport.written).endswith(b"tail")
    transport.close()
    await service.close()


async def test_close_sends_what_was_held_back_first():
    service, client, transport = await counting_client()
    connection = client.connection
    connection.write_command(commands.pong())
    connection.write_command(commands.error(9, pb.ServiceNotReady, "going away"))
    connection.close()
    assert transport.is_closing()
    answers = Client(connection, transport).peek()
    assert [a.type for a in answers] == [T.PONG, T.ERROR] and answers[1].error.request_id == 9
    await asyncio.sleep(0)
    await service.close()


async def test_a_lost_connection_drops_what_it_held_back():
    service, client, transport = await counting_client()
    connection = client.connection
    connection.write_command(commands.pong())
    connection.write_command(commands.pong())
    connection.connection_lost(None)
    transport._closing = True
    await asyncio.sleep(0)
    assert transport.sends == 1 and connection._unsent == []
    connection.write_command(commands.pong())      # after the loss: nothing is kept
    assert connection._unsent == [] and transport.sends == 1
    await service.close()


def test_the_bound_is_a_few_frames_of_a_turn():
    # A turn's dispatch round sends up to its permits' messages; the bound keeps what
    # one connection holds back to tens of KiB.
    assert 16 * 1024 <= connection_module.WRITE_COALESCE_BYTES <= 1024 * 1024


async def test_confirmed_appends_wake_readers_before_their_receipts_in_append_order():
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    ledger_id = ledger.current_ledger_id
    order: list[str] = []
    waiter = ledger.wait_for_entries()
    waiter.add_done_callback(lambda _f: order.append("reader"))
    client.hold_adds = True
    first = ledger.append(b"one")
    second = ledger.append(b"two")
    first.add_done_callback(lambda _f: order.append("receipt one"))
    second.add_done_callback(lambda _f: order.append("receipt two"))
    await asyncio.sleep(0.01)
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        assert await first == Position(ledger_id, 0)
        assert await second == Position(ledger_id, 1)
    await asyncio.sleep(0)          # the callbacks scheduled with the awaiting task's wake-up
    assert order[0] == "reader"
    assert order[1:] == ["receipt one", "receipt two"]
    await ledger.close()
