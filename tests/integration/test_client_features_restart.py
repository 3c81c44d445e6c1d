"""Everyday features of the official Pulsar client across a broker ``kill -9``: a
cluster of its own (etcd, two bookies, one broker restarted on the same ports).

Proves: delayed messages on a shared subscription that were not due when the broker
was killed arrive after the restart, once due, and none is lost.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pulsar

from tests.cluster import Cluster, unique_topic

RECEIVE_TIMEOUT_MS = 30_000


async def test_delayed_delivery_survives_broker_kill(etcd_process, tmp_path):
    """Five messages delayed by 4 s and one not delayed go to a shared subscription; the
    consumer gets the undelayed one, then the broker is killed with SIGKILL and started
    again: the five delayed ones all arrive, none before its due time."""
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        (broker,) = await cluster.start_brokers(1)
        topic = unique_topic("delayed-kill")
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
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
    finally:
        await cluster.stop()
