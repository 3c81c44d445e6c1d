"""Topic-level rate limits on a real broker (etcd, 3 bookies, 1 broker as processes),
set through Pulsar's topic paths (``/admin/v2/persistent/{t}/{ns}/{topic}/publishRate``,
``subscriptionDispatchRate``), measured with the official client as
tests/integration/test_rate_limits.py measures the namespace's: a topic's publish limit
holds within 10% over an 8 s window while its namespace allows more, and once removed
the namespace's limit holds again; a subscriptionDispatchRate limits each subscription
on its own. Nothing published is lost or failed."""

from __future__ import annotations

import threading
import urllib.error

import pytest

from tests.cluster import http_json, unique
from tests.integration.test_rate_limits import (
    PUBLISH_WINDOW_END_S,
    WINDOW_END_S,
    _backlogged_topic,
    _namespace,
    _publish_for,
    _rate_in_window,
    _receive_for,
)


def test_a_topics_publish_rate_overrides_its_namespaces_until_removed(pulsar_cluster, client):
    admin = pulsar_cluster.brokers[0].web_service_url
    namespace_rate = {"publishThrottlingRateInMsg": 400, "publishThrottlingRateInByte": -1}
    namespace = _namespace(admin, publishRate=namespace_rate)
    local = unique("t")
    topic = f"persistent://{namespace}/{local}"
    path = f"{admin}/admin/v2/persistent/{namespace}/{local}/publishRate"
    with pytest.raises(urllib.error.HTTPError) as missing:
        http_json("POST", path, {"publishThrottlingRateInMsg": 150})
    assert missing.value.code == 404                  # as Pulsar: the topic must exist
    http_json("PUT", f"{admin}/admin/v2/persistent/{namespace}/{local}")
    assert http_json("GET", path) is None
    assert http_json("GET", f"{path}?applied=true") == namespace_rate

    topic_rate = {"publishThrottlingRateInMsg": 150, "publishThrottlingRateInByte": -1}
    http_json("POST", path, {"publishThrottlingRateInMsg": 150})
    assert http_json("GET", path) == topic_rate
    assert http_json("GET", f"{path}?applied=true") == topic_rate
    receipts, sent, started = _publish_for(client, topic, b"m" * 100, PUBLISH_WINDOW_END_S + 0.5)
    rate = _rate_in_window(receipts, started, PUBLISH_WINDOW_END_S)
    print(f"topic publish limit 150 msg/s (namespace 400): measured {rate:.1f} msg/s; {sent} sent")
    assert 135 <= rate <= 165, rate

    http_json("DELETE", path)
    assert http_json("GET", path) is None
    assert http_json("GET", f"{path}?applied=true") == namespace_rate
    receipts, sent, started = _publish_for(client, topic, b"m" * 100, PUBLISH_WINDOW_END_S + 0.5)
    rate = _rate_in_window(receipts, started, PUBLISH_WINDOW_END_S)
    print(f"topic publish limit removed (namespace 400): measured {rate:.1f} msg/s; {sent} sent")
    assert 360 <= rate <= 440, rate


def test_a_subscription_dispatch_rate_limits_each_subscription_on_its_own(pulsar_cluster, client):
    """subscriptionDispatchRate 100 msg/s on a topic with a backlog of 1,200 and two
    subscriptions read at once: each gets ~100 msg/s (not 50: the limit is not shared);
    once removed, the rest arrives (nothing was lost)."""
    import pulsar

    admin = pulsar_cluster.brokers[0].web_service_url
    namespace = _namespace(admin)
    names = ("a", "b")

    def subscribe_both(topic: str):
        for name in names[1:]:
            client.subscribe(topic, name).close()
        return client.subscribe(topic, names[0])

    topic = _backlogged_topic(client, namespace, subscribe_both, 1200, b"d" * 100)
    path = f"{admin}/admin/v2/persistent/{namespace}/{topic.rsplit('/', 1)[1]}/subscriptionDispatchRate"
    rate = {"dispatchThrottlingRateInMsg": 100, "dispatchThrottlingRateInByte": -1, "ratePeriodInSecond": 1,
            "relativeToPublishRate": False}
    http_json("POST", path, rate)
    assert http_json("GET", path) == rate
    consumers = [client.subscribe(topic, name, consumer_type=pulsar.ConsumerType.Exclusive) for name in names]
    times: list[list[float]] = [[], []]
    starts = [0.0, 0.0]

    def receive(index: int) -> None:
        times[index], starts[index] = _receive_for(consumers[index], 1200, WINDOW_END_S)

    threads = [threading.Thread(target=receive, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    measured = [_rate_in_window(times[index], starts[index]) for index in range(2)]
    print(f"subscription dispatch limit 100 msg/s: measured {measured[0]:.1f} and {measured[1]:.1f} msg/s")
    for value in measured:
        assert 90 <= value <= 110, measured
    http_json("DELETE", path)
    assert http_json("GET", path) is None
    for index in range(2):
        rest, _ = _receive_for(consumers[index], 1200 - len(times[index]), 30)
        assert len(times[index]) + len(rest) == 1200
        consumers[index].close()
