"""A partitioned topic whose partitions two brokers serve, through the admin REST API
(a cluster of its own: etcd, two bookies, two brokers, a namespace of 8 bundles).

Proves: partitioned-stats and partitioned-internalStats asked of either broker answer
for every partition — this broker's from here, the other's asked of it — with the same
totals (before, each broker redirected the call to the other for the partition it did
not serve, and the client's redirects went round for ever); a subscription operation on
the partitioned topic is refused with the partitions' owners (412) rather than looping,
and the same operation on each partition's own path works (it is redirected to the
partition's owner).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pulsar

from tests.cluster import Cluster, http_json, unique

PARTITIONS = 8


def _put_at_owner(url: str) -> None:
    """PUT, following a 307 to the partition's owner once (urllib follows redirects of
    GET only)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="PUT"), timeout=30).close()
    except urllib.error.HTTPError as redirect:
        if redirect.code != 307:
            raise
        location = redirect.headers["Location"]
        urllib.request.urlopen(urllib.request.Request(location, data=b"", method="PUT"), timeout=30).close()


async def test_partitioned_admin_calls_with_partitions_on_two_brokers(etcd_process, tmp_path):
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        first, second = await cluster.start_brokers(2)
        namespace = f"public/{unique('split')}"
        http_json("PUT", f"{first.web_service_url}/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 8}})
        http_json("PUT", f"{first.web_service_url}/admin/v2/persistent/{namespace}/orders/partitions", PARTITIONS)
        client = pulsar.Client(first.service_url, operation_timeout_seconds=30)
        try:
            producer = client.create_producer(f"persistent://{namespace}/orders",
                                              message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                                              batching_enabled=False)
            for i in range(4 * PARTITIONS):
                producer.send(f"m{i}".encode())
            owners = set()
            for index in range(PARTITIONS):
                path = f"/admin/v2/persistent/{namespace}/orders-partition-{index}/stats"
                with urllib.request.urlopen(f"{first.web_service_url}{path}", timeout=30) as response:
                    owners.add(response.geturl().split("/admin/")[0])
            assert len(owners) == 2, owners        # the test's premise: the partitions are split

            for broker in (first, second):
                base = f"{broker.web_service_url}/admin/v2/persistent/{namespace}/orders"
                totals = http_json("GET", f"{base}/partitioned-stats")
                assert totals["msgInCounter"] == 4 * PARTITIONS, totals
                assert len(totals["partitions"]) == PARTITIONS
                internal = http_json("GET", f"{base}/partitioned-internalStats")
                assert internal["metadata"]["partitions"] == PARTITIONS
                assert len(internal["partitions"]) == PARTITIONS

            request = urllib.request.Request(
                f"{first.web_service_url}/admin/v2/persistent/{namespace}/orders/subscription/audit",
                data=b"", method="PUT")
            try:
                urllib.request.urlopen(request, timeout=30)
                raise AssertionError("a subscription operation over split partitions was not refused")
            except urllib.error.HTTPError as refused:
                assert refused.code == 412, refused.code
                assert "served by several brokers" in json.loads(refused.read())["reason"]
            for index in range(PARTITIONS):
                _put_at_owner(f"{first.web_service_url}/admin/v2/persistent/{namespace}/orders-partition-{index}"
                              "/subscription/audit")
            totals = http_json("GET", f"{second.web_service_url}/admin/v2/persistent/{namespace}/orders/partitioned-stats")
            assert "audit" in totals["subscriptions"], totals["subscriptions"]
        finally:
            client.close()
    finally:
        await cluster.stop()
