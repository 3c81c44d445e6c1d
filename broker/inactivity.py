"""Policies that clean up after users: subscription expiry and inactive-topic deletion,
as Pulsar defines them, with clocks that survive broker restarts.

- **Subscription expiry** (``subscription_expiration_time_minutes`` in the namespace's
  policies, else the broker's default; Pulsar's ``subscriptionExpirationTimeMinutes``):
  a durable subscription with no consumer connected for that long is deleted, backlog
  and all. A subscription with a consumer is never expired.
- **Inactive topics** (``inactive_topic_policies`` of the namespace, else the broker's
  ``brokerDeleteInactiveTopics*`` settings): a topic with no producer and — in mode
  ``delete_when_no_subscriptions`` — no subscription, or — in mode
  ``delete_when_subscriptions_caught_up`` — no subscription with a backlog or a consumer,
  is deleted once it has been so for ``maxInactiveDurationSeconds``. A partition is
  deleted as any topic is, by the broker serving it (a client that comes back re-creates
  it while its partitioned topic exists); with ``delete_inactive_partitioned_metadata``
  (Pulsar's ``brokerDeleteInactivePartitionedTopicMetadataEnabled``) the partitioned
  topic goes too once its last partition went.

**The clocks.** Pulsar keeps "last active" in memory, so each broker restart starts
them again and a cluster restarted more often than the expiry time never cleans up.
Here the moment something *became* inactive is written to etcd
(``/topic-activity/<topic>``: ``{"topic_inactive_since_ms": ms or null,
"subscriptions": {name: ms}}``), only on transitions: when a sweep first finds the
topic or a subscription inactive, and when it finds it active again (the record entry
is removed). A restart therefore keeps the clock: what was inactive for 50 minutes
before it is 50 minutes inactive after it. The record's times come from the broker
that saw the transition (wall clock, milliseconds).

**Safety.** A sweep (``InactivitySweeper``, every ``inactivity_check_interval_s``)
looks at the topics of the bundles this broker serves, loaded or not: a topic that is
not loaded has no producer and no consumer, and its subscriptions are the cursors in
etcd. Before deleting, it loads the topic and checks again on the loaded object
(``PersistentTopic.delete(force=False)`` refuses a topic with producers or consumers;
an expiring subscription is deleted only if it still has none), so a client that
connects during the sweep wins. A topic or subscription first seen inactive by a
sweep gets "now" as its start: the first sweep after an upgrade (no record yet) starts
every clock, which may keep things longer once, never shorter.

Pure parts (``decide``, the policy readers, the record codec) take the time they are
given; the sweeper is the shell.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.errors import InvalidArgument, MagnetarError, NotOwner
from common.topic_name import NamespaceName, TopicName
from metadata import keys

log = logging.getLogger(__name__)

NO_SUBSCRIPTIONS, CAUGHT_UP = "delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"
MODES = (NO_SUBSCRIPTIONS, CAUGHT_UP)
# Topics one sweep looks at, per namespace: a namespace with more is covered over
# several sweeps (the listing is taken in name order from where the last one stopped).
TOPICS_PER_SWEEP_MAX = 10_000


@dataclass(frozen=True)
class InactiveTopicPolicy:
    delete_while_inactive: bool
    max_inactive_s: float
    mode: str = NO_SUBSCRIPTIONS


def inactive_topic_policy_of(doc: object) -> dict:
    """Pulsar's InactiveTopicPolicies body, checked; the JSON the namespace stores."""
    if not isinstance(doc, dict):
        raise InvalidArgument("inactive topic policies must be a JSON object")
    mode = doc.get("inactiveTopicDeleteMode", NO_SUBSCRIPTIONS)
    if mode not in MODES:
        raise InvalidArgument(f"inactiveTopicDeleteMode must be one of {', '.join(MODES)}")
    seconds = doc.get("maxInactiveDurationSeconds", 60)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 2**31 - 1:
        raise InvalidArgument("maxInactiveDurationSeconds must be an integer in [1, 2147483647]")
    enabled = doc.get("deleteWhileInactive", True)
    if not isinstance(enabled, bool):
        raise InvalidArgument("deleteWhileInactive must be true or false")
    return {"inactiveTopicDeleteMode": mode, "maxInactiveDurationSeconds": seconds, "deleteWhileInactive": enabled}


def subscription_expiration_of(doc: object) -> int:
    """Minutes (0: the broker's default)."""
    if isinstance(doc, bool) or not isinstance(doc, int) or not 0 <= doc <= 2**31 - 1:
        raise InvalidArgument("subscription expiration time must be an integer number of minutes >= 0")
    return doc


def effective_topic_policy(namespace_doc: dict | None, broker_default: InactiveTopicPolicy) -> InactiveTopicPolicy:
    if not namespace_doc:
        return broker_default
    return InactiveTopicPolicy(bool(namespace_doc.get("deleteWhileInactive", True)),
                               float(namespace_doc.get("maxInactiveDurationSeconds", 60)),
                               str(namespace_doc.get("inactiveTopicDeleteMode", NO_SUBSCRIPTIONS)))


def effective_expiry_s(namespace_minutes: int | None, broker_minutes: float) -> float | None:
    """Seconds after which a subscription without consumers expires; None: never.
    The namespace's minutes win when set (> 0); else the broker's (> 0); else never."""
    if namespace_minutes:
        return namespace_minutes * 60.0
    return broker_minutes * 60.0 if broker_minutes > 0 else None


@dataclass
class ActivityRecord:
    topic_inactive_since_ms: int | None = None
    subscriptions: dict[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps({"topic_inactive_since_ms": self.topic_inactive_since_ms,
                           "subscriptions": dict(sorted(self.subscriptions.items()))}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "ActivityRecord":
        try:
            doc = json.loads(data)
            since = doc.get("topic_inactive_since_ms")
            return cls(int(since) if since is not None else None,
                       {str(k): int(v) for k, v in (doc.get("subscriptions") or {}).items()})
        except (ValueError, TypeError, AttributeError) as error:
            log.warning("unreadable topic activity record, clocks start again: error=%s", error)
            return cls()

    @property
    def empty(self) -> bool:
        return self.topic_inactive_since_ms is None and not self.subscriptions


@dataclass(frozen=True)
class TopicView:
    """What a sweep knows of one topic: its producers, the consumers of its
    non-durable subscriptions (readers), and each durable subscription's consumers and
    backlog."""
    producers: int
    subscriptions: dict[str, tuple[int, int]]     # name -> (consumers, backlog entries)
    readers: int = 0


@dataclass
class Decision:
    record: ActivityRecord
    delete_topic: bool = False
    expire: list[str] = field(default_factory=list)


def decide(view: TopicView, record: ActivityRecord, topic_policy: InactiveTopicPolicy, expiry_s: float | None,
           now_ms: int) -> Decision:
    """The new record, and what is past its time: subscriptions to expire, the topic to
    delete. A clock starts (``now_ms``) the first time something is seen inactive and
    stops (its entry dropped) when it is seen active."""
    subscriptions = {}
    expire = []
    for name, (consumers, _backlog) in sorted(view.subscriptions.items()):
        if consumers:
            continue
        since = record.subscriptions.get(name, now_ms)
        subscriptions[name] = since
        if expiry_s is not None and now_ms - since >= expiry_s * 1000:
            expire.append(name)
    remaining = {name: state for name, state in view.subscriptions.items() if name not in expire}
    if topic_policy.mode == CAUGHT_UP:
        busy = any(consumers or backlog for consumers, backlog in remaining.values())
    else:
        busy = bool(remaining)
    inactive = view.producers == 0 and view.readers == 0 and not busy
    if not inactive:
        topic_since = None
    elif record.topic_inactive_since_ms is None:
        topic_since = now_ms
    else:
        topic_since = record.topic_inactive_since_ms
    delete = (inactive and topic_policy.delete_while_inactive and topic_since is not None
              and now_ms - topic_since >= topic_policy.max_inactive_s * 1000)
    new_record = ActivityRecord(topic_since, {n: s for n, s in subscriptions.items() if n not in expire})
    assert not (delete and view.producers), "a topic with producers is never deleted"
    return Decision(new_record, delete, expire)


@dataclass
class InactivityCounters:
    subscriptions_expired: int = 0
    topics_deleted: int = 0
    partitioned_topics_deleted: int = 0
    sweeps: int = 0


class SweptService(Protocol):
    """What the sweeper needs of the broker service (broker/service.py, which owns it)."""
    config: Any
    resources: Any
    store: Any
    topic_ownership: Any
    shutting_down: bool

    def loaded_topic(self, name: TopicName) -> Any: ...

    async def get_topic(self, name: TopicName, *, create: bool) -> Any: ...

    async def topics_of_namespace(self, namespace: NamespaceName) -> list[str]: ...

    async def topic_exists(self, name: TopicName) -> bool: ...


class InactivitySweeper:
    """The shell: one sweep over the namespaces' topics this broker serves."""

    def __init__(self, service: SweptService) -> None:
        self._service = service
        self.counters = InactivityCounters()

    def _broker_policy(self) -> InactiveTopicPolicy:
        config = self._service.config
        return InactiveTopicPolicy(config.delete_inactive_topics_enabled, config.delete_inactive_topics_max_inactive_s,
                                   config.delete_inactive_topics_mode)

    async def run(self) -> None:
        interval_s = self._service.config.inactivity_check_interval_s
        while not self._service.shutting_down:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep()
            except MagnetarError as error:
                log.warning("inactivity sweep failed: error=%s", error)

    async def sweep(self) -> None:
        service = self._service
        resources = service.resources
        self.counters.sweeps += 1
        for tenant in await resources.tenants():
            for namespace_text in await resources.namespaces(tenant):
                namespace = NamespaceName.parse(namespace_text)
                try:
                    policies = await resources.policies(namespace)
                except MagnetarError:
                    continue   # deleted meanwhile
                topic_policy = effective_topic_policy(getattr(policies, "inactive_topic_policies", None),
                                                      self._broker_policy())
                expiry_s = effective_expiry_s(policies.subscription_expiration_time_minutes,
                                              service.config.subscription_expiration_time_minutes)
                if not topic_policy.delete_while_inactive and expiry_s is None:
                    continue
                await self._sweep_namespace(namespace, topic_policy, expiry_s)

    async def _sweep_namespace(self, namespace: NamespaceName, topic_policy: InactiveTopicPolicy,
                               expiry_s: float | None) -> None:
        service = self._service
        store = service.store
        prefix = keys.topic_activity_of_namespace(namespace.tenant, namespace.namespace)
        records = {r.key: ActivityRecord.decode(r.value) for r in await store.get_prefix(prefix)}
        topics = sorted(await service.topics_of_namespace(namespace))[:TOPICS_PER_SWEEP_MAX]
        existing_keys = set()
        for text in topics:
            name = TopicName.parse(text)
            key = keys.topic_activity(name.key_path)
            existing_keys.add(key)
            if not await self._serving(name):
                continue
            view = await self._view(name)
            if view is None:
                continue
            record = records.get(key, ActivityRecord())
            decision = decide(view, record, topic_policy, expiry_s, int(time.time() * 1000))
            if decision.record != record:
                if decision.record.empty:
                    await store.delete(key)
                else:
                    await store.put(key, decision.record.encode())
            for subscription in decision.expire:
                await self._expire(name, subscription, expiry_s)
            if decision.delete_topic:
                await self._delete(name, topic_policy)
        # Records of topics gone (deleted by an operator, or by us above) go too.
        for key in records:
            if key not in existing_keys:
                await store.delete(key)

    async def _serving(self, name: TopicName) -> bool:
        ownership = self._service.topic_ownership
        if ownership is None:
            return True
        try:
            return await ownership.is_serving(name)
        except (MagnetarError, NotOwner):
            return False

    async def _view(self, name: TopicName) -> TopicView | None:
        service = self._service
        topic = service.loaded_topic(name)
        if topic is not None:
            if topic.closing:
                return None
            subscriptions = list(topic.subscriptions.items())
            return TopicView(len(topic.producers), {
                sub_name: (len(s.consumers), s.cursor.backlog_entries(topic.entries_between))
                for sub_name, s in subscriptions if s.cursor.durable},
                readers=sum(len(s.consumers) for _, s in subscriptions if not s.cursor.durable))
        # Not loaded: no producer, no consumer; its subscriptions are its cursors. Their
        # backlog is unknown without loading: counted as some (so caught-up mode keeps
        # such a topic until it is loaded and found caught up).
        from urllib.parse import unquote

        prefix = keys.cursors_of_topic(name.key_path)
        cursors = await service.store.get_prefix(prefix, keys_only=True)
        return TopicView(0, {unquote(r.key[len(prefix):]): (0, 1) for r in cursors})

    async def _expire(self, name: TopicName, subscription: str, expiry_s: float | None) -> None:
        service = self._service
        try:
            topic = await service.get_topic(name, create=False)
            current = topic.subscriptions.get(subscription)
            if current is None or current.consumers or not current.cursor.durable:
                return   # gone, or a consumer came back meanwhile
            await topic.unsubscribe(subscription, None)
        except MagnetarError as error:
            log.warning("subscription expiry failed: topic=%s subscription=%s error=%s", name, subscription, error)
            return
        self.counters.subscriptions_expired += 1
        log.info("subscription expired: topic=%s subscription=%s inactive_s_min=%s", name, subscription, expiry_s)

    async def _delete(self, name: TopicName, policy: InactiveTopicPolicy) -> None:
        service = self._service
        try:
            topic = await service.get_topic(name, create=False)
            # Checked again on the loaded topic: a client that came meanwhile keeps it.
            if topic.producers or any(s.consumers for s in topic.subscriptions.values()):
                return
            if policy.mode == NO_SUBSCRIPTIONS and topic.subscriptions:
                return
            if policy.mode == CAUGHT_UP and any(s.cursor.backlog_entries(topic.entries_between)
                                                for s in topic.subscriptions.values()):
                return
            await topic.delete(force=False)
            await service.store.delete(keys.topic_activity(name.key_path))
        except MagnetarError as error:
            log.warning("inactive topic deletion failed: topic=%s error=%s", name, error)
            return
        self.counters.topics_deleted += 1
        log.info("inactive topic deleted: topic=%s mode=%s max_inactive_s=%s", name, policy.mode,
                 policy.max_inactive_s)
        if name.is_partition and service.config.delete_inactive_partitioned_metadata:
            await self._delete_partitioned_if_empty(name.partitioned_parent)

    async def _delete_partitioned_if_empty(self, parent: TopicName) -> None:
        """The partitioned topic goes once none of its partitions exists (each deleted
        by its owner's sweep). A partition a client re-creates between the check and the
        delete is left without its partitioned topic, as after an admin's forced delete:
        it is served while it exists and swept like any topic."""
        service = self._service
        try:
            count = await service.resources.partitions(parent)
            if count == 0:
                return
            for index in range(count):
                if await service.topic_exists(parent.partition(index)):
                    return
            await service.resources.delete_partitioned(parent)
        except MagnetarError as error:
            log.warning("inactive partitioned topic deletion failed: topic=%s error=%s", parent, error)
            return
        self.counters.partitioned_topics_deleted += 1
        log.info("inactive partitioned topic deleted: topic=%s partitions=%d", parent, count)
