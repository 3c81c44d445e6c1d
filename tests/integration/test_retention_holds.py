"""What retention keeps although no subscription and no retention policy holds it: a
cluster of its own (etcd, two bookies, one broker that rolls its ledgers every 300
entries and checks retention every 0.5 s, restarted on the same ports).

Proves:
- the entries stored after the last deduplication snapshot stay, so a broker killed
  before its next snapshot restores every producer's last sequence id from the snapshot
  plus those entries, and a resend of what was stored after the snapshot is still a
  duplicate (before, retention deleted the ledger holding them and the restarted broker
  took producer "a"'s resends for new messages: last_sequence_id 999 for 1149), also
  while only a reader has the topic loaded, and turning deduplication off lets them go;
- once a topic was compacted, the entries after the horizon stay until the next
  compaction has read them, so its compacted view has every key's latest value (before,
  keys written after the horizon into a ledger that closed before the next run were lost
  from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator

import pulsar

from broker.deduplication import SNAPSHOT_INTERVAL_ENTRIES
from common.topic_name import TopicName
from tests.cluster import Cluster, archiving_broker_args, http_json, unique

LEDGER_ENTRIES_MAX = 300
# "a" stores 0..1149: its snapshot comes after 1,000 entries (in the fourth ledger,
# entries 900..1199), 150 of its entries follow it there; "b" then fills that ledger
# and starts the fifth, which closes the fourth and leaves it to retention.
A_MESSAGES = SNAPSHOT_INTERVAL_ENTRIES + 150
B_MESSAGES = 200


def _ledger_ids(broker, topic: str) -> list[int]:
    path = TopicName.parse(topic).rest_path
    stats = http_json("GET", f"{broker.web_service_url}/admin/v2/{path}/internalStats")
    return [ledger["ledgerId"] for ledger in stats["ledgers"]]


async def _wait_for_ledgers(broker, topic: str, count: int) -> None:
    """Waits until retention has left ``count`` ledgers, then four more retention rounds,
    and checks that it still leaves ``count`` (not fewer)."""
    deadline = time.monotonic() + 20
    while len(ledgers := _ledger_ids(broker, topic)) > count:
        assert time.monotonic() < deadline, ledgers
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.0)
    ledgers = _ledger_ids(broker, topic)
    assert len(ledgers) == count, ledgers


def _compact(broker, topic: str) -> None:
    path = f"{broker.web_service_url}/admin/v2/{TopicName.parse(topic).rest_path}/compaction"
    http_json("PUT", path)
    deadline = time.monotonic() + 60
    while (status := http_json("GET", path))["status"] != "SUCCESS":
        assert status["status"] == "RUNNING", status
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


@contextlib.asynccontextmanager
async def _topic_of_its_own(etcd_process, tmp_path, policies: dict[str, object]) -> AsyncIterator[tuple[object, str]]:
    """(the broker, a topic name) in a cluster of its own and a namespace with only
    ``policies`` set; the cluster stops after."""
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        (broker,) = await cluster.start_brokers(1, extra_args=archiving_broker_args(LEDGER_ENTRIES_MAX))
        namespace = unique("holds")
        http_json("PUT", f"{broker.web_service_url}/admin/v2/namespaces/public/{namespace}")
        for policy, value in policies.items():
            http_json("POST", f"{broker.web_service_url}/admin/v2/namespaces/public/{namespace}/{policy}", value)
        yield broker, f"persistent://public/{namespace}/{unique('t')}"
    finally:
        await cluster.stop()


def _read_all(reader) -> dict[str, bytes]:
    """Each key's last value, reading until the reader has nothing more."""
    latest: dict[str, bytes] = {}
    while reader.has_message_available():
        message = reader.read_next(30_000)
        latest[message.partition_key()] = message.data()
    return latest


async def test_retention_keeps_what_deduplication_replays_after_a_kill(etcd_process, tmp_path):
    async with _topic_of_its_own(etcd_process, tmp_path, {"deduplication": True}) as (broker, topic):
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            for name, count in (("a", A_MESSAGES), ("b", B_MESSAGES)):
                producer = client.create_producer(topic, producer_name=name, batching_enabled=False,
                                                  block_if_queue_full=True)
                for i in range(count):
                    producer.send_async(f"{name}{i}".encode(), None)
                producer.flush()
                assert producer.last_sequence_id() == count - 1
            # Five ledgers; retention may take the three wholly before the snapshot.
            await _wait_for_ledgers(broker, topic, 2)
        finally:
            client.close()
        broker.kill9()
        await broker.start()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            # A reader loads the topic (deduplication is turned on by the first producer
            # only): the snapshot in the topic's record holds the fourth ledger anyway.
            reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1000)
            first = reader.read_next(30_000).data()
            assert first == b"a900", first       # the first entry of the fourth ledger
            await _wait_for_ledgers(broker, topic, 3)    # the fourth, the fifth, a new one
            producer = client.create_producer(topic, producer_name="a", batching_enabled=False)
            assert producer.last_sequence_id() == A_MESSAGES - 1
            # A resend of what "a" stored after the snapshot is not stored again.
            resent = producer.send(b"a1100-again", sequence_id=1100)
            assert (resent.ledger_id(), resent.entry_id()) == (-1, -1), resent
            # Deduplication turned off: its snapshot goes, and what it held with it.
            namespace = TopicName.parse(topic).namespace_name
            http_json("POST", f"{broker.web_service_url}/admin/v2/namespaces/{namespace}/deduplication", False)
            await _wait_for_ledgers(broker, topic, 1)
        finally:
            client.close()


async def test_retention_keeps_what_the_next_compaction_reads(etcd_process, tmp_path):
    async with _topic_of_its_own(etcd_process, tmp_path, {}) as (broker, topic):
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)

            def write(generation: str, keys: range) -> None:
                for i in keys:
                    producer.send_async(f"{generation}-{i}".encode(), None, partition_key=f"k{i}")
                producer.flush()

            first, later = range(0, 150), range(150, 3 * LEDGER_ENTRIES_MAX + 50)
            write("v1", first)                        # half of the first ledger:
            write("v2", first)                        # its keys' final values in the other half
            _compact(broker, topic)                   # horizon: its last entry
            write("v3", later)                        # two more full ledgers and a current one
            # Retention may take the first ledger (the compacted one covers it), not the
            # two after the horizon.
            await _wait_for_ledgers(broker, topic, 3)
            _compact(broker, topic)
            # The first ledger's keys only the compacted ledger still holds (before the
            # topic's first entry now); the later ones, the topic and the compacted ledger.
            expected = {**{f"k{i}": f"v2-{i}".encode() for i in first},
                        **{f"k{i}": f"v3-{i}".encode() for i in later}}
            reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True,
                                          receiver_queue_size=1000)
            assert _read_all(reader) == expected
            reader.seek(pulsar.MessageId.earliest)         # and again, the same
            assert _read_all(reader) == expected
            # A reader that loses its broker inside the deleted range comes back with its
            # last message id as the start, and goes on from there.
            slow = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True,
                                        receiver_queue_size=10)
            halfway = [slow.read_next(30_000) for _ in range(50)]
            assert halfway[-1].message_id().ledger_id() < _ledger_ids(broker, topic)[0]
            http_json("PUT", f"{broker.web_service_url}/admin/v2/{TopicName.parse(topic).rest_path}/unload")
            # read_next waits through the reconnection (has_message_available would ask
            # the broker while the reader is not attached yet: ConsumerNotFound).
            rest = [slow.read_next(30_000) for _ in range(len(expected) - len(halfway))]
            assert {m.partition_key(): m.data() for m in halfway + rest} == expected
            assert not slow.has_message_available()
        finally:
            client.close()
