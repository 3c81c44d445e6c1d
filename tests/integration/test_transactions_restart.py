"""Transactions survive a ``kill -9`` of the broker (``magnetar standalone``, which
starts the killed broker again on its port).

Before the kill, through the wire-level client (tests/txn_wire.py: the official Python
client has no transaction API): T1 sends 3 outputs and acknowledges 2 inputs and is
committed (END_TXN answered); T2 sends 2 outputs and acknowledges 2 inputs and stays
open (timeout 5 min); T3 sends 1 output and acknowledges 1 input and stays open with a
timeout of 6 s; a plain message is sent to the output topic after them.

Proves, after the restart: an official consumer of the output topic (its subscription
made before the kill, and a new one) gets T1's outputs and nothing of T2, T3 or the
plain message (held behind open T2: the topic's buffer was rebuilt from its entries);
T3 is aborted by its timeout with no client asking (the coordinator loaded by the
restarted broker on its own); a new connection commits T2 by its id (the coordinator's
record was in etcd), and then T2's outputs and the plain message are delivered, T3's
never; the input subscription then holds only the input T3 had acknowledged and the one
never acknowledged (T1's and T2's acknowledgements applied, T3's released).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pulsar
import pytest

from bench.fanout_check import running_standalone
from tests.integration.test_standalone_supervision import broker_pid
from tests.integration.test_transactions import receive_all, topic_name
from tests.txn_wire import Transaction, WireConnection

pytestmark = pytest.mark.timeout(400)


async def connected(service_url: str, timeout_s: float = 90) -> WireConnection:
    """A wire connection with the coordinators reached, retried while the broker comes
    back."""
    deadline = time.monotonic() + timeout_s
    while True:
        connection = WireConnection(service_url)
        try:
            await connection.open()
            await connection.connect_coordinators()
            return connection
        except (OSError, ConnectionError, TimeoutError, AssertionError, Exception) as error:
            await connection.close()
            if time.monotonic() > deadline:
                raise AssertionError(f"no coordinator after the restart: {error!r}") from None
            await asyncio.sleep(0.5)


async def ended_retrying(connection: WireConnection, txn: Transaction, *, commit: bool,
                         timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await connection.end(txn, commit=commit)
            return
        except Exception as error:   # the topic owner may still be loading: retried as a client does
            if "ServiceNotReady" not in str(error) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_transactions_survive_kill_9_of_the_broker(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1, brokers=1) as (process, ready):
        service_url = ready["service_url"]
        port = int(service_url.rsplit(":", 1)[1])
        source, sink = topic_name("restart-in"), topic_name("restart-out")
        client = pulsar.Client(service_url, operation_timeout_seconds=30)
        try:
            early = client.subscribe(sink, "early", initial_position=pulsar.InitialPosition.Earliest)
            plain = client.create_producer(sink)
            inputs_producer = client.create_producer(source)
            for i in range(6):
                inputs_producer.send(f"in{i}".encode())
            wire = await connected(service_url)
            consumer = await wire.subscribe(source, "work")
            received = [await consumer.receive() for _ in range(6)]
            producer = await wire.producer(sink)

            t1 = await wire.new_txn(timeout_ms=300_000)
            for i in range(3):
                await producer.send(f"t1-{i}".encode(), t1)
            for message in received[0:2]:
                await consumer.ack(message, t1)
            await wire.end(t1, commit=True)
            t2 = await wire.new_txn(timeout_ms=300_000)
            for i in range(2):
                await producer.send(f"t2-{i}".encode(), t2)
            for message in received[2:4]:
                await consumer.ack(message, t2)
            t3 = await wire.new_txn(timeout_ms=6000)
            await producer.send(b"t3-0", t3)
            await consumer.ack(received[4], t3)
            await asyncio.to_thread(plain.send, b"plain")
            assert await asyncio.to_thread(receive_all, early, 1500) == [b"t1-0", b"t1-1", b"t1-2"]

            victim = broker_pid(process.pid, port)
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            await wire.close()
            deadline = time.monotonic() + 90
            while broker_pid(process.pid, port) in (None, victim):
                assert time.monotonic() < deadline, "the standalone did not start the broker again"
                await asyncio.sleep(0.2)

            # T3 times out with no client of the coordinator: the restarted broker loads
            # the coordinator it serves and its sweep aborts T3. Until T2 ends nothing
            # more is readable (T2 is open and older than "plain").
            assert await asyncio.to_thread(receive_all, early, 5000) == []
            deadline = time.monotonic() + 60
            timed_out = f"transaction timed out, aborting: txn=({t3.most},{t3.least})"
            broker_log = tmp_path / "standalone" / "broker.log"
            while timed_out not in broker_log.read_text(errors="replace"):
                assert time.monotonic() < deadline, "T3 was not aborted by its timeout after the restart"
                await asyncio.sleep(0.5)
            assert await asyncio.to_thread(receive_all, early, 2000) == []
            late = client.subscribe(sink, "late", initial_position=pulsar.InitialPosition.Earliest)
            assert await asyncio.to_thread(receive_all, late, 2000) == [b"t1-0", b"t1-1", b"t1-2"]
            recovered_after_s = time.monotonic() - killed_at

            again = await connected(service_url)
            try:
                await ended_retrying(again, t2, commit=True)
                with pytest.raises(Exception) as t3_end:
                    await again.end(t3, commit=True)
                assert "InvalidTxnStatus" in str(t3_end.value) or "TransactionNotFound" in str(t3_end.value)
            finally:
                await again.close()
            assert await asyncio.to_thread(receive_all, early, 5000) == [b"t2-0", b"t2-1", b"plain"]
            assert await asyncio.to_thread(receive_all, late, 3000) == [b"t2-0", b"t2-1", b"plain"]
            work = client.subscribe(source, "work", consumer_type=pulsar.ConsumerType.Shared)
            assert sorted(await asyncio.to_thread(receive_all, work, 3000)) == [b"in4", b"in5"]
            print(f"broker killed; T1 (committed) read after the restart, T2 committed by id, T3 timed out; "
                  f"reads after {recovered_after_s:.1f} s")
        finally:
            client.close()
