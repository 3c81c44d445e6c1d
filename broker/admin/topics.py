"""Admin REST for persistent topics, as Pulsar's ``/admin/v2/persistent`` paths
(``{ns}`` is ``{tenant}/{namespace}``; ``{topic}`` is the URL-encoded local name, with
or without a ``-partition-N`` suffix):

    GET    /admin/v2/persistent/{ns}                     non-partitioned topics and partitions
    GET    /admin/v2/persistent/{ns}/partitioned         partitioned topics
    PUT    /admin/v2/persistent/{ns}/{topic}             create a non-partitioned topic (409 if it exists)
    DELETE /admin/v2/persistent/{ns}/{topic}[?force=true]
                                                         delete it (412 while clients are attached,
                                                         unless force, which disconnects them)
    PUT    /admin/v2/persistent/{ns}/{topic}/partitions  body N: create a partitioned topic
    POST   /admin/v2/persistent/{ns}/{topic}/partitions  body N: grow it to N partitions
    GET    /admin/v2/persistent/{ns}/{topic}/partitions  {"partitions": N} (0: not partitioned)
    DELETE /admin/v2/persistent/{ns}/{topic}/partitions[?force=true]
                                                         delete it and its partitions
    GET    .../{topic}/stats                             TopicStats
    GET    .../{topic}/partitioned-stats[?perPartition=false]
                                                         PartitionedTopicStats (summed)
    GET    .../{topic}/internalStats                     the managed ledger and its cursors
    GET    .../{topic}/partitioned-internalStats         each partition's internal stats
    GET    .../{topic}/lastMessageId                     {"ledgerId", "entryId", "partitionIndex"[, "batchIndex"]}
    PUT    .../{topic}/unload                            close it here; clients reconnect (a
                                                         partitioned name: every partition)
    POST   .../{topic}/terminate                         no more messages; answers the last message id
    POST   .../{topic}/terminate/partitions              the same for every partition: {"index": message id}
    PUT    .../{topic}/compaction                        start compacting (412 while one runs; a
                                                         partitioned name: every partition)
    GET    .../{topic}/compaction                        {"status": NOT_RUN|RUNNING|SUCCESS|ERROR, "lastError"}

A request for a topic another broker serves is redirected there (307). Operations on a
partitioned topic's name apply to its partitions where Pulsar does so, also when other
brokers serve some of them (broker/admin/fanout.py).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from aiohttp import web

from broker import stats
from broker.admin import fanout, topic_access
from broker.admin.keys import SERVICE, TOPIC_RATES
from broker.admin.common import flag, integer, json_body, namespace_of, no_content, topic_of
from broker.topic import PersistentTopic
from common.topic_name import TopicName
from common.errors import AlreadyExists, NotAllowed, PreconditionFailed, TopicNotFound

log = logging.getLogger(__name__)

# Partitions a partitioned topic may have. Pulsar leaves this unlimited by default
# (maxNumPartitionsPerPartitionedTopic=0); this bound keeps partitioned-stats and
# deletion, which visit every partition, to a size one request can handle.
PARTITIONS_MAX = 4096


BASE = "/admin/v2/persistent/{tenant}/{namespace}"
TOPIC_PATH = f"{BASE}/{{topic}}"

# Module-level handlers, registered in this order (fixed paths before the patterns that
# would also match them); each finds the broker in ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get(BASE)
async def list_topics(request: web.Request) -> web.Response:
    return web.json_response(await topic_access.namespace_topics(request.app[SERVICE], namespace_of(request)))


@routes.get(f"{BASE}/partitioned")
async def list_partitioned(request: web.Request) -> web.Response:
    resources = request.app[SERVICE].resources
    namespace = namespace_of(request)
    await resources.policies(namespace)
    return web.json_response(sorted(await resources.partitioned_topics(namespace)))


@routes.put(TOPIC_PATH)
async def create_topic(request: web.Request) -> web.Response:
    name = topic_of(request)
    await json_body(request, required=False)   # Pulsar's optional topic properties: not kept
    await topic_access.create_topic(request.app[SERVICE], name, request)
    return no_content()


@routes.delete(TOPIC_PATH)
async def delete_topic(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await service.resources.partitions(name) > 0:
        raise PreconditionFailed(f"{name} is a partitioned topic: delete it through its /partitions path")
    await topic_access.delete_topic(service, name, request, force=flag(request, "force"))
    return no_content()


# --- partitioned topics ---------------------------------------------------------------

async def partitions_body(request: web.Request) -> int:
    return integer(await json_body(request, required=True), "number of partitions",
                   minimum=1, maximum=PARTITIONS_MAX)


@routes.put(f"{TOPIC_PATH}/partitions")
async def create_partitioned(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    if name.is_partition:
        raise PreconditionFailed(f"a partitioned topic's name may not end in -partition-N: {name}")
    count = await partitions_body(request)
    await service.resources.policies(name.namespace_name)
    if await topic_access.exists(service, name):
        raise AlreadyExists(f"a non-partitioned topic {name} exists")
    await service.resources.create_partitioned(name, count)
    log.info("partitioned topic created: topic=%s partitions=%d", name, count)
    return no_content()


@routes.post(f"{TOPIC_PATH}/partitions")
async def update_partitioned(request: web.Request) -> web.Response:
    name = topic_of(request)
    count = await partitions_body(request)
    await request.app[SERVICE].resources.update_partitions(name, count)
    log.info("partitioned topic grown: topic=%s partitions=%d", name, count)
    return no_content()


@routes.get(f"{TOPIC_PATH}/partitions")
async def get_partitions(request: web.Request) -> web.Response:
    return web.json_response({"partitions": await topic_access.partition_count(request.app[SERVICE],
                                                                               topic_of(request))})


@routes.delete(f"{TOPIC_PATH}/partitions")
async def delete_partitioned(request: web.Request) -> web.Response:
    await topic_access.delete_partitioned(request.app[SERVICE], topic_of(request), request,
                                          force=flag(request, "force"))
    return no_content()


# --- stats ----------------------------------------------------------------------------

async def non_partitioned(request: web.Request) -> PersistentTopic:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name) > 0:
        raise TopicNotFound(f"{name} is a partitioned topic: ask for one of its partitions, or its "
                            f"partitioned-stats")
    return await topic_access.load(service, name, request)


async def partitions_stats(request: web.Request, suffix: str, local: Callable[[PersistentTopic], dict]
                           ) -> tuple[int, dict[str, dict]]:
    """(partition count, each existing partition's ``suffix`` stats by name): this
    broker's partitions from here, the others' from the brokers serving them."""
    service = request.app[SERVICE]
    name = topic_of(request)
    count = await topic_access.partition_count(service, name)
    if count == 0:
        raise TopicNotFound(f"partitioned topic {name} does not exist")
    owners = await fanout.partition_owners(service, name, count)
    found: dict[TopicName, dict] = {}
    for partition, owner in owners:
        if owner.is_self:
            try:
                found[partition] = local(await service.get_topic(partition, create=False))
            except TopicNotFound:
                continue
    elsewhere = [(partition, owner) for partition, owner in owners if not owner.is_self]
    async with fanout.PartitionCalls(service, request) as remote:
        answers = await fanout.bounded_gather(remote.json(owner, partition, suffix) for partition, owner in elsewhere)
    found.update((partition, answer) for (partition, _), answer in zip(elsewhere, answers) if answer is not None)
    return count, {str(partition): found[partition] for partition, _ in owners if partition in found}


@routes.get(f"{TOPIC_PATH}/stats")
async def topic_stats(request: web.Request) -> web.Response:
    topic = await non_partitioned(request)
    return web.json_response(stats.topic_stats(topic, request.app[TOPIC_RATES], time.monotonic()))


@routes.get(f"{TOPIC_PATH}/partitioned-stats")
async def partitioned_stats(request: web.Request) -> web.Response:
    per_partition = flag(request, "perPartition", default=True)
    meter, now = request.app[TOPIC_RATES], time.monotonic()
    count, by_partition = await partitions_stats(request, "stats", lambda t: stats.topic_stats(t, meter, now))
    return web.json_response(stats.partitioned_stats(by_partition, count, per_partition=per_partition))


@routes.get(f"{TOPIC_PATH}/internalStats")
async def internal_stats(request: web.Request) -> web.Response:
    return web.json_response(stats.internal_stats(await non_partitioned(request)))


@routes.get(f"{TOPIC_PATH}/partitioned-internalStats")
async def partitioned_internal_stats(request: web.Request) -> web.Response:
    count, by_partition = await partitions_stats(request, "internalStats", stats.internal_stats)
    return web.json_response(stats.partitioned_internal_stats(by_partition, count))


@routes.get(f"{TOPIC_PATH}/lastMessageId")
async def last_message_id(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name) > 0:
        raise NotAllowed(f"{name} is a partitioned topic: ask one of its partitions for its last message id")
    topic = await topic_access.load(service, name, request)
    position, batch_index = await topic.last_message_id()
    return web.json_response(stats.message_id_json(position, name.partition_index, batch_index))


# --- lifecycle -------------------------------------------------------------------------

@routes.put(f"{TOPIC_PATH}/unload")
async def unload(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    count = await topic_access.partition_count(service, name)
    if count > 0:
        async with fanout.PartitionCalls(service, request) as remote:
            answers = await fanout.apply_to_partitions(remote, await fanout.partition_owners(service, name, count),
                                                       f"unloading {name}", service.unload_topic, "PUT", "unload")
        log.info("partitioned topic unloaded: topic=%s partitions=%d answered=%d", name, count, len(answers))
        return no_content()
    await topic_access.redirect_unless_owner(service, name, request)
    if not await topic_access.exists(service, name):
        raise TopicNotFound(f"topic {name} does not exist")
    unloaded = await service.unload_topic(name)
    log.info("topic unloaded by admin: topic=%s was_loaded=%s", name, unloaded)
    return no_content()


@routes.post(f"{TOPIC_PATH}/terminate")
async def terminate(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name) > 0:
        raise NotAllowed(f"{name} is a partitioned topic: terminate it through its /terminate/partitions path")
    topic = await topic_access.load(service, name, request)
    last = await topic.terminate()
    log.info("topic terminated by admin: topic=%s last=%s", name, last)
    return web.json_response(stats.message_id_json(last, name.partition_index))


@routes.post(f"{TOPIC_PATH}/terminate/partitions")
async def terminate_partitions(request: web.Request) -> web.Response:
    """Terminates every partition that exists, wherever it is served; answers each
    one's last message id by partition index (Pulsar's ``terminate/partitions``)."""
    service = request.app[SERVICE]
    name = topic_of(request)
    count = await topic_access.partition_count(service, name)
    if count == 0:
        raise NotAllowed(f"{name} is not a partitioned topic: terminate it through its /terminate path")

    async def terminate_here(partition) -> object:
        try:
            topic = await service.get_topic(partition, create=False)
        except TopicNotFound:
            return fanout.ABSENT
        return stats.message_id_json(await topic.terminate(), partition.partition_index)

    async with fanout.PartitionCalls(service, request) as remote:
        answers = await fanout.apply_to_partitions(remote, await fanout.partition_owners(service, name, count),
                                                   f"terminating {name}", terminate_here, "POST", "terminate")
    last_ids = {str(partition.partition_index): answer for partition, answer in answers.items()}
    log.info("partitioned topic terminated by admin: topic=%s partitions=%d terminated=%d", name, count,
             len(last_ids))
    return web.json_response(last_ids)


@routes.put(f"{TOPIC_PATH}/compaction")
async def trigger_compaction(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    count = await topic_access.partition_count(service, name)
    if count > 0:
        # Every partition that exists, wherever it is served (as Pulsar does); one
        # already compacting fails the request after the others were started.
        async def compact_here(partition) -> object:
            try:
                topic = await service.get_topic(partition, create=False)
            except TopicNotFound:
                return fanout.ABSENT
            topic.trigger_compaction()
            return None

        async with fanout.PartitionCalls(service, request) as remote:
            answers = await fanout.apply_to_partitions(remote, await fanout.partition_owners(service, name, count),
                                                       f"compacting {name}", compact_here, "PUT", "compaction")
        log.info("compaction triggered by admin: topic=%s partitions=%d started=%d", name, count, len(answers))
        return no_content()
    topic = await topic_access.load(service, name, request)
    topic.trigger_compaction()
    log.info("compaction triggered by admin: topic=%s", name)
    return no_content()


@routes.get(f"{TOPIC_PATH}/compaction")
async def compaction_status(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name) > 0:
        raise NotAllowed(f"{name} is a partitioned topic: ask one of its partitions")
    topic = await topic_access.load(service, name, request)
    return web.json_response({"status": topic.compaction.status, "lastError": topic.compaction.last_error})
