"""Topic-level policies (broker/topic_policies.py) and the one resolver of a topic's
effective policies, over the in-memory metadata store.

Proves: ``overlay`` takes each field the topic sets over the namespace's (backlog quotas
per quota type) and leaves the rest, changing neither input; ``limit`` is the policy's
value capped by the broker's bound, the broker's when unset or 0; a partition's policies
are its partitioned topic's; changes are compare-and-set, an emptied record is deleted;
the resolver serves topic over namespace, caches (a change through the store is seen at
once), and refuses with ServiceNotReady — never the namespace's policies alone — when
the topic's record cannot be read (undecodable, or the store failing); a change
replaces an undecodable record.
"""

from __future__ import annotations

import pytest

from broker.resources import Resources
from broker.topic_policies import limit, overlay
from common.errors import MetadataUnavailable, ServiceNotReady
from common.topic_name import NamespaceName, TopicName
from metadata import keys
from metadata.memory_store import MemoryStore
from metadata.policies import NamespacePolicies, TenantInfo, TopicPolicies

HOLD = {"limit": 10, "limitSize": 10, "limitTime": -1, "policy": "producer_request_hold"}
EXCEPTION = {"limit": 20, "limitSize": 20, "limitTime": -1, "policy": "producer_exception"}
AGE = {"limit": -1, "limitSize": -1, "limitTime": 60, "policy": "producer_exception"}


def test_overlay_takes_the_topics_fields_over_the_namespaces():
    namespace = NamespacePolicies(retention_policies={"retentionTimeInMinutes": 5, "retentionSizeInMB": 1},
                                  message_ttl_in_seconds=30, deduplicationEnabled=True,
                                  backlog_quota_map={"destination_storage": HOLD, "message_age": AGE},
                                  max_producers_per_topic=7, schema_compatibility_strategy="BACKWARD")
    topic = TopicPolicies(message_ttl_in_seconds=5, deduplicationEnabled=False, max_consumers_per_topic=3,
                          backlog_quota_map={"destination_storage": EXCEPTION})
    effective = overlay(namespace, topic)
    assert effective.message_ttl_in_seconds == 5
    assert effective.deduplicationEnabled is False          # False overrides True: only None inherits
    assert effective.max_consumers_per_topic == 3 and effective.max_producers_per_topic == 7
    assert effective.retention_policies == {"retentionTimeInMinutes": 5, "retentionSizeInMB": 1}
    assert effective.backlog_quota_map == {"destination_storage": EXCEPTION, "message_age": AGE}
    assert effective.schema_compatibility_strategy == "BACKWARD"
    # Neither input changed; no topic record: the namespace's, as a copy.
    assert namespace.message_ttl_in_seconds == 30 and namespace.backlog_quota_map["destination_storage"] == HOLD
    assert overlay(namespace, None) == namespace and overlay(namespace, None) is not namespace


def test_limit_is_capped_by_the_broker():
    assert limit(None, 100) == 100 and limit(0, 100) == 100
    assert limit(3, 100) == 3 and limit(1000, 100) == 100


@pytest.fixture
async def resources():
    store = MemoryStore()
    resources = Resources(store, cache_ttl_s=60.0)
    await resources.create_tenant("t", TenantInfo())
    await resources.create_namespace(NamespaceName("t", "ns"),
                                     NamespacePolicies(message_ttl_in_seconds=30, max_producers_per_topic=7))
    return resources


async def test_the_resolver_serves_topic_over_namespace_and_partitions_share_their_parents(resources):
    topic = TopicName.parse("persistent://t/ns/orders")
    other = TopicName.parse("persistent://t/ns/other")
    assert (await resources.effective_policies(topic)).message_ttl_in_seconds == 30
    await resources.topic_policies.update(topic, lambda p: setattr(p, "message_ttl_in_seconds", 5))
    # Seen at once (the change dropped the cached copy), and by every partition.
    assert (await resources.effective_policies(topic)).message_ttl_in_seconds == 5
    assert (await resources.effective_policies(topic.partition(3))).message_ttl_in_seconds == 5
    assert (await resources.effective_policies(other)).message_ttl_in_seconds == 30
    await resources.topic_policies.update(topic.partition(1), lambda p: setattr(p, "max_producers_per_topic", 2))
    assert (await resources.effective_policies(topic)).max_producers_per_topic == 2
    # Emptied: the record is deleted, the namespace's apply again.
    await resources.topic_policies.update(topic, lambda p: setattr(p, "message_ttl_in_seconds", None))
    await resources.topic_policies.update(topic, lambda p: setattr(p, "max_producers_per_topic", None))
    assert await resources.store.get(keys.topic_policies(topic.key_path)) is None
    assert (await resources.effective_policies(topic)).message_ttl_in_seconds == 30


async def test_unreadable_topic_policies_refuse_the_topic(resources, monkeypatch):
    """A record that does not decode, or a store that fails: ServiceNotReady (retriable),
    at load (fresh) and once the cache runs out — never the namespace's policies alone."""
    topic = TopicName.parse("persistent://t/ns/broken")
    await resources.store.put(keys.topic_policies(topic.key_path), b"{not json")
    with pytest.raises(ServiceNotReady, match="not served without them") as refused:
        await resources.effective_policies(topic, fresh=True)
    assert refused.value.retriable
    # An operator's change replaces the bad record.
    await resources.topic_policies.update(topic, lambda p: setattr(p, "message_ttl_in_seconds", 9))
    assert (await resources.effective_policies(topic, fresh=True)).message_ttl_in_seconds == 9

    real_get = resources.store.get

    async def failing_get(key: str):
        if key.startswith(keys.TOPIC_POLICIES):
            raise MetadataUnavailable("etcd is unreachable")
        return await real_get(key)

    monkeypatch.setattr(resources.store, "get", failing_get)
    with pytest.raises(ServiceNotReady):
        await resources.effective_policies(topic, fresh=True)
    # Not cached as "no policies": the next read tries again.
    monkeypatch.setattr(resources.store, "get", real_get)
    assert (await resources.effective_policies(topic)).message_ttl_in_seconds == 9


async def test_deleting_a_partitioned_topic_or_namespace_drops_its_policies(resources):
    topic = TopicName.parse("persistent://t/ns/parted")
    await resources.create_partitioned(topic, 2)
    await resources.topic_policies.update(topic, lambda p: setattr(p, "deduplicationEnabled", True))
    await resources.delete_partitioned(topic)
    assert await resources.store.get(keys.topic_policies(topic.key_path)) is None
    lone = TopicName.parse("persistent://t/ns/lone")
    await resources.topic_policies.update(lone, lambda p: setattr(p, "compaction_threshold", 100))
    await resources.delete_namespace(NamespaceName("t", "ns"))
    assert await resources.store.get_prefix(keys.TOPIC_POLICIES) == []


def test_every_topic_policy_is_a_namespace_policy_of_the_same_name():
    """overlay sets NamespacePolicies fields by TopicPolicies' names: a topic field
    without a namespace twin would be laid over nothing."""
    from dataclasses import fields

    namespace_fields = {f.name for f in fields(NamespacePolicies)}
    assert {f.name for f in fields(TopicPolicies)} <= namespace_fields


async def test_expired_entries_are_renewed_by_one_prefix_read_per_namespace(monkeypatch):
    """The broker's periodic passes ask for every loaded topic's policies: once the
    cache runs out, 100 topics of a namespace cost one prefix read, not 100 reads (and
    100 callers at once share it). A change made by another broker is seen after the
    cache time, a record that does not decode still refuses its topic (and only it),
    and a failing prefix read falls back to reading each topic alone."""
    import asyncio

    store = MemoryStore()
    resources = Resources(store, cache_ttl_s=60.0)
    await resources.create_tenant("t", TenantInfo())
    await resources.create_namespace(NamespaceName("t", "ns"), NamespacePolicies(message_ttl_in_seconds=30))
    topics = [TopicName.parse(f"persistent://t/ns/topic-{index}") for index in range(100)]
    elsewhere = Resources(store, cache_ttl_s=60.0)     # another broker's view of the same store
    await elsewhere.topic_policies.update(topics[7], lambda p: setattr(p, "message_ttl_in_seconds", 7))
    for topic in topics:
        await resources.effective_policies(topic, fresh=True)   # loaded: read alone
    calls = {"get": 0, "get_prefix": 0}
    real_get, real_get_prefix = store.get, store.get_prefix

    async def counted_get(key: str):
        if key.startswith(keys.TOPIC_POLICIES):
            calls["get"] += 1
        return await real_get(key)

    async def counted_get_prefix(prefix: str, **options):
        if prefix.startswith(keys.TOPIC_POLICIES):
            calls["get_prefix"] += 1
        return await real_get_prefix(prefix, **options)

    monkeypatch.setattr(store, "get", counted_get)
    monkeypatch.setattr(store, "get_prefix", counted_get_prefix)
    import broker.topic_policies as topic_policies_module

    clock = [topic_policies_module.time.monotonic()]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return clock[0]

    monkeypatch.setattr(topic_policies_module, "time", Clock)
    await elsewhere.topic_policies.update(topics[9], lambda p: setattr(p, "message_ttl_in_seconds", 9))
    calls.update(get=0, get_prefix=0)
    clock[0] += 61.0                                           # every entry expired
    ttls = await asyncio.gather(*(resources.effective_policies(t) for t in topics))
    assert calls == {"get": 0, "get_prefix": 1}, calls
    assert [p.message_ttl_in_seconds for p in ttls] == [7 if i == 7 else 9 if i == 9 else 30 for i in range(100)]
    clock[0] += 30.0                                           # within the cache time: no read at all
    await asyncio.gather(*(resources.effective_policies(t) for t in topics))
    assert calls == {"get": 0, "get_prefix": 1}, calls

    await store.put(keys.topic_policies(topics[3].key_path), b"{not json")
    clock[0] += 61.0
    with pytest.raises(ServiceNotReady, match="not served without them"):
        await resources.effective_policies(topics[3])
    assert (await resources.effective_policies(topics[4])).message_ttl_in_seconds == 30
    assert calls == {"get": 1, "get_prefix": 2}, calls

    async def failing_get_prefix(prefix: str, **options):
        raise MetadataUnavailable("etcd is unreachable")

    monkeypatch.setattr(store, "get_prefix", failing_get_prefix)
    clock[0] += 61.0
    assert (await resources.effective_policies(topics[9])).message_ttl_in_seconds == 9
    assert calls["get"] == 2
