"""Topic-level policies on a real broker (etcd, 1 bookie, 1 broker checking policies
every half second), set through Pulsar's admin paths and felt by the official
pulsar-client.

Proves: GET/POST/DELETE of ``retention``, ``messageTTL`` (Pulsar's ``?messageTTL=``
query parameter), ``backlogQuota`` / ``backlogQuotaMap``, ``maxProducers``,
``maxConsumers``, ``deduplicationEnabled`` and ``compactionThreshold`` on a topic: its own
value (``null`` when unset), ``?applied=true`` the value in force (topic, else namespace,
else broker default), 404 for a missing topic, 400 for a bad body; precedence enforced
by the same code as namespace policies: a namespace's ``maxProducersPerTopic`` of 3
overridden by a topic's ``maxProducers`` of 1 refuses the second producer with
ProducerBusy, and removing the topic's lets it in; ``maxConsumers`` refuses a second
Shared consumer with ConsumerBusy; a topic ``messageTTL`` of 1 s expires that topic's
backlog while a sibling topic under the namespace (no TTL) keeps its own; a partitioned
topic's policy holds on its partitions; a topic's ``schemaCompatibilityStrategy``
(ALWAYS_INCOMPATIBLE) refuses with IncompatibleSchema the evolution its namespace's
BACKWARD lets a sibling topic make; ``persistence`` reads back. And the failure rule: with the topic's policy
record unreadable in etcd, the broker refuses to serve the topic — PRODUCER answered
ServiceNotReady (retriable) on the wire, the applied GET 503 — and an official client
that keeps retrying gets in once an operator writes the policy again, under that policy
(a second producer is refused).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pulsar
import pytest

from metadata import keys, open_store
from tests.cluster import Cluster, unique
from tests.raw_pulsar import RawConnection

POLICY_CHECK_INTERVAL_S = 0.5


@pytest.fixture(scope="module")
def policy_cluster(etcd_process, tmp_path_factory):
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("topic-policies")))
    try:
        asyncio.run(cluster.start_bookies(1))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
            "--policy-check-interval-s", str(POLICY_CHECK_INTERVAL_S)]))
        yield cluster
    finally:
        asyncio.run(cluster.stop())


@pytest.fixture(scope="module")
def policy_client(policy_cluster):
    client = pulsar.Client(policy_cluster.brokers[0].service_url, operation_timeout_seconds=10)
    yield client
    client.close()


def http(cluster, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(cluster.brokers[0].web_service_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        return error.code, json.loads(text) if text else None


def ok(cluster, method: str, path: str, body: object = None) -> object:
    status, answer = http(cluster, method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer


def _namespace(cluster) -> str:
    namespace = f"public/{unique('tp')}"
    ok(cluster, "PUT", f"/admin/v2/namespaces/{namespace}")
    return namespace


def _topic(cluster, namespace: str) -> tuple[str, str]:
    """A new non-partitioned topic: (its persistent:// name, its admin path)."""
    local = unique("t")
    ok(cluster, "PUT", f"/admin/v2/persistent/{namespace}/{local}")
    return f"persistent://{namespace}/{local}", f"/admin/v2/persistent/{namespace}/{local}"


def test_admin_paths_of_topic_policies(policy_cluster):
    """Each policy: unset is null, set reads back, applied shows topic over namespace over
    broker default, delete returns to the namespace's; bad bodies and missing topics
    are refused."""
    cluster = policy_cluster
    namespace = _namespace(cluster)
    ok(cluster, "POST", f"/admin/v2/namespaces/{namespace}/retention",
       {"retentionTimeInMinutes": 10, "retentionSizeInMB": 5})
    ok(cluster, "POST", f"/admin/v2/namespaces/{namespace}/maxConsumersPerTopic", 4)
    _, path = _topic(cluster, namespace)
    retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    assert http(cluster, "GET", f"{path}/retention") == (200, None)
    assert ok(cluster, "GET", f"{path}/retention?applied=true") == {"retentionTimeInMinutes": 10,
                                                                      "retentionSizeInMB": 5}
    ok(cluster, "POST", f"{path}/retention", retention)
    assert ok(cluster, "GET", f"{path}/retention") == retention
    assert ok(cluster, "GET", f"{path}/retention?applied=true") == retention
    ok(cluster, "DELETE", f"{path}/retention")
    assert http(cluster, "GET", f"{path}/retention") == (200, None)

    ok(cluster, "POST", f"{path}/messageTTL?messageTTL=120")
    assert ok(cluster, "GET", f"{path}/messageTTL") == 120
    ok(cluster, "POST", f"{path}/messageTTL", 90)          # a JSON body works too
    assert ok(cluster, "GET", f"{path}/messageTTL") == 90

    quota = {"limitSize": 1 << 20, "limitTime": -1, "policy": "producer_exception"}
    ok(cluster, "POST", f"{path}/backlogQuota?backlogQuotaType=destination_storage", quota)
    assert ok(cluster, "GET", f"{path}/backlogQuotaMap")["destination_storage"]["limitSize"] == 1 << 20
    ok(cluster, "DELETE", f"{path}/backlogQuota?backlogQuotaType=destination_storage")
    assert ok(cluster, "GET", f"{path}/backlogQuotaMap") == {}

    assert ok(cluster, "GET", f"{path}/maxConsumers?applied=true") == 4          # the namespace's
    assert ok(cluster, "GET", f"{path}/maxProducers?applied=true") == 10_000     # the broker's default
    ok(cluster, "POST", f"{path}/maxConsumers", 2)
    assert ok(cluster, "GET", f"{path}/maxConsumers") == 2
    assert ok(cluster, "GET", f"{path}/maxConsumers?applied=true") == 2
    ok(cluster, "POST", f"{path}/deduplicationEnabled", True)
    assert ok(cluster, "GET", f"{path}/deduplicationEnabled") is True
    ok(cluster, "POST", f"{path}/compactionThreshold", 1 << 30)
    assert ok(cluster, "GET", f"{path}/compactionThreshold?applied=true") == 1 << 30

    for bad_path, body in ((f"{path}/retention", {"retentionTimeInMinutes": "long"}),
                           (f"{path}/maxProducers", -3), (f"{path}/deduplicationEnabled", "yes"),
                           (f"{path}/messageTTL", None)):
        assert http(cluster, "POST", bad_path, body)[0] == 400, bad_path
    missing = f"/admin/v2/persistent/{namespace}/{unique('missing')}"
    assert http(cluster, "GET", f"{missing}/retention")[0] == 404
    assert http(cluster, "POST", f"{missing}/maxProducers", 1)[0] == 404


def test_topic_limits_override_the_namespaces(policy_cluster, policy_client):
    """Topic maxProducers 1 over the namespace's 3: the second producer is ProducerBusy;
    without the topic's, the namespace's 3 hold. maxConsumers 1: the second Shared
    consumer is ConsumerBusy."""
    cluster, client = policy_cluster, policy_client
    namespace = _namespace(cluster)
    ok(cluster, "POST", f"/admin/v2/namespaces/{namespace}/maxProducersPerTopic", 3)
    topic, path = _topic(cluster, namespace)
    ok(cluster, "POST", f"{path}/maxProducers", 1)
    first = client.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    ok(cluster, "DELETE", f"{path}/maxProducers")
    more = [client.create_producer(topic) for _ in range(2)]         # 3 in all: the namespace's limit
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    for producer in (first, *more):
        producer.close()

    ok(cluster, "POST", f"{path}/maxConsumers", 1)
    consumer = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    consumer.close()


def _backlog(cluster, path: str) -> int:
    return ok(cluster, "GET", f"{path}/stats")["subscriptions"]["sub"]["msgBacklog"]


def test_topic_message_ttl_expires_only_that_topics_backlog(policy_cluster, policy_client):
    """A topic's messageTTL of 1 s empties its subscription's backlog; a sibling topic
    of the namespace (no TTL anywhere) keeps its backlog. A partitioned topic's TTL
    acts on its partitions."""
    cluster, client = policy_cluster, policy_client
    namespace = _namespace(cluster)
    expiring, expiring_path = _topic(cluster, namespace)
    kept, kept_path = _topic(cluster, namespace)
    parted_local = unique("parted")
    parted_path = f"/admin/v2/persistent/{namespace}/{parted_local}"
    ok(cluster, "PUT", f"{parted_path}/partitions", 2)
    parted = f"persistent://{namespace}/{parted_local}"
    ok(cluster, "POST", f"{expiring_path}/messageTTL?messageTTL=1")
    ok(cluster, "POST", f"{parted_path}/messageTTL?messageTTL=1")
    for name in (expiring, kept, parted):
        client.subscribe(name, "sub").close()
        producer = client.create_producer(name, batching_enabled=False)
        for i in range(3):
            producer.send(f"m{i}".encode())
        producer.close()
    partition_paths = [f"{parted_path}-partition-{i}" for i in range(2)]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (_backlog(cluster, expiring_path) or
                                           any(_backlog(cluster, p) for p in partition_paths)):
        time.sleep(0.25)
    assert _backlog(cluster, expiring_path) == 0
    assert [_backlog(cluster, p) for p in partition_paths] == [0, 0]
    assert _backlog(cluster, kept_path) == 3


async def _write_raw(cluster, key: str, value: bytes) -> None:
    store = open_store(cluster.metadata_url)
    try:
        await store.put(key, value)
    finally:
        await store.close()


def test_unreadable_topic_policies_refuse_the_topic_until_written_again(policy_cluster, policy_client):
    """The topic's policy record is garbage in etcd and the topic is unloaded: PRODUCER
    is answered ServiceNotReady and the applied GET 503 (the broker will not serve the
    topic under its namespace's policies alone). The official client retrying its
    create_producer gets in once the policy is written again, and that policy
    (maxProducers 1) is in force."""
    cluster, client = policy_cluster, policy_client
    namespace = _namespace(cluster)
    topic, path = _topic(cluster, namespace)
    ok(cluster, "POST", f"{path}/maxProducers", 1)
    ok(cluster, "PUT", f"{path}/unload")
    local = topic.rsplit("/", 1)[1]
    asyncio.run(_write_raw(cluster, keys.topic_policies(f"persistent/{namespace}/{local}"), b"{garbage"))

    raw = RawConnection(cluster.brokers[0].service_url)
    try:
        pb = raw.pb
        raw.send(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
        answer = raw.next_command()
        assert answer.type == pb.BaseCommand.ERROR, answer
        assert answer.error.error == pb.ServiceNotReady and "topic policies" in answer.error.message, answer
    finally:
        raw.close()
    status, body = http(cluster, "GET", f"{path}/maxProducers?applied=true")
    assert status == 503, (status, body)

    retrying = pulsar.Client(cluster.brokers[0].service_url, operation_timeout_seconds=30)
    outcome: dict = {}

    def create() -> None:
        try:
            outcome["producer"] = retrying.create_producer(topic)
        except Exception as error:   # noqa: BLE001 - reported by the assertion below
            outcome["error"] = error

    creator = threading.Thread(target=create)
    creator.start()
    try:
        time.sleep(2)
        assert creator.is_alive(), f"the producer was not held back: {outcome}"
        ok(cluster, "POST", f"{path}/maxProducers", 1)      # the operator writes it again
        creator.join(timeout=40)
        assert "producer" in outcome, outcome
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        outcome["producer"].close()
    finally:
        creator.join(timeout=40)
        retrying.close()


def test_topic_schema_strategy_overrides_the_namespaces(policy_cluster, policy_client):
    """A topic's schemaCompatibilityStrategy (PUT, as Pulsar) of ALWAYS_INCOMPATIBLE
    refuses a second schema that the namespace's BACKWARD accepts on a sibling topic
    (a dropped field); removed, the namespace's applies to it again. Persistence reads
    back, and a bad one is refused."""
    from pulsar.schema import Integer, JsonSchema, Record, String

    cluster, client = policy_cluster, policy_client
    first = type("Item", (Record,), {"name": String(), "qty": Integer()})
    evolved = type("Item", (Record,), {"name": String()})
    namespace = _namespace(cluster)
    assert http(cluster, "PUT", f"/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy", "BACKWARD")[0] == 204
    strict, strict_path = _topic(cluster, namespace)
    sibling, _ = _topic(cluster, namespace)
    assert http(cluster, "PUT", f"{strict_path}/schemaCompatibilityStrategy", "ALWAYS_INCOMPATIBLE")[0] == 204
    assert ok(cluster, "GET", f"{strict_path}/schemaCompatibilityStrategy") == "ALWAYS_INCOMPATIBLE"
    for name in (strict, sibling):
        client.create_producer(name, schema=JsonSchema(first)).close()
    client.create_producer(sibling, schema=JsonSchema(evolved)).close()       # BACKWARD: a dropped field
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(strict, schema=JsonSchema(evolved))
    ok(cluster, "DELETE", f"{strict_path}/schemaCompatibilityStrategy")
    assert ok(cluster, "GET", f"{strict_path}/schemaCompatibilityStrategy?applied=true") == "BACKWARD"
    client.create_producer(strict, schema=JsonSchema(evolved)).close()

    persistence = {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1,
                   "managedLedgerMaxMarkDeleteRate": 0.0}
    ok(cluster, "POST", f"{strict_path}/persistence", persistence)
    assert ok(cluster, "GET", f"{strict_path}/persistence?applied=true") == persistence
    assert http(cluster, "POST", f"{strict_path}/persistence", {"bookkeeperEnsemble": 1,
                                                              "bookkeeperWriteQuorum": 2})[0] == 400
