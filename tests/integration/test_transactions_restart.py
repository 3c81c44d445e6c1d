"""Transactions survive a ``kill -9`` of the broker (``magnetar standalone``, which
starts the killed broker again on its port).

Before the kill, through the wire-level client (tests/txn_wire.py: the official Python
client has no transaction API): T1 sends 3 outputs and acknowledges 2 inputs and is
committed (END_TXN answered); T2 sends 2 outputs and acknowledges 2 inputs and stays
open (timeout 5 min); T4 sends 1 output and acknowledges 1 input, and its commit is
decided (the COMMITTING record written) but the broker is stopped there, before any
participant is told (the test-only pause, MAGNETAR_TRANSACTION_PAUSE_FILE); T3 sends 1
output and acknowledges 1 input and stays open with a timeout of 5 s; a plain message is
sent to the output topic after them all. Then the broker is killed with SIGKILL.

Proves, after the restart: an official consumer of the output topic (its subscription
made before the kill, and a new one) gets T1's outputs and nothing else while T2 is
open (everything later is held behind it: the topic's buffer was rebuilt from its
entries); the restarted broker loads the coordinator on its own, finishes T4's commit
and aborts T3 at its timeout, with no client asking (its log); a new connection commits
T2 by its id (the coordinator's record was in etcd) and repeats T4's commit (answered
as done); then T2's outputs, T4's and the plain message are delivered, T3's never; the
input subscription then holds only the input T3 had acknowledged and the one never
acknowledged (T1's, T2's and T4's acknowledgements applied, T3's released).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pulsar
import pytest

from bench.fanout_check import running_standalone
from broker.transaction_coordinator import PAUSE_FILE_ENV
from tests.integration.test_standalone_supervision import broker_pid
from tests.integration.test_transactions import receive_all, topic_name
from tests.txn_wire import Transaction, WireConnection

pytestmark = [pytest.mark.timeout(400), pytest.mark.long]


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
        except Exception as error:   # refused, reset, timed out: the broker is still coming back
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
    pause_file = tmp_path / "transaction-pause"
    pause_file.touch()   # no pause until the test removes it
    broker_log = tmp_path / "standalone" / "broker.log"
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1, brokers=1,
                                  env={PAUSE_FILE_ENV: str(pause_file)}) as (process, ready):
        service_url = ready["service_url"]
        port = int(service_url.rsplit(":", 1)[1])
        source, sink = topic_name("restart-in"), topic_name("restart-out")
        client = pulsar.Client(service_url, operation_timeout_seconds=30)
        try:
            early = client.subscribe(sink, "early", initial_position=pulsar.InitialPosition.Earliest)
            plain = client.create_producer(sink)
            inputs_producer = client.create_producer(source)
            for i in range(7):
                inputs_producer.send(f"in{i}".encode())
            wire = await connected(service_url)
            consumer = await wire.subscribe(source, "work")
            received = [await consumer.receive() for _ in range(7)]
            producer = await wire.producer(sink)

            t1 = await wire.new_txn(timeout_ms=300_000)
            for i in range(3):
                await producer.send(f"t1-{i}".encode(), t1)
            for message in received[0:2]:
                await consumer.ack(message, t1)
            await wire.end(t1, commit=True)
            assert await asyncio.to_thread(receive_all, early, 1500) == [b"t1-0", b"t1-1", b"t1-2"]
            t2 = await wire.new_txn(timeout_ms=300_000)
            for i in range(2):
                await producer.send(f"t2-{i}".encode(), t2)
            for message in received[2:4]:
                await consumer.ack(message, t2)
            t4 = await wire.new_txn(timeout_ms=300_000)
            await producer.send(b"t4-0", t4)
            await consumer.ack(received[5], t4)
            pause_file.unlink()
            t4_end = asyncio.ensure_future(wire.end(t4, commit=True))
            paused = f"transaction paused after its decision ({PAUSE_FILE_ENV}): txn=({t4.most},{t4.least})"
            await wait_for_log(broker_log, paused)
            assert not t4_end.done()
            t3 = await wire.new_txn(timeout_ms=5000)
            await producer.send(b"t3-0", t3)
            await consumer.ack(received[4], t3)
            await asyncio.to_thread(plain.send, b"plain")

            victim = broker_pid(process.pid, port)
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            await wire.close()
            t4_end.cancel()
            deadline = time.monotonic() + 90
            while broker_pid(process.pid, port) in (None, victim):
                assert time.monotonic() < deadline, "the standalone did not start the broker again"
                await asyncio.sleep(0.2)

            # The restarted broker loads the coordinator it serves: T4's decided commit
            # is carried out and T3 aborted at its timeout, no client asking. Until T2
            # ends nothing more is readable (T2 is open and older than the rest).
            await wait_for_log(broker_log, f"transaction ended: txn=({t4.most},{t4.least}) action=commit")
            await wait_for_log(broker_log, f"transaction timed out, aborting: txn=({t3.most},{t3.least})")
            recovered_after_s = time.monotonic() - killed_at
            assert await asyncio.to_thread(receive_all, early, 2000) == []
            late = client.subscribe(sink, "late", initial_position=pulsar.InitialPosition.Earliest)
            assert await asyncio.to_thread(receive_all, late, 2000) == [b"t1-0", b"t1-1", b"t1-2"]

            again = await connected(service_url)
            try:
                await ended_retrying(again, t2, commit=True)
                await again.end(t4, commit=True)   # a retried commit of a finished one: done
                with pytest.raises(Exception) as t3_end:
                    await again.end(t3, commit=True)
                assert "InvalidTxnStatus" in str(t3_end.value) or "TransactionNotFound" in str(t3_end.value)
            finally:
                await again.close()
            assert await asyncio.to_thread(receive_all, early, 5000) == [b"t2-0", b"t2-1", b"t4-0", b"plain"]
            assert await asyncio.to_thread(receive_all, late, 3000) == [b"t2-0", b"t2-1", b"t4-0", b"plain"]
            work = client.subscribe(source, "work", consumer_type=pulsar.ConsumerType.Shared)
            assert sorted(await asyncio.to_thread(receive_all, work, 3000)) == [b"in4", b"in6"]
            print(f"broker killed with T4 decided and untold: T1 read after the restart, T4 finished and T3 "
                  f"timed out by the restarted broker {recovered_after_s:.1f} s after the kill, T2 committed by id")
        finally:
            client.close()


async def wait_for_log(path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"not in {path} after {timeout_s} s: {text}"
        await asyncio.sleep(0.3)
