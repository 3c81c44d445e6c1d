"""Policies that clean up, on a real broker restarted halfway (broker/inactivity.py):

- Subscription expiry: with a broker default of 9 s, a subscription whose consumer
  left is deleted about 9 s after it left — not 9 s after the restart (the clock is
  kept in etcd) — and not before; a subscription whose consumer stays (and reconnects
  after the restart) is kept.
- Inactive topics: a namespace's ``inactiveTopicPolicies`` (set and read back through
  Pulsar's admin path) deletes a topic whose producer left, about 8 s after it left,
  restart or not; a topic with a subscription, a topic whose producer stays connected,
  and an inactive topic of a namespace without the policy (the broker default is off)
  are kept.
"""

from __future__ import annotations

import asyncio
import time

from tests.cluster import http_json, unique, wait_until

SWEEP_ARGS = ["--inactivity-check-interval-s", "0.5"]


def _subscriptions(broker, local_name: str, namespace: str = "public/default") -> list[str]:
    return http_json("GET", f"{broker.web_service_url}/admin/v2/persistent/{namespace}/{local_name}/subscriptions")


def _topics(broker, namespace: str) -> list[str]:
    return http_json("GET", f"{broker.web_service_url}/admin/v2/persistent/{namespace}")


async def _restart(broker) -> float:
    await broker.terminate(timeout_s=20)
    await broker.start()
    return time.monotonic()


async def test_subscription_expiry_keeps_its_clock_across_a_restart(cluster):
    """A consumerless subscription expires about 9 s after its consumer left, a broker
    restart in between; one with a consumer stays."""
    import pulsar

    expiry_s = 9.0
    await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1, extra_args=[
        *SWEEP_ARGS, "--subscription-expiration-time-minutes", str(expiry_s / 60)])
    local_name = unique("expiry")
    topic = f"persistent://public/default/{local_name}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        kept = client.subscribe(topic, "kept")
        producer = client.create_producer(topic)
        producer.send(b"backlog")
        client.subscribe(topic, "gone").close()
        left_at = time.monotonic()
        assert sorted(await asyncio.to_thread(_subscriptions, broker, local_name)) == ["gone", "kept"]
        await asyncio.sleep(3)
        restarted_at = await _restart(broker)
        # Still there a little before its time.
        while time.monotonic() < left_at + expiry_s - 1.5:
            assert "gone" in await asyncio.to_thread(_subscriptions, broker, local_name)
            await asyncio.sleep(0.5)
        await asyncio.to_thread(wait_until, lambda: "gone" not in _subscriptions(broker, local_name), 20,
                                "the consumerless subscription to expire")
        expired_after_s = time.monotonic() - left_at
        # A clock started again at the restart would not let it go before restart + expiry.
        assert expired_after_s < (restarted_at - left_at) + expiry_s - 1.0, (expired_after_s, restarted_at - left_at)
        assert "kept" in await asyncio.to_thread(_subscriptions, broker, local_name)
        kept.close()
        producer.close()
    finally:
        client.close()


async def test_inactive_topics_go_after_their_time_across_a_restart(cluster):
    """A namespace's inactiveTopicPolicies delete a topic about 8 s after its producer
    left, a broker restart in between; active topics and other namespaces' stay."""
    import pulsar

    inactive_s = 8.0
    await cluster.start_bookies(2)
    (broker,) = await cluster.start_brokers(1, extra_args=SWEEP_ARGS)
    namespace = f"public/{unique('cleanup')}"
    admin = broker.web_service_url
    http_json("PUT", f"{admin}/admin/v2/namespaces/{namespace}")
    policy = {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
              "maxInactiveDurationSeconds": int(inactive_s), "deleteWhileInactive": True}
    http_json("POST", f"{admin}/admin/v2/namespaces/{namespace}/inactiveTopicPolicies", policy)
    assert http_json("GET", f"{admin}/admin/v2/namespaces/{namespace}/inactiveTopicPolicies") == policy
    names = {kind: f"persistent://{namespace}/{kind}" for kind in ("idle", "subscribed", "producing")}
    parted = f"persistent://{namespace}/parted"
    http_json("PUT", f"{admin}/admin/v2/persistent/{namespace}/parted/partitions", 2)
    untouched = f"persistent://public/default/{unique('default-ns')}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        for topic in (names["idle"], untouched, parted):
            producer = client.create_producer(topic)
            producer.send(b"x")
            producer.close()
        left_at = time.monotonic()
        client.subscribe(names["subscribed"], "s").close()
        staying = client.create_producer(names["producing"])
        await asyncio.sleep(3)
        restarted_at = await _restart(broker)
        staying.send(b"after the restart")   # its client reconnected
        while time.monotonic() < left_at + inactive_s - 1.5:
            assert names["idle"] in await asyncio.to_thread(_topics, broker, namespace)
            await asyncio.sleep(0.5)
        await asyncio.to_thread(wait_until, lambda: names["idle"] not in _topics(broker, namespace), 20,
                                "the idle topic to be deleted")
        deleted_after_s = time.monotonic() - left_at
        assert deleted_after_s < (restarted_at - left_at) + inactive_s - 1.0, (deleted_after_s, restarted_at - left_at)
        await asyncio.sleep(2)   # a few more sweeps
        remaining = await asyncio.to_thread(_topics, broker, namespace)
        assert names["subscribed"] in remaining and names["producing"] in remaining, remaining
        assert untouched in await asyncio.to_thread(_topics, broker, "public/default")
        # The partitioned topic's partitions went as any topic does; the partitioned
        # topic stays (the broker's --delete-inactive-partitioned-metadata is off), and a
        # producer coming back re-creates its partitions.
        # (A namespace's listing names a partitioned topic's partitions whether they
        # exist or not, as Pulsar's: the broker's count says what it deleted.)
        assert _metric(broker, "magnetar_broker_inactive_topics_deleted_total") == 3   # idle and 2 partitions
        assert http_json("GET", f"{admin}/admin/v2/persistent/{namespace}/parted/partitions") == {"partitions": 2}
        again = client.create_producer(parted)
        for index in range(4):
            again.send(f"back {index}".encode())
        again.close()
        staying.close()
    finally:
        client.close()


async def test_a_partitioned_topic_goes_with_its_last_partition_when_configured(cluster):
    """--delete-inactive-partitioned-metadata on two brokers: the partitions of an idle
    partitioned topic are deleted by whichever broker serves each, and the partitioned
    topic itself once the last one went; a partitioned topic whose producer stays keeps
    everything."""
    import pulsar

    await cluster.start_bookies(2)
    brokers = await cluster.start_brokers(2, extra_args=[*SWEEP_ARGS, "--delete-inactive-partitioned-metadata"])
    admin = brokers[0].web_service_url
    namespace = f"public/{unique('cleanup-parted')}"
    http_json("PUT", f"{admin}/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 4}})
    http_json("POST", f"{admin}/admin/v2/namespaces/{namespace}/inactiveTopicPolicies",
              {"inactiveTopicDeleteMode": "delete_when_no_subscriptions", "maxInactiveDurationSeconds": 3,
               "deleteWhileInactive": True})
    for local in ("idle", "kept"):
        http_json("PUT", f"{admin}/admin/v2/persistent/{namespace}/{local}/partitions", 4)
    client = pulsar.Client(brokers[0].service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(f"persistent://{namespace}/idle")
        for index in range(8):
            producer.send(f"m{index}".encode())
        producer.close()
        staying = client.create_producer(f"persistent://{namespace}/kept")
        staying.send(b"x")
        owners = {http_json("GET", f"{admin}/lookup/v2/topic/persistent/{namespace}/idle-partition-{index}")
                  ["brokerUrl"] for index in range(4)}
        print(f"the idle topic's partitions were served by {len(owners)} broker(s)")

        def partitioned() -> list[str]:
            return http_json("GET", f"{admin}/admin/v2/persistent/{namespace}/partitioned")

        await asyncio.to_thread(wait_until, lambda: f"persistent://{namespace}/idle" not in partitioned(), 30,
                                "the idle partitioned topic to be deleted")
        remaining = await asyncio.to_thread(_topics, brokers[0], namespace)
        assert not [t for t in remaining if "/idle-partition-" in t], remaining
        assert partitioned() == [f"persistent://{namespace}/kept"]
        assert sum("/kept-partition-" in t for t in remaining) == 4, remaining
        staying.send(b"still here")
        staying.close()
    finally:
        client.close()
    counted = sum(_metric(broker, "magnetar_broker_inactive_partitioned_topics_deleted_total") for broker in brokers)
    assert counted == 1, counted


def _metric(broker, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{broker.web_service_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {broker.name}'s metrics")
