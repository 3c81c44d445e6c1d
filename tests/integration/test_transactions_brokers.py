"""Transactions across two brokers of a secured cluster (``magnetar standalone --brokers 2
--auth``: token authentication and authorization on): the coordinator on one, the
topics on the other, so the outcome travels between brokers (END_TXN_ON_PARTITION /
END_TXN_ON_SUBSCRIPTION, broker/transaction_peers.py, presenting the brokers' own
token); then the coordinator's broker is killed with SIGKILL and the coordinator moves.

Transactional commands through tests/txn_wire.py (the official Python client has no
transaction API): ADD_*_TO_TXN and END_TXN to the coordinator's broker, sends and acks
to the topics' owner, as the Java client sends them. What others see is read with the
official client.

Proves: a client without credentials is refused; a role that did not open a
transaction may not end it (AuthorizationError; Pulsar's ownership rule); a commit made
on broker X delivers the outputs stored on broker Y and applies
the acknowledgement made on Y; an abort on X hides Y's outputs; a transaction open when
X is killed is committed afterwards through whichever broker serves its coordinator
then (its record was in etcd), and its outputs are delivered. Each broker's
/admin/v3/transactions/coordinators answers for every coordinator, gathering the
other broker's; so do slowTransactions (each transaction's per-topic part asked of the
topic's broker) and a topic's transactionBufferStats (redirected to its broker), with
authorization on.
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
from runtime.tokens import TokenSigner, read_key_value
from tests.integration.test_standalone_supervision import broker_pid
from tests.integration.test_transactions import receive_all, topic_name
from tests.txn_wire import ASSIGN_TOPIC, TxnError, WireConnection

pytestmark = [pytest.mark.timeout(400), pytest.mark.long]


def admin_json(base: str, path: str, token: str) -> object:
    request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def coordinator_stats_of_each_broker(admin_url: str, token: str) -> dict[str, dict]:
    """{broker web address: its answer to /admin/v3/transactions/coordinators}."""
    (cluster,) = admin_json(admin_url, "/admin/v2/clusters", token)
    return {address: admin_json(f"http://{address}", "/admin/v3/transactions/coordinators", token)
            for address in admin_json(admin_url, f"/admin/v2/brokers/{cluster}", token)}


async def owner_not(connection: WireConnection, avoid: str, prefix: str) -> str:
    """A new topic whose owner is not ``avoid``."""
    for _ in range(40):
        topic = topic_name(prefix)
        if await connection.lookup(topic) != avoid:
            return topic
    raise AssertionError(f"40 new topics all went to {avoid}: cannot put a topic away from the coordinator")


async def test_a_transaction_whose_coordinator_and_topics_are_on_different_brokers(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1, brokers=2,
                                  extra=["--auth"]) as (process, ready):
        hosts = ready["service_url"].removeprefix("pulsar://").split(",")
        urls = [f"pulsar://{host}" for host in hosts]
        assert len(urls) == 2 and ready["auth"], ready
        with open(ready["superuser_token_file"], encoding="ascii") as handle:
            token = handle.read().strip()
        stranger = await WireConnection(urls[0]).open()   # no credentials: its first request refused
        try:
            with pytest.raises((TxnError, ConnectionError)) as refused:
                await stranger.connect_coordinators()
            assert isinstance(refused.value, ConnectionError) or "Authentication" in str(refused.value)
        finally:
            await stranger.close()
        connections = {url: await WireConnection(url, token).open() for url in urls}
        client = pulsar.Client(ready["service_url"], authentication=pulsar.AuthenticationToken(token),
                               operation_timeout_seconds=30)
        try:
            first = connections[urls[0]]
            coordinator_id = 0
            x = await first.lookup(f"{ASSIGN_TOPIC}-partition-{coordinator_id}")
            assert x in connections, (x, urls)
            source = await owner_not(first, x, "brokers-in")
            sink = await owner_not(first, x, "brokers-out")
            y = await first.lookup(sink)
            assert await first.lookup(source) == y != x   # two brokers: both topics on the other one
            on_x, on_y = connections[x], connections[y]

            reader = client.subscribe(sink, "reader", initial_position=pulsar.InitialPosition.Earliest)
            inputs = client.create_producer(source)
            for i in range(3):
                inputs.send(f"in{i}".encode())
            consumer = await on_y.subscribe(source, "work")
            received = [await consumer.receive() for _ in range(3)]
            producer = await on_y.producer(sink)

            t1 = await on_x.new_txn(timeout_ms=120_000, coordinator_id=coordinator_id)
            await producer.send(b"t1-0", t1)
            await producer.send(b"t1-1", t1)
            await consumer.ack(received[0], t1)
            assert await asyncio.to_thread(receive_all, reader, 1000) == []
            await on_x.end(t1, commit=True)
            assert await asyncio.to_thread(receive_all, reader, 3000) == [b"t1-0", b"t1-1"]

            # Each broker's /admin/v3/transactions/coordinators answers for every
            # coordinator (4, the default), gathering those the other broker serves.
            stats_by_broker = await asyncio.to_thread(coordinator_stats_of_each_broker, ready["admin_url"], token)
            assert len(stats_by_broker) == 2, stats_by_broker
            for address, stats in stats_by_broker.items():
                assert sorted(stats) == ["0", "1", "2", "3"], (address, stats)
                assert all(one["state"] == "Ready" for one in stats.values()), (address, stats)

            # slowTransactions and a topic's transaction buffer stats, asked of either
            # broker with authorization on: gathered (the coordinator's broker asks the
            # topic's for its part with its own token), or redirected to the topic's.
            slow_txn = await on_x.new_txn(timeout_ms=120_000, coordinator_id=coordinator_id)
            await producer.send(b"slow-0", slow_txn)
            await asyncio.sleep(1.1)
            sink_path = sink.removeprefix("persistent://")
            for address in stats_by_broker:
                slow = await asyncio.to_thread(admin_json, f"http://{address}",
                                               "/admin/v3/transactions/slowTransactions/1000", token)
                one = slow[f"({slow_txn.most},{slow_txn.least})"]
                assert one["producedPartitions"][sink]["startPosition"] is not None, (address, one)
                buffer = await asyncio.to_thread(admin_json, f"http://{address}",
                                                 f"/admin/v3/transactions/transactionBufferStats/{sink_path}", token)
                assert buffer["ongoingTxnSize"] == 1, (address, buffer)
            await on_x.end(slow_txn, commit=False)

            # Another role may not end (or add to) a transaction it did not open.
            signer = TokenSigner.with_secret_key(read_key_value(os.path.join(ready["data_dir"], "auth", "secret.key")))
            intruder = await WireConnection(x, signer.create("intruder")).open()
            try:
                theirs = await on_x.new_txn(timeout_ms=120_000, coordinator_id=coordinator_id)
                with pytest.raises(TxnError) as denied:
                    await intruder.end(theirs, commit=True)
                assert "AuthorizationError" in str(denied.value)
                await on_x.end(theirs, commit=False)
            finally:
                await intruder.close()

            t2 = await on_x.new_txn(timeout_ms=120_000, coordinator_id=coordinator_id)
            await producer.send(b"t2-0", t2)
            await consumer.ack(received[1], t2)
            await on_x.end(t2, commit=False)
            # The abort released received[1]: delivered again on Y.
            assert (await consumer.receive()).payload == b"in1"

            t3 = await on_x.new_txn(timeout_ms=300_000, coordinator_id=coordinator_id)
            await producer.send(b"t3-0", t3)
            await producer.send(b"plain")
            assert await asyncio.to_thread(receive_all, reader, 1500) == []

            port = int(x.rsplit(":", 1)[1])
            victim = broker_pid(process.pid, port)
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            await on_x.close()
            # Commit T3 through whichever broker serves coordinator 0 now (Y after the
            # failover, or X started again), retried as a client does while it moves.
            deadline = time.monotonic() + 120
            while True:
                again = None
                try:
                    again = await WireConnection(y, token).open()
                    owner = await again.lookup(f"{ASSIGN_TOPIC}-partition-{coordinator_id}")
                    if owner != y:
                        await again.close()
                        again = await WireConnection(owner, token).open()
                    await again.end(t3, commit=True)
                    break
                except (TxnError, OSError, ConnectionError, TimeoutError) as error:
                    assert time.monotonic() < deadline, f"T3 not committed 120 s after the kill: {error!r}"
                    await asyncio.sleep(1.0)
                finally:
                    if again is not None:
                        await again.close()
            committed_after_s = time.monotonic() - killed_at
            assert await asyncio.to_thread(receive_all, reader, 5000) == [b"t3-0", b"plain"]
            await consumer.close()
            work = client.subscribe(source, "work", consumer_type=pulsar.ConsumerType.Shared)
            assert sorted(await asyncio.to_thread(receive_all, work, 3000)) == [b"in1", b"in2"]
            print(f"coordinator's broker killed: T3 committed through {owner} {committed_after_s:.1f} s later")
        finally:
            client.close()
            for connection in connections.values():
                await connection.close()
