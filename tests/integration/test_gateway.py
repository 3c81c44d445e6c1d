"""The HTTP gateway on real processes: etcd, 3 bookies, a broker and two gateways
(``magnetar gateway``), with the official ``pulsar-client`` on the other side.

What it proves (the issue's "Must show"):
- produce over HTTP → consume with pulsar-client, and the reverse, with payloads, keys,
  properties and event times intact (batched and not);
- 3 HTTP workers on one shared subscription take 10,000 messages, each processed exactly
  once when they ack and no lease expires; a worker that pulls and never acks sees its
  messages go to another worker after the lease, with the delivery attempt raised;
  extending the lease prevents that;
- two gateway instances: pull from one, ack (and nack, and extend) through the other;
  kill -9 of a gateway holding leases: its messages are redelivered through another,
  none lost;
- broadcast: 2 members each get every message; key-shared keeps each key's order;
- dead letters after max_deliveries; push over Server-Sent Events with the same receipts.
How: each test its own topic on the module's cluster; HTTP through aiohttp.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import time

import aiohttp
import pytest

from common.errors import LeaseExpired
from gateway.receipts import ReceiptKeys, decode
from tests.cluster import Cluster
from tests.integration.gateway_helpers import Gateway, drain, new_topic_path, payload_bytes, start_gateway_cluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def gw_cluster(etcd_process, tmp_path_factory):
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("gateway-cluster")))
    try:
        asyncio.run(start_gateway_cluster(cluster, gateways=2))
        yield cluster
    finally:
        asyncio.run(cluster.stop())


@pytest.fixture(scope="module")
def pulsar_client(gw_cluster):
    import pulsar

    client = pulsar.Client(gw_cluster.brokers[0].service_url, operation_timeout_seconds=30)
    yield client
    client.close()


@pytest.fixture
async def gateways(gw_cluster):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield [Gateway(g.url, session) for g in gw_cluster.gateways[:2]]


async def test_http_produce_is_consumed_by_the_official_client(gateways, pulsar_client):
    """One message, a batch and a stream produced over HTTP arrive at a pulsar-client
    consumer with payload, key, properties and event time as sent."""
    import pulsar

    gateway = gateways[0]
    topic, path = new_topic_path("http-to-native")
    consumer = pulsar_client.subscribe(topic, "native", consumer_type=pulsar.ConsumerType.Shared,
                                       initial_position=pulsar.InitialPosition.Earliest)
    sent = [
        {"payload": "single", "key": "k-single", "properties": {"p": "1"}, "event_time_ms": 1_700_000_000_001},
    ]
    _, document = await gateway.call("POST", f"{gateway.topic_url(path)}/message", sent[0])
    assert document["message_id"].count(":") == 3
    batch = [{"payload": base64.b64encode(bytes([i, 0, 255])).decode(), "encoding": "base64", "key": "k-batch",
              "properties": {"i": str(i)}, "event_time_ms": 1_700_000_000_100 + i} for i in range(5)]
    ids = await gateway.produce(path, batch)
    assert len({i.rsplit(":", 2)[0] for i in ids}) == 1, "a batch request of one key is one entry"
    keyed = await gateway.produce(path, [{"payload": f"key-{i}", "key": f"k{i}"} for i in range(3)])
    assert len({i.rsplit(":", 2)[0] for i in keyed}) == 3, "one entry per key (key-shared routes entries)"
    lines = b"".join(json.dumps({"payload": f"line-{i}", "key": "stream"}).encode() + b"\n" for i in range(3))
    async with gateway.session.post(f"{gateway.topic_url(path)}/messages/stream", data=lines) as response:
        results = [json.loads(line) for line in (await response.text()).splitlines()]
    assert [r["status"] for r in results] == ["stored"] * 3, results
    received = []
    for _ in range(12):
        message = await asyncio.to_thread(consumer.receive, 10_000)
        received.append(message)
        consumer.acknowledge(message)
    consumer.close()
    by_payload = {m.data(): m for m in received}
    single = by_payload[b"single"]
    assert single.partition_key() == "k-single"
    assert single.properties() == {"p": "1"}
    assert single.event_timestamp() == 1_700_000_000_001
    for i in range(5):
        message = by_payload[bytes([i, 0, 255])]
        assert message.partition_key() == "k-batch"
        assert message.properties() == {"i": str(i)}
        assert message.event_timestamp() == 1_700_000_000_100 + i
    assert {f"line-{i}".encode() for i in range(3)} <= set(by_payload)
    assert [by_payload[f"key-{i}".encode()].partition_key() for i in range(3)] == ["k0", "k1", "k2"]


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
async def test_official_producer_is_pulled_over_http(gateways, pulsar_client, batching):
    """Messages from a pulsar-client producer (batched or not) come out of an HTTP pull
    with payload (text or base64), key, properties and event time intact."""
    gateway = gateways[0]
    topic, path = new_topic_path("native-to-http")
    await gateway.subscribe(path, "http")
    producer = pulsar_client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=50)
    expected = {}
    for i in range(20):
        payload = f"text-{i}".encode() if i % 2 else bytes([0xFF, i])
        expected[payload] = i
        producer.send_async(payload, None, partition_key=f"key-{i}", properties={"n": str(i)},
                            event_timestamp=1_600_000_000_000 + i)
    producer.flush()
    producer.close()
    got = await drain(gateway, path, "http")
    assert len(got) == 20
    for message in got:
        i = expected[payload_bytes(message)]
        assert message["encoding"] == ("text" if i % 2 else "base64")
        assert message["key"] == f"key-{i}"
        assert message["properties"] == {"n": str(i)}
        assert message["event_time_ms"] == 1_600_000_000_000 + i
        assert message["delivery_attempt"] == 1


async def test_three_workers_process_10000_messages_exactly_once(gateways):
    """3 workers pulling from one shared subscription (through both gateways) and acking
    each pull: all 10,000 messages arrive, each exactly once, all on first delivery."""
    topic, path = new_topic_path("work-queue")
    await gateways[0].subscribe(path, "jobs")
    await asyncio.gather(*(gateways[i % 2].produce(path, [{"payload": f"job-{i * 100 + j}"} for j in range(100)])
                           for i in range(100)))
    seen: collections.Counter[str] = collections.Counter()
    attempts: collections.Counter[int] = collections.Counter()

    async def worker(gateway: Gateway) -> int:
        taken = 0
        idle_polls = 0
        while idle_polls < 2:
            messages = await gateway.pull(path, "jobs", max_messages=100, wait_ms=1000, lease_ms=60_000)
            if not messages:
                idle_polls += 1 if sum(seen.values()) >= 10_000 else 0
                continue
            for message in messages:
                seen[message["payload"]] += 1
                attempts[message["delivery_attempt"]] += 1
            await gateway.ack(path, "jobs", messages)
            taken += len(messages)
        return taken

    started = time.monotonic()
    counts = await asyncio.wait_for(asyncio.gather(worker(gateways[0]), worker(gateways[1]), worker(gateways[0])),
                                    timeout=180)
    assert len(seen) == 10_000
    assert set(seen.values()) == {1}, [p for p, n in seen.items() if n > 1][:10]
    assert attempts == {1: 10_000}
    assert sum(counts) == 10_000
    assert all(count > 0 for count in counts), counts
    print(f"10,000 messages through 3 HTTP workers in {time.monotonic() - started:.1f} s: {counts}")


async def test_unacked_lease_goes_to_another_worker_and_extension_prevents_it(gateways):
    """Worker A pulls and never acks: after its 1 s lease, worker B gets the same
    messages with delivery_attempt 2. Extending a lease instead keeps them from B until
    the new deadline; A then acks, and nothing comes again."""
    gateway = gateways[0]
    _, path = new_topic_path("leases")
    await gateway.subscribe(path, "s")
    await gateway.produce(path, [{"payload": f"m{i}"} for i in range(10)])
    taken_by_a = await gateway.pull(path, "s", max_messages=10, wait_ms=5000, lease_ms=1000)
    assert len(taken_by_a) == 10 and all(m["delivery_attempt"] == 1 for m in taken_by_a)
    started = time.monotonic()
    taken_by_b = []
    while len(taken_by_b) < 10 and time.monotonic() - started < 15:
        taken_by_b += await gateway.pull(path, "s", max_messages=10, wait_ms=2000, lease_ms=2000)
    assert time.monotonic() - started >= 0.9, "redelivered before the lease ended"
    assert sorted(m["payload"] for m in taken_by_b) == sorted(m["payload"] for m in taken_by_a)
    assert all(m["delivery_attempt"] == 2 for m in taken_by_b)
    # B extends (its lease was 2 s): nothing reaches a third pull for 3 s.
    results = await gateway.settle(path, "s", "extend", [m["receipt"] for m in taken_by_b], lease_ms=6000)
    assert all(r["status"] == "extended" for r in results), results
    assert await gateway.pull(path, "s", max_messages=10, wait_ms=3000) == []
    # The old receipts still ack (the broker is the authority), the new ones too.
    await gateway.ack(path, "s", [{"receipt": r["receipt"]} for r in results])
    assert await gateway.pull(path, "s", max_messages=10, wait_ms=2500) == []


async def _entries_returned_unused(gateway: Gateway) -> float:
    async with gateway.session.get(f"{gateway.url}/metrics") as response:
        text = await response.text()
    (line,) = [line for line in text.splitlines() if line.startswith("magnetar_gateway_entries_returned_unused_total")]
    return float(line.split()[-1])


async def test_read_ahead_given_back_unused_is_not_a_delivery(gateways):
    """A steady puller makes gateway 0 read ahead; when it stops, what it read ahead goes
    back after the ready hold marked unused (its metrics count those entries), and pulled
    then through gateway 1 every message is on its first delivery attempt: a message no
    client got is not a delivery (before, the broker counted it, and max_deliveries could
    dead-letter a message nobody ever pulled)."""
    first, second = gateways
    _, path = new_topic_path("read-ahead")
    await first.subscribe(path, "s")
    for i in range(30):                       # 30 entries of 5 messages
        await first.produce(path, [{"payload": f"m{i}.{j}"} for j in range(5)])
    unused_before = await _entries_returned_unused(first)
    pulled: list[dict] = []
    for _ in range(6):                        # the read-ahead grows to what these pulls take
        messages = await first.pull(path, "s", max_messages=5, wait_ms=3000)
        await first.ack(path, "s", messages)
        pulled += messages
    deadline = time.monotonic() + 20
    while await _entries_returned_unused(first) == unused_before:
        assert time.monotonic() < deadline, "gateway 0 gave nothing back unused: it read nothing ahead"
        await asyncio.sleep(0.2)
    while len(pulled) < 150:
        assert time.monotonic() < deadline + 30, f"only {len(pulled)} of 150 messages came back"
        messages = await second.pull(path, "s", max_messages=50, wait_ms=2000)
        await second.ack(path, "s", messages)
        pulled += messages
    assert sorted(m["payload"] for m in pulled) == sorted(f"m{i}.{j}" for i in range(30) for j in range(5))
    attempts = collections.Counter(m["delivery_attempt"] for m in pulled)
    assert attempts == {1: 150}, attempts


async def test_pull_from_one_gateway_settle_through_the_other(gateways):
    """Receipts from gateway 0 are acked, nacked and extended through gateway 1: acked
    messages never come back, a nack returns the message at once (with attempt 2), an
    extension is forwarded to the lease holder."""
    first, second = gateways
    _, path = new_topic_path("two-gateways")
    await first.subscribe(path, "s")
    # One entry each: a nacked message of a batch entry would wait for its siblings'
    # leases (the broker redelivers whole entries; tests/unit/test_gateway_leases.py).
    for i in range(6):
        await first.call("POST", f"{first.topic_url(path)}/message", {"payload": f"m{i}"})
    messages = []
    while len(messages) < 6:
        messages += await first.pull(path, "s", max_messages=6, wait_ms=5000, lease_ms=1500)
    assert len(messages) == 6
    by_payload = {m["payload"]: m for m in messages}
    acked = [by_payload[f"m{i}"] for i in range(4)]
    await second.ack(path, "s", acked)
    extended = await second.settle(path, "s", "extend", [by_payload["m4"]["receipt"]], lease_ms=8000)
    assert extended[0]["status"] == "extended", extended
    nacked = await second.settle(path, "s", "nack", [by_payload["m5"]["receipt"]])
    assert nacked == [{"status": "nacked"}]
    again = await second.pull(path, "s", max_messages=6, wait_ms=3000)
    assert [(m["payload"], m["delivery_attempt"]) for m in again] == [("m5", 2)]
    await second.ack(path, "s", again)
    # Past the first lease: the acked ones and the extended one stay away.
    assert await second.pull(path, "s", max_messages=6, wait_ms=2500) == []
    results = await second.settle(path, "s", "ack", [extended[0]["receipt"]])
    assert results == [{"status": "acked"}]


async def test_kill9_of_a_gateway_holding_leases_loses_nothing(gw_cluster, gateways):
    """A third gateway pulls 50 messages with a long lease and is killed with SIGKILL:
    every one of them is pulled again through another gateway (attempt 2), none lost."""
    third = gw_cluster.gateway("gateway-doomed", extra_args=["--body-mib-max", "1"])
    await third.start()
    doomed = Gateway(third.url, gateways[0].session)
    _, path = new_topic_path("kill9")
    await doomed.subscribe(path, "s")
    await doomed.produce(path, [{"payload": f"m{i}"} for i in range(50)])
    held = []
    while len(held) < 50:
        held += await doomed.pull(path, "s", max_messages=50, wait_ms=3000, lease_ms=600_000)
    third.kill9()
    again = await drain(gateways[0], path, "s", idle_s=3)
    assert sorted(m["payload"] for m in again) == sorted(m["payload"] for m in held)
    assert all(m["delivery_attempt"] == 2 for m in again)
    # Its receipts: acks still apply (nothing to do now), nack and extend say the lease is gone.
    results = await gateways[1].settle(path, "s", "extend", [held[0]["receipt"]], lease_ms=1000)
    assert results[0]["status"] == "error" and results[0]["error"]["code"] == LeaseExpired.code, results


async def test_broadcast_members_each_get_every_message(gateways):
    """Two members of a broadcast subscription each receive all 200 messages once."""
    _, path = new_topic_path("broadcast")
    for member in ("m1", "m2"):
        await gateways[0].subscribe(path, "fanout", mode="broadcast", member=member)
    await gateways[0].produce(path, [{"payload": f"e{i}"} for i in range(200)])
    got = await asyncio.gather(*(drain(gateways[i], path, "fanout", mode="broadcast", member=member)
                                 for i, member in enumerate(("m1", "m2"))))
    for messages in got:
        assert sorted(m["payload"] for m in messages) == sorted(f"e{i}" for i in range(200))
    _, backlog = await gateways[0].call("GET", f"{gateways[0].topic_url(path)}/subscriptions/fanout/backlog?member=m1")
    assert backlog["backlog"] == 0, backlog


async def test_key_shared_keeps_each_keys_order(gateways):
    """Two key-shared consumers (one per gateway) pulling while messages of 16 keys are
    produced: each key goes to one consumer, in the order produced, and both get keys."""
    _, path = new_topic_path("key-shared")
    await gateways[0].subscribe(path, "ks", mode="key_shared", consumer="c1")
    keys = [f"key-{k}" for k in range(16)]
    received: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)

    async def consumer(name: str, gateway: Gateway) -> None:
        for message in await drain(gateway, path, "ks", mode="key_shared", consumer=name, idle_s=3):
            key, sequence = message["payload"].split(":")
            assert message["key"] == key
            received[key].append((name, int(sequence)))

    async def producer() -> None:
        await asyncio.sleep(0.5)    # both consumers attached first
        for start in range(0, 480, 48):
            await gateways[0].produce(path, [{"payload": f"{keys[i % 16]}:{i}", "key": keys[i % 16]}
                                             for i in range(start, start + 48)])

    await asyncio.gather(consumer("c1", gateways[0]), consumer("c2", gateways[1]), producer())
    assert sum(len(v) for v in received.values()) == 480
    for key, deliveries in received.items():
        sequences = [sequence for _, sequence in deliveries]
        assert sequences == sorted(sequences), (key, sequences)
        assert len({name for name, _ in deliveries}) == 1, (key, deliveries)
    assert len({name for deliveries in received.values() for name, _ in deliveries}) == 2


async def test_dead_letter_after_max_deliveries(gateways, pulsar_client):
    """With max_deliveries=2, a message nacked twice is not delivered a third time: it
    goes to {topic}-{subscription}-DLQ, where the official client reads it."""
    topic, path = new_topic_path("dlq")
    gateway = gateways[0]
    await gateway.subscribe(path, "s")
    dead_letter = pulsar_client.subscribe(f"{topic}-s-DLQ", "dlq-reader",
                                          initial_position=__import__("pulsar").InitialPosition.Earliest)
    await gateway.produce(path, [{"payload": "poison", "properties": {"a": "1"}}])
    for attempt in (1, 2):
        messages = await gateway.pull(path, "s", max_messages=1, wait_ms=5000, max_deliveries=2)
        assert [m["delivery_attempt"] for m in messages] == [attempt]
        await gateway.settle(path, "s", "nack", [messages[0]["receipt"]])
    assert await gateway.pull(path, "s", max_messages=1, wait_ms=2000, max_deliveries=2) == []
    message = await asyncio.to_thread(dead_letter.receive, 10_000)
    assert message.data() == b"poison"
    assert message.properties()["a"] == "1"
    assert message.properties()["REAL_TOPIC"] == topic
    dead_letter.close()


async def test_a_stale_receipt_never_settles_another_workers_lease(gateways):
    """Worker A's lease (1 s) ends; the message goes to worker B (attempt 2). A's late
    ack, through either gateway, answers LeaseExpired per receipt and changes nothing:
    B's lease still holds (B extends and acks it), and the message is not delivered a
    third time."""
    _, path = new_topic_path("stale")
    first, second = gateways
    await first.subscribe(path, "s")
    await first.produce(path, [{"payload": "once"}])
    (held_by_a,) = await first.pull(path, "s", max_messages=1, wait_ms=5000, lease_ms=1000)
    await asyncio.sleep(1.5)
    held_by_b = []
    while not held_by_b:
        held_by_b = await first.pull(path, "s", max_messages=1, wait_ms=5000, lease_ms=30_000)
    assert held_by_b[0]["delivery_attempt"] == 2 and held_by_b[0]["payload"] == "once"
    for gateway in (first, second):
        (result,) = await gateway.settle(path, "s", "ack", [held_by_a["receipt"]])
        assert result["status"] == "error" and result["error"]["error"] == "LeaseExpired", result
        assert "not acknowledged" in result["error"]["message"], result
    (extended,) = await second.settle(path, "s", "extend", [held_by_b[0]["receipt"]], lease_ms=30_000)
    assert extended["status"] == "extended", extended
    await second.ack(path, "s", held_by_b)
    assert await first.pull(path, "s", max_messages=1, wait_ms=1500) == []


async def test_two_processes_serve_one_port_and_settle_at_the_lease_holder(gw_cluster):
    """--processes 2: both processes answer on the one port (receipts name two settle
    addresses), and a nack or extension arriving at the process that does not hold the
    lease is forwarded to the one that does: over fresh connections, every one of them
    succeeds, and the nacked messages come back."""
    multi = gw_cluster.gateway("gateway-multi", extra_args=["--processes", "2", "--ready-hold-ms", "1000"])
    await multi.start()
    try:
        _, path = new_topic_path("processes")
        async with aiohttp.ClientSession() as session:
            await Gateway(multi.url, session).subscribe(path, "s", initial_position="earliest")
            for i in range(40):   # one entry each (a batch entry goes to one consumer whole)
                await Gateway(multi.url, session).call("POST", f"{Gateway(multi.url, session).topic_url(path)}/message",
                                                       {"payload": f"p{i}"})
        held, issuers = [], set()
        for _ in range(200):
            if len(held) >= 40:
                break
            # A fresh connection each time: the kernel spreads them over the processes
            # (by a hash of the connection's addresses). One message a pull, so that 40
            # connections all landing on one process (2^-39) cannot pass for one process
            # answering alone.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                got = await Gateway(multi.url, session).pull(path, "s", max_messages=1, wait_ms=2000)
            held += got
            issuers |= {decode(m["receipt"], _keys(gw_cluster)).issuer_url for m in got}
        assert len(held) == 40 and len(issuers) == 2, (len(held), issuers)
        assert multi.url not in issuers   # each process is named by its own settle address
        for message in held:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                gateway = Gateway(multi.url, session)
                (extended,) = await gateway.settle(path, "s", "extend", [message["receipt"]], lease_ms=30_000)
                assert extended["status"] == "extended", extended
                (nacked,) = await gateway.settle(path, "s", "nack", [extended["receipt"]])
                assert nacked["status"] == "nacked", nacked
        async with aiohttp.ClientSession() as session:
            again = await drain(Gateway(multi.url, session), path, "s")
        assert sorted(m["payload"] for m in again) == sorted(f"p{i}" for i in range(40))
    finally:
        await multi.terminate()


def _keys(cluster) -> ReceiptKeys:
    kid, secret = cluster.gateway_secret.split(":", 1)
    return ReceiptKeys("standalone", {kid: secret.encode()}, kid)


async def test_ordered_pulls_hold_back_a_leased_keys_later_messages(gateways):
    """ordered: true (Pub/Sub's ordering keys, within a gateway consumer): a pull gets
    one message per key, every key at once (throughput across keys is not held back),
    and no later message of a key while one of it is leased; acking releases the next.
    Two workers see each key's messages strictly in order, never two of a key at once."""
    _, path = new_topic_path("ordered")
    gateway = gateways[0]
    await gateway.subscribe(path, "s")
    await gateway.produce(path, [{"payload": f"{key}-{n}", "key": key} for n in range(4) for key in "wxyz"])
    first = []
    while not first:
        first = await gateway.pull(path, "s", max_messages=16, wait_ms=5000, ordered=True)
    assert sorted(m["payload"] for m in first) == ["w-0", "x-0", "y-0", "z-0"], first
    assert await gateway.pull(path, "s", max_messages=16, wait_ms=300, ordered=True) == []
    seen: dict[str, list[int]] = collections.defaultdict(list)
    held: set[str] = set()

    async def worker(initial: list[dict]) -> None:
        batch = initial
        while True:
            keys = [m["key"] for m in batch]
            assert len(keys) == len(set(keys)) and not held & set(keys), (keys, held)
            held.update(keys)
            for m in batch:
                seen[m["key"]].append(int(m["payload"].split("-")[1]))
            await asyncio.sleep(0.05)
            held.difference_update(keys)
            await gateway.ack(path, "s", batch)
            if sum(len(v) for v in seen.values()) >= 16:
                return
            batch = await gateway.pull(path, "s", max_messages=3, wait_ms=500, ordered=True)

    await asyncio.gather(worker(first), worker([]))
    assert dict(seen) == {key: [0, 1, 2, 3] for key in "wxyz"}, seen


async def test_reject_sends_straight_to_the_dead_letter_topic(gateways, pulsar_client):
    """reject, sent through the gateway that did not issue the receipt (so forwarded to
    the one holding the lease), publishes the message to the dead-letter topic at its
    first delivery and acknowledges it: a result per receipt, the other message of the
    pull is untouched, and the same receipt again is a clear per-message error."""
    topic, path = new_topic_path("reject")
    first, second = gateways
    await first.subscribe(path, "s")
    dead_letter = pulsar_client.subscribe(f"{topic}-s-DLQ", "dlq-reader",
                                          initial_position=__import__("pulsar").InitialPosition.Earliest)
    await first.produce(path, [{"payload": "poison", "properties": {"a": "1"}}, {"payload": "fine"}])
    messages = []
    while len(messages) < 2:
        messages += await first.pull(path, "s", max_messages=2, wait_ms=5000)
    poison = next(m for m in messages if m["payload"] == "poison")
    fine = next(m for m in messages if m["payload"] == "fine")
    assert poison["delivery_attempt"] == 1
    results = await second.settle(path, "s", "reject", [poison["receipt"], "not-a-receipt"])
    assert results[0] == {"status": "rejected", "dead_letter_topic": f"{topic}-s-DLQ"}, results
    assert results[1]["status"] == "error" and results[1]["error"]["error"] == "InvalidReceipt", results
    message = await asyncio.to_thread(dead_letter.receive, 10_000)
    assert message.data() == b"poison"
    assert message.properties()["a"] == "1" and message.properties()["REAL_TOPIC"] == topic
    again = await first.settle(path, "s", "reject", [poison["receipt"]])
    assert again[0]["status"] == "error" and again[0]["error"]["error"] == "LeaseExpired", again
    await first.ack(path, "s", [fine])
    assert await first.pull(path, "s", max_messages=2, wait_ms=1500) == []
    dead_letter.close()


async def test_server_sent_events_push_with_credits(gateways):
    """An SSE stream with 3 credits delivers 3 messages, then nothing until they are
    acked; acks free credits and the rest arrives; each event carries receipts."""
    gateway = gateways[0]
    _, path = new_topic_path("sse")
    await gateway.subscribe(path, "push")
    await gateway.produce(path, [{"payload": f"p{i}"} for i in range(5)])
    url = f"{gateway.topic_url(path)}/subscriptions/push/events?credits=3&lease_ms=30000"
    received = []
    async with gateway.session.get(url) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")

        async def next_batch(timeout_s: float) -> list[dict]:
            data = None
            async with asyncio.timeout(timeout_s):
                while True:
                    line = (await response.content.readline()).decode().rstrip("\n")
                    if line.startswith("data: "):
                        data = json.loads(line[6:])
                    elif line == "" and data is not None:
                        return data["messages"]

        while len(received) < 3:
            received += await next_batch(10)
        assert len(received) == 3
        with pytest.raises(TimeoutError):
            await next_batch(1.5)
        await gateway.ack(path, "push", received)
        more = []
        while len(more) < 2:
            more += await next_batch(10)
        await gateway.ack(path, "push", more)
    assert sorted(m["payload"] for m in received + more) == [f"p{i}" for i in range(5)]


async def _create_partitioned(gw_cluster, gateway: Gateway, path: str, partitions: int) -> None:
    """A partitioned topic, through the broker's admin API."""
    admin = gw_cluster.brokers[0].web_service_url
    async with gateway.session.put(f"{admin}/admin/v2/{path}/partitions", data=str(partitions).encode(),
                                   headers={"Content-Type": "application/json"}) as response:
        assert response.status in (200, 204), await response.text()


async def test_partitioned_topic_over_http(gw_cluster, gateways):
    """A topic of 3 partitions: keyed messages land on the partition of their key
    (message ids name it), keyless ones on one partition per request; a pull drains all
    partitions, and receipts of partitions settle through the topic's path."""
    gateway = gateways[0]
    topic, path = new_topic_path("partitioned")
    await _create_partitioned(gw_cluster, gateway, path, 3)
    await gateway.subscribe(path, "s")
    ids = await gateway.produce(path, [{"payload": f"k{i % 6}:{i}", "key": f"k{i % 6}"} for i in range(60)])
    partition_of_key = {}
    for i, message_id in enumerate(ids):
        partition = int(message_id.split(":")[2])
        assert partition_of_key.setdefault(f"k{i % 6}", partition) == partition
    assert len(set(partition_of_key.values())) > 1
    got = await drain(gateway, path, "s")
    assert sorted(m["payload"] for m in got) == sorted(f"k{i % 6}:{i}" for i in range(60))


async def test_topic_unload_moves_producers_and_consumers_without_loss(gw_cluster, gateways):
    """The broker unloads the topic (CLOSE_PRODUCER, CLOSE_CONSUMER) while the gateway
    holds leases: its producer and consumer reconnect; the leased messages come back
    (the broker redelivers what a closed consumer held) and produce goes on."""
    gateway = gateways[0]
    _, path = new_topic_path("unload")
    admin = gw_cluster.brokers[0].web_service_url
    await gateway.subscribe(path, "s")
    for i in range(10):
        await gateway.call("POST", f"{gateway.topic_url(path)}/message", {"payload": f"m{i}"})
    held = []
    while len(held) < 5:
        held += await gateway.pull(path, "s", max_messages=5 - len(held), wait_ms=3000, lease_ms=600_000)
    async with gateway.session.put(f"{admin}/admin/v2/{path}/unload") as response:
        assert response.status in (200, 204), await response.text()
    await gateway.call("POST", f"{gateway.topic_url(path)}/message", {"payload": "after"})
    got = await drain(gateway, path, "s", idle_s=3)
    assert sorted(m["payload"] for m in got) == sorted([f"m{i}" for i in range(10)] + ["after"])
    redelivered = {m["payload"]: m["delivery_attempt"] for m in got if m["payload"] in {h["payload"] for h in held}}
    assert set(redelivered) == {m["payload"] for m in held}
    results = await gateway.settle(path, "s", "extend", [held[0]["receipt"]], lease_ms=1000)
    assert results[0]["error"]["code"] == LeaseExpired.code, results


async def test_peek_shows_the_next_messages_without_taking_them(gw_cluster, gateways):
    """GET .../peek: the subscription's next unacknowledged messages (a batch entry split
    into its messages, keys and properties kept), nothing leased or delivered — a pull
    after it still gets them — and once some are acked they are gone from the peek; a
    partitioned topic is read across its partitions; bad input is 400, an unknown
    subscription 404."""
    gateway = gateways[1]
    _, path = new_topic_path("peek")
    await gateway.subscribe(path, "s")
    await gateway.produce(path, [{"payload": f"b{i}", "properties": {"i": str(i)}} for i in range(5)])
    await gateway.call("POST", f"{gateway.topic_url(path)}/message",
                       {"payload": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64", "key": "k"})
    url = f"{gateway.topic_url(path)}/subscriptions/s/peek"
    _, document = await gateway.call("GET", f"{url}?max_messages=3")
    assert [m["payload"] for m in document["messages"]] == ["b0", "b1", "b2"]
    assert document["messages"][1]["properties"] == {"i": "1"}
    assert document["messages"][0]["publish_time_ms"] > 0
    _, document = await gateway.call("GET", f"{url}?max_messages=10")
    assert [m["payload"] for m in document["messages"][:5]] == [f"b{i}" for i in range(5)]
    last = document["messages"][5]
    assert (last["encoding"], last["payload"], last["key"]) == ("base64", base64.b64encode(b"\xff\x00").decode(), "k")
    pulled = await gateway.pull(path, "s", max_messages=6, wait_ms=5000)
    assert [m["payload"] for m in pulled[:5]] == [f"b{i}" for i in range(5)]      # peeking took nothing
    await gateway.ack(path, "s", pulled)
    _, document = await gateway.call("GET", url)
    assert document["messages"] == []
    await gateway.call("GET", f"{url}?max_messages=0", expect=400)
    await gateway.call("GET", f"{url}?encoding=hex", expect=400)
    await gateway.call("GET", f"{gateway.topic_url(path)}/subscriptions/nobody/peek", expect=404)

    _, partitioned = new_topic_path("peek-partitioned")
    await _create_partitioned(gw_cluster, gateway, partitioned, 3)
    await gateway.subscribe(partitioned, "s")
    await gateway.produce(partitioned, [{"payload": f"k{i}", "key": f"key-{i}"} for i in range(12)])
    _, document = await gateway.call("GET", f"{gateway.topic_url(partitioned)}/subscriptions/s/peek?max_messages=20")
    assert sorted(m["payload"] for m in document["messages"]) == sorted(f"k{i}" for i in range(12))
    assert len({m["message_id"].split(":")[2] for m in document["messages"]}) > 1
