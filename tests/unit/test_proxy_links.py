"""The proxy's pools of links to brokers (proxy/upstream.py's LinkPool) against a
stand-in broker on a loopback socket that answers CONNECT and LOOKUP and records the
CONNECTs it got: at most ``links_max`` links (the least recently used idle one goes),
idle links closed after ``idle_s``, each new link's CONNECT read from ``connect_fields``
at its opening (a refreshed credential reaches the next link), nothing left once the
pool is closed (its client connection went)."""

from __future__ import annotations

import asyncio

import pytest

from protocol import commands
from protocol.codec import NEED_DATA, CommandDecoder, encode_command
from protocol.proto import pulsar_api_pb2 as pb
from proxy.upstream import LinkPool, UpstreamGone

T = pb.BaseCommand


class StandInBroker(asyncio.Protocol):
    connects: list[pb.CommandConnect] = []
    open_now = 0

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.decoder = CommandDecoder()
        StandInBroker.open_now += 1

    def connection_lost(self, exc) -> None:
        StandInBroker.open_now -= 1

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        while (frame := self.decoder.next_command()) is not NEED_DATA:
            if frame.command.type == T.CONNECT:
                StandInBroker.connects.append(frame.command.connect)
                self.transport.write(encode_command(commands.connected("stand-in", 20, 5 * 1024 * 1024)))
            elif frame.command.type == T.LOOKUP:
                self.transport.write(encode_command(commands.lookup_response(
                    frame.command.lookupTopic.request_id, "pulsar://owner:6650", authoritative=True)))


async def settle(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_links_are_bounded_idle_closed_and_carry_the_latest_credential():
    StandInBroker.connects, StandInBroker.open_now = [], 0
    server = await asyncio.get_running_loop().create_server(StandInBroker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    counted = []
    credential = {"original_principal": "alice", "auth_data": b"proxy-token-1"}
    pool = LinkPool(connect_fields=lambda: dict(credential), tls_context=None, timeout_s=5,
                    frame_bytes_max=5 * 1024 * 1024, pending_max=10, links_max=2, idle_s=0.5,
                    on_count=counted.append)
    try:
        lookup = commands.wrap(pb.CommandLookupTopic(topic="persistent://t/n/x", request_id=0))
        first = await pool.get("a", "127.0.0.1", port, False)
        answer = await first.forward(lookup, 5)
        assert answer.command.lookupTopicResponse.brokerServiceUrl == "pulsar://owner:6650"
        assert await pool.get("a", "127.0.0.1", port, False) is first          # one link per broker
        credential["auth_data"] = b"proxy-token-2"
        await pool.get("b", "127.0.0.1", port, False)
        await pool.get("c", "127.0.0.1", port, False)                         # "a" is the least recently used
        assert pool.live() == ["c", "b"] and first.closed and sum(counted) == 2
        await settle(lambda: StandInBroker.open_now == 2)
        assert [c.auth_data for c in StandInBroker.connects] == [b"proxy-token-1", b"proxy-token-2",
                                                                 b"proxy-token-2"]
        assert {c.original_principal for c in StandInBroker.connects} == {"alice"}
        # Idle past idle_s: closed, and the stand-in sees them go.
        await settle(lambda: sum(counted) == 0)
        await settle(lambda: StandInBroker.open_now == 0)
        # Used again after that: a new link.
        again = await pool.get("a", "127.0.0.1", port, False)
        assert again is not first and not again.closed and sum(counted) == 1
    finally:
        pool.close()
    assert sum(counted) == 0
    await settle(lambda: StandInBroker.open_now == 0)
    with pytest.raises(UpstreamGone):
        await pool.get("a", "127.0.0.1", port, False)
    server.close()
    await server.wait_closed()
