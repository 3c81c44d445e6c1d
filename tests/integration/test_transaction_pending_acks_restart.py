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
the Exclusive subscription.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pulsar
import pytest

from bench.fanout_check import running_standalone
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
            print(f"pending acknowledgements held after kill -9: first read {held_after_s:.1f} s after the kill")
        finally:
            client.close()


def receive_all_unacked(consumer, timeout_ms: int) -> list[bytes]:
    """What the official consumer gets until ``timeout_ms`` passes with nothing new,
    acknowledging nothing."""
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=timeout_ms).data())
        except pulsar.Timeout:
            return got
