"""Push over Server-Sent Events, with the same receipts, leases and acks as pulls, and
credit-based flow control: a stream holds at most ``credits`` messages leased and not
settled; an ack, nack or expiry of one of them gives its credit back. Nothing is
fetched from the broker beyond the credits free (the same waiters and permits as a
pull), and a message's lease starts once its event has been written (``await write``,
which also waits while the client reads slowly: back-pressure reaches the broker as
permits not granted).

A stream ends after ``duration_ms`` (default and most: an hour); clients reconnect, as
SSE clients do. Events: ``event: messages`` with ``data: {"messages": [...]}`` and ``id:`` the first
message's id (digits, colons and '-' only, so it never needs escaping); a comment line
``: keep-alive`` every ``sse_keepalive_ms`` when nothing else was sent. Acks made
through another gateway instance give credits back only when the lease would have ended
(this instance learns of them then, or sooner when the other instance's hint arrives).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from common.errors import InvalidArgument, TooManyRequests
from gateway import json_codec
from gateway.consume import _give_back, _start_leases, render, wait_for_messages
from gateway.http_common import dumps, subscription_of, topic_of
from gateway.keys import SERVICE
from gateway.leases import State
from gateway.openapi import SSE_DURATION_MS_MAX

log = logging.getLogger(__name__)

_INTEGER_PARAMETERS = ("credits", "lease_ms", "max_deliveries", "duration_ms")
# A stream ends after at most this long (clients reconnect, as SSE clients do).
DURATION_MS_MAX = SSE_DURATION_MS_MAX
# What a pull's body has that a stream's query has not (credits stands for max_messages;
# a stream waits as long as it lasts).
_NOT_IN_QUERY = ("max_messages", "wait_ms", "ordered")
_LIVE = (State.WRITING, State.LEASED)
# While a stream has no credit left, it looks again this often.
_NO_CREDIT_SLEEP_S = 0.05


def _query_spec(request: web.Request, credits_max: int, config) -> tuple[json_codec.PullSpec, int]:
    raw: dict = {}
    for name, value in request.query.items():
        if name in raw:
            raise InvalidArgument(f"query parameter {name!r} is given twice")
        if name in _NOT_IN_QUERY:
            raise InvalidArgument(f"unknown query parameter {name!r}")
        if name in _INTEGER_PARAMETERS:
            try:
                raw[name] = int(value)
            except ValueError:
                raise InvalidArgument(f"query parameter {name!r} must be an integer") from None
        else:
            raw[name] = value
    credits = raw.pop("credits", 10)
    duration_ms = raw.pop("duration_ms", DURATION_MS_MAX)
    if not 1 <= duration_ms <= DURATION_MS_MAX:
        raise InvalidArgument(f"duration_ms must be in [1, {DURATION_MS_MAX}]")
    raw["max_messages"] = credits
    spec = json_codec.parse_pull(raw, messages_max=credits_max, wait_ms_max=config.wait_ms_max,
                                 lease_ms_min=config.lease_ms_min, lease_ms_max=config.lease_ms_max,
                                 lease_ms_default=config.lease_ms_default)
    return spec, duration_ms


async def events(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    config = service.config
    topic = topic_of(request)
    subscription = subscription_of(request)
    try:
        spec, duration_ms = _query_spec(request, config.sse_credits_max, config)
    except InvalidArgument as error:
        raise InvalidArgument(error.message.replace("body.", "").replace("max_messages", "credits")) from None
    consumers = await service.pull_consumers(topic, subscription, spec)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    keepalive_s = config.sse_keepalive_ms / 1000
    ends_at = time.monotonic() + duration_ms / 1000
    issued: list = []
    while not service.stopping and time.monotonic() < ends_at:
        issued = [slot for slot in issued if slot.state in _LIVE]
        credit = spec.max_messages - len(issued)
        if credit <= 0:
            await asyncio.sleep(_NO_CREDIT_SLEEP_S)
            continue
        try:
            taken = await wait_for_messages(consumers, credit,
                                            max(0.0, min(keepalive_s, ends_at - time.monotonic())))
        except TooManyRequests:
            await asyncio.sleep(_NO_CREDIT_SLEEP_S)
            continue
        if not taken:
            await response.write(b": keep-alive\n\n")
            continue
        try:
            messages = render(service, taken, spec.encoding, spec.lease_ms)
            data = dumps({"messages": messages})
            await response.write(b"event: messages\nid: " + messages[0]["message_id"].encode() + b"\ndata: " + data
                                 + b"\n\n")
        except BaseException:
            _give_back(taken)
            raise
        _start_leases(taken, spec.lease_ms / 1000)
        service.messages_pulled += len(taken)
        service.subscription_counts.add(topic, subscription, "pulled", len(taken))
        issued.extend(slot for _, slot in taken)
    await response.write_eof()
    return response
