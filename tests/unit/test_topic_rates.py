"""Topic-level rate limits (issues 35 and 37): a topic's publishRate, dispatchRate and
subscriptionDispatchRate over its namespace's, resolved through the effective policies
(broker/topic_policies.py) into the limits the broker applies (broker/rate_limits.py).

Proves: a topic's rate for this cluster overrides the namespace's and leaves the
namespace's other clusters alone; removing it (through the store, as the admin path
does) lets the namespace's apply again; the resolver sees a change through the store at
once; each subscription gets a bucket of its own while the topic's shared bucket still
bounds them all together.
"""

from __future__ import annotations

from broker.rate_limits import (
    BothThrottles,
    DispatchRateThrottle,
    RateLimit,
    SubscriptionDispatchRates,
    topic_rate_limits,
)
from broker.resources import Resources
from broker.topic_policies import overlay
from common.topic_name import NamespaceName, TopicName
from metadata.memory_store import MemoryStore
from metadata.policies import NamespacePolicies, TenantInfo, TopicPolicies


def _publish(messages: int) -> dict:
    return {"publishThrottlingRateInMsg": messages, "publishThrottlingRateInByte": -1}


def _dispatch(messages: int, period_s: int = 1) -> dict:
    return {"dispatchThrottlingRateInMsg": messages, "dispatchThrottlingRateInByte": -1,
            "ratePeriodInSecond": period_s, "relativeToPublishRate": False}


def test_a_topics_rate_overrides_the_namespaces_for_its_cluster_only():
    namespace = NamespacePolicies(publishMaxMessageRate={"here": _publish(500), "there": _publish(70)},
                                  topicDispatchRate={"here": _dispatch(300)})
    topic = TopicPolicies(publishMaxMessageRate={"here": _publish(100)},
                          subscriptionDispatchRate={"here": _dispatch(20, 2)})
    effective = overlay(namespace, topic)
    assert topic_rate_limits(effective, "here").publish == RateLimit(100, None)
    assert topic_rate_limits(effective, "there").publish == RateLimit(70, None)     # the namespace's, untouched
    assert topic_rate_limits(effective, "here").dispatch == RateLimit(300, None, 1.0)  # not set on the topic
    assert topic_rate_limits(effective, "here").per_subscription == RateLimit(20, None, 2.0)
    assert namespace.publishMaxMessageRate["here"] == _publish(500)                 # the input unchanged
    # "No limit" (-1) on the topic overrides a namespace limit too, as in Pulsar.
    unlimited = overlay(namespace, TopicPolicies(publishMaxMessageRate={"here": _publish(-1)}))
    assert topic_rate_limits(unlimited, "here").publish is None
    assert topic_rate_limits(overlay(namespace, None), "here").publish == RateLimit(500, None)


async def test_resolution_follows_set_and_remove_through_the_store():
    store = MemoryStore()
    resources = Resources(store, cache_ttl_s=60.0)
    await resources.create_tenant("t", TenantInfo())
    await resources.create_namespace(NamespaceName("t", "ns"),
                                     NamespacePolicies(publishMaxMessageRate={"c": _publish(500)}))
    topic = TopicName.parse("persistent://t/ns/x")
    partition = TopicName.parse("persistent://t/ns/x-partition-2")
    assert topic_rate_limits(await resources.effective_policies(topic), "c").publish == RateLimit(500, None)
    await resources.effective_policies(partition)     # cached now: the change below must still show

    def set_rate(policies: TopicPolicies) -> None:
        policies.publishMaxMessageRate = {"c": _publish(100)}
        policies.topicDispatchRate = {"c": _dispatch(40)}

    await resources.topic_policies.update(topic, set_rate)
    for name in (topic, partition):                   # a partitioned topic's rate holds for its partitions
        limits = topic_rate_limits(await resources.effective_policies(name), "c")
        assert limits.publish == RateLimit(100, None)
        assert limits.dispatch == RateLimit(40, None, 1.0)
    await resources.topic_policies.update(topic, lambda p: setattr(p, "publishMaxMessageRate", None))
    limits = topic_rate_limits(await resources.effective_policies(topic), "c")
    assert limits.publish == RateLimit(500, None)     # the namespace's again
    assert limits.dispatch == RateLimit(40, None, 1.0)
    await resources.topic_policies.update(topic, lambda p: setattr(p, "topicDispatchRate", None))
    assert await resources.topic_policies.get(topic, fresh=True) is None     # the emptied record is gone


def test_each_subscription_has_its_own_bucket_under_the_topics_shared_one():
    now = [0.0]
    clock = lambda: now[0]     # noqa: E731
    shared = DispatchRateThrottle(RateLimit(50, None, 1.0), clock=clock)
    rates = SubscriptionDispatchRates(RateLimit(30, None, 1.0), shared, clock=clock)
    first, second = rates.throttle(), rates.throttle()
    assert isinstance(first, BothThrottles) and first.own is not second.own
    assert first.allowance() == 30
    first.consume(30, 3000)
    assert first.allowance() == 0                     # its own bucket is empty...
    assert second.allowance() == 20                   # ...the other's is not, but the topic has 20 left
    assert 0 < first.retry_after_s() <= 0.2
    second.consume(20, 2000)
    assert second.allowance() == 0 and shared.allowance() == 0
    now[0] += 1.0
    assert first.allowance() == 30 and second.allowance() == 30
    alone = SubscriptionDispatchRates(RateLimit(30, None, 1.0), None, clock=clock).throttle()
    assert isinstance(alone, DispatchRateThrottle) and alone.limit == RateLimit(30, None, 1.0)
