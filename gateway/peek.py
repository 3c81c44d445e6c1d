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

import datetime
import json
from urllib.parse import quote, unquote

from aiohttp import web

from client.messages import MessageId
from common.errors import InvalidArgument, SubscriptionNotFound, TopicNotFound
from common.topic_name import TopicName
from gateway.admin_client import admin_entry
from gateway.http_common import ok, subscription_of, topic_of
from gateway.json_codec import ENCODINGS, render_payload
from gateway.keys import SERVICE
from protocol.batch import parse_batch
from protocol.proto import pulsar_api_pb2 as pb

PEEK_MESSAGES_MAX = 100


def _time_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000)
    except ValueError:
        return None


def messages_of_entry(partition: int, headers: dict[str, str], body: bytes, encoding: str) -> list[dict]:
    """The messages of one entry as the broker's admin API answers it, rendered as the
    gateway renders pulled messages (without receipt and lease)."""
    lower = {name.lower(): value for name, value in headers.items()}
    ledger_id, entry_id = (int(part) for part in lower["x-pulsar-message-id"].split(":")[:2])
    common = {"publish_time_ms": _time_ms(lower.get("x-pulsar-publish-time")),
              "producer": unquote(lower.get("x-pulsar-producer-name", ""))}
    event_time_ms = _time_ms(lower.get("x-pulsar-event-time"))
    if event_time_ms:
        common["event_time_ms"] = event_time_ms
    if "x-pulsar-num-batch-message" not in lower:
        payload, used = render_payload(body, encoding)
        rendered = {"message_id": str(MessageId(ledger_id, entry_id, partition)), "payload": payload,
                    "encoding": used, "properties": json.loads(lower.get("x-pulsar-property") or "{}"), **common}
        if "x-pulsar-partition-key" in lower:
            rendered["key"] = unquote(lower["x-pulsar-partition-key"])
        return [rendered]
    count = int(lower["x-pulsar-num-batch-message"])
    metadata = pb.MessageMetadata(producer_name="", sequence_id=0, publish_time=0, num_messages_in_batch=count)
    messages = []
    for single in parse_batch(metadata, body):
        payload, used = render_payload(bytes(single.payload), encoding)
        rendered = {"message_id": str(MessageId(ledger_id, entry_id, partition, single.batch_index, count)),
                    "payload": payload, "encoding": used,
                    "properties": {kv.key: kv.value for kv in single.metadata.properties}, **common}
        if single.metadata.HasField("partition_key"):
            rendered["key"] = single.metadata.partition_key
        if single.metadata.HasField("event_time") and single.metadata.event_time:
            rendered["event_time_ms"] = single.metadata.event_time
        messages.append(rendered)
    return messages


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
            messages += messages_of_entry(name.partition_index, *entry, encoding)
            position += 1
    if not found:
        raise SubscriptionNotFound(f"subscription {subscription} does not exist on {topic}")
    return ok({"messages": messages[:max_messages]})
