"""Transactions' admin REST on two brokers, and acknowledgements held in a transaction
on a subscription or topic that is deleted (``magnetar standalone --brokers 2``, one
bookie).

The transactional side speaks through tests/txn_wire.py (the official Python client has
no transaction API; see tests/integration/test_transactions.py): NEW_TXN and ADD_*_TO_TXN
to the coordinator's broker, sends and acknowledgements to the topic's owner, as the
Java client sends them. What other consumers get is read with the official client; the
durable pending-acknowledgement records are read from etcd.

Proves:
- a subscription deleted (admin DELETE, or the official client's unsubscribe) while
  open transactions hold acknowledgements on it takes them along: their records leave
  etcd at once, a subscription made again under the name is neither held back by them
  nor acknowledged by their commit, the commit and the abort succeed and do not bring
  the deleted subscription back; records of a deleted subscription left behind by a
  broker that died before removing them are removed when the topic is loaded again;
- a deleted topic takes its pending acknowledgements along, and a transaction's commit
  afterwards neither fails nor makes the topic again;
- /admin/v3/transactions/slowTransactions and coordinatorStats asked of either broker
  answer for every coordinator, the other broker's gathered; ?coordinatorId asked of
  the wrong broker is redirected (307); once the transactions end, each coordinator's
  execution-latency series (Pulsar's pulsar_txn_execution_latency_le_* and the
  histogram) count each in a bucket no earlier than its lifetime;
- transactionBufferStats, pendingAckStats, transactionInBufferStats,
  transactionInPendingAckStats and positionStatsInPendingAck carry Pulsar's field names and values that follow an
  open transaction, its abort and a reload of the topic; asked of the broker not
  serving the topic they are redirected (307) to the one that does; the transaction's
  metadata, asked of its coordinator's broker, carries the same per-topic parts (asked
  of the topic's broker).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pulsar
import pytest
import pytest_asyncio

from bench.fanout_check import running_standalone
from common.topic_name import TopicName
from metadata import keys, open_store
from protocol.proto import pulsar_api_pb2 as pb
from tests.integration.test_transactions import receive_all, topic_name
from tests.txn_wire import ASSIGN_TOPIC, WireConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

EXCLUSIVE, SHARED = pb.CommandSubscribe.Exclusive, pb.CommandSubscribe.Shared
TXN = "/admin/v3/transactions"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None   # a 3xx is raised as HTTPError: the test sees it


_OPENER = urllib.request.build_opener(_NoRedirects)


def http(method: str, url: str, body: object = None) -> tuple[int, object, str | None]:
    """(status, JSON answer or None, Location) of one request (``body`` sent as JSON),
    redirects not followed."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, method=method, data=data,
                                     headers={} if data is None else {"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=30) as answer:
            body = answer.read()
            return answer.status, json.loads(body) if body.strip() else None, None
    except urllib.error.HTTPError as error:
        body = error.read()
        try:
            parsed = json.loads(body) if body.strip() else None
        except ValueError:
            parsed = body.decode(errors="replace")
        return error.code, parsed, error.headers.get("Location")


def followed(method: str, url: str) -> tuple[int, object]:
    """One request, following at most one 307 (to the broker serving what it names)."""
    status, body, location = http(method, url)
    if status == 307:
        status, body, _again = http(method, location)
    return status, body


def rest_path(topic: str) -> str:
    return TopicName.parse(topic).rest_path


def txn_path(topic: str) -> str:
    """How /admin/v3/transactions paths name a persistent topic: tenant/namespace/topic."""
    return rest_path(topic).removeprefix("persistent/")


def position(message) -> str:
    return f"{message.ledger_id}:{message.entry_id}"


def latency_series(web_url: str, coordinator_id: int) -> dict[str, float]:
    """The transaction execution-latency series of one coordinator, from its broker's
    /metrics: Pulsar's pulsar_txn_execution_latency_le_* and the histogram's count."""
    with urllib.request.urlopen(f"{web_url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if f'coordinator_id="{coordinator_id}"' in line and (
                line.startswith("pulsar_txn_execution_latency_le_")
                or line.startswith("magnetar_broker_transaction_execution_seconds_count")):
            found[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found


@dataclass
class Cluster:
    ready: dict
    connections: dict[str, WireConnection]
    web: list[str]            # each broker's admin base URL
    client: pulsar.Client
    store: object             # the metadata store (etcd)

    @property
    def any(self) -> WireConnection:
        return next(iter(self.connections.values()))

    async def owner(self, topic: str) -> WireConnection:
        return self.connections[await self.any.lookup(topic)]

    def coordinator(self, coordinator_id: int) -> WireConnection:
        return self.connections[self.any.transactions[coordinator_id]]

    async def web_of(self, topic: str) -> tuple[str, str]:
        """(the admin URL of the broker serving ``topic``, that of the other one)."""
        status, body = await asyncio.to_thread(followed, "GET", f"{self.web[0]}/lookup/v2/topic/{rest_path(topic)}")
        assert status == 200, (status, body)
        owner = body["httpUrl"].rstrip("/")
        assert owner in self.web, (owner, self.web)
        return owner, next(url for url in self.web if url != owner)

    async def topic_not_on(self, url: str, prefix: str) -> str:
        """A new topic served by the broker that is not ``url``."""
        for _ in range(40):
            topic = topic_name(prefix)
            if await self.any.lookup(topic) != url:
                return topic
        raise AssertionError(f"40 new topics all went to {url}: cannot put a topic on the other broker")

    async def pending_records(self, topic: str, subscription: str | None = None) -> list[str]:
        key_path = TopicName.parse(topic).key_path
        prefix = keys.pending_acks_of_topic(key_path) if subscription is None else \
            keys.pending_acks_of_subscription(key_path, subscription)
        return [record.key for record in await self.store.get_prefix(prefix, keys_only=True)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory):
    async with running_standalone(str(tmp_path_factory.mktemp("txn-admin") / "data"), bookies=1, copies=1,
                                  brokers=2) as (_process, ready):
        urls = [f"pulsar://{host}" for host in ready["service_url"].removeprefix("pulsar://").split(",")]
        assert len(urls) == 2, ready
        connections = {url: await WireConnection(url).open() for url in urls}
        store = open_store(ready["metadata"])
        client = pulsar.Client(ready["service_url"], operation_timeout_seconds=30)
        try:
            for connection in connections.values():
                await connection.connect_coordinators()
            _status, (cluster_name,) = await asyncio.to_thread(followed, "GET",
                                                               f"{ready['admin_url']}/admin/v2/clusters")
            _status, addresses = await asyncio.to_thread(followed, "GET",
                                                         f"{ready['admin_url']}/admin/v2/brokers/{cluster_name}")
            assert len(addresses) == 2, addresses
            yield Cluster(ready, connections, [f"http://{address}" for address in addresses], client, store)
        finally:
            client.close()
            for connection in connections.values():
                await connection.close()
            await store.close()


async def filled(client: pulsar.Client, topic: str, count: int) -> None:
    producer = client.create_producer(topic)
    for i in range(count):
        await asyncio.to_thread(producer.send, f"m{i}".encode())
    producer.close()


# --- held acknowledgements of a deleted subscription or topic ---------------------------------------


async def test_held_acknowledgements_go_with_their_deleted_subscription(cluster):
    topic = topic_name("txn-sub-deleted")
    await filled(cluster.client, topic, 4)
    owner = await cluster.owner(topic)
    owner_web, _other_web = await cluster.web_of(topic)
    gone = await owner.subscribe(topic, "gone", sub_type=SHARED)
    again = await owner.subscribe(topic, "again", sub_type=SHARED)
    left = await owner.subscribe(topic, "left", sub_type=SHARED)
    on_gone = [await gone.receive() for _ in range(4)]
    on_again = [await again.receive() for _ in range(4)]
    on_left = [await left.receive() for _ in range(4)]
    committed = await cluster.coordinator(0).new_txn(timeout_ms=120_000, coordinator_id=0)
    aborted = await cluster.coordinator(1).new_txn(timeout_ms=120_000, coordinator_id=1)
    await gone.ack(on_gone[0], committed)
    await gone.ack(on_gone[1], committed)
    await again.ack(on_again[0], committed)
    await gone.ack(on_gone[2], aborted)
    await left.ack(on_left[3], aborted)
    assert len(await cluster.pending_records(topic, "gone")) == 2
    assert len(await cluster.pending_records(topic, "again")) == 1
    assert len(await cluster.pending_records(topic, "left")) == 1
    await gone.close()
    await again.close()
    await left.close()

    # A client's unsubscribe (the official consumer's) deletes them as the admin does.
    leaving = cluster.client.subscribe(topic, "left", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(await asyncio.to_thread(receive_all, leaving, 1500)) == [b"m0", b"m1", b"m2"]   # m3 held
    await asyncio.to_thread(leaving.unsubscribe)
    assert await cluster.pending_records(topic, "left") == []

    # Deleted by the admin REST: the records go at once, the stats know it no more.
    base = f"{owner_web}/admin/v2/{rest_path(topic)}/subscription"
    for name in ("gone", "again"):
        status, body, _location = await asyncio.to_thread(http, "DELETE", f"{base}/{name}")
        assert status in (200, 204), (status, body)
    assert await cluster.pending_records(topic) == []
    status, body = await asyncio.to_thread(followed, "GET", f"{owner_web}{TXN}/pendingAckStats/{txn_path(topic)}/gone")
    assert status == 404 and body["error"] == "SubscriptionNotFound", (status, body)

    # "again" is made again at the start: a new subscription, not held back by the
    # deleted one's acknowledgements, and not acknowledged by their commit.
    status, body, _location = await asyncio.to_thread(http, "PUT", f"{base}/again", {"ledgerId": -1, "entryId": -1})
    assert status in (200, 204), (status, body)
    status, stats = await asyncio.to_thread(followed, "GET",
                                            f"{owner_web}{TXN}/pendingAckStats/{txn_path(topic)}/again")
    assert status == 200 and stats.get("ongoingTxnSize") == 0 and stats.get("pendingAckSize") == 0, (status, stats)

    # The transaction's metadata still names the subscription; there is nothing of it left.
    status, metadata = await asyncio.to_thread(
        followed, "GET", f"{cluster.web[0]}{TXN}/transactionMetadata/{committed.most}/{committed.least}")
    assert status == 200 and metadata["ackedPartitions"] == {topic: {"gone": {}, "again": {
        "cumulativeAckPosition": None, "individualAckSize": 0}}}, (status, metadata)

    await cluster.coordinator(0).end(committed, commit=True)    # neither fails ...
    await cluster.coordinator(1).end(aborted, commit=False)
    status, names = await asyncio.to_thread(followed, "GET", f"{owner_web}/admin/v2/{rest_path(topic)}/subscriptions")
    assert (status, sorted(names)) == (200, ["again"]), (status, names)   # ... nor brings "gone" back
    status, topic_stats = await asyncio.to_thread(followed, "GET", f"{owner_web}/admin/v2/{rest_path(topic)}/stats")
    assert topic_stats["subscriptions"]["again"]["msgBacklog"] == 4, topic_stats["subscriptions"]
    consumer = cluster.client.subscribe(topic, "again", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(await asyncio.to_thread(receive_all, consumer, 2000)) == [b"m0", b"m1", b"m2", b"m3"]
    await asyncio.to_thread(consumer.close)
    assert await cluster.pending_records(topic) == []

    # A broker that died after deleting the cursor but before the records: the records
    # of a subscription that does not exist are removed when the topic is loaded again.
    key_path = TopicName.parse(topic).key_path
    await cluster.store.put(keys.pending_acks(key_path, "ghost", "3:999"), b"[[1,0,null,0]]")
    status, body, _location = await asyncio.to_thread(http, "PUT", f"{owner_web}/admin/v2/{rest_path(topic)}/unload")
    assert status in (200, 204), (status, body)
    status, buffer = await asyncio.to_thread(followed, "GET",
                                             f"{owner_web}{TXN}/transactionBufferStats/{txn_path(topic)}")
    assert status == 200 and buffer["recoverEndTime"] >= buffer["recoverStartTime"] > 0, (status, buffer)
    assert await cluster.pending_records(topic) == []
    status, names = await asyncio.to_thread(followed, "GET", f"{owner_web}/admin/v2/{rest_path(topic)}/subscriptions")
    assert (status, sorted(names)) == (200, ["again"]), (status, names)


async def test_held_acknowledgements_go_with_their_deleted_topic(cluster):
    topic = topic_name("txn-topic-deleted")
    await filled(cluster.client, topic, 2)
    owner = await cluster.owner(topic)
    owner_web, _other_web = await cluster.web_of(topic)
    consumer = await owner.subscribe(topic, "work", sub_type=SHARED)
    received = [await consumer.receive() for _ in range(2)]
    txn = await cluster.coordinator(2).new_txn(timeout_ms=120_000, coordinator_id=2)
    await consumer.ack(received[0], txn)
    assert len(await cluster.pending_records(topic)) == 1
    await consumer.close()

    status, body, _location = await asyncio.to_thread(http, "DELETE", f"{owner_web}/admin/v2/{rest_path(topic)}")
    assert status in (200, 204), (status, body)
    assert await cluster.pending_records(topic) == []
    await cluster.coordinator(2).end(txn, commit=True)    # does not fail ...
    namespace = rest_path(topic).rsplit("/", 1)[0]
    status, topics = await asyncio.to_thread(followed, "GET", f"{owner_web}/admin/v2/{namespace}")
    assert status == 200 and topic not in topics, (status, topics)   # ... nor makes the topic again
    assert await cluster.pending_records(topic) == []


# --- slow transactions of every coordinator -----------------------------------------------------------


async def test_slow_transactions_are_gathered_from_every_broker(cluster):
    coordinators = sorted(cluster.any.transactions)
    txns = [await cluster.coordinator(n).new_txn(timeout_ms=120_000, coordinator_id=n) for n in coordinators]
    mine = {f"({txn.most},{txn.least})" for txn in txns}
    served = {url: {n for n in coordinators if cluster.any.transactions[n] == url} for url in cluster.connections}
    coordinator_webs = {n: (await cluster.web_of(f"{ASSIGN_TOPIC}-partition-{n}"))[0] for n in coordinators}
    before = {n: await asyncio.to_thread(latency_series, coordinator_webs[n], n) for n in coordinators}
    ended = False
    try:
        await asyncio.sleep(1.2)
        for base in cluster.web:
            status, slow = await asyncio.to_thread(followed, "GET", f"{base}{TXN}/slowTransactions/1000")
            assert status == 200 and mine <= set(slow), (base, status, slow, served)
            for txn in txns:
                one = slow[f"({txn.most},{txn.least})"]
                assert one["status"] == "OPEN" and one["openTimestamp"] > 0, one
            status, none_slow = await asyncio.to_thread(followed, "GET", f"{base}{TXN}/slowTransactions/3600000")
            assert status == 200 and not mine & set(none_slow), (base, none_slow)

        # ?coordinatorId=N asked of a broker that does not serve N: 307 to the one that does.
        for n in coordinators:
            for base in cluster.web:
                status, body, location = await asyncio.to_thread(
                    http, "GET", f"{base}{TXN}/slowTransactions/1000?coordinatorId={n}")
                if status == 307:
                    status, body, _location = await asyncio.to_thread(http, "GET", location)
                assert status == 200 and {f"({txns[n].most},{txns[n].least})"} == mine & set(body), (n, base, body)
        # Pulsar's coordinatorStats: every coordinator, or one alone with ?coordinatorId.
        for base in cluster.web:
            status, stats = await asyncio.to_thread(followed, "GET", f"{base}{TXN}/coordinatorStats")
            assert status == 200 and sorted(stats) == [str(n) for n in coordinators], (base, stats)
            assert all(one["state"] == "Ready" and one["ongoingTxnSize"] >= 1 for one in stats.values()), stats
            status, one = await asyncio.to_thread(followed, "GET", f"{base}{TXN}/coordinatorStats?coordinatorId=1")
            assert status == 200 and one["state"] == "Ready" and one["ongoingTxnSize"] >= 1, (base, one)
        # Which broker served what (2 brokers, 4 coordinators): each broker asked above
        # answered for coordinators it does not serve unless one broker served them all.
        print("coordinators served by broker:", served)

        # Ended (one committed, the others aborted): each lived more than 1.2 s, so it
        # falls in Pulsar's le_5000 bucket or a later one, never an earlier one.
        for index, txn in enumerate(txns):
            await cluster.coordinator(txn.most).end(txn, commit=index == 0)
        ended = True
        for n in coordinators:
            after = await asyncio.to_thread(latency_series, coordinator_webs[n], n)
            grown = {name: after[name] - before[n].get(name, 0) for name in after}
            assert len([name for name in after if name.startswith("pulsar_txn_execution_latency_le_")]) == 14, after
            assert grown["magnetar_broker_transaction_execution_seconds_count"] == 1, (n, grown)
            early = ("10", "20", "50", "100", "500", "1000")
            assert sum(grown[f"pulsar_txn_execution_latency_le_{ms}"] for ms in early) == 0, (n, grown)
            assert sum(value for name, value in grown.items() if name.startswith("pulsar_txn_execution")) == 1, grown
    finally:
        if not ended:
            for txn in txns:
                await cluster.coordinator(txn.most).end(txn, commit=False)


# --- per-topic stats ------------------------------------------------------------------------------------


async def test_transaction_buffer_and_pending_ack_stats_answered_by_the_topics_broker(cluster):
    coordinator_url = cluster.any.transactions[3]
    topic = await cluster.topic_not_on(coordinator_url, "txn-stats")
    await filled(cluster.client, topic, 3)
    owner = await cluster.owner(topic)
    owner_web, other_web = await cluster.web_of(topic)
    path = txn_path(topic)
    consumer = await owner.subscribe(topic, "stats", sub_type=EXCLUSIVE)
    received = [await consumer.receive() for _ in range(3)]
    producer = await owner.producer(topic)
    txn = await cluster.coordinator(3).new_txn(timeout_ms=120_000, coordinator_id=3)
    sent_at = await producer.send(b"in-txn", txn)
    await consumer.ack(received[1], txn, cumulative=True)
    ids = f"{txn.most}/{txn.least}"

    # Asked of the other broker: redirected to the topic's.
    for suffix in (f"transactionBufferStats/{path}", f"pendingAckStats/{path}/stats",
                   f"transactionInBufferStats/{path}/{ids}", f"transactionInPendingAckStats/{path}/stats/{ids}"):
        status, _body, location = await asyncio.to_thread(http, "GET", f"{other_web}{TXN}/{suffix}")
        assert status == 307 and location.startswith(owner_web), (suffix, status, location)

    def get(suffix: str) -> dict:
        status, body, _location = http("GET", f"{owner_web}{TXN}/{suffix}")
        assert status == 200, (suffix, status, body)
        return body

    buffer = await asyncio.to_thread(get, f"transactionBufferStats/{path}")
    assert buffer["state"] == "Ready" and buffer["ongoingTxnSize"] == 1 and buffer["abortedTxnSize"] == 0, buffer
    assert buffer["maxReadPosition"] == position(received[2]), (buffer, received[2])   # readers stop before the txn
    assert buffer["lastSnapshotTimestamps"] == 0, buffer
    in_buffer = await asyncio.to_thread(get, f"transactionInBufferStats/{path}/{ids}")
    assert in_buffer == {"startPosition": f"{sent_at[0]}:{sent_at[1]}", "aborted": False}, (in_buffer, sent_at)
    pending = await asyncio.to_thread(get, f"pendingAckStats/{path}/stats")
    assert pending == {"state": "Ready", "ongoingTxnSize": 1, "pendingAckSize": 1}, pending
    in_pending = await asyncio.to_thread(get, f"transactionInPendingAckStats/{path}/stats/{ids}")
    assert in_pending == {"cumulativeAckPosition": position(received[1]), "individualAckSize": 0}, in_pending
    # Under the cumulative acknowledgement, or not.
    for message, state in ((received[0], "PendingAck"), (received[1], "PendingAck"),
                           (received[2], "NotInPendingAck")):
        got = await asyncio.to_thread(
            get, f"positionStatsInPendingAck/{path}/stats/{message.ledger_id}/{message.entry_id}")
        assert got == {"state": state}, (message, got)
    status, missing, _location = await asyncio.to_thread(http, "GET", f"{owner_web}{TXN}/pendingAckStats/{path}/nope")
    assert status == 404 and missing["error"] == "SubscriptionNotFound", (status, missing)

    # The transaction's metadata, from its coordinator's broker (the other one): the
    # per-topic parts asked of the topic's broker, as Pulsar's broker asks them.
    status, metadata = await asyncio.to_thread(followed, "GET", f"{other_web}{TXN}/transactionMetadata/{ids}")
    assert status == 200 and metadata["status"] == "OPEN", (status, metadata)
    assert metadata["producedPartitions"] == {topic: in_buffer}, metadata
    assert metadata["ackedPartitions"] == {topic: {"stats": in_pending}}, metadata
    assert "owner" in metadata and metadata["timeoutAt"] == 120_000, metadata

    await cluster.coordinator(3).end(txn, commit=False)
    buffer = await asyncio.to_thread(get, f"transactionBufferStats/{path}")
    assert buffer["ongoingTxnSize"] == 0 and buffer["abortedTxnSize"] == 1, buffer
    assert await asyncio.to_thread(get, f"transactionInBufferStats/{path}/{ids}") == {"startPosition": None,
                                                                                       "aborted": True}
    assert await asyncio.to_thread(get, f"pendingAckStats/{path}/stats") == {
        "state": "Ready", "ongoingTxnSize": 0, "pendingAckSize": 0}
    assert (await asyncio.to_thread(get, f"transactionInPendingAckStats/{path}/stats/{ids}"))[
        "cumulativeAckPosition"] is None
    first = f"positionStatsInPendingAck/{path}/stats/{received[0].ledger_id}/{received[0].entry_id}"
    assert await asyncio.to_thread(get, first) == {"state": "NotInPendingAck"}   # released by the abort
    await consumer.ack(received[0])   # plainly, for good
    deadline = time.monotonic() + 10
    while (state := (await asyncio.to_thread(get, first))["state"]) != "MarkDelete":
        assert time.monotonic() < deadline, state
        await asyncio.sleep(0.1)
    await consumer.close()

    # Loaded again (maybe by the other broker): the buffer rebuilt from the topic, the
    # aborted transaction found again behind its marker.
    started = int(time.time() * 1000)
    status, body, _location = await asyncio.to_thread(http, "PUT", f"{owner_web}/admin/v2/persistent/{path}/unload")
    assert status in (200, 204), (status, body)
    status, buffer = await asyncio.to_thread(followed, "GET", f"{owner_web}{TXN}/transactionBufferStats/{path}")
    assert status == 200 and buffer["recoverEndTime"] >= buffer["recoverStartTime"] >= started, (status, buffer)
    assert buffer["ongoingTxnSize"] == 0 and buffer["abortedTxnSize"] == 1, buffer
