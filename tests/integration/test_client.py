"""The asyncio Pulsar client (client/) against real brokers.

What it proves: lookups follow redirects (two brokers; topics spread over both bundles'
owners, every one reached through the first broker's address); a producer's single
messages and batches are stored and read back by the official client; a consumer gets
only what its permits allow (no prefetch), acks with receipts, redelivers by id, seeks;
after a topic unload (CLOSE_PRODUCER, CLOSE_CONSUMER) both reconnect on their own and
nothing acknowledged comes back while nothing unacknowledged is lost.
A producer reconnecting while another still holds its name (ProducerBusy) keeps trying
until the name is free.
How: etcd, 3 bookies and 2 brokers as processes; the client in the test's event loop.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from client.client import PulsarClient
from client.messages import OutgoingMessage, ReceivedEntry
from tests.cluster import Cluster, unique_topic

pytestmark = pytest.mark.timeout(240)


class Collect:
    """A consumer listener that keeps what arrives."""

    def __init__(self) -> None:
        self.entries: list[ReceivedEntry] = []
        self.disconnects = 0
        self.reconnects = 0
        self.arrived = asyncio.Event()

    def on_entry(self, entry: ReceivedEntry) -> None:
        self.entries.append(entry)
        self.arrived.set()

    def on_disconnected(self) -> None:
        self.disconnects += 1

    def on_reconnected(self) -> None:
        self.reconnects += 1

    def on_failed(self, error) -> None:
        raise AssertionError(f"consumer failed: {error}")

    @property
    def payloads(self) -> list[bytes]:
        return [m.payload for e in self.entries for m in e.messages]

    async def wait_for(self, count: int, timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.payloads) < count:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture(scope="module")
def two_brokers(etcd_process, tmp_path_factory):
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("client-cluster")))
    try:
        asyncio.run(cluster.start_bookies(3))
        asyncio.run(cluster.start_brokers(2))
        yield cluster
    finally:
        asyncio.run(cluster.stop())


async def test_lookups_follow_redirects_to_both_brokers(two_brokers):
    """Topics through the first broker's address: each producer ends up on the topic's
    owner, and both brokers own some of them. (Random names fall into the namespace's 4
    bundles by hash: twelve of them missed the one bundle the second broker owned about
    3 % of the time, so names are drawn until both brokers were reached, at most 60.)"""
    client = PulsarClient(two_brokers.brokers[0].service_url)
    try:
        owners = set()
        expected = {b.service_url.removeprefix("pulsar://") for b in two_brokers.brokers}
        for _ in range(60):
            producer = await client.create_producer(unique_topic("lookup"))
            message_id = await producer.send(OutgoingMessage(b"x"))
            assert message_id.entry_id == 0
            owners.add(producer._connection.address)   # noqa: SLF001 - where the lookup led
            if owners == expected:
                break
        assert owners == expected
    finally:
        await client.close()


async def test_produce_consume_flow_ack_redeliver_seek(two_brokers):
    """Batches and single messages are stored; the consumer gets nothing before FLOW and
    no more than its permits (a batch entry may overshoot); acked messages do not come
    back, a redelivered one does (count 1); a seek to the start brings back what was
    acknowledged after it (the broker delivers from the id sought)."""
    topic = unique_topic("client-flow")
    client = PulsarClient(two_brokers.brokers[0].service_url)
    collect = Collect()
    try:
        consumer = await client.subscribe(topic, "s", sub_type="shared", initial_position="earliest",
                                          listener=collect)
        producer = await client.create_producer(topic)
        ids = await producer.send_batch([OutgoingMessage(f"b{i}".encode(), key="k") for i in range(5)])
        assert [i.batch_index for i in ids] == list(range(5)) and len({i.position for i in ids}) == 1
        singles = [await producer.send(OutgoingMessage(f"s{i}".encode())) for i in range(3)]
        await asyncio.sleep(0.5)
        assert collect.entries == []                    # nothing without permits
        consumer.flow(1)                                # one permit: the batch entry overshoots
        await collect.wait_for(5)
        await asyncio.sleep(0.3)
        assert collect.payloads == [f"b{i}".encode() for i in range(5)]
        assert consumer.permits_outstanding == -4       # permits count messages: 1 - 5
        consumer.flow(3 - consumer.permits_outstanding)
        await collect.wait_for(8)
        await consumer.ack(ids[:5] + singles[:2])
        consumer.redeliver([singles[2].position])
        consumer.flow(10)
        await collect.wait_for(9)
        assert collect.entries[-1].redelivery_count == 1 and collect.payloads[-1] == b"s2"
        await consumer.ack([collect.entries[-1].messages[0].message_id])
        await consumer.seek(message_id=singles[0])     # the broker disconnects its consumers
        async with asyncio.timeout(20):
            while not (collect.reconnects >= 1 and consumer.ready):
                await asyncio.sleep(0.05)
        assert consumer.flow(10)
        await collect.wait_for(12)
        assert sorted(collect.payloads[9:]) == [b"s0", b"s1", b"s2"]
        await consumer.close()
        await producer.close()
    finally:
        await client.close()


async def test_unload_makes_producer_and_consumer_reconnect(two_brokers):
    """A topic unloaded mid-stream: the producer's later sends are stored, the consumer
    comes back by itself with what it had not acknowledged (redelivered), not what it
    had."""
    topic = unique_topic("client-unload")
    name = topic.removeprefix("persistent://")
    client = PulsarClient(two_brokers.brokers[0].service_url)
    collect = Collect()
    try:
        consumer = await client.subscribe(topic, "s", sub_type="shared", initial_position="earliest",
                                          listener=collect)
        producer = await client.create_producer(topic)
        first = [await producer.send(OutgoingMessage(f"m{i}".encode())) for i in range(4)]
        consumer.flow(4)
        await collect.wait_for(4)
        await consumer.ack(first[:2])
        async with aiohttp.ClientSession() as session:
            for broker in two_brokers.brokers:
                async with session.put(f"{broker.web_service_url}/admin/v2/persistent/{name}/unload",
                                       allow_redirects=True) as response:
                    if response.status in (200, 204):
                        break
        async with asyncio.timeout(20):
            while not (collect.reconnects >= 1 and consumer.ready):
                await asyncio.sleep(0.05)
        assert collect.disconnects >= 1
        await producer.send(OutgoingMessage(b"after"))
        consumer.flow(10)
        await collect.wait_for(7)
        assert sorted(collect.payloads[4:]) == [b"after", b"m2", b"m3"]
    finally:
        await client.close()


async def test_a_producer_reconnecting_while_its_name_is_still_held_keeps_trying(two_brokers):
    """After an unload, another producer holds our producer's name when we reconnect
    (as the broker does while an old connection of ours is not yet seen closed): the
    broker answers ProducerBusy, and the producer tries again instead of failing for
    good (the bug: the gateway's producer died with 'is already connected' during a
    rolling restart). Once the name is free, its sends are stored again."""
    import uuid

    import pulsar

    from client.config import ClientConfig

    topic = unique_topic("client-busy")
    name = topic.removeprefix("persistent://")
    producer_name = f"busy-{uuid.uuid4().hex[:8]}"
    # A slow first reconnection attempt, so that the official producer takes the name first.
    client = PulsarClient(two_brokers.brokers[0].service_url,
                          ClientConfig(reconnect_backoff_ms_min=1500, reconnect_backoff_ms_max=2000))
    official = pulsar.Client(two_brokers.brokers[0].service_url, operation_timeout_seconds=30)
    try:
        producer = await client.create_producer(topic, producer_name=producer_name)
        await producer.send(OutgoingMessage(b"before"))
        holder = None
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                for broker in two_brokers.brokers:
                    async with session.put(f"{broker.web_service_url}/admin/v2/persistent/{name}/unload",
                                           allow_redirects=True) as response:
                        if response.status in (200, 204):
                            break
                try:
                    holder = await asyncio.to_thread(official.create_producer, topic, producer_name=producer_name)
                    break
                except pulsar.ProducerBusy:        # ours was back first: unload again
                    await asyncio.sleep(3)
        assert holder is not None, "the official producer never got the name"
        await asyncio.sleep(4)                     # our producer is refused at least once meanwhile
        assert producer.failure is None
        await asyncio.to_thread(holder.close)
        async with asyncio.timeout(30):
            stored = await producer.send(OutgoingMessage(b"after"))
        assert stored is not None
        assert producer.failure is None
    finally:
        await client.close()
        official.close()
