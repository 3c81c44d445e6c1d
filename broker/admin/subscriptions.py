"""Admin REST for a topic's subscriptions, as Pulsar's paths (``{topic}`` is
``/admin/v2/persistent/{tenant}/{namespace}/{topic}``; on a partitioned topic's name
each operation applies to every partition, as in Pulsar):

    GET    {topic}/subscriptions                                 names of the subscriptions
    PUT    {topic}/subscription/{sub}                            create, durable; optional body a
                                                                 message id {"ledgerId", "entryId"}
                                                                 to start at (default: latest; -1/-1
                                                                 is earliest); 409 if it exists
    DELETE {topic}/subscription/{sub}[?force=true]               delete (412 while consumers are
                                                                 attached, unless force)
    POST   {topic}/subscription/{sub}/skip_all                   acknowledge the whole backlog
    POST   {topic}/subscription/{sub}/skip/{count}               acknowledge the next count unacknowledged entries
    POST   {topic}/subscription/{sub}/resetcursor/{timestamp}    move to the first message published at
                                                                 or after timestamp (ms)
    POST   {topic}/subscription/{sub}/expireMessages/{seconds}   acknowledge what was published more than
                                                                 seconds ago (message expiry, at once)
    POST   {topic}/all_subscription/expireMessages/{seconds}     the same for every durable subscription
    POST   {topic}/subscription/{sub}/resetcursor[?isExcluded=true]
                                                                 move to a message id (body); on a
                                                                 partitioned topic the body names the
                                                                 partition with "partitionIndex"

A cursor reset makes everything before the new position acknowledged and nothing after
it; the subscription's consumers are then disconnected so they drop what they had
buffered and reconnect from the new position. Skips count entries (a batch is one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from broker import policy_enforcement
from broker.admin import fanout, topic_access
from broker.admin.keys import SERVICE
from broker.admin.common import flag, json_body, message_id_of, path_integer, no_content, topic_of
from broker.admin.policy_codec import subscription_name_of
from common.position import Position
from broker.topic import PersistentTopic
from common.topic_name import TopicName
from common.errors import AlreadyExists, InvalidArgument, NotAllowed, PreconditionFailed, SubscriptionNotFound
from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1
# The longest expiry asked for: a century (a larger one expires nothing anyway).
EXPIRY_SECONDS_MAX = 100 * 365 * 24 * 3600
# A skip or a peek walks entries one by one (to step over those acknowledged
# individually); it yields to the event loop this often so a long walk does not stall
# other work.
_SKIP_STEPS_PER_YIELD = 10_000


async def nth_unacknowledged(topic: PersistentTopic, subscription: Subscription, n: int) -> Position | None:
    """The position of the n-th (n >= 1) entry after the subscription's mark-delete
    position that it has not acknowledged (individually acknowledged entries are
    stepped over); None past the last confirmed entry."""
    cursor = subscription.cursor
    ledger = topic.ledger
    position = cursor.mark_delete_position
    found = 0
    steps = 0
    while True:
        position = ledger.next_position(position)
        if position > ledger.last_confirmed:
            return None
        if not cursor.is_acked(position):
            found += 1
            if found == n:
                return position
        steps += 1
        if steps % _SKIP_STEPS_PER_YIELD == 0:
            await asyncio.sleep(0)


async def skip_entries(topic: PersistentTopic, subscription: Subscription, count: int) -> int:
    """Acknowledges the next ``count`` unacknowledged entries after the mark-delete
    position (all of the backlog if it is shorter); returns how many were skipped."""
    cursor = subscription.cursor
    backlog = cursor.backlog_entries(topic.entries_between)
    if count >= backlog:
        cursor.ack_cumulative(topic.ledger.last_confirmed)
        return backlog
    if count == 0:
        return 0
    position = await nth_unacknowledged(topic, subscription, count)
    # None: acknowledgements overtook the walk and fewer than count are left: all of them.
    cursor.ack_cumulative(position if position is not None else topic.ledger.last_confirmed)
    return count


async def expire_older_than(topic: PersistentTopic, subscriptions: list[Subscription], seconds: int) -> int:
    """Acknowledges, for each durable subscription of ``subscriptions``, every message
    published more than ``seconds`` ago (Pulsar's expire-messages; the namespace's
    message TTL does the same on a timer); returns the entries this acknowledged."""
    return await policy_enforcement.expire_before(topic, int(time.time() * 1000) - seconds * 1000, subscriptions)


def reset(subscription: Subscription, position: Position) -> None:
    # Disconnect, then reset, with no await between (as a SEEK does): nothing from
    # before the reset is dispatched in between, the consumers drop what they had
    # buffered, and what they held is not kept for replay past the reset.
    subscription.disconnect_consumers()
    subscription.reset_cursor(position)


TOPIC_PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
SUBSCRIPTION_PATH = f"{TOPIC_PATH}/subscription/{{subscription}}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


def named(request: web.Request) -> tuple[TopicName, str]:
    return topic_of(request), subscription_name_of(request.match_info["subscription"])


async def each_partition(request: web.Request, what: str, local: Callable[[PersistentTopic, Subscription], Awaitable[object]],
                         method: str, suffix: str, *, query: dict[str, str] | None = None) -> None:
    """Applies one change to the subscription the request names on every partition
    that has it: this broker's through ``local``, the others' by ``method`` on
    ``suffix`` (under the subscription's path) at their owners; 404 if no partition
    has it, the first failure (naming what was applied) if any partition failed."""
    service = request.app[SERVICE]
    name, subscription = named(request)
    targets = await topic_access.targets(service, name, request)
    outcomes = fanout.Outcomes(f"{what} of subscription {subscription} on {name}")
    path = f"subscription/{quote(subscription, safe='')}" + (f"/{suffix}" if suffix else "")
    async with fanout.PartitionCalls(service, request) as remote:
        await fanout.bounded_gather(
            [outcomes.run(topic.name, local(topic, topic.subscriptions[subscription]))
             for topic in targets.local if subscription in topic.subscriptions]
            + [outcomes.run(partition, remote.call(method, owner, partition, path, query=query))
               for partition, owner in targets.remote])
    outcomes.raise_failure()
    if not outcomes.applied:
        raise SubscriptionNotFound(f"subscription {subscription} does not exist on {name}")


@routes.get(f"{TOPIC_PATH}/subscriptions")
async def list_subscriptions(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    targets = await topic_access.targets(service, topic_of(request), request)
    names = {name for t in targets.local for name in t.subscriptions}
    async with fanout.PartitionCalls(service, request) as remote:
        answers = await fanout.bounded_gather(remote.json(owner, partition, "subscriptions")
                                              for partition, owner in targets.remote)
    for answer in answers:
        if isinstance(answer, list):
            names.update(str(n) for n in answer)
    return web.json_response(sorted(names))


@routes.put(SUBSCRIPTION_PATH)
async def create_subscription(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name, subscription = named(request)
    body = await json_body(request, required=False)
    kind, position = message_id_of(body) if body is not None else ("latest", None)
    targets = await topic_access.targets(service, name, request, create=True)
    if kind == "position" and targets.count > 1:
        raise NotAllowed("a partitioned topic's subscription starts at earliest or latest, not a message id")
    async with fanout.PartitionCalls(service, request) as remote:
        # Checked everywhere first, so an existing subscription changes nothing.
        for topic in targets.local:
            if subscription in topic.subscriptions:
                raise AlreadyExists(f"subscription {subscription} already exists on {topic.full_name}")
        remote_names = await fanout.bounded_gather(remote.json(owner, partition, "subscriptions")
                                                   for partition, owner in targets.remote)
        for (partition, _), names in zip(targets.remote, remote_names):
            if isinstance(names, list) and subscription in names:
                raise AlreadyExists(f"subscription {subscription} already exists on {partition}")
        outcomes = fanout.Outcomes(f"creating subscription {subscription} on {name}")
        path = f"subscription/{quote(subscription, safe='')}"
        await fanout.bounded_gather(
            [outcomes.run(topic.name, topic.create_subscription(
                subscription, topic.ledger.first_position if kind == "earliest" else position))
             for topic in targets.local]
            + [outcomes.run(partition, remote.call("PUT", owner, partition, path, body=body))
               for partition, owner in targets.remote])
    outcomes.raise_failure()
    log.info("subscription created by admin: topic=%s subscription=%s start=%s partitions_elsewhere=%d",
             name, subscription, position if position is not None else kind, len(targets.remote))
    return no_content()


@routes.delete(SUBSCRIPTION_PATH)
async def delete_subscription(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    force = flag(request, "force")
    name, subscription = named(request)
    if not force:
        # Refused before anything is deleted while any partition has consumers on it.
        targets = await topic_access.targets(service, name, request)
        for topic in targets.local:
            attached = topic.subscriptions.get(subscription)
            if attached is not None and attached.consumers:
                raise PreconditionFailed(f"subscription {subscription} on {topic.full_name} has "
                                         f"{len(attached.consumers)} consumers attached")
        async with fanout.PartitionCalls(service, request) as remote:
            remote_stats = await fanout.bounded_gather(remote.json(owner, partition, "stats")
                                                       for partition, owner in targets.remote)
        for (partition, _), partition_stats in zip(targets.remote, remote_stats):
            consumers = _consumers_of(partition_stats, subscription)
            if consumers:
                raise PreconditionFailed(f"subscription {subscription} on {partition} has "
                                         f"{consumers} consumers attached")

    async def delete_here(topic: PersistentTopic, attached: Subscription) -> None:
        disconnected = attached.disconnect_consumers() if force else 0
        await topic.unsubscribe(attached.name, None)
        log.info("subscription deleted by admin: topic=%s subscription=%s consumers_disconnected=%d",
                 topic.full_name, attached.name, disconnected)

    await each_partition(request, "deletion", delete_here, "DELETE", "",
                         query={"force": "true"} if force else None)
    return no_content()


@routes.post(f"{SUBSCRIPTION_PATH}/skip_all")
async def skip_all(request: web.Request) -> web.Response:
    async def skip_here(topic: PersistentTopic, subscription: Subscription) -> None:
        skipped = await skip_entries(topic, subscription, INT64_MAX)
        log.info("subscription backlog cleared: topic=%s subscription=%s entries=%d", topic.full_name,
                 subscription.name, skipped)

    await each_partition(request, "clearing the backlog", skip_here, "POST", "skip_all")
    return no_content()


@routes.post(f"{SUBSCRIPTION_PATH}/skip/{{count}}")
async def skip(request: web.Request) -> web.Response:
    count = path_integer(request, "count", minimum=0, maximum=INT64_MAX)

    async def skip_here(topic: PersistentTopic, subscription: Subscription) -> None:
        skipped = await skip_entries(topic, subscription, count)
        log.info("subscription entries skipped: topic=%s subscription=%s entries=%d", topic.full_name,
                 subscription.name, skipped)

    await each_partition(request, f"skipping {count} entries", skip_here, "POST", f"skip/{count}")
    return no_content()


@routes.post(f"{SUBSCRIPTION_PATH}/resetcursor/{{timestamp}}")
async def reset_by_time(request: web.Request) -> web.Response:
    timestamp_ms = path_integer(request, "timestamp", minimum=0, maximum=INT64_MAX)

    async def reset_here(topic: PersistentTopic, subscription: Subscription) -> None:
        position = await topic.find_position_by_time(timestamp_ms)
        reset(subscription, position)
        log.info("subscription reset by time: topic=%s subscription=%s timestamp_ms=%d position=%s",
                 topic.full_name, subscription.name, timestamp_ms, position)

    await each_partition(request, f"resetting to {timestamp_ms} ms", reset_here, "POST",
                         f"resetcursor/{timestamp_ms}")
    return no_content()


@routes.post(f"{SUBSCRIPTION_PATH}/resetcursor")
async def reset_by_message_id(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name, subscription_name = named(request)
    body = await json_body(request, required=True)
    kind, position = message_id_of(body)
    excluded = flag(request, "isExcluded")
    count = await topic_access.partition_count(service, name)
    if count > 0:
        index = body.get("partitionIndex", -1) if isinstance(body, dict) else -1
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise InvalidArgument(f"resetting {name} by message id needs a partitionIndex in [0, {count})")
        name = name.partition(index)
    topic = await topic_access.load(service, name, request)
    subscription = topic_access.subscription_of(topic, subscription_name)
    ledger = topic.ledger
    if kind == "earliest":
        target = ledger.first_position
    elif kind == "latest":
        target = ledger.end_position
    else:
        assert position is not None
        target = ledger.next_position(position) if excluded else ledger.normalize(position)
    reset(subscription, target)
    log.info("subscription reset by message id: topic=%s subscription=%s position=%s", topic.full_name,
             subscription_name, target)
    return no_content()


@routes.post(f"{SUBSCRIPTION_PATH}/expireMessages/{{seconds}}")
async def expire_messages(request: web.Request) -> web.Response:
    seconds = path_integer(request, "seconds", minimum=0, maximum=EXPIRY_SECONDS_MAX)

    async def expire_here(topic: PersistentTopic, subscription: Subscription) -> None:
        expired = await expire_older_than(topic, [subscription], seconds)
        log.info("subscription messages expired by admin: topic=%s subscription=%s older_than_s=%d entries=%d",
                 topic.full_name, subscription.name, seconds, expired)

    await each_partition(request, f"expiring messages older than {seconds} s", expire_here, "POST",
                         f"expireMessages/{seconds}")
    return no_content()


@routes.post(f"{TOPIC_PATH}/all_subscription/expireMessages/{{seconds}}")
async def expire_all_subscriptions(request: web.Request) -> web.Response:
    """Every durable subscription of the topic (each partition's, wherever it is
    served) acknowledges what was published more than ``seconds`` ago."""
    service = request.app[SERVICE]
    seconds = path_integer(request, "seconds", minimum=0, maximum=EXPIRY_SECONDS_MAX)
    name = topic_of(request)
    targets = await topic_access.targets(service, name, request)
    outcomes = fanout.Outcomes(f"expiring messages older than {seconds} s on {name}")

    async def expire_here(topic: PersistentTopic) -> None:
        expired = await expire_older_than(topic, list(topic.subscriptions.values()), seconds)
        log.info("messages expired by admin: topic=%s older_than_s=%d entries=%d", topic.full_name, seconds,
                 expired)

    async with fanout.PartitionCalls(service, request) as remote:
        await fanout.bounded_gather(
            [outcomes.run(topic.name, expire_here(topic)) for topic in targets.local]
            + [outcomes.run(partition, remote.call("POST", owner, partition,
                                                   f"all_subscription/expireMessages/{seconds}"))
               for partition, owner in targets.remote])
    outcomes.raise_failure()
    return no_content()


def _consumers_of(topic_stats: object, subscription: str) -> int:
    """How many consumers a partition's stats (from its owner) show on ``subscription``."""
    if not isinstance(topic_stats, dict):
        return 0
    entry = (topic_stats.get("subscriptions") or {}).get(subscription)
    consumers = entry.get("consumers") if isinstance(entry, dict) else None
    return len(consumers) if isinstance(consumers, list) else 0
