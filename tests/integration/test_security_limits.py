"""Limits against abuse on a real broker (etcd, 1 bookie, 1 broker with small limits).

Proves: a connection that sends no CONNECT is closed after ``--connect-timeout-s``; a
frame begun and not finished (slow-loris) is closed after ``--frame-timeout-s``, while
a connection that keeps completing frames is not; connections from one address past
``--connections-per-address-max`` are closed at once and the count frees up when
others leave; a topic refuses producers past ``--producers-per-topic-max`` with
ProducerBusy (the official client's ProducerBusy); the admin API refuses a body over
its limit with 413.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from protocol import commands
from protocol.codec import encode_command
from protocol.proto import pulsar_api_pb2 as pb
from tests.cluster import Cluster, unique


@pytest.fixture(scope="module")
def limited(etcd_process, tmp_path_factory):
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("limits")))
    try:
        asyncio.run(cluster.start_bookies(1))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--connect-timeout-s", "1", "--frame-timeout-s", "1", "--connections-per-address-max", "6",
            "--producers-per-topic-max", "2"]))
        yield cluster
    finally:
        asyncio.run(cluster.stop())


def _address(cluster) -> tuple[str, int]:
    host, port = cluster.brokers[0].service_url.removeprefix("pulsar://").rsplit(":", 1)
    return host, int(port)


def _connect_frame() -> bytes:
    return encode_command(commands.wrap(pb.CommandConnect(client_version="limits-test", protocol_version=20)))


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True if the peer closes before ``timeout_s`` (whatever it sent before)."""
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
        return True
    except TimeoutError:
        return False


async def test_connect_and_frame_deadlines(limited):
    host, port = _address(limited)
    # No CONNECT at all.
    reader, writer = await asyncio.open_connection(host, port)
    assert await _closed_within(reader, 15)
    writer.close()
    # CONNECT, then half a frame (its size prefix and a few bytes) and nothing more.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_connect_frame())
    writer.write(struct.pack(">II", 100, 96) + b"\x08")
    await writer.drain()
    assert await _closed_within(reader, 15)
    writer.close()
    # A connection that keeps completing PINGs, each sent in two halves, lives on.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_connect_frame())
    ping = encode_command(commands.ping())
    started = time.monotonic()
    while time.monotonic() - started < 3:
        writer.write(ping[:3])
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(ping[3:])
        await writer.drain()
        await asyncio.sleep(0.05)
    assert not await _closed_within(reader, 0.5)
    writer.close()


async def test_connections_per_address(limited):
    host, port = _address(limited)
    held = []
    for _ in range(6):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_connect_frame())
        held.append((reader, writer))
    await asyncio.sleep(0.5)
    reader, writer = await asyncio.open_connection(host, port)
    assert await _closed_within(reader, 10)   # the seventh
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    await asyncio.sleep(1.0)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_connect_frame())
    await writer.drain()
    assert not await _closed_within(reader, 0.5)   # room again
    writer.close()


def test_producers_per_topic_and_http_body_limit(limited):
    client = pulsar.Client(limited.brokers[0].service_url, operation_timeout_seconds=10)
    try:
        topic = f"persistent://public/default/{unique('limit')}"
        producers = [client.create_producer(topic) for _ in range(2)]
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        producers[0].close()
        client.create_producer(topic).send(b"room again")
    finally:
        client.close()
    body = json.dumps({"adminRoles": ["x" * 2_000_000], "allowedClusters": ["standalone"]}).encode()
    request = urllib.request.Request(f"{limited.brokers[0].web_service_url}/admin/v2/tenants/{unique('big')}",
                                     data=body, method="PUT", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 413
