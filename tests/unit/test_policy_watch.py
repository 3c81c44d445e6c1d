"""broker/policy_watch.py on the in-memory store (etcd's watch semantics).

Proves: a namespace's policies changed through one broker (its own Resources) reach a
second broker's loaded topics at once: the second broker's cached policies are dropped
(it had them cached as "off") and its topics of that namespace have deduplication
turned on and the broker's policy pass (rate limits) is woken, while a topic of
another namespace is left alone; a namespace's other keys
(bundles) are not taken for policies. A topic's own policies changed through one
broker are read afresh by another at once (its cached copy dropped) and wake its pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from broker import policy_watch
from broker.resources import Resources
from common.topic_name import NamespaceName, TopicName
from metadata import keys
from metadata.memory_store import MemoryStore
from metadata.policies import TenantInfo


@dataclass
class _Topic:
    """What the watch uses of a loaded topic."""

    name: TopicName
    closing: bool = False
    deduplication: list[bool] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return str(self.name)

    async def set_deduplication(self, enabled: bool) -> None:
        self.deduplication.append(enabled)


def test_policies_keys_name_their_namespace_and_nothing_else():
    """Only ``/namespaces/<tenant>/<ns>/policies`` names a namespace."""
    assert policy_watch.namespace_of_policies_key(keys.namespace_policies("t", "ns")) == NamespaceName("t", "ns")
    assert policy_watch.namespace_of_policies_key(keys.namespace_bundles("t", "ns")) is None
    assert policy_watch.namespace_of_policies_key("/namespaces/t/policies") is None
    assert policy_watch.namespace_of_policies_key("/other/t/ns/policies") is None


async def test_a_change_through_another_broker_reaches_the_loaded_topics_at_once():
    store = MemoryStore()
    here, there = Resources(store), Resources(store)
    await here.create_tenant("t", TenantInfo(allowedClusters=["c"]))
    watched, other = NamespaceName("t", "orders"), NamespaceName("t", "other")
    await here.create_namespace(watched)
    await here.create_namespace(other)
    topics = [_Topic(TopicName.parse("persistent://t/orders/a")), _Topic(TopicName.parse("persistent://t/other/b"))]
    assert not (await there.policies(watched)).deduplicationEnabled          # cached as off over there
    woken: list[bool] = []
    task = asyncio.get_running_loop().create_task(
        policy_watch.follow(store, there, lambda: topics, lambda: woken.append(True)))
    try:
        async with asyncio.timeout(5):
            while not all(topic.deduplication for topic in topics):          # brought in line at start
                await asyncio.sleep(0.01)
        assert [topic.deduplication for topic in topics] == [[False], [False]]

        await here.update_policies(watched, lambda policies: setattr(policies, "deduplicationEnabled", True))
        async with asyncio.timeout(5):
            while topics[0].deduplication[-1] is not True:
                await asyncio.sleep(0.01)
        assert topics[1].deduplication == [False]                              # another namespace: untouched
        assert woken                                      # the broker's policy pass (rate limits) woken
        # The cache over there was dropped: its next read sees the change (its TTL is 5 s).
        assert (await there.policies(watched)).deduplicationEnabled is True
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()


async def test_a_topics_policy_change_through_another_broker_drops_the_cached_copy_at_once():
    """A topic's own policies changed through one broker: a second broker that had
    them cached (as none) reads the new ones at once and its policy pass is woken; a
    removal likewise."""
    store = MemoryStore()
    here, there = Resources(store, cache_ttl_s=60.0), Resources(store, cache_ttl_s=60.0)
    await here.create_tenant("t", TenantInfo(allowedClusters=["c"]))
    await here.create_namespace(NamespaceName("t", "ns"))
    topic = TopicName.parse("persistent://t/ns/x")
    woken: list[bool] = []
    task = asyncio.get_running_loop().create_task(
        policy_watch.follow_topic_policies(store, there.topic_policies, lambda: woken.append(True)))
    try:
        async with asyncio.timeout(5):
            while not woken:                                                 # started: the pass woken once
                await asyncio.sleep(0.01)
        assert await there.topic_policies.get(topic) is None                # cached as none for 60 s
        rate = {"c": {"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": -1}}
        await here.topic_policies.update(topic, lambda p: setattr(p, "publishMaxMessageRate", rate))
        async with asyncio.timeout(5):
            while (await there.effective_policies(topic)).publishMaxMessageRate != rate:
                await asyncio.sleep(0.01)
        assert len(woken) >= 2
        await here.topic_policies.update(topic, lambda p: setattr(p, "publishMaxMessageRate", None))
        async with asyncio.timeout(5):
            while await there.topic_policies.get(topic) is not None:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()
