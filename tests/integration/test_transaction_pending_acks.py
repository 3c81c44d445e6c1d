"""Acknowledgements in an open transaction hold their messages back (Pulsar's
pending-ack state), through ``magnetar standalone``, and cumulative acknowledgements
in a transaction.

The transactional side speaks through tests/txn_wire.py (the official Python client has
no transaction API; see tests/integration/test_transactions.py); what other consumers
get is read with the official ``pulsar-client`` where it can be.

Proves, on a Shared subscription: a message acknowledged in an open transaction is not
sent again when its consumer asks for its unacknowledged messages again, nor to another
consumer once its consumer has closed, nor after the topic is unloaded and loaded again
(the pending acknowledgements read back from etcd); a second transaction acknowledging
it gets TransactionConflict, and so does a transaction acknowledging a message already
acknowledged; the abort delivers it again (redelivery count raised); the commit
acknowledges it for good. On Exclusive and Failover subscriptions: a cumulative
acknowledgement in a transaction holds everything up to it back from a new consumer,
the abort delivers it all again in order, the commit acknowledges it; Pulsar's
conflicts (another transaction's cumulative acknowledgement, one not past the
transaction's own, one at or before the mark-delete position); refused on Shared.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pulsar
import pytest
import pytest_asyncio

from bench.fanout_check import running_standalone
from protocol.proto import pulsar_api_pb2 as pb
from tests.integration.test_transactions import receive_all, topic_name
from tests.txn_wire import TxnError, WireConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

EXCLUSIVE, FAILOVER, SHARED = pb.CommandSubscribe.Exclusive, pb.CommandSubscribe.Failover, pb.CommandSubscribe.Shared


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory):
    async with running_standalone(str(tmp_path_factory.mktemp("txn-held") / "data"), bookies=1, copies=1,
                                  brokers=1) as (process, ready):
        yield process, ready


@pytest_asyncio.fixture(loop_scope="module")
async def wire(standalone):
    _process, ready = standalone
    connection = await WireConnection(ready["service_url"]).open()
    await connection.connect_coordinators()
    yield connection
    await connection.close()


@pytest.fixture
def client(standalone):
    _process, ready = standalone
    client = pulsar.Client(ready["service_url"], operation_timeout_seconds=30)
    yield client
    client.close()


def payloads(messages) -> list[bytes]:
    return [m.payload for m in messages]


def conflict_of(error: pytest.ExceptionInfo) -> bool:
    return "TransactionConflict" in str(error.value)


async def filled(client, topic: str, count: int) -> None:
    producer = client.create_producer(topic)
    for i in range(count):
        await asyncio.to_thread(producer.send, f"m{i}".encode())
    producer.close()


def unload(admin_url: str, topic: str) -> None:
    path = topic.removeprefix("persistent://")
    request = urllib.request.Request(f"{admin_url}/admin/v2/persistent/{path}/unload", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status in (200, 204), answer.status


async def test_a_message_acknowledged_in_an_open_transaction_is_not_redelivered_until_the_abort(
        standalone, wire, client):
    _process, ready = standalone
    topic = topic_name("held-shared")
    await filled(client, topic, 6)
    first = await wire.subscribe(topic, "work", sub_type=SHARED)
    received = [await first.receive() for _ in range(6)]
    assert payloads(received) == [f"m{i}".encode() for i in range(6)]
    txn = await wire.new_txn(timeout_ms=120_000)
    for message in received[:2]:
        await first.ack(message, txn)

    # The consumer asks for everything it holds unacknowledged: not m0 and m1.
    first.redeliver_unacknowledged()
    again = await first.received_within(2.0)
    assert sorted(payloads(again)) == [b"m2", b"m3", b"m4", b"m5"]
    assert all(m.redelivery_count >= 1 for m in again)

    # It leaves; another consumer of the subscription (the official client) gets the
    # rest, never the two the open transaction holds.
    await first.close()
    official = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(await asyncio.to_thread(receive_all, official, 2500)) == [b"m2", b"m3", b"m4", b"m5"]
    await asyncio.to_thread(official.close)   # its acknowledgements flushed

    # Unloaded and loaded again: the pending acknowledgements come back from etcd.
    await asyncio.to_thread(unload, ready["admin_url"], topic)
    reloaded = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert await asyncio.to_thread(receive_all, reloaded, 2500) == []

    # Conflicts: m0 is held by the open transaction; m2 was acknowledged plainly.
    other = await wire.subscribe(topic, "work", sub_type=SHARED)
    second = await wire.new_txn(timeout_ms=60_000)
    with pytest.raises(TxnError) as held:
        await other.ack(received[0], second)
    assert conflict_of(held), held.value
    with pytest.raises(TxnError) as acked:
        await other.ack(received[2], second)
    assert conflict_of(acked), acked.value
    await wire.end(second, commit=False)
    await other.close()

    # The abort delivers them again, their redelivery count raised.
    await wire.end(txn, commit=False)
    redelivered = []
    for _ in range(2):
        message = await asyncio.to_thread(reloaded.receive, 10_000)
        redelivered.append((message.data(), message.redelivery_count()))
        reloaded.acknowledge(message)
    assert sorted(p for p, _count in redelivered) == [b"m0", b"m1"]
    assert all(count >= 1 for _p, count in redelivered), redelivered
    assert await asyncio.to_thread(receive_all, reloaded, 1500) == []


async def test_the_commit_acknowledges_held_messages_for_good(standalone, wire, client):
    _process, ready = standalone
    topic = topic_name("held-commit")
    await filled(client, topic, 4)
    consumer = await wire.subscribe(topic, "work", sub_type=SHARED)
    received = [await consumer.receive() for _ in range(4)]
    txn = await wire.new_txn(timeout_ms=120_000)
    for message in received[:3]:
        await consumer.ack(message, txn)
    await consumer.close()
    await asyncio.to_thread(unload, ready["admin_url"], topic)
    official = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert await asyncio.to_thread(receive_all, official, 2500) == [b"m3"]
    await wire.end(txn, commit=True)
    assert await asyncio.to_thread(receive_all, official, 1500) == []
    await asyncio.to_thread(official.close)
    await asyncio.to_thread(unload, ready["admin_url"], topic)
    fresh = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert await asyncio.to_thread(receive_all, fresh, 2000) == []


async def test_a_cumulative_acknowledgement_in_a_transaction_on_an_exclusive_subscription(standalone, wire, client):
    _process, ready = standalone
    topic = topic_name("held-cumulative")
    await filled(client, topic, 6)
    first = await wire.subscribe(topic, "cum", sub_type=EXCLUSIVE)
    received = [await first.receive() for _ in range(6)]
    txn = await wire.new_txn(timeout_ms=120_000)
    await first.ack(received[3], txn, cumulative=True)

    # Pulsar's conflicts: another transaction's cumulative acknowledgement, an
    # individual one under it, and the transaction's own not past what it holds.
    second = await wire.new_txn(timeout_ms=60_000)
    with pytest.raises(TxnError) as other_cumulative:
        await first.ack(received[4], second, cumulative=True)
    assert conflict_of(other_cumulative), other_cumulative.value
    with pytest.raises(TxnError) as under_it:
        await first.ack(received[1], second)
    assert conflict_of(under_it), under_it.value
    with pytest.raises(TxnError) as not_past:
        await first.ack(received[2], txn, cumulative=True)
    assert conflict_of(not_past), not_past.value
    await wire.end(second, commit=False)

    # A new consumer (the rewind to the mark-delete position) gets only what follows
    # the held acknowledgement; also after the topic is loaded again.
    await first.close()
    await asyncio.to_thread(unload, ready["admin_url"], topic)
    taker = await wire.subscribe(topic, "cum", sub_type=EXCLUSIVE)
    assert payloads(await taker.received_within(2.0)) == [b"m4", b"m5"]

    # The abort delivers everything unacknowledged again, in order.
    await wire.end(txn, commit=False)
    after_abort = [await taker.receive() for _ in range(6)]
    assert payloads(after_abort) == [f"m{i}".encode() for i in range(6)]
    assert all(m.redelivery_count >= 1 for m in after_abort[:4])

    # A cumulative acknowledgement committed: acknowledged for good.
    third = await wire.new_txn(timeout_ms=60_000)
    await taker.ack(after_abort[4], third, cumulative=True)
    await wire.end(third, commit=True)
    await taker.close()
    official = client.subscribe(topic, "cum", consumer_type=pulsar.ConsumerType.Exclusive)
    assert await asyncio.to_thread(receive_all, official, 2500) == [b"m5"]
    await asyncio.to_thread(official.close)

    # At or before the mark-delete position: conflicts, cumulative or not.
    last = await wire.subscribe(topic, "cum", sub_type=EXCLUSIVE)
    fourth = await wire.new_txn(timeout_ms=60_000)
    with pytest.raises(TxnError) as before_mark:
        await last.ack(after_abort[3], fourth, cumulative=True)
    assert conflict_of(before_mark), before_mark.value
    with pytest.raises(TxnError) as acked:
        await last.ack(after_abort[2], fourth)
    assert conflict_of(acked), acked.value
    await wire.end(fourth, commit=False)
    await last.close()


async def test_a_cumulative_acknowledgement_in_a_transaction_on_failover_and_refused_on_shared(wire, client):
    topic = topic_name("held-failover")
    await filled(client, topic, 4)
    consumer = await wire.subscribe(topic, "fo", sub_type=FAILOVER)
    received = [await consumer.receive() for _ in range(4)]
    txn = await wire.new_txn(timeout_ms=60_000)
    await consumer.ack(received[1], txn, cumulative=True)
    await wire.end(txn, commit=True)
    await consumer.close()
    official = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover)
    assert await asyncio.to_thread(receive_all, official, 2500) == [b"m2", b"m3"]
    await asyncio.to_thread(official.close)

    shared = await wire.subscribe(topic, "shared", sub_type=SHARED)
    message = await shared.receive()
    refused = await wire.new_txn(timeout_ms=60_000)
    with pytest.raises(TxnError) as not_allowed:
        await shared.ack(message, refused, cumulative=True)
    assert "NotAllowed" in str(not_allowed.value), not_allowed.value
    await wire.end(refused, commit=False)
    await shared.close()


def receive_unacked(consumer, timeout_ms: int = 2000) -> list[bytes]:
    """What the official consumer gets until ``timeout_ms`` passes with nothing new,
    acknowledging nothing."""
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=timeout_ms).data())
        except pulsar.Timeout:
            return got


async def test_a_batch_acknowledged_in_part_in_a_transaction_is_redelivered_without_the_held_message(
        wire, client):
    """A batch of three (the official producer batching): message 0 acknowledged in an
    open transaction by batch index (ack set 0b110, as the Java client sends it). The
    official consumer that takes over gets messages 1 and 2 only; another transaction
    acknowledging message 1 conflicts (conflicts are per entry here); after the commit
    message 0 is never delivered again."""
    topic = topic_name("held-batch")
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                      batching_max_publish_delay_ms=60_000)
    for i in range(3):
        producer.send_async(f"b{i}".encode(), None)
    await asyncio.to_thread(producer.flush)
    consumer = await wire.subscribe(topic, "work", sub_type=SHARED)
    batch = await consumer.receive()
    assert batch.metadata.num_messages_in_batch == 3, batch.metadata
    txn = await wire.new_txn(timeout_ms=120_000)
    await consumer.ack(batch, txn, ack_set=(0b110,), batch_size=3)
    await consumer.close()

    official = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert await asyncio.to_thread(receive_unacked, official) == [b"b1", b"b2"]
    await asyncio.to_thread(official.close)

    other = await wire.subscribe(topic, "work", sub_type=SHARED)
    again = await other.receive()
    second = await wire.new_txn(timeout_ms=60_000)
    with pytest.raises(TxnError) as conflict:
        await other.ack(again, second, ack_set=(0b101,), batch_size=3)
    assert conflict_of(conflict), conflict.value
    await wire.end(second, commit=False)
    await other.close()

    await wire.end(txn, commit=True)
    after = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert await asyncio.to_thread(receive_unacked, after) == [b"b1", b"b2"]
    await asyncio.to_thread(after.close)
    producer.close()


def admin_get(admin_url: str, path: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(f"{admin_url}{path}", timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def topic_txn_series(admin_url: str, topic: str) -> dict[str, float]:
    """The per-topic and per-subscription transaction series of ``topic`` (Pulsar's
    pulsar_txn_tb_* and pulsar_txn_tp_*), keyed "name" or "name/subscription"."""
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith(("pulsar_txn_tb_", "pulsar_txn_tp_")) and f'topic="{topic}"' in line:
            name = line.split("{", 1)[0]
            if 'subscription="' in line:
                name += "/" + line.split('subscription="', 1)[1].split('"', 1)[0]
            found[name] = float(line.rsplit(" ", 1)[1])
    return found


def txn_series(admin_url: str, coordinator_id: int) -> dict[str, float]:
    """The pulsar_txn_* series of one coordinator, from the broker's /metrics."""
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("pulsar_txn_") and f'coordinator_id="{coordinator_id}"' in line:
            name = line.split("{", 1)[0]
            found[name] = float(line.rsplit(" ", 1)[1])
    return found


async def test_the_admin_rest_and_metrics_show_coordinators_and_an_open_transaction(standalone, wire, client):
    _process, ready = standalone
    admin_url = ready["admin_url"]
    topic = topic_name("txn-admin")
    await filled(client, topic, 2)
    consumer = await wire.subscribe(topic, "admin-sub", sub_type=EXCLUSIVE)
    received = [await consumer.receive() for _ in range(2)]
    producer = await wire.producer(topic)
    before = await asyncio.to_thread(txn_series, admin_url, 0)
    txn = await wire.new_txn(timeout_ms=120_000)   # coordinator 0, the wire client's default
    assert txn.most == 0
    await producer.send(b"out", txn)
    await consumer.ack(received[0], txn, cumulative=True)

    status, coordinators = await asyncio.to_thread(admin_get, admin_url, "/admin/v3/transactions/coordinators")
    assert status == 200 and str(txn.most) in coordinators, coordinators
    stats = coordinators[str(txn.most)]
    assert stats["state"] == "Ready" and stats["ongoingTxnSize"] >= 1, stats
    status, one = await asyncio.to_thread(admin_get, admin_url,
                                          f"/admin/v3/transactions/coordinators?coordinatorId={txn.most}")
    assert status == 200 and list(one) == [str(txn.most)], one

    path = f"/admin/v3/transactions/transactionMetadata/{txn.most}/{txn.least}"
    status, metadata = await asyncio.to_thread(admin_get, admin_url, path)
    assert status == 200, metadata
    assert metadata["txnId"] == f"({txn.most},{txn.least})" and metadata["status"] == "OPEN"
    assert metadata["timeoutAt"] == 120_000 and metadata["openTimestamp"] > 0
    assert metadata["producedPartitions"][topic]["startPosition"] is not None, metadata
    held = f"{received[0].ledger_id}:{received[0].entry_id}"
    assert metadata["ackedPartitions"][topic]["admin-sub"] == {"cumulativeAckPosition": held,
                                                               "individualAckSize": 0}, metadata
    await asyncio.sleep(0.05)
    status, slow = await asyncio.to_thread(admin_get, admin_url, "/admin/v3/transactions/slowTransactions/1")
    assert status == 200 and metadata["txnId"] in slow, slow
    status, none_slow = await asyncio.to_thread(admin_get, admin_url,
                                                "/admin/v3/transactions/slowTransactions/3600000")
    assert status == 200 and metadata["txnId"] not in none_slow

    during = await asyncio.to_thread(txn_series, admin_url, txn.most)
    assert during["pulsar_txn_active_count"] >= 1, during
    # The topic's own series: one transaction open in its buffer, none ended yet.
    on_topic = await asyncio.to_thread(topic_txn_series, admin_url, topic)
    assert on_topic == {"pulsar_txn_tb_active_total": 1, "pulsar_txn_tb_aborted_total": 0,
                        "pulsar_txn_tb_committed_total": 0, "pulsar_txn_tp_committed_count_total/admin-sub": 0,
                        "pulsar_txn_tp_aborted_count_total/admin-sub": 0}, on_topic
    assert during["pulsar_txn_created_total"] >= before.get("pulsar_txn_created_total", 0) + 1, (before, during)
    assert during["pulsar_txn_append_log_total"] >= before.get("pulsar_txn_append_log_total", 0) + 3

    await wire.end(txn, commit=True)
    status, gone = await asyncio.to_thread(admin_get, admin_url, path)
    assert status == 404 and gone["error"] == "TransactionNotFound", gone
    after = await asyncio.to_thread(txn_series, admin_url, txn.most)
    assert after["pulsar_txn_committed_total"] == during.get("pulsar_txn_committed_total", 0) + 1, (during, after)
    expected = {"pulsar_txn_tb_active_total": 0, "pulsar_txn_tb_aborted_total": 0,
                "pulsar_txn_tb_committed_total": 1, "pulsar_txn_tp_committed_count_total/admin-sub": 1,
                "pulsar_txn_tp_aborted_count_total/admin-sub": 0}
    for _ in range(100):
        on_topic = await asyncio.to_thread(topic_txn_series, admin_url, topic)
        if on_topic == expected:
            break
        await asyncio.sleep(0.1)
    assert on_topic == expected, on_topic
    await consumer.close()
