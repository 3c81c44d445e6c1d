"""Everyday features of the official Pulsar client across a broker ``kill -9``: a
cluster of its own (etcd, two bookies, one broker restarted on the same ports).

Proves: delayed messages on a shared subscription that were not due when the broker
was killed arrive after the restart, once due, and none is lost; with deduplication on,
a producer that comes back after the kill gets its last sequence id (restored from the
snapshot in etcd and topped up from the entries after it), and what it sends again is
not stored twice; a compacted ledger of more keys than the former 20,000 cap,
written before the kill, serves a read_compacted reader after it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from datetime import timedelta

import pulsar

from broker.deduplication import SNAPSHOT_INTERVAL_ENTRIES, SNAPSHOT_PROPERTY
from managed_ledger.managed_ledger_info import ManagedLedgerInfo
from common.topic_name import TopicName
from metadata import keys, open_store
from tests.cluster import Cluster, unique, unique_topic

RECEIVE_TIMEOUT_MS = 30_000
COMPACTED_KEYS = 21_000          # more than the 20,000 entries the former compacted view could name
DELETED_KEYS = 1_000
# Past the deduplication snapshot interval (1,000 stored entries), with entries after it.
DEDUP_MESSAGES = SNAPSHOT_INTERVAL_ENTRIES + 10


def _admin(broker, method: str, path: str, body: object | None = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{broker.web_service_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=15).close()


async def test_delayed_delivery_deduplication_and_compaction_survive_broker_kill(etcd_process, tmp_path):
    """21,000 keys are written twice ("old-…" then "new-…", in batches), 1,000 of them are
    then deleted by null-value tombstones, and PUT …/compaction writes the compacted
    ledger (GET reports SUCCESS). Five messages delayed by 4 s and one not delayed go to
    a shared subscription; the consumer gets the undelayed one. In a namespace with
    deduplication on, a producer named "writer" stores sequence ids 0..1009, and the
    deduplication snapshot in etcd (taken after 1,000 entries) names it with an id
    below 1009. Then the broker is killed with SIGKILL and started again: the five
    delayed ones all arrive, none before its due time; a new "writer" has
    last_sequence_id() 1009 (the snapshot topped up from the entries after it), and
    its resends of 1007..1009 are not stored again; a reader with is_read_compacted=True from earliest
    gets exactly the 20,000 live keys, each once with its latest value, then a message
    produced after the restart, and a reader without it (the namespace retains everything)
    gets every message."""
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        (broker,) = await cluster.start_brokers(1)
        topic = unique_topic("delayed-kill")
        namespace = unique("dedup-ns")
        _admin(broker, "PUT", f"/admin/v2/namespaces/public/{namespace}")
        _admin(broker, "POST", f"/admin/v2/namespaces/public/{namespace}/deduplication", True)
        dedup_topic = f"persistent://public/{namespace}/{unique('dedup-kill')}"
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            writer = client.create_producer(dedup_topic, producer_name="writer", batching_enabled=False,
                                            block_if_queue_full=True)
            for i in range(DEDUP_MESSAGES):
                writer.send_async(f"d{i}".encode(), None)
            writer.flush()
            assert writer.last_sequence_id() == DEDUP_MESSAGES - 1
            # The snapshot taken after 1,000 stored entries is in etcd before the kill,
            # so the new owner restores it and tops it up from the entries after it.
            snapshot = await _wait_for_dedup_snapshot(cluster, dedup_topic)
            assert SNAPSHOT_INTERVAL_ENTRIES - 1 <= snapshot["producers"]["writer"] < DEDUP_MESSAGES - 1, snapshot
            compacted_topic = _write_and_compact(client, broker)
            consumer = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
            producer = client.create_producer(topic, batching_enabled=False)
            due_ms = int(time.time() * 1000) + 4000
            for i in range(5):
                producer.send(f"late-{i}".encode(), deliver_at=due_ms)
            producer.send(b"now")
            first = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            assert first.data() == b"now"
            consumer.acknowledge(first)
            broker.kill9()
            await broker.start()
            late = await asyncio.to_thread(
                lambda: [consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS) for _ in range(5)])
            assert int(time.time() * 1000) >= due_ms
            assert sorted(m.data() for m in late) == [f"late-{i}".encode() for i in range(5)]
        finally:
            client.close()
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            writer = client.create_producer(dedup_topic, producer_name="writer", batching_enabled=False)
            last = DEDUP_MESSAGES - 1
            assert writer.last_sequence_id() == last
            for i in (last - 2, last - 1, last):
                writer.send(f"d{i}-again".encode(), sequence_id=i)
            writer.send(f"d{last + 1}".encode())
            # The dedup namespace retains nothing: what keeps the first ledger for this
            # read is the deduplication snapshot taken inside it (retention keeps what a
            # new owner would replay). Before that rule a retention round right after
            # the restart could delete it (a rare failure of this test).
            reader = client.create_reader(dedup_topic, pulsar.MessageId.earliest, receiver_queue_size=2000)
            got = _read(reader, DEDUP_MESSAGES + 1, broker, dedup_topic)
            assert got == [f"d{i}".encode() for i in range(DEDUP_MESSAGES + 1)]
            assert not reader.has_message_available()
            await asyncio.to_thread(_read_compacted_and_all, client, compacted_topic)
        finally:
            client.close()
    finally:
        await cluster.stop()


def _read(reader, count: int, broker, topic: str) -> list[bytes]:
    """``count`` messages from ``reader``; if one does not come in time, fails saying how
    many came, the last of them, and the broker's view of the topic (its stats)."""
    got: list[bytes] = []
    try:
        while len(got) < count:
            got.append(reader.read_next(RECEIVE_TIMEOUT_MS).data())
    except pulsar.Timeout:
        path = TopicName.parse(topic).rest_path
        with urllib.request.urlopen(f"{broker.web_service_url}/admin/v2/{path}/stats", timeout=15) as response:
            stats = response.read().decode()
        raise AssertionError(f"read {len(got)} of {count} (last {got[-1:]}) before a {RECEIVE_TIMEOUT_MS} ms "
                             f"timeout; the topic's stats: {stats[:3000]}") from None
    return got


def _write_and_compact(client, broker) -> str:
    # Its own namespace, retaining everything: compaction keeps only what comes after
    # its horizon (as in Pulsar), so without retention the broker may trim what the
    # compactor has passed, and the full read from the start below would race it.
    namespace = unique("compact-ns")
    _admin(broker, "PUT", f"/admin/v2/namespaces/public/{namespace}")
    _admin(broker, "POST", f"/admin/v2/namespaces/public/{namespace}/retention",
           {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    local = unique("compacted-kill")
    topic = f"persistent://public/{namespace}/{local}"
    path = f"/admin/v2/persistent/public/{namespace}/{local}/compaction"
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=50, block_if_queue_full=True)
    for generation in ("old", "new"):
        for i in range(COMPACTED_KEYS):
            producer.send_async(f"{generation}-{i}".encode(), None, partition_key=f"k{i}")
        producer.flush()
    for i in range(DELETED_KEYS):
        producer.send_async(None, None, partition_key=f"k{i}")
    producer.flush()
    producer.close()
    _admin(broker, "PUT", path)
    deadline = time.monotonic() + 60
    while (status := _admin_json(broker, path))["status"] != "SUCCESS":
        assert status["status"] == "RUNNING", status
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return topic


def _read_compacted_and_all(client, topic: str) -> None:
    client.create_producer(topic, batching_enabled=False).send(b"after", partition_key="k0")
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True, receiver_queue_size=5000)
    live = COMPACTED_KEYS - DELETED_KEYS
    got = [reader.read_next(RECEIVE_TIMEOUT_MS) for _ in range(live + 1)]
    latest = {m.partition_key(): m.data() for m in got[:live]}
    assert len(latest) == live
    assert latest == {f"k{i}": f"new-{i}".encode() for i in range(DELETED_KEYS, COMPACTED_KEYS)}
    assert got[-1].data() == b"after"
    assert not reader.has_message_available()
    full = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
    total = 2 * COMPACTED_KEYS + DELETED_KEYS + 1
    assert len([full.read_next(RECEIVE_TIMEOUT_MS) for _ in range(total)]) == total
    assert not full.has_message_available()


async def _wait_for_dedup_snapshot(cluster, topic: str) -> dict:
    """The deduplication snapshot in the topic's managed-ledger record once it names
    the producer "writer" (written by the broker in the background; up to 15 s)."""
    store = open_store(cluster.metadata_url)
    try:
        key = keys.managed_ledger(TopicName.parse(topic).key_path)
        deadline = time.monotonic() + 15
        while True:
            record = await store.get(key)
            text = ManagedLedgerInfo.decode(record.value).properties.get(SNAPSHOT_PROPERTY) if record else None
            if text is not None and "writer" in json.loads(text)["producers"]:
                return json.loads(text)
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.1)
    finally:
        await store.close()


def _admin_json(broker, path: str) -> dict:
    with urllib.request.urlopen(f"{broker.web_service_url}{path}", timeout=15) as response:
        return json.loads(response.read())

