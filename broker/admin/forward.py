"""Requests the console sends to whichever broker it was opened on, for topics another
broker serves: answered through this broker instead of with a 307.

Why: a topic path sent to a broker that does not serve the topic is redirected (307) to
the one that does, and the CLI follows. A page in a browser cannot: the redirect points
to another origin (another broker's address), so the browser makes it a cross-origin
request, which fails without CORS headers, and it drops the ``Authorization`` header on
the way. The console's page on broker A showed "Failed to fetch" for every topic broker
B served, and could not draw B's history.

How: a request carrying ``X-Magnetar-Forward: true`` (the console sets it on every call;
nobody else needs to) that a handler answers with a 307 is sent here to the redirect's
``Location`` with the same method, query and body, and the owner's answer (status,
body, ``Content-Type`` and ``X-Pulsar-*`` headers, as a peek's message id) goes back
to the caller. The request was authenticated and authorized here first (this middleware
runs inside the auth middleware), and the owner is asked with the credentials the
partition fan-out uses (broker/admin/fanout.py ``PartitionCalls``: this broker's own
token when it has one, else the caller's ``Authorization``), so the owner decides again
for a caller it can see. Bounded: one call per request, ``FORWARD_TIMEOUT_S``, an answer
of at most ``FORWARD_BYTES_MAX``; an owner that cannot be reached answers 502. Without the
header, nothing changes: the 307 goes back as before.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from broker.service import BrokerService

log = logging.getLogger(__name__)

FORWARD_HEADER = "X-Magnetar-Forward"
# As long as a partition call of the fan-out may take (fanout.PARTITION_CALL_TIMEOUT_S).
FORWARD_TIMEOUT_S = 30.0
# The largest answer passed back: a topic's stats with thousands of consumers is a few
# MB; a peeked message is at most max_message_size (5 MiB by default).
FORWARD_BYTES_MAX = 32 * 1024 * 1024
_ANSWER_HEADERS_PREFIX = "x-pulsar-"


def forward_middleware(service: BrokerService):
    @web.middleware
    async def middleware(request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPTemporaryRedirect as redirect:
            if request.headers.get(FORWARD_HEADER, "").lower() != "true":
                raise
            return await _forward(service, request, redirect.location)

    return middleware


async def _forward(service: BrokerService, request: web.Request, location: str) -> web.Response:
    token = service.broker_client_token() if service.broker_client_token is not None else None
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {
        name: request.headers[name] for name in ("Authorization",) if name in request.headers}
    if "Content-Type" in request.headers:
        headers["Content-Type"] = request.headers["Content-Type"]
    ssl_context = service.peer_tls.current() if location.startswith("https://") else None
    body = await request.read() if request.can_read_body else None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as session:
            async with session.request(request.method, location, headers=headers, data=body,
                                       ssl=ssl_context) as answer:
                if (answer.content_length or 0) > FORWARD_BYTES_MAX:
                    raise web.HTTPBadGateway(reason=f"the answer of {location} is larger than {FORWARD_BYTES_MAX} bytes")
                content = await answer.content.read(FORWARD_BYTES_MAX + 1)
                if len(content) > FORWARD_BYTES_MAX:
                    raise web.HTTPBadGateway(reason=f"the answer of {location} is larger than {FORWARD_BYTES_MAX} bytes")
                passed = {name: value for name, value in answer.headers.items()
                          if name.lower().startswith(_ANSWER_HEADERS_PREFIX) or name.lower() == "content-type"}
                return web.Response(status=answer.status, body=content, headers=passed)
    except (aiohttp.ClientError, asyncio.TimeoutError) as failure:
        log.warning("the broker serving a topic not reachable for a forwarded request: url=%s error=%s: %s",
                    location, type(failure).__name__, failure)
        raise web.HTTPBadGateway(reason=f"{location}: {type(failure).__name__}: {failure}") from None
