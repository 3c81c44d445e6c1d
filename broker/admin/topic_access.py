"""How admin handlers reach topics: the owner check (a request for a topic another broker
serves is redirected there, as Pulsar does with 307), loading, partition fan-out, and
the few topic-level steps the broker service does not offer yet.

A partitioned topic ``t`` has no managed ledger of its own: its partitions
``t-partition-i`` do, and they come into being lazily (a producer, consumer or admin
call on the partition creates its managed ledger). So the partitions this module
fans out to are the ones that exist; one never created has nothing to report.

"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from aiohttp import web

from broker.admin import fanout
from broker.admin.common import redirect_base
from broker.service import BrokerService, OwnerInfo
from broker.topic import PersistentTopic
from common.topic_name import NamespaceName, TopicName
from common.errors import (
    PreconditionFailed,
    SubscriptionNotFound,
    TopicNotFound,
)
from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)


async def redirect_unless_owner(service: BrokerService, name: TopicName, request: web.Request) -> None:
    owner = await service.owner_of(name)
    if not owner.is_self:
        base = redirect_base(request, owner.web_service_url, owner.web_service_url_tls)
        raise web.HTTPTemporaryRedirect(location=f"{base}{request.path_qs}")


async def load(service: BrokerService, name: TopicName, request: web.Request, *, create: bool = False,
               ) -> PersistentTopic:
    """The topic, loaded here (TopicNotFound if it does not exist)."""
    await redirect_unless_owner(service, name, request)
    return await service.get_topic(name, create=create)


async def partition_count(service: BrokerService, name: TopicName) -> int:
    """0 for a non-partitioned topic or a partition; TopicNotFound if the namespace is missing."""
    return await service.partitioned_metadata(name)


async def exists(service: BrokerService, name: TopicName) -> bool:
    """Whether a non-partitioned topic (or partition) has a managed ledger."""
    return await service.topic_exists(name)


async def existing_partitions(service: BrokerService, name: TopicName, count: int, request: web.Request,
                              ) -> list[PersistentTopic]:
    """The partitions of ``name`` that exist, loaded (the others are skipped)."""
    topics = []
    for index in range(count):
        try:
            topics.append(await load(service, name.partition(index), request))
        except TopicNotFound:
            continue
    return topics


@dataclass
class Targets:
    """A subscription operation's partitions: those this broker serves, loaded, and the
    others with the broker serving each (empty unless the partitions are split)."""

    local: list[PersistentTopic]
    remote: list[tuple[TopicName, OwnerInfo]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.local) + len(self.remote)


async def targets(service: BrokerService, name: TopicName, request: web.Request, *, create: bool = False,
                  ) -> Targets:
    """A subscription operation's topics: every partition of a partitioned topic (they
    are created when ``create``; otherwise the ones that exist), or the topic itself.
    Partitions another broker serves send the request there (307) when that broker
    serves them all; split between brokers, this broker's partitions are loaded here and
    the others come back with their owners, for the caller to ask each
    (broker/admin/fanout.py): redirected, the request went from owner to owner for ever."""
    count = await partition_count(service, name)
    if count == 0:
        return Targets([await load(service, name, request, create=create)])
    owners = await fanout.partition_owners(service, name, count)
    if not fanout.split_between_brokers(owners):
        if create:
            return Targets([await load(service, name.partition(i), request, create=True) for i in range(count)])
        return Targets(await existing_partitions(service, name, count, request))
    local: list[PersistentTopic] = []
    remote: list[tuple[TopicName, OwnerInfo]] = []
    for partition, owner in owners:
        if not owner.is_self:
            remote.append((partition, owner))
            continue
        try:
            local.append(await service.get_topic(partition, create=create))
        except TopicNotFound:
            continue
    return Targets(local, remote)


def subscription_of(topic: PersistentTopic, name: str) -> Subscription:
    subscription = topic.subscriptions.get(name)
    if subscription is None:
        raise SubscriptionNotFound(f"subscription {name} does not exist on {topic.full_name}")
    return subscription


def has_clients(topic: PersistentTopic) -> bool:
    return bool(topic.producers) or any(s.consumers for s in topic.subscriptions.values())


async def create_topic(service: BrokerService, name: TopicName, request: web.Request) -> PersistentTopic:
    """Creates a non-partitioned topic (or a partition): 409 if it, or a partitioned
    topic of that name, exists already."""
    await redirect_unless_owner(service, name, request)
    return await service.create_topic(name)


async def delete_topic(service: BrokerService, name: TopicName, request: web.Request, *, force: bool) -> None:
    await redirect_unless_owner(service, name, request)
    await service.delete_topic(name, force=force)
    log.info("topic deleted by admin: topic=%s force=%s", name, force)


async def delete_partitioned(service: BrokerService, name: TopicName, request: web.Request, *, force: bool) -> None:
    """Deletes every partition that exists, wherever it is served, then the partitioned
    metadata, then any partition a reconnecting client re-created meanwhile. Without
    ``force`` nothing is deleted while any partition has clients. A partition that
    fails to go keeps the metadata (the request fails naming what was deleted), so the
    call can be repeated."""
    count = await service.resources.partitions(name)
    if count == 0:
        raise TopicNotFound(f"partitioned topic {name} does not exist")
    owners = await fanout.partition_owners(service, name, count)
    async with fanout.PartitionCalls(service, request) as remote:
        if not force:
            elsewhere = [(partition, owner) for partition, owner in owners if not owner.is_self]
            remote_stats = await fanout.bounded_gather(remote.json(owner, partition, "stats")
                                                       for partition, owner in elsewhere)
            attached = [partition for partition, owner in owners if owner.is_self
                        and (loaded := service.loaded_topic(partition)) is not None and has_clients(loaded)]
            attached += [partition for (partition, _), answer in zip(elsewhere, remote_stats)
                         if _stats_show_clients(answer)]
            if attached:
                raise PreconditionFailed(f"partition {min(attached, key=lambda p: p.partition_index)} has "
                                         "connected producers or consumers")
        await _delete_partitions(service, remote, owners, force=force, what=f"deleting {name}")
        await service.resources.delete_partitioned(name)
        # A client still connected when its partition went reconnects by the partition's
        # name and may have brought it back before the metadata was gone. From now on no
        # partition of it can be created (broker/service.py), so one more pass leaves none.
        await _delete_partitions(service, remote, owners, force=True, what=f"deleting what came back of {name}")
    log.info("partitioned topic deleted by admin: topic=%s partitions=%d", name, count)


async def delete_topics(service: BrokerService, names: list[TopicName], request: web.Request, *, what: str) -> None:
    """Deletes each of ``names`` (forcibly) wherever it is served: this broker's here,
    the others' by their owners (a redirect of the whole request would go from owner to
    owner when the topics are split between brokers)."""
    owners = [(name, await service.owner_of(name)) for name in names]
    async with fanout.PartitionCalls(service, request) as remote:
        await _delete_partitions(service, remote, owners, force=True, what=what)


async def _delete_partitions(service: BrokerService, remote: fanout.PartitionCalls,
                             owners: list[tuple[TopicName, OwnerInfo]], *, force: bool, what: str) -> None:
    async def delete_here(partition: TopicName) -> object:
        return await _delete_here(service, partition, force=force)

    await fanout.apply_to_partitions(remote, owners, what, delete_here, "DELETE",
                                     query={"force": "true"} if force else None)


async def _delete_here(service: BrokerService, partition: TopicName, *, force: bool) -> object:
    try:
        await service.delete_topic(partition, force=force)
    except TopicNotFound:
        return fanout.ABSENT
    log.info("topic deleted by admin: topic=%s force=%s", partition, force)
    return None


def _stats_show_clients(topic_stats: object) -> bool:
    """Whether a partition's stats (from its owner) show producers or consumers."""
    if not isinstance(topic_stats, dict):
        return False
    if topic_stats.get("publishers"):
        return True
    subscriptions = topic_stats.get("subscriptions") or {}
    return any(isinstance(s, dict) and s.get("consumers") for s in subscriptions.values())


async def namespace_topics(service: BrokerService, namespace: NamespaceName) -> list[str]:
    """Non-partitioned topics and partitions of a namespace, as Pulsar lists them. The
    partitions of a partitioned topic are listed whether or not they were used yet,
    because Pulsar creates them with the partitioned topic."""
    names = set(await service.topics_of_namespace(namespace))
    for parent_text in await service.resources.partitioned_topics(namespace):
        parent = TopicName.parse(parent_text)
        count = await service.resources.partitions(parent)
        names.update(str(parent.partition(i)) for i in range(count))
    return sorted(names)
