"""Namespace policies that act as time passes, seen through the official Pulsar client
(pulsar-client) on a cluster of this module (etcd, three bookies, one broker that
applies the policies every 0.5 s instead of 5 s).

Proves: with a message TTL, messages nobody consumed in time are acknowledged for the
subscription (its backlog empties; a consumer then gets only what came later);
backlog quotas act by their policy — producer_exception fails the producer's sends and
refuses new producers with ProducerBlockedQuotaExceededException until the backlog is
consumed, producer_request_hold refuses new producers with
ProducerBlockedQuotaExceededError until then, consumer_backlog_eviction drops the
oldest backlog so the subscription keeps only the newest messages; /metrics counts
what each did. (The broker also names an advertised listener: a client asking for it
works, one asking for a listener the broker lacks is refused.)
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import pulsar
import pytest

from tests.cluster import Cluster, free_port, unique, wait_until

RECEIVE_TIMEOUT_MS = 10_000
POLICY_CHECK_INTERVAL_S = 0.5
PAYLOAD = b"x" * 200


@pytest.fixture(scope="module")
def policy_cluster(etcd_process, tmp_path_factory):
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("policy-cluster")))
    try:
        asyncio.run(cluster.start_bookies(3))
        port = free_port()
        asyncio.run(cluster.start_brokers(
            1, port=port, extra_args=["--policy-check-interval-s", str(POLICY_CHECK_INTERVAL_S),
                                      "--advertised-listeners", f"internal:pulsar://127.0.0.1:{port}"]))
        yield cluster
    finally:
        asyncio.run(cluster.stop())


@pytest.fixture(scope="module")
def policy_client(policy_cluster):
    client = pulsar.Client(policy_cluster.brokers[0].service_url, operation_timeout_seconds=10)
    yield client
    client.close()


def _admin(cluster, method: str, path: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{cluster.brokers[0].web_service_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=15) as response:
        text = response.read()
    return json.loads(text) if text else None


def _namespace(cluster, policy: str, value: object) -> str:
    namespace = unique("ns")
    _admin(cluster, "PUT", f"/admin/v2/namespaces/public/{namespace}")
    _admin(cluster, "POST", f"/admin/v2/namespaces/public/{namespace}/{policy}", value)
    return namespace


def _backlog(cluster, namespace: str, local: str) -> int:
    stats = _admin(cluster, "GET", f"/admin/v2/persistent/public/{namespace}/{local}/stats")
    return stats["subscriptions"]["sub"]["msgBacklog"]


def _metric(cluster, name: str) -> float:
    with urllib.request.urlopen(f"{cluster.brokers[0].web_service_url}/metrics", timeout=15) as response:
        text = response.read().decode()
    match = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_message_ttl_expires_unconsumed_messages(policy_cluster, policy_client):
    """TTL 1 s: five messages left unconsumed are acknowledged for the subscription by
    the broker (backlog 0); the consumer then receives only a message sent later."""
    namespace = _namespace(policy_cluster, "messageTTL", 1)
    local = unique("ttl")
    topic = f"persistent://public/{namespace}/{local}"
    policy_client.subscribe(topic, "sub").close()
    producer = policy_client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"old{i}".encode())
    assert _backlog(policy_cluster, namespace, local) == 5
    wait_until(lambda: _backlog(policy_cluster, namespace, local) == 0, 20, "the TTL to expire the backlog")
    assert _metric(policy_cluster, "magnetar_broker_messages_expired") >= 5
    consumer = policy_client.subscribe(topic, "sub")
    producer.send(b"fresh")
    assert consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS).data() == b"fresh"
    consumer.close()
    producer.close()


def test_backlog_quota_producer_exception(policy_cluster, policy_client):
    """Quota 2 KiB, producer_exception: once the backlog is past it, the producer's
    sends fail and a new producer is refused, both with
    ProducerBlockedQuotaExceededException; once the subscription consumed everything,
    a producer is created and sends again."""
    namespace = _namespace(policy_cluster, "backlogQuota", {"limitSize": 2048, "policy": "producer_exception"})
    local = unique("quota-exception")
    topic = f"persistent://public/{namespace}/{local}"
    policy_client.subscribe(topic, "sub").close()
    producer = policy_client.create_producer(topic, batching_enabled=False)
    for _ in range(20):
        producer.send(PAYLOAD)

    def send_refused() -> bool:
        try:
            producer.send(PAYLOAD)
        except pulsar.ProducerBlockedQuotaExceededException:
            return True
        return False

    wait_until(send_refused, 20, "a send to fail with ProducerBlockedQuotaExceededException")
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        policy_client.create_producer(topic)
    consumer = policy_client.subscribe(topic, "sub")
    while True:
        try:
            consumer.acknowledge(consumer.receive(timeout_millis=2000))
        except pulsar.Timeout:
            break
    wait_until(lambda: _backlog(policy_cluster, namespace, local) == 0, 20, "the acknowledgements to land")
    again = policy_client.create_producer(topic, batching_enabled=False)
    again.send(b"after")
    assert consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS).data() == b"after"
    assert _metric(policy_cluster, "magnetar_broker_backlog_quota_producers_refused") >= 1
    for closable in (again, consumer, producer):
        closable.close()


def test_backlog_quota_producer_request_hold(policy_cluster, policy_client):
    """Quota 2 KiB, producer_request_hold: past it, a new producer is refused with
    ProducerBlockedQuotaExceededError; after the backlog is consumed one is created."""
    namespace = _namespace(policy_cluster, "backlogQuota", {"limitSize": 2048, "policy": "producer_request_hold"})
    local = unique("quota-hold")
    topic = f"persistent://public/{namespace}/{local}"
    policy_client.subscribe(topic, "sub").close()
    producer = policy_client.create_producer(topic, batching_enabled=False)
    for _ in range(20):
        producer.send(PAYLOAD)
    producer.close()
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
        policy_client.create_producer(topic)
    consumer = policy_client.subscribe(topic, "sub")
    for _ in range(20):
        consumer.acknowledge(consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS))
    wait_until(lambda: _backlog(policy_cluster, namespace, local) == 0, 20, "the acknowledgements to land")
    policy_client.create_producer(topic).close()
    consumer.close()


def test_backlog_quota_consumer_backlog_eviction(policy_cluster, policy_client):
    """Quota 2 KiB, consumer_backlog_eviction: fifty 200-byte messages left unconsumed;
    the broker skips the oldest until the backlog fits the quota, and the producer is
    never refused. The consumer then gets only the newest messages, ending with the
    last one."""
    namespace = _namespace(policy_cluster, "backlogQuota",
                           {"limitSize": 2048, "policy": "consumer_backlog_eviction"})
    local = unique("quota-evict")
    topic = f"persistent://public/{namespace}/{local}"
    policy_client.subscribe(topic, "sub").close()
    producer = policy_client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        producer.send(f"{i:03d}".encode() + PAYLOAD)
    wait_until(lambda: _backlog(policy_cluster, namespace, local) <= 10, 20, "the backlog to be evicted")
    assert _backlog(policy_cluster, namespace, local) > 0
    consumer = policy_client.subscribe(topic, "sub")
    got = []
    while True:
        try:
            message = consumer.receive(timeout_millis=2000)
        except pulsar.Timeout:
            break
        got.append(int(message.data()[:3]))
        consumer.acknowledge(message)
    assert got and got[-1] == 49 and len(got) <= 10, got
    assert got == list(range(got[0], 50))
    assert _metric(policy_cluster, "magnetar_broker_backlog_quota_evicted_entries") >= 40
    consumer.close()
    producer.close()


def test_advertised_listeners(policy_cluster):
    """The broker advertises one listener, "internal". A client created with
    listener_name="internal" looks topics up through it and produces and consumes; a
    client naming a listener the broker lacks cannot create a producer."""
    url = policy_cluster.brokers[0].service_url
    topic = f"persistent://public/default/{unique('listener')}"
    client = pulsar.Client(url, listener_name="internal", operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(topic, "sub")
        client.create_producer(topic).send(b"via internal")
        assert consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS).data() == b"via internal"
    finally:
        client.close()
    stranger = pulsar.Client(url, listener_name="nope", operation_timeout_seconds=3)
    try:
        with pytest.raises(pulsar.PulsarException):
            stranger.create_producer(topic)
    finally:
        stranger.close()
