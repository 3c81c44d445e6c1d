"""Deduplication across retention and a broker ``kill -9``: a cluster of its own (etcd,
two bookies, one broker that rolls its ledgers every 300 entries and checks retention
every 0.5 s, restarted on the same ports).

Proves: retention keeps the entries stored after the last deduplication snapshot even
when nothing else holds them (no subscription, no retention policy), so a broker
killed before its next snapshot restores every producer's last sequence id from the
snapshot plus those entries, and a resend of what was stored after the snapshot is
still a duplicate. Before the fix, retention deleted the ledger holding them and the
restarted broker took producer "a"'s resends for new messages.
"""

from __future__ import annotations

import asyncio
import time

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


async def test_retention_keeps_what_deduplication_replays_after_a_kill(etcd_process, tmp_path):
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        (broker,) = await cluster.start_brokers(1, extra_args=archiving_broker_args(LEDGER_ENTRIES_MAX))
        namespace = unique("dedup-retention")
        http_json("PUT", f"{broker.web_service_url}/admin/v2/namespaces/public/{namespace}")
        http_json("POST", f"{broker.web_service_url}/admin/v2/namespaces/public/{namespace}/deduplication", True)
        topic = f"persistent://public/{namespace}/{unique('t')}"
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
            deadline = time.monotonic() + 20
            while len(ledgers := _ledger_ids(broker, topic)) > 2:
                assert time.monotonic() < deadline, ledgers
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)     # four more retention rounds: the fourth ledger stays
            ledgers = _ledger_ids(broker, topic)
            assert len(ledgers) == 2, ledgers
        finally:
            client.close()
        broker.kill9()
        await broker.start()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer(topic, producer_name="a", batching_enabled=False)
            assert producer.last_sequence_id() == A_MESSAGES - 1
            # A resend of what "a" stored after the snapshot is not stored again.
            resent = producer.send(b"a1100-again", sequence_id=1100)
            assert (resent.ledger_id(), resent.entry_id()) == (-1, -1), resent
            reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1000)
            first = reader.read_next(30_000).data()
            # The oldest entry kept is the first of the fourth ledger ("a" 900).
            assert first == b"a900", first
        finally:
            client.close()
    finally:
        await cluster.stop()
