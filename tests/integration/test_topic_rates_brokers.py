"""A topic-level rate change made through a broker that does not serve the topic (a
cluster of its own: etcd, two bookies, two brokers, as processes; the official client).

Proves: the broker serving the topic applies the topic's publishRate set through the
other broker at once — its topic policy watch (broker/policy_watch.py) drops its cached
copy and wakes its policy pass, rather than waiting out the 5 s cache and the 5 s policy
check — so the rate measured from 2 s after the call is at most the limit plus 10 % (over a
6 s window: this case proves the propagation; tests/integration/test_rate_limits.py
proves the accuracy within 10 % over 8 s).
"""

from __future__ import annotations

import asyncio

import pulsar

from tests.cluster import Cluster, http_json, unique
from tests.integration.test_rate_limits import _publish_for, _rate_in_window

WINDOW_END_S = 6.0


async def test_a_topic_rate_set_through_another_broker_acts_on_the_serving_one_at_once(etcd_process, tmp_path):
    cluster = Cluster(etcd_process, str(tmp_path))
    try:
        await cluster.start_bookies(2)
        first, second = await cluster.start_brokers(2)
        namespace = f"public/{unique('rates')}"
        local = unique("t")
        topic = f"persistent://{namespace}/{local}"
        http_json("PUT", f"{first.web_service_url}/admin/v2/namespaces/{namespace}")
        lookup = http_json("GET", f"{first.web_service_url}/lookup/v2/topic/persistent/{namespace}/{local}")
        serving = next(b for b in (first, second) if b.service_url == lookup["brokerUrl"])
        other = second if serving is first else first
        client = pulsar.Client(serving.service_url, operation_timeout_seconds=30)
        try:
            client.create_producer(topic).close()          # the topic exists, loaded on its broker
            http_json("POST", f"{other.web_service_url}/admin/v2/persistent/{namespace}/{local}/publishRate",
                      {"publishThrottlingRateInMsg": 120, "publishThrottlingRateInByte": -1})
            receipts, sent, started = await asyncio.to_thread(_publish_for, client, topic, b"m" * 100,
                                                              WINDOW_END_S + 0.5)
        finally:
            client.close()
        rate = _rate_in_window(receipts, started, WINDOW_END_S)
        print(f"topic publish limit 120 msg/s set through the other broker: measured {rate:.1f} msg/s; {sent} sent")
        # Above the limit would mean the serving broker still used its cached policy (the
        # unlimited producer sends thousands a second); the floor only says the limit is not
        # grossly over-applied, and is loose because a loaded 2-core machine stalls the
        # producer's process now and then (measured 100.0 in one CI run; the accuracy
        # within 10 % over 8 s is test_rate_limits.py's).
        assert 84 <= rate <= 132, rate
    finally:
        await cluster.stop()
