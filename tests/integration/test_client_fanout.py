"""Fan-out in one client: several subscriptions of one topic read through one
connection share each batch entry's split (client/split_cache.py) against a real
Magnetar broker, and each still sees exactly what its own subscription is owed.

What it proves:
- three exclusive subscriptions of one topic, one compressed (LZ4) batch entry and one
  plain one: each entry is split once and taken from the cache by the other two
  (hits counted on the connection); one subscription changing its messages'
  properties leaves the others' alone;
- one subscription acknowledges half of a batch by batch index, another nothing;
  after both ask for redelivery, the broker sends the entries again with each one's
  ack set and a redelivery count of 1: the first gets only the other half of that
  batch, the second all of it, both through the shared split; the third subscription
  (all acknowledged) gets nothing again;
- the public API (magnetar.client): four subscriptions reading a 3,000-message batched
  backlog through one Client each get every message once, in order, with the cache in
  use.
How: the module's cluster (etcd, 3 bookies, 1 broker), the client in the test's event
loop. About 5 s.
"""

from __future__ import annotations

import asyncio

import pytest

from client.client import PulsarClient
from client.messages import OutgoingMessage, ReceivedEntry
from client.producer import Producer
from magnetar.client import Client, CompressionType, InitialPosition
from protocol.proto import pulsar_api_pb2 as pb
from tests.cluster import unique_topic

pytestmark = pytest.mark.timeout(120)


class Collect:
    def __init__(self) -> None:
        self.entries: list[ReceivedEntry] = []
        self.arrived = asyncio.Event()

    def on_entry(self, entry: ReceivedEntry) -> None:
        self.entries.append(entry)
        self.arrived.set()

    def on_disconnected(self) -> None:
        pass

    def on_reconnected(self) -> None:
        pass

    def on_failed(self, error) -> None:
        raise AssertionError(f"consumer failed: {error}")

    async def wait_for_entries(self, count: int, timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.entries) < count:
                self.arrived.clear()
                await self.arrived.wait()


def connection_splits(client: PulsarClient):
    (connection,) = client.pool._connections.values()
    return connection.splits


async def test_subscriptions_share_splits_and_keep_their_own_acks_and_redeliveries(pulsar_cluster):
    topic = unique_topic("fanout-split")
    client = PulsarClient(pulsar_cluster.brokers[0].service_url)
    try:
        collects = {name: Collect() for name in ("all", "half", "none")}
        consumers = {name: await client.subscribe(topic, name, sub_type="exclusive", initial_position="earliest",
                                                  listener=collect)
                     for name, collect in collects.items()}
        compressed = Producer(client.pool, topic, producer_name="lz4", compression=pb.LZ4)
        await compressed.start()
        first = await compressed.send_batch([OutgoingMessage(f"a{i}".encode() * 20, properties={"i": str(i)})
                                             for i in range(10)])
        await compressed.close()
        producer = await client.create_producer(topic)
        second = await producer.send_batch([OutgoingMessage(f"b{i}".encode(), key=f"k{i}") for i in range(10)])
        splits = connection_splits(client)
        hits_before = splits.hits
        for consumer in consumers.values():
            assert consumer.flow(100)
        for collect in collects.values():
            await collect.wait_for_entries(2)
        # Two entries, three subscriptions: split twice, taken from the cache four times.
        assert splits.hits - hits_before == 4, (splits.hits, splits.misses, splits.mismatches)
        for collect in collects.values():
            assert [m.payload for e in collect.entries for m in e.messages] == \
                [f"a{i}".encode() * 20 for i in range(10)] + [f"b{i}".encode() for i in range(10)]
            assert [m.properties for m in collect.entries[0].messages] == [{"i": str(i)} for i in range(10)]
        for message in collects["all"].entries[0].messages:
            message.properties["i"] = "changed"
        assert collects["half"].entries[0].messages[3].properties == {"i": "3"}
        assert collects["none"].entries[0].messages[3].properties == {"i": "3"}

        await consumers["all"].ack(first + second)
        await consumers["half"].ack(first[0::2])          # batch-index acknowledgements
        hits_before = splits.hits
        assert consumers["half"].redeliver_all() and consumers["none"].redeliver_all()
        await collects["half"].wait_for_entries(4)
        await collects["none"].wait_for_entries(4)
        assert splits.hits - hits_before >= 2       # the redelivered entries through the shared splits
        half, none = collects["half"].entries[2:], collects["none"].entries[2:]
        assert [e.redelivery_count for e in half + none] == [1, 1, 1, 1]
        assert [m.payload for m in half[0].messages] == [f"a{i}".encode() * 20 for i in range(1, 10, 2)]
        assert [m.message_id.batch_index for m in half[0].messages] == [1, 3, 5, 7, 9]
        assert [m.payload for m in half[1].messages] == [f"b{i}".encode() for i in range(10)]
        assert [m.payload for e in none for m in e.messages] == \
            [f"a{i}".encode() * 20 for i in range(10)] + [f"b{i}".encode() for i in range(10)]
        await asyncio.sleep(0.5)
        assert len(collects["all"].entries) == 2          # all acknowledged: nothing again
    finally:
        await client.close()


async def test_four_subscriptions_of_one_client_each_read_the_whole_backlog(pulsar_cluster):
    topic = unique_topic("fanout-api")
    count = 3_000
    async with Client(pulsar_cluster.brokers[0].service_url) as client:
        producer = await client.create_producer(topic, batching_max_messages=500, max_pending_messages=count,
                                                compression_type=CompressionType.LZ4)
        await asyncio.gather(*(producer.send(f"m{i}".encode()) for i in range(count)))
        consumers = await asyncio.gather(*(client.subscribe(topic, f"fan-{n}", initial_position=InitialPosition.Earliest)
                                           for n in range(4)))

        async def read_all(consumer) -> list[bytes]:
            got = []
            async with asyncio.timeout(60):
                while len(got) < count:
                    message = await consumer.receive()
                    got.append(message.data())
                    await consumer.acknowledge(message)
            return got

        for got in await asyncio.gather(*(read_all(consumer) for consumer in consumers)):
            assert got == [f"m{i}".encode() for i in range(count)]
        (connection,) = client._pool._connections.values()
        assert connection.splits.hits >= 3, (connection.splits.hits, connection.splits.misses)
