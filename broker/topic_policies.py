"""Topic-level policies, and the one resolver of the policies a topic is served under.

Pulsar lets a topic override its namespace's policies (``/admin/v2/persistent/{t}/{ns}/
{topic}/retention``, ``messageTTL``, ``backlogQuota``, ``maxProducers``, ...): topic over
namespace over broker default. Here a topic's own policies are a ``TopicPolicies``
record in etcd (metadata/policies.py; a partitioned topic's record holds for all its
partitions), and ``overlay`` lays its set fields over the namespace's policies. The
result is a ``NamespacePolicies`` — the very type the enforcement code (retention,
message TTL, backlog quotas, deduplication, compaction threshold, producer and
consumer limits) already reads — so every check goes through ``effective`` and there is
no second path where a topic could be served under its namespace's policies alone.

Failure rule (the reason the record is in etcd and read at topic load): if a topic's
policies cannot be read — etcd unreachable, or a record that does not decode — the
topic is not served: ``effective`` raises ServiceNotReady (retriable; the official
clients look the topic up again and retry), and a topic load fails with it, instead of
serving the topic under its namespace's policies as if it had none (in Pulsar, topic
policies that failed to load from their system topic are silently missing).

Reads are cached per topic for ``cache_ttl_s`` (as namespace policies are), at most
``CACHED_TOPICS_MAX`` topics; a change through this broker drops the cached copy, so
it acts at once here, and broker/policy_watch.py drops other brokers' copies when it
sees the change in etcd (within the cache time if the watch is down). The absence of a
record is cached too (most topics have none).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import OrderedDict
from dataclasses import fields
from typing import Callable

from common.errors import (
    MalformedFrame,
    MetadataError,
    MetadataKeyExists,
    MetadataVersionConflict,
    PreconditionFailed,
    ServiceNotReady,
)
from common.topic_name import TopicName
from metadata import keys
from metadata.policies import NamespacePolicies, TopicPolicies
from metadata.store import MetadataStore

# Topics whose policies are cached: a broker serves up to tens of thousands of topics;
# each entry is a small record (or None).
CACHED_TOPICS_MAX = 50_000
# Namespaces whose last prefix read is remembered (see TopicPolicyStore._namespace_records).
CACHED_NAMESPACES_MAX = 10_000
# A record of a namespace's prefix read that does not decode.
_UNREADABLE = object()
# Compare-and-set attempts of one change before giving up (PreconditionFailed, retried
# by the caller): each lost attempt means another change landed in between.
CAS_ATTEMPTS_MAX = 16
# TopicPolicies fields that are maps (backlog quota type -> quota, cluster -> rate): laid
# over the namespace's map key by key.
_MERGED = ("backlog_quota_map", "publishMaxMessageRate", "topicDispatchRate", "subscriptionDispatchRate")
# TopicPolicies fields laid over NamespacePolicies fields of the same name, whole.
_OVERLAID = tuple(f.name for f in fields(TopicPolicies) if f.name not in _MERGED)


def overlay(namespace: NamespacePolicies, topic: TopicPolicies | None) -> NamespacePolicies:
    """The policies a topic is served under: its namespace's, with each field the topic
    sets taking their place (backlog quotas per quota type). Pure; neither argument
    changes. Maps (backlog quotas per quota type, rates per cluster) are laid over key by
    key."""
    effective = copy.deepcopy(namespace)
    if topic is None:
        return effective
    for name in _OVERLAID:
        value = getattr(topic, name)
        if value is not None:
            setattr(effective, name, copy.deepcopy(value))
    for name in _MERGED:
        value = getattr(topic, name)
        if value:
            setattr(effective, name, {**(getattr(effective, name) or {}), **copy.deepcopy(value)})
    return effective


def limit(policy_value: int | None, broker_max: int) -> int:
    """A per-topic limit: the policy's value (None or 0: the broker's), never above the
    broker's own bound."""
    if not policy_value or policy_value < 0:
        return broker_max
    return min(policy_value, broker_max)


def _owner(topic: TopicName) -> TopicName:
    """The topic whose record holds ``topic``'s policies (a partition's parent)."""
    return topic.partitioned_parent


class TopicPolicyStore:
    """Reads (cached), changes (compare-and-set) and removes topics' policy records."""

    def __init__(self, store: MetadataStore, *, cache_ttl_s: float) -> None:
        self.store = store
        self.cache_ttl_s = cache_ttl_s
        self._cache: OrderedDict[str, tuple[float, TopicPolicies | None]] = OrderedDict()
        # Per namespace (key prefix): when its records were last read in one prefix
        # read, and that read while under way (concurrent callers share it).
        self._namespace_reads: OrderedDict[str, tuple[float, asyncio.Future[dict | None]]] = OrderedDict()

    async def get(self, topic: TopicName, *, fresh: bool = False) -> TopicPolicies | None:
        """The topic's own policies (None: it has none). ServiceNotReady when they cannot
        be read: the topic must not be served without them. ``fresh``: its record read
        now; otherwise an entry older than ``cache_ttl_s`` is renewed with the records
        of the whole namespace, in one prefix read shared by its topics (the broker's
        periodic passes ask for every loaded topic's: 10,000 topics were 10,000 reads
        every few seconds; most topics have no record, and the prefix read says so)."""
        owner = _owner(topic)
        key = owner.key_path
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and not fresh and now - cached[0] < self.cache_ttl_s:
            self._cache.move_to_end(key)
            return cached[1]
        if not fresh:
            read_at, found = await self._namespace_records(key.rsplit("/", 1)[0] + "/", now)
            if found is not None:
                policies = found.get(key)
                if policies is not _UNREADABLE:
                    self._remember(key, read_at, policies)
                    return policies
        try:
            record = await self.store.get(keys.topic_policies(key))
            policies = TopicPolicies.decode(record.value) if record is not None else None
        except (MetadataError, MalformedFrame) as error:
            self._cache.pop(key, None)
            raise ServiceNotReady(f"the topic policies of {owner} could not be read ({error.message}); "
                                  "the topic is not served without them") from None
        self._remember(key, now, policies)
        return policies

    async def _namespace_records(self, prefix: str, now: float) -> tuple[float, dict | None]:
        """(when, {topic key path: policies}) of the namespace's records (``prefix``: its
        topics' key paths' common start), from a prefix read started within the last
        ``cache_ttl_s`` or one started now; None instead of the records if the read
        failed (each topic is then read alone, which reports the failure). A record
        that does not decode is _UNREADABLE (read alone too)."""
        current = self._namespace_reads.get(prefix)
        if current is None or now - current[0] >= self.cache_ttl_s:
            future: asyncio.Future[dict | None] = asyncio.get_running_loop().create_future()
            current = (now, future)
            self._namespace_reads[prefix] = current
            self._namespace_reads.move_to_end(prefix)
            while len(self._namespace_reads) > CACHED_NAMESPACES_MAX:
                self._namespace_reads.popitem(last=False)
            found: dict | None = None
            try:
                records = await self.store.get_prefix(keys.topic_policies(prefix))
                found = {}
                for record in records:
                    try:
                        found[record.key[len(keys.TOPIC_POLICIES):]] = TopicPolicies.decode(record.value)
                    except MalformedFrame:
                        found[record.key[len(keys.TOPIC_POLICIES):]] = _UNREADABLE
            except MetadataError:
                pass
            finally:
                if found is None and self._namespace_reads.get(prefix) is current:
                    self._namespace_reads.pop(prefix, None)
                future.set_result(found)
        return current[0], await asyncio.shield(current[1])

    def _remember(self, key: str, now: float, policies: TopicPolicies | None) -> None:
        self._cache[key] = (now, policies)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHED_TOPICS_MAX:
            self._cache.popitem(last=False)

    def forget(self, topic: TopicName) -> None:
        self.forget_key(_owner(topic).key_path)

    def forget_key(self, key: str) -> None:
        """Drops the cached policies of the topic whose key path is ``key`` (and its
        namespace's last prefix read): the next read is fresh."""
        self._cache.pop(key, None)
        self._namespace_reads.pop(key.rsplit("/", 1)[0] + "/", None)

    def forget_all(self) -> None:
        self._cache.clear()
        self._namespace_reads.clear()

    async def update(self, topic: TopicName, change: Callable[[TopicPolicies], None]) -> TopicPolicies:
        """Read-modify-write of the topic's record with compare-and-set (created when
        absent, deleted when it ends up empty). A record that does not decode is
        replaced: the change is the operator's way out of it."""
        owner = _owner(topic)
        key = keys.topic_policies(owner.key_path)
        for _ in range(CAS_ATTEMPTS_MAX):
            record = await self.store.get(key)
            try:
                policies = TopicPolicies.decode(record.value) if record is not None else TopicPolicies()
            except MalformedFrame:
                policies = TopicPolicies()
            change(policies)
            try:
                if record is None:
                    if policies.is_empty():
                        break
                    await self.store.create(key, policies.encode())
                elif policies.is_empty():
                    await self.store.compare_and_delete(key, expected_version=record.version)
                else:
                    await self.store.compare_and_set(key, policies.encode(), expected_version=record.version)
            except (MetadataVersionConflict, MetadataKeyExists):
                continue
            break
        else:
            raise PreconditionFailed(f"the policies of {owner} changed concurrently too often; retry")
        self.forget(owner)
        return policies

    async def delete(self, topic: TopicName) -> None:
        """Removes the topic's policies (when the topic itself is deleted)."""
        owner = _owner(topic)
        await self.store.delete(keys.topic_policies(owner.key_path))
        self.forget(owner)


class PolicyResolver:
    """The one place a topic's effective policies come from (see the module docstring)."""

    def __init__(self, namespace_policies, topic_policies: TopicPolicyStore) -> None:
        # namespace_policies: Resources.policies (cached per namespace).
        self._namespace_policies = namespace_policies
        self.topic_policies = topic_policies

    async def effective(self, topic: TopicName, *, fresh: bool = False) -> NamespacePolicies:
        """``fresh``: the topic's own record read from etcd now (at topic load), not
        from the cache; the namespace's come through its own cache either way. Read
        only: a topic without policies of its own gets its namespace's cached object
        itself, as Resources.policies hands it out (a copy for each call was most of
        the retention and policy passes' CPU with 10,000 loaded topics)."""
        namespace = await self._namespace_policies(topic.namespace_name)
        own = await self.topic_policies.get(topic, fresh=fresh)
        return namespace if own is None else overlay(namespace, own)
