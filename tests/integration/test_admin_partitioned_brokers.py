"""A partitioned topic whose partitions two brokers serve, through the admin REST API
(a cluster of its own: etcd, two bookies, two brokers, a namespace of 8 bundles).

Proves, with every call asked of one broker and its effect read from the other:
- each broker counts its calls on the other's partitions in /metrics
  (``magnetar_broker_partition_calls_total`` by outcome);
- partitioned-stats and partitioned-internalStats answer for every partition — this
  broker's from here, the other's asked of it — with the same totals (before, each
  broker redirected the call to the other for the partition it did not serve, and the
  client's redirects went round for ever);
- subscription operations on the partitioned name (create, list, skip, clear, reset,
  expire, delete) reach every partition; one refused (the subscription exists, consumers are
  attached) changes nothing on any partition;
- unload, compaction and termination reach every partition (before, unload left the
  other broker's partitions loaded, and compaction and termination were refused);
- deleting the partitioned topic, and force-deleting a namespace whose topics both
  brokers serve, delete everything (before, both redirected from owner to owner).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pulsar

from tests.cluster import Cluster, http_json, unique

PARTITIONS = 8
PER_PARTITION = 4


def _refused(method: str, url: str, status: int, body: object | None = None) -> str:
    """The reason of a request that must fail with ``status``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as refused:
        assert refused.code == status, (refused.code, refused.read())
        return json.loads(refused.read())["reason"]
    raise AssertionError(f"{method} {url} was not refused")


def _put_at_owner(url: str) -> None:
    """PUT, following a 307 to the topic's owner once (urllib follows redirects of GET
    only)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="PUT"), timeout=30).close()
    except urllib.error.HTTPError as redirect:
        if redirect.code != 307:
            raise
        location = redirect.headers["Location"]
        urllib.request.urlopen(urllib.request.Request(location, data=b"", method="PUT"), timeout=30).close()


def _owner_url(web_service_url: str, path: str) -> str:
    """The broker that answers ``path`` (GET, following the redirect to the owner)."""
    with urllib.request.urlopen(f"{web_service_url}{path}", timeout=30) as response:
        return response.geturl().split("/admin/")[0]


def _backlogs(broker_url: str, namespace: str, subscription: str) -> dict[int, int | None]:
    """Each partition's backlog on ``subscription`` (None: no such subscription there)."""
    stats = http_json("GET", f"{broker_url}/admin/v2/persistent/{namespace}/orders/partitioned-stats")
    backlogs = {}
    for name, partition in stats["partitions"].items():
        entry = partition["subscriptions"].get(subscription)
        backlogs[int(name.rsplit("-", 1)[1])] = None if entry is None else entry["msgBacklog"]
    return backlogs


async def test_partitioned_admin_calls_with_partitions_on_two_brokers(etcd_process, tmp_path):
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        first, second = await cluster.start_brokers(2)
        namespace = f"public/{unique('split')}"
        topic = f"persistent://{namespace}/orders"
        http_json("PUT", f"{first.web_service_url}/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 8}})
        http_json("PUT", f"{first.web_service_url}/admin/v2/persistent/{namespace}/orders/partitions", PARTITIONS)
        client = pulsar.Client(first.service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer(topic, batching_enabled=False,
                                              message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
            for i in range(PER_PARTITION * PARTITIONS):
                producer.send(f"m{i}".encode())
            owners = {_owner_url(first.web_service_url, f"/admin/v2/persistent/{namespace}/orders-partition-{i}/stats")
                      for i in range(PARTITIONS)}
            assert len(owners) == 2, owners        # the test's premise: the partitions are split

            for broker in (first, second):
                base = f"{broker.web_service_url}/admin/v2/persistent/{namespace}/orders"
                totals = http_json("GET", f"{base}/partitioned-stats")
                assert totals["msgInCounter"] == PER_PARTITION * PARTITIONS, totals
                assert len(totals["partitions"]) == PARTITIONS
                internal = http_json("GET", f"{base}/partitioned-internalStats")
                assert internal["metadata"]["partitions"] == PARTITIONS
                assert len(internal["partitions"]) == PARTITIONS

            # Subscription operations: asked of one broker, seen on every partition.
            one = f"{first.web_service_url}/admin/v2/persistent/{namespace}/orders"
            other = f"{second.web_service_url}/admin/v2/persistent/{namespace}/orders"
            http_json("PUT", f"{one}/subscription/audit", {"ledgerId": -1, "entryId": -1})   # from earliest
            assert _backlogs(second.web_service_url, namespace, "audit") == {i: PER_PARTITION for i in range(PARTITIONS)}
            assert "already exists" in _refused("PUT", f"{other}/subscription/audit", 409)
            assert http_json("GET", f"{other}/subscriptions") == ["audit"]
            http_json("POST", f"{other}/subscription/audit/skip/1")
            assert _backlogs(first.web_service_url, namespace, "audit") == {i: PER_PARTITION - 1 for i in range(PARTITIONS)}
            http_json("POST", f"{one}/subscription/audit/skip_all")
            assert _backlogs(second.web_service_url, namespace, "audit") == {i: 0 for i in range(PARTITIONS)}
            http_json("POST", f"{other}/subscription/audit/resetcursor/0")
            assert _backlogs(first.web_service_url, namespace, "audit") == {i: PER_PARTITION for i in range(PARTITIONS)}
            _refused("POST", f"{one}/subscription/nobody/skip_all", 404)
            http_json("POST", f"{other}/subscription/audit/expireMessages/3600")     # nothing is that old
            assert _backlogs(first.web_service_url, namespace, "audit") == {i: PER_PARTITION for i in range(PARTITIONS)}
            http_json("POST", f"{one}/subscription/audit/expireMessages/0")          # everything until now
            assert _backlogs(second.web_service_url, namespace, "audit") == {i: 0 for i in range(PARTITIONS)}
            http_json("POST", f"{other}/subscription/audit/resetcursor/0")
            http_json("POST", f"{one}/all_subscription/expireMessages/0")
            assert _backlogs(second.web_service_url, namespace, "audit") == {i: 0 for i in range(PARTITIONS)}
            http_json("POST", f"{other}/subscription/audit/resetcursor/0")

            # Each broker counts its calls on the other's partitions (/metrics).
            for broker in (first, second):
                with urllib.request.urlopen(f"{broker.web_service_url}/metrics", timeout=30) as response:
                    text = response.read().decode()
                ok = re.search(r'^magnetar_broker_partition_calls_total\{outcome="ok"\} (\S+)$', text, re.M)
                assert ok is not None and float(ok.group(1)) >= PARTITIONS // 2, broker.name
                assert 'magnetar_broker_partition_calls_total{outcome="unreachable"} 0.0' in text

            consumer = client.subscribe(topic, "audit")        # one consumer on every partition
            assert "consumers attached" in _refused("DELETE", f"{other}/subscription/audit", 412)
            assert _backlogs(first.web_service_url, namespace, "audit") == {i: PER_PARTITION for i in range(PARTITIONS)}
            http_json("DELETE", f"{other}/subscription/audit?force=true")
            # The force disconnected the consumer, which (an official client, as with
            # Pulsar) subscribes again at once and so may make "audit" anew on a
            # partition: closed, and what it re-made deleted, before the checks.
            consumer.close()
            for partition, backlog in _backlogs(first.web_service_url, namespace, "audit").items():
                if backlog is not None:
                    path = f"/admin/v2/persistent/{namespace}/orders-partition-{partition}"
                    owner = _owner_url(first.web_service_url, f"{path}/stats")
                    http_json("DELETE", f"{owner}{path}/subscription/audit?force=true")
            assert _backlogs(first.web_service_url, namespace, "audit") == {i: None for i in range(PARTITIONS)}
            assert http_json("GET", f"{one}/subscriptions") == []
            _refused("DELETE", f"{one}/subscription/audit", 404)

            # Unload: every partition comes back fresh (its counters start again at 0).
            http_json("PUT", f"{one}/unload")
            reloaded = http_json("GET", f"{other}/partitioned-stats")
            assert {name: p["msgInCounter"] for name, p in reloaded["partitions"].items()} == {
                f"{topic}-partition-{i}": 0 for i in range(PARTITIONS)}

            # Compaction of the partitioned name runs on every partition.
            http_json("PUT", f"{other}/compaction")
            deadline = time.monotonic() + 60
            statuses: dict[int, str] = {}
            while time.monotonic() < deadline:
                statuses = {i: http_json("GET", f"{first.web_service_url}/admin/v2/persistent/{namespace}"
                                                f"/orders-partition-{i}/compaction")["status"]
                            for i in range(PARTITIONS)}
                if set(statuses.values()) == {"SUCCESS"}:
                    break
                time.sleep(0.2)
            assert set(statuses.values()) == {"SUCCESS"}, statuses

            # Deletion: refused while the producer is connected (nothing goes), then whole.
            assert "connected producers or consumers" in _refused("DELETE", f"{other}/partitions", 412)
            assert http_json("GET", f"{one}/partitions") == {"partitions": PARTITIONS}

            # Termination of every partition: each one's last message id, by index.
            last_ids = http_json("POST", f"{other}/terminate/partitions")
            assert sorted(last_ids, key=int) == [str(i) for i in range(PARTITIONS)], last_ids
            assert all(last_ids[str(i)]["partitionIndex"] == i for i in range(PARTITIONS)), last_ids
            try:
                producer.send(b"after the end")
                raise AssertionError("a terminated partitioned topic took a message")
            except (pulsar.TopicTerminated, pulsar.AlreadyClosed):
                pass
            assert "not a partitioned topic" in _refused(
                "POST", f"{first.web_service_url}/admin/v2/persistent/{namespace}/orders-partition-0/terminate/partitions",
                403)      # the client closed its producer when the partitions told it they ended
        finally:
            try:
                client.close()
            except pulsar.AlreadyClosed:
                pass      # the official client's answer when a producer it holds was ended by termination
        http_json("DELETE", f"{other}/partitions")
        for broker in (first, second):
            assert http_json("GET", f"{broker.web_service_url}/admin/v2/persistent/{namespace}/orders/partitions") == {
                "partitions": 0}
            assert http_json("GET", f"{broker.web_service_url}/admin/v2/persistent/{namespace}") == []

        # A namespace whose non-partitioned topics both brokers serve, force-deleted.
        for i in range(PARTITIONS):
            _put_at_owner(f"{first.web_service_url}/admin/v2/persistent/{namespace}/plain-{i}")
        owners = {_owner_url(first.web_service_url, f"/admin/v2/persistent/{namespace}/plain-{i}/stats")
                  for i in range(PARTITIONS)}
        assert len(owners) == 2, owners
        http_json("DELETE", f"{second.web_service_url}/admin/v2/namespaces/{namespace}?force=true")
        _refused("GET", f"{first.web_service_url}/admin/v2/namespaces/{namespace}", 404)
    finally:
        await cluster.stop()
