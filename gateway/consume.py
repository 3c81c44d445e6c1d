"""Consuming over HTTP: subscriptions (create, delete), long-polling pulls, and
ack / nack / extend by receipt handle (gateway/settle.py does those).

A pull answers as soon as it has ``max_messages``, or has something and the current
dispatch round is over, or ``wait_ms`` passed (then maybe with none). Its messages'
leases start when the response has been written; if writing fails (the client went
away), they are handed to the next pull as if never sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import quote

from aiohttp import web

from client.consumer import Consumer
from common.errors import ConsumerBusy, InvalidArgument, NotAllowed, SubscriptionNotFound, TooManyRequests
from gateway import json_codec, settle
from gateway.consumers import BROADCAST_PROPERTY, GATHER_S, SHORT_POLL_S, SUB_TYPES, GatewayConsumer, Waiter
from gateway.http_common import dumps, json_body, ok, subscription_of, topic_of
from gateway.keys import SERVICE
from gateway.leases import Slot
from gateway.service import GatewayService, now_unix_ms
from gateway.stats import MEMBER_SEPARATOR, admin_request

log = logging.getLogger(__name__)



# --- subscriptions -----------------------------------------------------------------------------

async def create_subscription(request: web.Request) -> web.Response:
    """Creates the subscription's cursor at the initial position (a broadcast member's
    own cursor, for broadcast), through the broker protocol: subscribe, then detach.
    Creating one that exists changes nothing."""
    service = request.app[SERVICE]
    topic = topic_of(request)
    subscription = subscription_of(request)
    spec = json_codec.parse_subscription(await json_body(request, required=False))
    name = service.consumer_name(spec.mode, spec.member, spec.consumer)
    properties = {BROADCAST_PROPERTY: "broadcast"} if spec.mode == "broadcast" else {}
    for partition in await service.partition_topics(topic):
        consumer = Consumer(service.broker_pool, partition, subscription, sub_type=SUB_TYPES[spec.mode],
                            consumer_name=name or f"{service.instance_name}-create",
                            initial_position=spec.initial_position, properties=properties)
        try:
            await consumer.start()
        except ConsumerBusy:
            continue   # exclusive and in use: it exists
        except NotAllowed as error:
            raise NotAllowed(f"subscription {subscription} exists in another mode and has consumers: "
                             f"{error.message}") from None
        await consumer.close()
    document = {"topic": topic, "subscription": subscription, "mode": spec.mode,
                "initial_position": spec.initial_position}
    if spec.member is not None:
        document["member"] = spec.member
    return ok(document)


async def delete_subscription(request: web.Request) -> web.Response:
    """Deletes the subscription's cursor (a member's, with ``?member=``) through the
    broker's admin API, after closing this gateway's own consumers of it."""
    service = request.app[SERVICE]
    topic = topic_of(request)
    subscription = subscription_of(request)
    member = request.query.get("member")
    if member is not None:
        if not member or len(member) > json_codec.NAME_CHARS_MAX:
            raise InvalidArgument(f"member must be 1-{json_codec.NAME_CHARS_MAX} characters")
        json_codec.check_consumer_name(member, "query.member")
    cursor = f"{subscription}{MEMBER_SEPARATOR}{member}" if member else subscription
    await service.consumers.close_subscription(subscription, member)
    status, document = await admin_request(service, "DELETE", topic, f"/subscription/{_quote(cursor)}")
    if status == 404:
        raise SubscriptionNotFound(f"subscription {cursor} does not exist on {topic}")
    return ok({"topic": topic, "subscription": subscription, "deleted": True, **({"member": member} if member else {})})


def _quote(text: str) -> str:
    return quote(text, safe="")


# --- pulls ------------------------------------------------------------------------------------------

async def wait_for_messages(consumers: list[GatewayConsumer], want: int, wait_s: float, ordered: bool = False
                            ) -> list[tuple[GatewayConsumer, Slot]]:
    """Registers a waiter on every consumer and returns what it collected: up to
    ``want`` messages, once full, or once something came and the round is over, or when
    ``wait_s`` passed. TooManyRequests when the leases are at their limit."""
    waiter = Waiter(want, consumers, ordered=ordered)
    deadline = time.monotonic() + max(wait_s, SHORT_POLL_S)
    gather_deadline = None
    try:
        for consumer in consumers:
            consumer.register(waiter)
        if not waiter.taken and all(consumer.table.room <= 0 for consumer in consumers):
            raise TooManyRequests(f"{consumers[0].table.leases_max} messages of this subscription are leased "
                                  "through this gateway already; ack or nack some first")
        while waiter.remaining > 0 and waiter.failure is None:
            now = time.monotonic()
            if waiter.taken and gather_deadline is None:
                gather_deadline = now + GATHER_S
            limit = deadline if gather_deadline is None else min(deadline, gather_deadline)
            if now >= limit:
                break
            waiter.wake.clear()
            try:
                async with asyncio.timeout(limit - now):
                    await waiter.wake.wait()
            except TimeoutError:
                break
    except BaseException:
        _give_back(waiter.taken)
        raise
    finally:
        for consumer in consumers:
            consumer.unregister(waiter)
    if waiter.failure is not None and not waiter.taken:
        raise waiter.failure
    return waiter.taken


def _give_back(taken: list[tuple[GatewayConsumer, Slot]]) -> None:
    by_consumer: dict[GatewayConsumer, list[Slot]] = {}
    for consumer, slot in taken:
        by_consumer.setdefault(consumer, []).append(slot)
    for consumer, slots in by_consumer.items():
        consumer.unwritten(slots)


def _start_leases(taken: list[tuple[GatewayConsumer, Slot]], lease_s: float) -> None:
    by_consumer: dict[GatewayConsumer, list[Slot]] = {}
    for consumer, slot in taken:
        by_consumer.setdefault(consumer, []).append(slot)
    for consumer, slots in by_consumer.items():
        consumer.written(slots, lease_s)


def render(service: GatewayService, taken: list[tuple[GatewayConsumer, Slot]], encoding: str,
           lease_ms: int) -> list[dict]:
    """The messages as the API shows them, each with a receipt whose deadline is where
    the lease ends at the earliest (it starts when the response is written, later)."""
    deadline_ms = now_unix_ms() + lease_ms
    return [json_codec.render_message(slot.message, encoding, attempt=slot.attempt, lease_deadline_ms=deadline_ms,
                                      receipt=service.receipt(consumer, slot.message.message_id, slot.attempt,
                                                              deadline_ms))
            for consumer, slot in taken]


async def pull(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    config = service.config
    topic = topic_of(request)
    subscription = subscription_of(request)
    spec = json_codec.parse_pull(await json_body(request, required=False), messages_max=config.pull_messages_max,
                                 wait_ms_max=config.wait_ms_max, lease_ms_min=config.lease_ms_min,
                                 lease_ms_max=config.lease_ms_max, lease_ms_default=config.lease_ms_default)
    consumers = await service.pull_consumers(topic, subscription, spec)
    taken = await wait_for_messages(consumers, spec.max_messages, spec.wait_ms / 1000, spec.ordered)
    try:
        body = dumps({"messages": render(service, taken, spec.encoding, spec.lease_ms)})
        response = web.Response(body=body, content_type="application/json")
        await response.prepare(request)
        await response.write_eof()
    except BaseException:
        _give_back(taken)
        raise
    # Written: the leases start now (the receipts promise no earlier end).
    _start_leases(taken, spec.lease_ms / 1000)
    service.messages_pulled += len(taken)
    service.subscription_counts.add(topic, subscription, "pulled", len(taken))
    return response


# --- ack, nack, extend ---------------------------------------------------------------------------

def _forwarded(request: web.Request) -> bool:
    return request.headers.get(settle.FORWARDED_HEADER) in ("1", settle.HINT)


async def ack(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    topic, subscription = topic_of(request), subscription_of(request)
    handles, _ = json_codec.parse_receipts(await json_body(request))
    results = await settle.ack(service, topic, subscription, handles, path=request.raw_path,
                               forwarded=_forwarded(request),
                               hint=request.headers.get(settle.FORWARDED_HEADER) == settle.HINT)
    return ok({"results": results})


async def nack(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    topic, subscription = topic_of(request), subscription_of(request)
    handles, delay_ms = json_codec.parse_nack(await json_body(request))
    results = await settle.nack(service, topic, subscription, handles, delay_ms, path=request.raw_path,
                                forwarded=_forwarded(request))
    return ok({"results": results})


async def extend(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    config = service.config
    topic, subscription = topic_of(request), subscription_of(request)
    handles, lease_ms = json_codec.parse_extend(await json_body(request), lease_ms_min=config.lease_ms_min,
                                                lease_ms_max=config.lease_ms_max,
                                                lease_ms_default=config.lease_ms_default)
    results = await settle.extend(service, topic, subscription, handles, lease_ms, path=request.raw_path,
                                  forwarded=_forwarded(request))
    return ok({"results": results})


async def reject(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    topic, subscription = topic_of(request), subscription_of(request)
    handles, dead_letter_topic = json_codec.parse_reject(await json_body(request))
    results = await settle.reject(service, topic, subscription, handles, dead_letter_topic, path=request.raw_path,
                                  forwarded=_forwarded(request))
    return ok({"results": results})
