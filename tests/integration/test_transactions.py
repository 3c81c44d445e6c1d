"""Transactions (Pulsar's PIP-31) through ``magnetar standalone``, end to end.

The transactional side speaks through tests/txn_wire.py, a wire-level client: the
official Python ``pulsar-client`` (3.13.0 here) has no transaction API at all (no
``Client.new_transaction``, no ``txn`` argument on ``send`` or ``acknowledge``, no
``enable_transaction`` setting; only its error classes exist). What other clients see is
checked with the official client.

Proves: sends in a transaction are not delivered to an official consumer until the
commit, then all of them, in order; after an abort they never are, and a message sent
after them is; a later plain message waits behind an open transaction (the max read
position) and comes after the commit; acknowledgements in a transaction take effect at
the commit (a new official consumer of the subscription gets only the others) and are
undone by an abort (delivered again); a second transaction acknowledging a message
another holds gets TransactionConflict; a transaction past its timeout is aborted by the
coordinator (its sends never delivered, END_TXN commit then refused); a
consume-transform-produce loop with a worker that dies mid-transaction and one that takes
over gives each output exactly once.
"""

from __future__ import annotations

import asyncio
import uuid

import pulsar
import pytest
import pytest_asyncio

from bench.fanout_check import running_standalone
from tests.txn_wire import TxnError, WireConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]


def topic_name(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


def receive_all(consumer, timeout_ms: int = 1500) -> list[bytes]:
    """What the official consumer gets until ``timeout_ms`` passes with nothing new."""
    got = []
    while True:
        try:
            message = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return got
        got.append(message.data())
        consumer.acknowledge(message)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standalone(tmp_path_factory):
    async with running_standalone(str(tmp_path_factory.mktemp("txn") / "data"), bookies=1, copies=1,
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


async def test_sends_are_seen_only_after_the_commit(wire, client):
    topic = topic_name("txn-commit")
    consumer = client.subscribe(topic, "reader", initial_position=pulsar.InitialPosition.Earliest)
    producer = await wire.producer(topic)
    plain = client.create_producer(topic)
    txn = await wire.new_txn(timeout_ms=60_000)
    for i in range(3):
        await producer.send(f"t{i}".encode(), txn)
    # A plain message after the transaction's first send waits behind it.
    plain.send(b"plain-after")
    assert await asyncio.to_thread(receive_all, consumer) == []
    await wire.end(txn, commit=True)
    assert await asyncio.to_thread(receive_all, consumer, 5000) == [b"t0", b"t1", b"t2", b"plain-after"]


async def test_an_aborted_transaction_is_never_delivered(wire, client):
    topic = topic_name("txn-abort")
    consumer = client.subscribe(topic, "reader", initial_position=pulsar.InitialPosition.Earliest)
    producer = await wire.producer(topic)
    txn = await wire.new_txn(timeout_ms=60_000)
    for i in range(3):
        await producer.send(f"aborted-{i}".encode(), txn)
    kept = await wire.new_txn(timeout_ms=60_000)
    await producer.send(b"kept", kept)
    await wire.end(txn, commit=False)
    await wire.end(kept, commit=True)
    await producer.send(b"plain")
    assert await asyncio.to_thread(receive_all, consumer, 3000) == [b"kept", b"plain"]
    # A send in the ended transaction is refused (it would open it again).
    with pytest.raises(TxnError):
        await producer.send(b"late", txn)
    # A subscription made later, from the earliest entry, sees the same.
    late = client.subscribe(topic, "late-reader", initial_position=pulsar.InitialPosition.Earliest)
    assert await asyncio.to_thread(receive_all, late, 2000) == [b"kept", b"plain"]


async def test_acknowledgements_take_effect_at_the_commit_and_are_undone_by_an_abort(wire, client):
    topic = topic_name("txn-ack")
    plain = client.create_producer(topic)
    consumer = await wire.subscribe(topic, "work")
    for i in range(6):
        plain.send(f"m{i}".encode())
    received = [await consumer.receive() for _ in range(6)]
    assert [r.payload for r in received] == [f"m{i}".encode() for i in range(6)]
    committed = await wire.new_txn(timeout_ms=60_000)
    for message in received[:2]:
        await consumer.ack(message, committed)
    aborted = await wire.new_txn(timeout_ms=60_000)
    for message in received[2:4]:
        await consumer.ack(message, aborted)
    # A message another open transaction holds cannot be acknowledged in a second one.
    other = await wire.new_txn(timeout_ms=60_000)
    with pytest.raises(TxnError) as conflict:
        await consumer.ack(received[0], other)
    assert "TransactionConflict" in str(conflict.value)
    await wire.end(other, commit=False)
    await wire.end(aborted, commit=False)
    # The abort gives the consumer its two messages again.
    again = sorted([(await consumer.receive()).payload for _ in range(2)])
    assert again == [b"m2", b"m3"]
    await wire.end(committed, commit=True)
    await consumer.close()
    # A new consumer of the subscription gets everything but the committed two.
    official = client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(await asyncio.to_thread(receive_all, official, 3000)) == [b"m2", b"m3", b"m4", b"m5"]


async def test_a_transaction_past_its_timeout_is_aborted(wire, client):
    topic = topic_name("txn-timeout")
    consumer = client.subscribe(topic, "reader", initial_position=pulsar.InitialPosition.Earliest)
    producer = await wire.producer(topic)
    plain = client.create_producer(topic)
    txn = await wire.new_txn(timeout_ms=2000)
    await producer.send(b"never", txn)
    plain.send(b"after")
    # Held back behind the open transaction until its timeout aborts it; then the plain
    # message comes and the transactional one never does.
    assert await asyncio.to_thread(receive_all, consumer, 8000) == [b"after"]
    with pytest.raises(TxnError) as refused:
        await wire.end(txn, commit=True)
    assert "InvalidTxnStatus" in str(refused.value) or "TransactionNotFound" in str(refused.value)


async def transform(connection: WireConnection, consumer, producer, message, timeout_ms: int = 60_000) -> bool:
    """One step of consume-transform-produce: the output sent and the input acknowledged
    in one transaction, committed. False when the input is held by another open
    transaction (TransactionConflict): this one is aborted, its output never seen."""
    txn = await connection.new_txn(timeout_ms=timeout_ms)
    await producer.send(b"out-" + message.payload, txn)
    try:
        await consumer.ack(message, txn)
    except TxnError as error:
        assert "TransactionConflict" in str(error), error
        await connection.end(txn, commit=False)
        return False
    await connection.end(txn, commit=True)
    return True


async def test_consume_transform_produce_is_exactly_once_when_a_worker_dies(standalone, wire, client):
    """Worker A transforms 5 inputs, then dies (its connection dropped) in the middle of
    the 6th transaction: output sent, input acknowledged, no commit. Worker B gets every
    input A had not committed but the 6th, which A's open transaction holds back (the
    pending acknowledgement); once A's transaction times out (3 s) the 6th is delivered
    again and B commits it. Every output is read exactly once."""
    _process, ready = standalone
    source, sink = topic_name("ctp-in"), topic_name("ctp-out")
    inputs = [f"in{i:02d}".encode() for i in range(20)]
    plain = client.create_producer(source)
    worker_a = await WireConnection(ready["service_url"]).open()
    await worker_a.connect_coordinators()
    consumer_a = await worker_a.subscribe(source, "transform", permits=1000)
    producer_a = await worker_a.producer(sink)
    for payload in inputs:
        plain.send(payload)
    for _ in range(5):
        assert await transform(worker_a, consumer_a, producer_a, await consumer_a.receive())
    dying = await worker_a.new_txn(timeout_ms=3000)
    sixth = await consumer_a.receive()
    await producer_a.send(b"out-" + sixth.payload, dying)
    await consumer_a.ack(sixth, dying)
    await worker_a.close()   # dies: no END_TXN; the coordinator's timeout ends it

    consumer_b = await wire.subscribe(source, "transform", permits=1000)
    producer_b = await wire.producer(sink)
    done: set[bytes] = set()
    conflicts = 0
    while len(done) < 15:
        message = await consumer_b.receive(timeout_s=20)
        if message.payload in done:
            continue
        if await transform(wire, consumer_b, producer_b, message):
            done.add(message.payload)
        else:
            conflicts += 1
    # The 6th was never delivered to B while A's transaction held it: no conflict.
    assert conflicts == 0 and sixth.payload in done
    reader = client.subscribe(sink, "check", initial_position=pulsar.InitialPosition.Earliest)
    outputs = await asyncio.to_thread(receive_all, reader, 3000)
    assert sorted(outputs) == [b"out-" + p for p in inputs], outputs
    # Every input is acknowledged on the subscription: a new consumer gets nothing.
    await consumer_b.close()
    leftover = client.subscribe(source, "transform", consumer_type=pulsar.ConsumerType.Shared)
    assert await asyncio.to_thread(receive_all, leftover, 2000) == []
