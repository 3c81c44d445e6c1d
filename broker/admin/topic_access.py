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

from aiohttp import web

from broker.admin import fanout
from broker.service import BrokerService
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
        raise web.HTTPTemporaryRedirect(location=f"{owner.web_service_url}{request.path_qs}")


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


async def targets(service: BrokerService, name: TopicName, request: web.Request, *, create: bool = False,
                  ) -> list[PersistentTopic]:
    """A subscription operation's topics: every partition of a partitioned topic (they
    are created when ``create``), or the topic itself. Partitions served by another
    broker send the request there (307) when one broker serves them all; split between
    brokers, the request is refused with the partitions' owners (PreconditionFailed):
    redirected, it went from owner to owner for ever (broker/admin/fanout.py), and the
    changes are not fanned out to other brokers yet, so each partition's own path
    (which its owner serves) is the way."""
    count = await partition_count(service, name)
    if count == 0:
        return [await load(service, name, request, create=create)]
    owners = await fanout.partition_owners(service, name, count)
    if fanout.split_between_brokers(owners):
        served: dict[str, list[int]] = {}
        for partition, owner in owners:
            served.setdefault(owner.web_service_url or owner.broker_id, []).append(partition.partition_index)
        raise PreconditionFailed(f"the partitions of {name} are served by several brokers "
                                 f"({'; '.join(f'{url}: {indexes}' for url, indexes in sorted(served.items()))}): "
                                 "send this request for each partition")
    if create:
        return [await load(service, name.partition(i), request, create=True) for i in range(count)]
    return await existing_partitions(service, name, count, request)


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
    """Deletes every partition that exists, then the partitioned metadata, then any
    partition a reconnecting client re-created meanwhile. Without ``force`` nothing is
    deleted while any partition has clients."""
    count = await service.resources.partitions(name)
    if count == 0:
        raise TopicNotFound(f"partitioned topic {name} does not exist")
    if not force:
        for index in range(count):
            partition = service.loaded_topic(name.partition(index))
            if partition is not None and has_clients(partition):
                raise PreconditionFailed(f"partition {partition.full_name} has connected producers or consumers")
    for index in range(count):
        try:
            await delete_topic(service, name.partition(index), request, force=force)
        except TopicNotFound:
            continue
    await service.resources.delete_partitioned(name)
    # A client still connected when its partition went reconnects by the partition's
    # name and may have brought it back before the metadata was gone. From now on no
    # partition of it can be created (broker/service.py), so one more pass leaves none.
    for index in range(count):
        try:
            await delete_topic(service, name.partition(index), request, force=True)
        except TopicNotFound:
            continue
    log.info("partitioned topic deleted by admin: topic=%s partitions=%d", name, count)


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
