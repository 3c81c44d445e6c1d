"""Looking at a subscription's next messages over HTTP without taking them:
``GET {subscription}/peek?max_messages=&encoding=`` — no lease, no delivery, the
cursor untouched.

The messages come from the broker's admin API (``.../subscription/{sub}/position/{n}``:
the n-th entry the subscription has not acknowledged, whether or not a consumer holds
it now), a batch entry split into its messages here. A partitioned topic is read one
partition after another until ``max_messages``. At most ``PEEK_MESSAGES_MAX`` messages
(and as many admin calls) per request.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from client.messages import MessageId
from common.errors import BrokerError, InvalidArgument, MalformedFrame, SubscriptionNotFound, TopicNotFound
from common.topic_name import TopicName
from gateway.admin_client import admin_entry
from gateway.http_common import ok, subscription_of, topic_of
from gateway.json_codec import ENCODINGS, render_payload
from gateway.keys import SERVICE
from protocol.admin_entry import PeekedMessage, entry_messages

PEEK_MESSAGES_MAX = 100


def render(message: PeekedMessage, partition: int, encoding: str) -> dict:
    """A peeked message as the gateway renders pulled ones (without receipt and lease)."""
    payload, used = render_payload(message.payload, encoding)
    rendered = {"message_id": str(MessageId(message.ledger_id, message.entry_id, partition, message.batch_index,
                                            message.batch_size)),
                "payload": payload, "encoding": used, "properties": message.properties,
                "publish_time_ms": message.publish_time_ms, "producer": message.producer}
    if message.key is not None:
        rendered["key"] = message.key
    if message.event_time_ms:
        rendered["event_time_ms"] = message.event_time_ms
    return rendered


async def peek(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    topic = topic_of(request)
    subscription = subscription_of(request)
    try:
        max_messages = int(request.query.get("max_messages", "10"))
    except ValueError:
        raise InvalidArgument("max_messages must be an integer") from None
    if not 1 <= max_messages <= PEEK_MESSAGES_MAX:
        raise InvalidArgument(f"max_messages must be in [1, {PEEK_MESSAGES_MAX}], not {max_messages}")
    encoding = request.query.get("encoding", "text")
    if encoding not in ENCODINGS:
        raise InvalidArgument(f"encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}")
    assert service.http is not None
    messages: list[dict] = []
    found = False
    calls = 0
    for partition in await service.partition_topics(topic):
        name = TopicName.parse(partition)
        position = 1
        while len(messages) < max_messages and calls < PEEK_MESSAGES_MAX:
            calls += 1
            path = f"/admin/v2/{name.rest_path}/subscription/{quote(subscription, safe='')}/position/{position}"
            try:
                entry = await admin_entry(service.http, service.config.admin_url, path)
            except (SubscriptionNotFound, TopicNotFound):
                break                   # not on this partition (it may be on another)
            found = True
            if entry is None:
                break
            try:
                peeked = entry_messages(*entry)
            except (MalformedFrame, ValueError, KeyError) as error:
                raise BrokerError(f"the broker's answer for {path} does not parse: {error}") from None
            messages += [render(message, name.partition_index, encoding) for message in peeked]
            position += 1
    if not found:
        raise SubscriptionNotFound(f"subscription {subscription} does not exist on {topic}")
    return ok({"messages": messages[:max_messages]})
