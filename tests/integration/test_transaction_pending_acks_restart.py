"""Pending acknowledgements survive a ``kill -9`` of the broker (``magnetar
standalone`` starts it again on its port): messages acknowledged in a transaction still
open when the broker died stay held back from every consumer after the restart, until
the transaction ends.

Before the kill, through the wire-level client (tests/txn_wire.py: the official Python
client has no transaction API): on a Shared subscription T1 acknowledges m0 and m1 (open)
and T2 acknowledges m2 (open); on an Exclusive subscription of the same topic T3
acknowledges cumulatively up to m2 (open). Then the broker is killed with SIGKILL.

Proves, after the restart (the topic loaded by the new broker process, its pending
acknowledgements read back from etcd): an official consumer of the Shared subscription
gets m3..m5 only, and of the Exclusive one m3..m5 only; T1's commit acknowledges m0 and
m1 for good; T2's abort delivers m2 again; T3's abort delivers m0..m5 again in order on
the Exclusive subscription. A third subscription on which T1 also acknowledged, deleted
before the kill, left no record behind and is not made again by T1's commit; a record
of a subscription that does not exist (what a broker dying in the middle of deleting
one leaves) is removed when the restarted broker loads the topic.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request

import pulsar
import pytest

from bench.fanout_check import running_standalone
from common.topic_name import TopicName
from metadata import keys, open_store
from protocol.proto import pulsar_api_pb2 as pb
from tests.integration.test_standalone_supervision import broker_pid
from tests.integration.test_transactions import receive_all, topic_name
from tests.integration.test_transactions_restart import connected, ended_retrying

pytestmark = [pytest.mark.timeout(400), pytest.mark.long]


async def test_pending_acknowledgements_hold_messages_back_across_kill_9(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1, brokers=1) as (process, ready):
        service_url = ready["service_url"]
        port = int(service_url.rsplit(":", 1)[1])
        topic = topic_name("held-restart")
        client = pulsar.Client(service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer(topic)
            for i in range(6):
                await asyncio.to_thread(producer.send, f"m{i}".encode())
            wire = await connected(service_url)
            shared = await wire.subscribe(topic, "shared", sub_type=pb.CommandSubscribe.Shared)
            exclusive = await wire.subscribe(topic, "exclusive", sub_type=pb.CommandSubscribe.Exclusive)
            on_shared = [await shared.receive() for _ in range(6)]
            on_exclusive = [await exclusive.receive() for _ in range(6)]
            t1 = await wire.new_txn(timeout_ms=300_000)
            t2 = await wire.new_txn(timeout_ms=300_000)
            t3 = await wire.new_txn(timeout_ms=300_000)
            for message in on_shared[:2]:
                await shared.ack(message, t1)
            await shared.ack(on_shared[2], t2)
            await exclusive.ack(on_exclusive[2], t3, cumulative=True)

            # A third subscription, deleted while T1 holds an acknowledgement on it: its
            # record goes with it. A record of a subscription that does not exist (as
            # a broker dying between the cursor's deletion and the records' leaves it)
            # is removed when the restarted broker loads the topic.
            doomed = await wire.subscribe(topic, "deleted", sub_type=pb.CommandSubscribe.Shared)
            await doomed.ack(await doomed.receive(), t1)
            await doomed.close()
            # One per subscription and transaction: shared T1 and T2, exclusive T3, deleted T1.
            assert len(await pending_records(ready["metadata"], topic)) == 4
            await asyncio.to_thread(admin, "DELETE", ready["admin_url"], topic, "subscription/deleted")
            key_path = TopicName.parse(topic).key_path
            store = open_store(ready["metadata"])
            try:
                await store.put(keys.pending_acks(key_path, "ghost", f"{t1.most}:{t1.least}"), b"[[1,0,null,0]]")
            finally:
                await store.close()
            assert sorted(key.rsplit("/", 2)[1] for key in await pending_records(ready["metadata"], topic)) == [
                "exclusive", "ghost", "shared", "shared"]

            victim = broker_pid(process.pid, port)
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            await wire.close()
            deadline = time.monotonic() + 90
            while broker_pid(process.pid, port) in (None, victim):
                assert time.monotonic() < deadline, "the standalone did not start the broker again"
                await asyncio.sleep(0.2)

            # The official client reconnects by itself; a new consumer of each
            # subscription gets only what no open transaction holds.
            reader = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
            assert sorted(await asyncio.to_thread(receive_all, reader, 3000)) == [b"m3", b"m4", b"m5"]
            held_after_s = time.monotonic() - killed_at
            single = client.subscribe(topic, "exclusive", consumer_type=pulsar.ConsumerType.Exclusive)
            assert await asyncio.to_thread(receive_all_unacked, single, 3000) == [b"m3", b"m4", b"m5"]
            assert sorted(key.rsplit("/", 2)[1] for key in await pending_records(ready["metadata"], topic)) == [
                "exclusive", "shared", "shared"]   # the ghost's record removed at load

            again = await connected(service_url)
            try:
                await ended_retrying(again, t1, commit=True)
                await ended_retrying(again, t2, commit=False)
                # T2's abort: m2 comes again; T1's commit: m0 and m1 never.
                assert await asyncio.to_thread(receive_all, reader, 3000) == [b"m2"]
                await ended_retrying(again, t3, commit=False)
            finally:
                await again.close()
            # T3's abort: the exclusive subscription starts again from its first
            # unacknowledged message (nothing was acknowledged there).
            assert await asyncio.to_thread(receive_all, single, 3000) == [f"m{i}".encode() for i in range(6)]
            # T1's commit did not bring the deleted subscription back; nothing is left.
            assert sorted(await asyncio.to_thread(admin, "GET", ready["admin_url"], topic, "subscriptions")) == [
                "exclusive", "shared"]
            assert await pending_records(ready["metadata"], topic) == []
            print(f"pending acknowledgements held after kill -9: first read {held_after_s:.1f} s after the kill")
        finally:
            client.close()


async def pending_records(metadata_url: str, topic: str) -> list[str]:
    """The keys of the topic's pending-acknowledgement records in etcd."""
    store = open_store(metadata_url)
    try:
        prefix = keys.pending_acks_of_topic(TopicName.parse(topic).key_path)
        return [record.key for record in await store.get_prefix(prefix, keys_only=True)]
    finally:
        await store.close()


def admin(method: str, admin_url: str, topic: str, suffix: str) -> object:
    request = urllib.request.Request(f"{admin_url}/admin/v2/{TopicName.parse(topic).rest_path}/{suffix}",
                                     method=method)
    with urllib.request.urlopen(request, timeout=30) as answer:
        body = answer.read()
        return json.loads(body) if body.strip() else None


def receive_all_unacked(consumer, timeout_ms: int) -> list[bytes]:
    """What the official consumer gets until ``timeout_ms`` passes with nothing new,
    acknowledging nothing."""
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=timeout_ms).data())
        except pulsar.Timeout:
            return got
