"""Pulsar's admin REST API (``/admin/v2/...``) on a real broker (etcd, 3 bookies, 1
broker as processes), driven with plain HTTP as users and client test suites drive it,
with the official pulsar-client producing and consuming where a test needs traffic.

Proves: every route answers with Pulsar's paths, methods, status codes and JSON shapes;
errors are JSON with a reason and the status of their kind (400 bad input, 404 missing,
409 exists, 412 precondition); stats and internal stats report what really flowed.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import aiohttp
import pulsar
import pytest

from tests.cluster import unique, wait_until

_NO_BODY = object()


class Admin:
    """A tiny admin client: ``call`` returns (status, decoded JSON or text)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def call(self, method: str, path: str, body: object = _NO_BODY, *, raw: str | None = None,
             ) -> tuple[int, object]:
        data = None
        headers = {}
        if raw is not None:
            data = raw.encode()
        elif body is not _NO_BODY:
            data = json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode()
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    def ok(self, method: str, path: str, body: object = _NO_BODY) -> object:
        status, doc = self.call(method, path, body)
        assert 200 <= status < 300, (method, path, status, doc)
        return doc

    def error(self, expected_status: int, method: str, path: str, body: object = _NO_BODY, *,
              raw: str | None = None) -> dict:
        status, doc = self.call(method, path, body, raw=raw)
        assert status == expected_status, (method, path, status, doc)
        assert isinstance(doc, dict) and doc.get("reason"), doc
        return doc


@pytest.fixture(scope="module")
def admin(pulsar_cluster) -> Admin:
    return Admin(pulsar_cluster.brokers[0].web_service_url)


def new_namespace(admin: Admin) -> str:
    """A fresh tenant/namespace allowed on the broker's cluster."""
    tenant = unique("tenant")
    admin.ok("PUT", f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["standalone"]})
    namespace = f"{tenant}/ns"
    admin.ok("PUT", f"/admin/v2/namespaces/{namespace}")
    return namespace


# --- clusters, tenants, brokers ----------------------------------------------------------------

def test_clusters_crud_and_errors(admin):
    """The broker's own cluster is listed with its URLs; a cluster can be created (once:
    409 the second time), read, updated and deleted; missing clusters are 404, a bad
    body 400, and a cluster a tenant still allows cannot be deleted (412)."""
    assert "standalone" in admin.ok("GET", "/admin/v2/clusters")
    standalone = admin.ok("GET", "/admin/v2/clusters/standalone")
    assert standalone["serviceUrl"].startswith("http://") and standalone["brokerServiceUrl"].startswith("pulsar://")

    name = unique("cluster")
    path = f"/admin/v2/clusters/{name}"
    assert admin.call("PUT", path, {"serviceUrl": "http://elsewhere:8080"}) == (204, None)
    admin.error(409, "PUT", path, {"serviceUrl": "http://elsewhere:8080"})
    assert admin.ok("GET", path)["serviceUrl"] == "http://elsewhere:8080"
    assert name in admin.ok("GET", "/admin/v2/clusters")
    admin.ok("POST", path, {"serviceUrl": "http://moved:8080", "brokerServiceUrl": "pulsar://moved:6650"})
    assert admin.ok("GET", path)["brokerServiceUrl"] == "pulsar://moved:6650"
    admin.error(400, "POST", path, raw="{not json")
    admin.error(400, "POST", path, {"serviceUrl": 42})

    tenant = unique("tenant")
    admin.ok("PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": [name]})
    admin.error(412, "DELETE", path)
    admin.ok("DELETE", f"/admin/v2/tenants/{tenant}")
    assert admin.call("DELETE", path) == (204, None)
    admin.error(404, "GET", path)
    admin.error(404, "DELETE", path)
    admin.error(404, "POST", path, {"serviceUrl": "http://x:1"})
    admin.error(400, "PUT", "/admin/v2/clusters/bad%20name", {})


def test_tenants_crud_and_errors(admin):
    """Tenants are created once (409 after), read back as TenantInfo, updated, listed
    and deleted; a tenant needs existing clusters (412), a missing tenant is 404, a
    malformed body 400, and a tenant with namespaces cannot be deleted (412)."""
    tenant = unique("tenant")
    path = f"/admin/v2/tenants/{tenant}"
    admin.error(404, "GET", path)
    admin.error(412, "PUT", path, {"adminRoles": [], "allowedClusters": ["no-such-cluster"]})
    admin.error(412, "PUT", path, {"adminRoles": [], "allowedClusters": []})
    admin.error(400, "PUT", path, raw="[1, 2")
    admin.error(400, "PUT", path, {"allowedClusters": "standalone"})
    admin.error(400, "PUT", path)
    assert admin.call("PUT", path, {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}) == (204, None)
    admin.error(409, "PUT", path, {"adminRoles": [], "allowedClusters": ["standalone"]})
    assert admin.ok("GET", path) == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    assert tenant in admin.ok("GET", "/admin/v2/tenants")
    admin.ok("POST", path, {"adminRoles": ["ops", "dev"], "allowedClusters": ["standalone"]})
    assert admin.ok("GET", path)["adminRoles"] == ["ops", "dev"]
    admin.error(404, "POST", f"/admin/v2/tenants/{unique('missing')}", {"allowedClusters": ["standalone"]})

    admin.ok("PUT", f"/admin/v2/namespaces/{tenant}/ns1")
    admin.error(412, "DELETE", path)
    admin.ok("DELETE", f"/admin/v2/namespaces/{tenant}/ns1")
    assert admin.call("DELETE", path) == (204, None)
    admin.error(404, "DELETE", path)
    assert tenant not in admin.ok("GET", "/admin/v2/tenants")


async def test_concurrent_tenant_creation_has_one_winner(pulsar_cluster):
    """Eight simultaneous PUTs of one tenant: exactly one succeeds (204), the others get
    409, because creation is a compare-and-swap in etcd, not a check-then-write."""
    base = pulsar_cluster.brokers[0].web_service_url
    tenant = unique("race")
    async with aiohttp.ClientSession() as session:
        async def create() -> int:
            async with session.put(f"{base}/admin/v2/tenants/{tenant}",
                                   json={"adminRoles": [], "allowedClusters": ["standalone"]}) as response:
                await response.read()
                return response.status

        statuses = await asyncio.gather(*(create() for _ in range(8)))
        async with session.delete(f"{base}/admin/v2/tenants/{tenant}") as response:
            assert response.status == 204
    assert sorted(statuses) == [204] + [409] * 7, statuses


def test_brokers_endpoints(admin, pulsar_cluster):
    """The broker lists itself for its cluster (host:port of its web service), is the
    leader while it stands alone, answers health "ok", and shows its runtime settings
    under Pulsar's names; an unknown cluster is 404."""
    broker = pulsar_cluster.brokers[0]
    address = broker.web_service_url.split("://", 1)[1]
    assert admin.ok("GET", "/admin/v2/brokers/standalone") == [address]
    # The election runs beside serving: a broker that just became ready may not have
    # won it yet (503 "no leader elected right now" until it has).
    wait_until(lambda: admin.call("GET", "/admin/v2/brokers/leaderBroker")[0] == 200, 30, "a leader to be elected")
    leader = admin.ok("GET", "/admin/v2/brokers/leaderBroker")
    assert leader["serviceUrl"] == broker.web_service_url
    assert leader["brokerId"] == broker.broker_id
    assert admin.call("GET", "/admin/v2/brokers/health") == (200, "ok")
    runtime = admin.ok("GET", "/admin/v2/brokers/configuration/runtime")
    assert runtime["clusterName"] == "standalone"
    assert runtime["brokerServicePort"] == str(broker.port)
    assert all(isinstance(v, str) for v in runtime.values())
    admin.error(404, "GET", f"/admin/v2/brokers/{unique('nowhere')}")


def test_unknown_paths_and_methods_answer_json(admin):
    """A path no route knows is a 404 with a JSON reason, a known path with the wrong
    method a JSON 405, and a bad query flag a 400."""
    doc = admin.error(404, "GET", "/admin/v2/no/such/thing")
    assert doc["error"] == "NotFound"
    admin.error(405, "PATCH", "/admin/v2/tenants")
    admin.error(400, "DELETE", "/admin/v2/namespaces/public/default?force=maybe")


# --- namespaces and policies ----------------------------------------------------------------------

def test_namespaces_crud_listing_and_delete_with_topics(admin, client):
    """Namespaces are created once (409 after; 404 under a missing tenant), listed, read
    as policies, and list their topics; deleting one that has topics is refused (412)
    until ?force=true, which deletes the topics (and the partitioned topic) with it."""
    tenant = unique("tenant")
    admin.ok("PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": ["standalone"]})
    namespace = f"{tenant}/apps"
    path = f"/admin/v2/namespaces/{namespace}"
    admin.error(404, "PUT", f"/admin/v2/namespaces/{unique('missing')}/apps")
    admin.error(404, "GET", f"/admin/v2/namespaces/{unique('missing')}")
    admin.error(404, "GET", path)
    admin.error(400, "PUT", path, raw="{")
    admin.error(400, "PUT", path, {"message_ttl_in_seconds": -5})
    assert admin.call("PUT", path, {"message_ttl_in_seconds": 60}) == (204, None)
    admin.error(409, "PUT", path)
    assert admin.ok("GET", f"/admin/v2/namespaces/{tenant}") == [namespace]
    policies = admin.ok("GET", path)
    assert policies["message_ttl_in_seconds"] == 60 and policies["broadcast_subscriptions"] == []
    assert admin.ok("GET", f"{path}/topics") == []

    topic = f"persistent://{namespace}/orders"
    producer = client.create_producer(topic)
    producer.send(b"one")
    admin.ok("PUT", f"/admin/v2/persistent/{namespace}/shipments/partitions", 2)
    listed = admin.ok("GET", f"{path}/topics")
    assert listed == sorted([topic, f"persistent://{namespace}/shipments-partition-0",
                             f"persistent://{namespace}/shipments-partition-1"])
    admin.error(412, "DELETE", path)
    assert admin.call("DELETE", f"{path}?force=true") == (204, None)
    admin.error(404, "GET", path)
    admin.error(404, "DELETE", path)
    assert admin.ok("GET", f"/admin/v2/namespaces/{tenant}") == []
    producer.close()
    # Recreated, the namespace starts empty: the topics went with the old one.
    admin.ok("PUT", path)
    assert admin.ok("GET", f"{path}/topics") == []
    assert admin.ok("GET", f"/admin/v2/persistent/{namespace}/partitioned") == []


def test_namespace_policies_roundtrip(admin):
    """Each policy reads null until set, reads back what was POSTed, rejects malformed
    values with 400 (leaving the old value), and reads null again after DELETE;
    backlog quotas are kept per type."""
    namespace = new_namespace(admin)
    base = f"/admin/v2/namespaces/{namespace}"
    cases = [
        ("retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
         {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}, [{"retentionTimeInMinutes": -2}, "big"]),
        ("deduplication", True, True, [1, "yes"]),
        ("messageTTL", 3600, 3600, [-1, True, 1.5]),
        ("persistence", {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2},
         {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2,
          "managedLedgerMaxMarkDeleteRate": 0.0},
         [{"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1},
          {"bookkeeperEnsemble": 0}]),
        ("autoTopicCreation", {"allowAutoTopicCreation": False}, {"allowAutoTopicCreation": False,
                                                                  "topicType": "non-partitioned"},
         [{"allowAutoTopicCreation": "no"}, {"allowAutoTopicCreation": True, "topicType": "sharded"}]),
    ]
    for path, value, stored, bad_values in cases:
        assert admin.call("GET", f"{base}/{path}") == (200, None), path
        assert admin.call("POST", f"{base}/{path}", value) == (204, None), path
        assert admin.ok("GET", f"{base}/{path}") == stored, path
        for bad in bad_values:
            admin.error(400, "POST", f"{base}/{path}", bad)
        admin.error(400, "POST", f"{base}/{path}", raw="{oops")
        admin.error(400, "POST", f"{base}/{path}")
        assert admin.ok("GET", f"{base}/{path}") == stored, path
        assert admin.ok("GET", base)  # the whole policies still read
        assert admin.call("DELETE", f"{base}/{path}") == (204, None), path
        assert admin.call("GET", f"{base}/{path}") == (200, None), path
    # Partitioned auto-creation is refused rather than stored and ignored.
    admin.error(501, "POST", f"{base}/autoTopicCreation",
                {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 4})

    assert admin.ok("GET", f"{base}/backlogQuotaMap") == {}
    admin.ok("POST", f"{base}/backlogQuota", {"limitSize": 1 << 30, "policy": "producer_exception"})
    admin.ok("POST", f"{base}/backlogQuota?backlogQuotaType=message_age",
             {"limitTime": 600, "policy": "consumer_backlog_eviction"})
    quotas = admin.ok("GET", f"{base}/backlogQuotaMap")
    assert quotas["destination_storage"] == {"limit": 1 << 30, "limitSize": 1 << 30, "limitTime": -1,
                                             "policy": "producer_exception"}
    assert quotas["message_age"]["limitTime"] == 600
    admin.error(400, "POST", f"{base}/backlogQuota", {"limitSize": 10, "policy": "drop_everything"})
    admin.error(400, "POST", f"{base}/backlogQuota?backlogQuotaType=weekly", {"limitSize": 10})
    admin.ok("DELETE", f"{base}/backlogQuota")
    assert list(admin.ok("GET", f"{base}/backlogQuotaMap")) == ["message_age"]

    missing = f"/admin/v2/namespaces/{namespace}-gone"
    admin.error(404, "GET", f"{missing}/retention")
    admin.error(404, "POST", f"{missing}/messageTTL", 10)
    admin.error(404, "DELETE", f"{missing}/deduplication")


def test_broadcast_subscriptions_extension(admin):
    """Magnetar's broadcast subscriptions of a namespace: listed (empty at first), added
    with POST of a JSON string (409 if already listed, 400 if not a name), removed with
    DELETE .../{sub} (404 if not listed), and kept in the namespace's policies."""
    namespace = new_namespace(admin)
    path = f"/admin/v2/namespaces/{namespace}/broadcastSubscriptions"
    assert admin.ok("GET", path) == []
    assert admin.call("POST", path, "audit") == (204, None)
    admin.ok("POST", path, "fan out")
    admin.error(409, "POST", path, "audit")
    admin.error(400, "POST", path, {"subscription": "x"})
    admin.error(400, "POST", path, "")
    assert admin.ok("GET", path) == ["audit", "fan out"]
    assert admin.ok("GET", f"/admin/v2/namespaces/{namespace}")["broadcast_subscriptions"] == ["audit", "fan out"]
    assert admin.call("DELETE", f"{path}/{urllib.parse.quote('fan out')}") == (204, None)
    admin.error(404, "DELETE", f"{path}/fan%20out")
    assert admin.ok("GET", path) == ["audit"]
    admin.error(404, "GET", f"/admin/v2/namespaces/{namespace}x/broadcastSubscriptions")


# --- topics -------------------------------------------------------------------------------------------

def test_non_partitioned_topic_lifecycle(admin, client):
    """PUT creates a non-partitioned topic even where auto-creation is off (its managed
    ledger exists: internal stats show an open ledger), a second PUT is 409, names are
    URL-decoded, a name with a space is refused (400), the topic is listed with
    partitions metadata 0; DELETE refuses while
    a producer is attached (412), and with force disconnects it and deletes the topic
    (404 after). A partitioned topic's name, or a partition beyond its count, cannot
    be created this way."""
    namespace = new_namespace(admin)
    admin.ok("POST", f"/admin/v2/namespaces/{namespace}/autoTopicCreation", {"allowAutoTopicCreation": False})
    base = f"/admin/v2/persistent/{namespace}"
    local = "events:v1+raw"
    path = f"{base}/{urllib.parse.quote(local, safe='')}"
    assert admin.call("PUT", path) == (204, None)
    # A name with whitespace is refused, naming the character (issue 39).
    refused = admin.error(400, "PUT", f"{base}/{urllib.parse.quote('events v1', safe='')}")
    assert "may not hold whitespace" in refused["reason"], refused
    admin.error(409, "PUT", path)
    assert admin.ok("GET", base) == [f"persistent://{namespace}/{local}"]
    assert admin.ok("GET", f"{path}/partitions") == {"partitions": 0}
    internal = admin.ok("GET", f"{path}/internalStats")
    assert internal["state"] == "LedgerOpened" and internal["numberOfEntries"] == 0
    assert admin.ok("GET", f"{path}/subscriptions") == []
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(f"persistent://{namespace}/not-created")   # auto-creation is off

    producer = client.create_producer(f"persistent://{namespace}/{local}")
    producer.send(b"kept until deleted")
    admin.error(412, "DELETE", path)
    assert admin.call("DELETE", f"{path}?force=true") == (204, None)
    admin.error(404, "DELETE", path)
    admin.error(404, "GET", f"{path}/stats")
    assert admin.ok("GET", base) == []   # the producer's reconnection may not recreate it
    try:
        producer.close()
    except pulsar.PulsarException:
        pass

    admin.ok("PUT", f"{base}/split/partitions", 2)
    admin.error(409, "PUT", f"{base}/split")
    admin.error(412, "PUT", f"{base}/split-partition-5")
    admin.error(412, "DELETE", f"{base}/split")
    admin.error(404, "PUT", f"/admin/v2/persistent/{namespace}x/t")
    admin.error(400, "PUT", f"{base}/bad%2Fname")


def test_partitioned_topic_created_via_rest_and_produced_to(admin, client):
    """A 4-partition topic created with PUT .../partitions (body 4) is what the official
    client sees: it produces over all 4 partitions, and partitioned-stats sums them
    (msgInCounter is the number sent) with each partition's own stats unless
    perPartition=false. Counts are checked (400 for 0, -1, non-integers, too many; 409
    for a second create; 412 to shrink); POST grows it; DELETE refuses while a producer
    is attached (412) and with force deletes every partition."""
    namespace = new_namespace(admin)
    base = f"/admin/v2/persistent/{namespace}"
    path = f"{base}/clicks/partitions"
    for bad in (0, -1, "4", 2.5, True, 100_000):
        admin.error(400, "PUT", path, bad)
    admin.error(400, "PUT", path, raw="four")
    admin.error(400, "PUT", path)
    admin.error(404, "GET", f"{base}/clicks/partitioned-stats")
    assert admin.call("PUT", path, 4) == (204, None)
    admin.error(409, "PUT", path, 4)
    assert admin.ok("GET", path) == {"partitions": 4}
    assert admin.ok("GET", f"{base}/partitioned") == [f"persistent://{namespace}/clicks"]
    admin.error(412, "PUT", f"{base}/clicks-partition-1/partitions", 2)

    topic = f"persistent://{namespace}/clicks"
    producer = client.create_producer(topic)
    sent = 40
    for index in range(sent):
        producer.send(f"click-{index}".encode())
    stats = admin.ok("GET", f"{base}/clicks/partitioned-stats")
    assert stats["metadata"] == {"partitions": 4}
    assert stats["msgInCounter"] == sent
    assert set(stats["partitions"]) == {f"{topic}-partition-{i}" for i in range(4)}
    assert all(p["msgInCounter"] > 0 for p in stats["partitions"].values())
    assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == sent
    assert [p["producerName"] for p in stats["publishers"]] == [producer.producer_name()]
    assert admin.ok("GET", f"{base}/clicks/partitioned-stats?perPartition=false")["partitions"] == {}
    internal = admin.ok("GET", f"{base}/clicks/partitioned-internalStats")
    assert sum(p["numberOfEntries"] for p in internal["partitions"].values()) == sent
    partition_stats = admin.ok("GET", f"{base}/clicks-partition-2/stats")
    assert partition_stats["msgInCounter"] == stats["partitions"][f"{topic}-partition-2"]["msgInCounter"]
    admin.error(404, "GET", f"{base}/clicks/stats")

    # Unloading the partitioned topic unloads every partition: the counters restart.
    assert admin.call("PUT", f"{base}/clicks/unload") == (204, None)
    producer.send(b"after unload")
    assert admin.ok("GET", f"{base}/clicks/partitioned-stats")["msgInCounter"] == 1

    admin.ok("POST", path, 6)
    assert admin.ok("GET", path) == {"partitions": 6}
    admin.error(412, "POST", path, 3)
    admin.error(400, "POST", path, 0)
    admin.error(404, "POST", f"{base}/nothing/partitions", 8)
    assert len(admin.ok("GET", base)) == 6

    admin.error(412, "DELETE", path)
    assert admin.call("DELETE", f"{path}?force=true") == (204, None)
    producer.close()
    assert admin.ok("GET", path) == {"partitions": 0}
    assert admin.ok("GET", base) == []
    admin.error(404, "DELETE", path)
    # A partition of the deleted topic does not come back as a topic of its own (a
    # client still connected when it was deleted reconnects to it by that name).
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer(f"{topic}-partition-0")
    assert admin.ok("GET", base) == []


def test_stats_and_internal_stats_after_traffic(admin, client):
    """After real traffic, stats name the producer and the consumer, count what went in
    and out, show the backlog the consumer left unacknowledged, and measure non-zero
    rates between two looks more than a second apart; internal stats show the entries,
    the ledger and the cursor's positions; lastMessageId is the producer's last id."""
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/metrics"
    path = f"/admin/v2/persistent/{namespace}/metrics"
    producer = client.create_producer(topic, producer_name="meter-producer")
    consumer = client.subscribe(topic, "readers", consumer_name="meter-consumer")
    first = admin.ok("GET", f"{path}/stats")
    assert first["msgInCounter"] == 0 and first["msgRateIn"] == 0
    sent = 30
    last_id = None
    started = time.monotonic()
    for index in range(sent):
        last_id = producer.send(b"x" * 100)
        time.sleep(0.04)
    received = [consumer.receive(timeout_millis=10_000) for _ in range(sent)]
    for message in received[:20]:
        consumer.acknowledge(message)
    time.sleep(max(0.0, 1.1 - (time.monotonic() - started)))

    stats = admin.ok("GET", f"{path}/stats")   # the first look after a window of over a second
    assert stats["msgInCounter"] == sent
    assert stats["bytesInCounter"] >= sent * 100
    assert stats["msgOutCounter"] == sent
    assert stats["msgRateIn"] > 0 and stats["msgThroughputIn"] > 0 and stats["averageMsgSize"] > 0
    assert stats["msgRateOut"] > 0
    assert stats["storageSize"] >= sent * 100
    assert stats["publishers"][0]["msgRateIn"] > 0
    assert stats["subscriptions"]["readers"]["consumers"][0]["msgRateOut"] > 0
    # Acknowledgements reach the broker in groups (every 100 ms).
    stats = wait_until(lambda: (doc := admin.ok("GET", f"{path}/stats"))["subscriptions"]["readers"]["msgBacklog"]
                       == 10 and doc, 10, "the backlog of readers to be 10", interval_s=0.05)
    assert stats["backlogSize"] > 0
    [publisher] = stats["publishers"]
    assert publisher["producerName"] == "meter-producer"
    assert publisher["address"] and publisher["connectedSince"].endswith("Z")
    subscription = stats["subscriptions"]["readers"]
    assert subscription["type"] == "Exclusive"
    [consumer_stats] = subscription["consumers"]
    assert consumer_stats["consumerName"] == "meter-consumer"
    assert consumer_stats["msgOutCounter"] == sent and consumer_stats["address"]
    assert {"availablePermits", "unackedMessages", "connectedSince"} <= set(consumer_stats)

    internal = admin.ok("GET", f"{path}/internalStats")
    assert internal["numberOfEntries"] == sent and internal["entriesAddedCounter"] == sent
    assert internal["lastConfirmedEntry"] == f"{last_id.ledger_id()}:{last_id.entry_id()}"
    assert internal["state"] == "LedgerOpened"
    assert internal["ledgers"][-1] == {"ledgerId": last_id.ledger_id(), "entries": internal["currentLedgerEntries"],
                                       "size": internal["currentLedgerSize"], "offloaded": False}
    cursor = internal["cursors"]["readers"]
    assert cursor["markDeletePosition"] == f"{last_id.ledger_id()}:{last_id.entry_id() - 10}"
    assert cursor["readPosition"] == f"{last_id.ledger_id()}:{last_id.entry_id() + 1}"
    assert cursor["active"] is True

    last = admin.ok("GET", f"{path}/lastMessageId")
    assert (last["ledgerId"], last["entryId"]) == (last_id.ledger_id(), last_id.entry_id())
    consumer.close()
    producer.close()


def test_subscription_admin_moves_cursor(admin, client):
    """Subscriptions made over REST start where asked (latest by default, earliest with
    -1:-1, or a message id), are listed, are 409 when made twice; skip/N, skip_all and
    both resetcursor forms move the backlog as Pulsar's do; DELETE refuses while a
    consumer is attached (412) unless forced, and a missing subscription is 404."""
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/jobs"
    path = f"/admin/v2/persistent/{namespace}/jobs"
    producer = client.create_producer(topic)
    ids = [producer.send(f"job-{i}".encode()) for i in range(10)]

    def backlog(subscription: str) -> int:
        return admin.ok("GET", f"{path}/stats")["subscriptions"][subscription]["msgBacklog"]

    assert admin.call("PUT", f"{path}/subscription/tail") == (204, None)
    admin.ok("PUT", f"{path}/subscription/all", {"ledgerId": -1, "entryId": -1})
    admin.ok("PUT", f"{path}/subscription/from-5", {"ledgerId": ids[5].ledger_id(), "entryId": ids[5].entry_id()})
    admin.error(409, "PUT", f"{path}/subscription/tail")
    admin.error(400, "PUT", f"{path}/subscription/odd", {"ledgerId": "x"})
    assert admin.ok("GET", f"{path}/subscriptions") == ["all", "from-5", "tail"]
    assert (backlog("tail"), backlog("all"), backlog("from-5")) == (0, 10, 5)

    admin.ok("POST", f"{path}/subscription/all/skip/3")
    assert backlog("all") == 7
    admin.ok("POST", f"{path}/subscription/all/skip_all")
    assert backlog("all") == 0
    admin.ok("POST", f"{path}/subscription/all/resetcursor/0")
    assert backlog("all") == 10
    admin.ok("POST", f"{path}/subscription/all/resetcursor", {"ledgerId": ids[8].ledger_id(),
                                                             "entryId": ids[8].entry_id()})
    assert backlog("all") == 2
    admin.ok("POST", f"{path}/subscription/all/resetcursor?isExcluded=true",
             {"ledgerId": ids[8].ledger_id(), "entryId": ids[8].entry_id()})
    assert backlog("all") == 1
    admin.ok("POST", f"{path}/subscription/all/resetcursor/{int(time.time() * 1000) + 60_000}")
    assert backlog("all") == 0
    admin.error(400, "POST", f"{path}/subscription/all/skip/-1")
    admin.error(400, "POST", f"{path}/subscription/all/resetcursor/yesterday")
    admin.error(400, "POST", f"{path}/subscription/all/resetcursor")
    admin.error(404, "POST", f"{path}/subscription/nobody/skip_all")

    # A consumer that read and acknowledged everything gets job-7 again after a reset
    # to it (once its acknowledgements reached the broker, so none lands after the reset).
    consumer = client.subscribe(topic, "from-5")
    for expected in range(5, 10):
        message = consumer.receive(timeout_millis=10_000)
        assert message.data() == f"job-{expected}".encode()
        consumer.acknowledge(message)
    wait_until(lambda: backlog("from-5") == 0, 10, "the acknowledgements of from-5", interval_s=0.05)
    admin.ok("POST", f"{path}/subscription/from-5/resetcursor", {"ledgerId": ids[7].ledger_id(),
                                                                "entryId": ids[7].entry_id()})
    assert consumer.receive(timeout_millis=10_000).data() == b"job-7"
    wait_until(lambda: admin.ok("GET", f"{path}/stats")["subscriptions"]["from-5"]["consumers"], 10,
               "from-5's consumer in the stats", interval_s=0.05)
    admin.error(412, "DELETE", f"{path}/subscription/from-5")
    assert admin.call("DELETE", f"{path}/subscription/from-5?force=true") == (204, None)
    assert admin.call("DELETE", f"{path}/subscription/tail") == (204, None)
    admin.error(404, "DELETE", f"{path}/subscription/tail")
    assert admin.ok("GET", f"{path}/subscriptions") == ["all"]
    consumer.close()
    producer.close()


def test_partitioned_subscription_applies_to_every_partition(admin, client):
    """On a partitioned topic's name, creating a subscription creates it on every
    partition (from the earliest message when asked), skip_all and a reset by time
    act on every partition's cursor, a reset by message id on the partition the body
    names, and DELETE removes it everywhere; terminate and lastMessageId are refused
    (403) on the partitioned name."""
    namespace = new_namespace(admin)
    base = f"/admin/v2/persistent/{namespace}"
    admin.ok("PUT", f"{base}/tasks/partitions", 3)
    producer = client.create_producer(f"persistent://{namespace}/tasks")
    for index in range(9):
        producer.send(f"task-{index}".encode())
    admin.ok("PUT", f"{base}/tasks/subscription/workers", {"ledgerId": -1, "entryId": -1})
    admin.error(409, "PUT", f"{base}/tasks/subscription/workers")
    assert admin.ok("GET", f"{base}/tasks/subscriptions") == ["workers"]
    stats = admin.ok("GET", f"{base}/tasks/partitioned-stats")
    assert stats["subscriptions"]["workers"]["msgBacklog"] == 9
    admin.ok("POST", f"{base}/tasks/subscription/workers/skip_all")
    assert admin.ok("GET", f"{base}/tasks/partitioned-stats")["subscriptions"]["workers"]["msgBacklog"] == 0
    admin.ok("POST", f"{base}/tasks/subscription/workers/resetcursor/0")
    assert admin.ok("GET", f"{base}/tasks/partitioned-stats")["subscriptions"]["workers"]["msgBacklog"] == 9
    admin.ok("POST", f"{base}/tasks/subscription/workers/skip_all")
    # By message id, a partitioned topic's reset names one partition.
    admin.error(400, "POST", f"{base}/tasks/subscription/workers/resetcursor", {"ledgerId": -1, "entryId": -1})
    admin.ok("POST", f"{base}/tasks/subscription/workers/resetcursor",
             {"ledgerId": -1, "entryId": -1, "partitionIndex": 1})
    entries = admin.ok("GET", f"{base}/tasks-partition-1/internalStats")["numberOfEntries"]
    assert entries > 0
    assert admin.ok("GET", f"{base}/tasks/partitioned-stats")["subscriptions"]["workers"]["msgBacklog"] == entries
    admin.ok("DELETE", f"{base}/tasks/subscription/workers")
    assert admin.ok("GET", f"{base}/tasks/subscriptions") == []
    admin.error(403, "POST", f"{base}/tasks/terminate")
    admin.error(403, "GET", f"{base}/tasks/lastMessageId")
    producer.close()


def test_unload_terminate_and_compaction(admin, client):
    """Unload closes the topic here and the client carries on after reconnecting;
    terminate answers the last message id and the producer can send no more; the
    compaction status is NOT_RUN until a compaction is asked for, then SUCCESS; a
    missing topic is 404 for all three."""
    namespace = new_namespace(admin)
    topic = f"persistent://{namespace}/ledger"
    path = f"/admin/v2/persistent/{namespace}/ledger"
    producer = client.create_producer(topic)
    producer.send(b"before")
    assert admin.call("PUT", f"{path}/unload") == (204, None)
    after = producer.send(b"after unload")
    # Loaded afresh: counters restart, the managed ledger keeps both entries.
    reloaded = admin.ok("GET", f"{path}/internalStats")
    assert (reloaded["entriesAddedCounter"], reloaded["numberOfEntries"]) == (1, 2)
    terminated = admin.ok("POST", f"{path}/terminate")
    assert (terminated["ledgerId"], terminated["entryId"]) == (after.ledger_id(), after.entry_id())
    with pytest.raises(pulsar.PulsarException):
        producer.send(b"too late")
    assert admin.ok("GET", f"{path}/internalStats")["state"] == "Terminated"

    assert admin.ok("GET", f"{path}/compaction")["status"] == "NOT_RUN"
    assert admin.call("PUT", f"{path}/compaction") == (204, None)
    wait_until(lambda: admin.ok("GET", f"{path}/compaction")["status"] == "SUCCESS", 20, "compaction to finish")
    missing = f"/admin/v2/persistent/{namespace}/ghost"
    admin.error(404, "PUT", f"{missing}/unload")
    admin.error(404, "POST", f"{missing}/terminate")
    admin.error(404, "PUT", f"{missing}/compaction")
    # The client closed the producer itself when the topic told it it was terminated.


def test_client_with_http_service_url(pulsar_cluster, admin):
    """The official client given the http:// URL looks topics up over REST (GET
    .../partitions, then /lookup/v2/topic/...), and produces and consumes through the
    broker it was pointed to, partitioned topic included."""
    namespace = new_namespace(admin)
    admin.ok("PUT", f"/admin/v2/persistent/{namespace}/web/partitions", 2)
    http_client = pulsar.Client(pulsar_cluster.brokers[0].web_service_url, operation_timeout_seconds=20)
    try:
        for topic in (f"persistent://{namespace}/plain", f"persistent://{namespace}/web"):
            consumer = http_client.subscribe(topic, "http-readers")
            producer = http_client.create_producer(topic)
            producer.send(b"over http")
            assert consumer.receive(timeout_millis=10_000).data() == b"over http"
            producer.close()
            consumer.close()
        assert admin.ok("GET", f"/admin/v2/persistent/{namespace}/web/partitions") == {"partitions": 2}
    finally:
        http_client.close()
