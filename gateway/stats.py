"""Admin passthroughs users expect from an HTTP surface: a topic's stats and a
subscription's backlog, read from the broker's admin API (Pulsar's
``/admin/v2/persistent/...`` paths; a broker that does not own the topic redirects to
the one that does, and the redirect is followed)."""

from __future__ import annotations

import logging

from aiohttp import web

from common.errors import InvalidArgument, SubscriptionNotFound, TopicNotFound
from common.topic_name import TopicName
from gateway.admin_client import admin_call
from gateway.http_common import ok, subscription_of, topic_of
from gateway.keys import SERVICE
from gateway.service import GatewayService

log = logging.getLogger(__name__)

MEMBER_SEPARATOR = "::member::"


async def admin_request(service: GatewayService, method: str, topic: str, suffix: str) -> tuple[int, object]:
    """``method`` on the broker's admin path of ``topic`` + ``suffix``; (status, JSON or
    None). Errors the broker reports come back as their catalogue classes."""
    assert service.http is not None
    return await admin_call(service.http, service.config.admin_url, method,
                            f"/admin/v2/{TopicName.parse(topic).rest_path}{suffix}")


async def _stats(service: GatewayService, topic: str) -> dict:
    partitions = await service.producers.partitions(topic)
    status, document = await admin_request(service, "GET", topic,
                                           "/partitioned-stats" if partitions > 0 else "/stats")
    if status == 404 or not isinstance(document, dict):
        raise TopicNotFound(f"topic {topic} does not exist")
    return document


async def topic_stats(request: web.Request) -> web.Response:
    """The broker's stats of the topic (partitioned: summed over partitions), as the
    broker reports them (Pulsar's field names)."""
    service = request.app[SERVICE]
    return ok(await _stats(service, topic_of(request)))


async def backlog(request: web.Request) -> web.Response:
    """How many messages the subscription (or a broadcast member's cursor, with
    ``?member=``) has not acknowledged, and how many are out with consumers."""
    service = request.app[SERVICE]
    topic = topic_of(request)
    subscription = subscription_of(request)
    member = request.query.get("member")
    if member is not None and (not member or "::" in member or len(member) > 256):
        raise InvalidArgument("member must be a non-empty name without '::'")
    cursor = f"{subscription}{MEMBER_SEPARATOR}{member}" if member else subscription
    stats = await _stats(service, topic)
    subscriptions = stats.get("subscriptions") if isinstance(stats.get("subscriptions"), dict) else {}
    found = subscriptions.get(cursor)
    if not isinstance(found, dict):
        raise SubscriptionNotFound(f"subscription {cursor} does not exist on {topic}")
    document = {"topic": topic, "subscription": subscription,
                "backlog": int(found.get("msgBacklog", 0)),
                "unacked": int(found.get("unackedMessages", 0)),
                "consumers": len(found.get("consumers", []) or [])}
    if member:
        document["member"] = member
    return ok(document)
