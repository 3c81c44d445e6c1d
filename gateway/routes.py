"""The gateway's route table: one line per operation. gateway/openapi.py documents each
of these, and builds its document from this table as the app holds it."""

from __future__ import annotations

from aiohttp import web

from gateway import consume, peek, produce, push, stats
from gateway.keys import OPENAPI
from gateway.openapi import SUBSCRIPTION_BASE, TOPIC_BASE


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


def add_routes(app: web.Application) -> None:
    router = app.router
    router.add_get("/v1/openapi.json", openapi_document, allow_head=False)
    router.add_post(f"{TOPIC_BASE}/message", produce.produce_one)
    router.add_post(f"{TOPIC_BASE}/messages", produce.produce_batch)
    router.add_post(f"{TOPIC_BASE}/messages/stream", produce.produce_stream)
    router.add_get(f"{TOPIC_BASE}/stats", stats.topic_stats, allow_head=False)
    router.add_put(SUBSCRIPTION_BASE, consume.create_subscription)
    router.add_delete(SUBSCRIPTION_BASE, consume.delete_subscription)
    router.add_get(f"{SUBSCRIPTION_BASE}/backlog", stats.backlog, allow_head=False)
    router.add_get(f"{SUBSCRIPTION_BASE}/peek", peek.peek, allow_head=False)
    router.add_post(f"{SUBSCRIPTION_BASE}/pull", consume.pull)
    router.add_post(f"{SUBSCRIPTION_BASE}/ack", consume.ack)
    router.add_post(f"{SUBSCRIPTION_BASE}/nack", consume.nack)
    router.add_post(f"{SUBSCRIPTION_BASE}/extend", consume.extend)
    router.add_post(f"{SUBSCRIPTION_BASE}/reject", consume.reject)
    router.add_get(f"{SUBSCRIPTION_BASE}/events", push.events, allow_head=False)
