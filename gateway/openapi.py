"""The OpenAPI 3.1 document of the gateway, built from the application's own routes so it
cannot drift from them: every route must have an operation here (``build`` fails
otherwise), and every operation here must have a route. Limits in the schemas come from
the config the gateway runs with. ``gateway/openapi.json`` is this document for the
default config, checked in; tests/unit/test_gateway_openapi.py keeps the three (routes,
served document, file) in agreement: regenerate the file with
``magnetar gateway --print-openapi > gateway/openapi.json``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from common.version import __version__
from gateway.config import GatewayConfig
from gateway.http_common import PARTITION_SUFFIX
from gateway.json_codec import (
    DEAD_LETTER_TOPIC_CHARS_MAX,
    DEAD_LETTER_TOPIC_PATTERN,
    WHITESPACE_CLASS,
    NACK_DELAY_MS_MAX,
    NAME_CHARS_MAX,
    PRODUCER_NAME_CHARS_MAX,
    SEQUENCE_ID_MAX,
    PROPERTIES_MAX,
    PROPERTY_CHARS_MAX,
    RECEIPTS_PER_REQUEST_MAX,
    TIME_MS_MAX,
)
from gateway.peek import PEEK_MESSAGES_MAX
from gateway.receipts import MODES

# A stream ends after at most this long (gateway/push.py; clients reconnect).
SSE_DURATION_MS_MAX = 3_600_000

TOPIC_BASE = "/v1/topics/persistent/{tenant}/{namespace}/{topic}"
SUBSCRIPTION_BASE = f"{TOPIC_BASE}/subscriptions/{{subscription}}"

_REF = "#/components/schemas/"


def _ref(name: str) -> dict:
    return {"$ref": f"{_REF}{name}"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _error(description: str) -> dict:
    return {"description": description, "content": _json(_ref("Error"))}


def _path_parameter(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}


# What the server refuses in names, said here so a client generated from the document
# refuses it too (gateway/http_common.py and common/topic_name.py check the same):
# "." and ".." are not names (a URL client folds them away), a topic's local name may
# not hold whitespace or name one of a partitioned topic's partitions, and the whole
# name stays under common/topic_name.py's 1,024 bytes (128 + 128 ASCII + 188 characters
# of at most 4 bytes each).
_DOT_SEGMENTS = {"enum": [".", ".."]}
_WHITESPACE = WHITESPACE_CLASS
TENANT_CHARS_MAX = 128
TOPIC_CHARS_MAX = 188
_NAME_PART = {"type": "string", "pattern": r"^[-=:.A-Za-z0-9_]+$", "maxLength": TENANT_CHARS_MAX,
              "not": _DOT_SEGMENTS}
TOPIC_PARAMETERS = [
    _path_parameter("tenant", _NAME_PART, "Pulsar tenant, e.g. public"),
    _path_parameter("namespace", _NAME_PART, "Pulsar namespace, e.g. default"),
    _path_parameter("topic", {"type": "string", "pattern": f"^[^/{_WHITESPACE}\\x00-\\x1f\\x7f]+$",
                              "maxLength": TOPIC_CHARS_MAX,
                              "not": {"anyOf": [_DOT_SEGMENTS, {"pattern": PARTITION_SUFFIX.pattern}]}},
                    "the topic's local name (the topic, not one of its partitions)"),
]
SUBSCRIPTION_PARAMETERS = TOPIC_PARAMETERS + [
    _path_parameter("subscription", {"type": "string", "pattern": r"^[^/\x00-\x1f\x7f]+$", "minLength": 1,
                                     "maxLength": 256, "not": {"anyOf": [_DOT_SEGMENTS, {"pattern": "::"}]}},
                    "the subscription's name (no '::': it separates a broadcast member's cursor)"),
]
# A dead-letter topic: a local name (public/default), tenant/namespace/name or the full
# persistent://tenant/namespace/name; short enough for common/topic_name.py's 1,024 bytes.
DEAD_LETTER_TOPIC = {"type": "string", "minLength": 1, "maxLength": DEAD_LETTER_TOPIC_CHARS_MAX,
                     "pattern": DEAD_LETTER_TOPIC_PATTERN}
# Consumer and member names: no ':' (the gateway joins names with it) and no control characters.
CONSUMER_NAME = {"type": "string", "minLength": 1, "maxLength": NAME_CHARS_MAX, "pattern": r"^[^:\x00-\x1f\x7f]+$"}
PRODUCER_QUERY = {"name": "producer", "in": "query", "required": False,
                  "schema": {"type": "string", "minLength": 1, "maxLength": PRODUCER_NAME_CHARS_MAX,
                             "pattern": "^[^\\x00-\\x1f\\x7f]+$"},
                  "description": "idempotent produce: every line then carries an increasing sequence_id, and a "
                                 "line the broker had stored already is answered duplicate"}
MEMBER_QUERY = {"name": "member", "in": "query", "required": False, "schema": CONSUMER_NAME,
                "description": "a broadcast subscription's member"}

# Answers every operation may give besides its own.
COMMON_ERRORS = {
    "400": _error("malformed request: bad JSON, a field of the wrong type or out of range, a bad name"),
    "401": _error("authentication is on and the request carries no valid credentials"),
    "403": _error("authentication is on and the caller may not produce or consume on this topic"),
    "404": _error("no such topic, subscription or route"),
    "413": _error("a limit was exceeded: body bytes, messages per request, max_messages, wait_ms, lease_ms"),
    "429": _error("too many requests or leases in flight: retry after Retry-After seconds"),
    "502": _error("a broker failed the request (the gateway itself worked)"),
    "503": _error("the brokers cannot serve this now (retriable; Retry-After)"),
    "504": _error("the broker did not answer in time (retriable; a produce may or may not have been stored)"),
    "default": _error("any other failure, as a catalogue error"),
}


# Which names a mode needs, as the server checks them (gateway/json_codec.py): broadcast
# names its member, key_shared, exclusive and failover name their consumer, and only
# broadcast has members. Exactly one of these holds for a valid request.
MODE_RULES = {"oneOf": [
    {"title": "shared", "properties": {"mode": {"const": "shared"}}, "not": {"required": ["member"]}},
    {"title": "broadcast", "required": ["mode", "member"], "properties": {"mode": {"const": "broadcast"}}},
    {"title": "named consumer", "required": ["mode", "consumer"],
     "properties": {"mode": {"enum": ["key_shared", "exclusive", "failover"]}}, "not": {"required": ["member"]}},
]}


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def schemas(config: GatewayConfig) -> dict:
    name = {"type": "string", "minLength": 1, "maxLength": NAME_CHARS_MAX}
    message_properties = {
        "payload": {"type": "string", "description": "the message: UTF-8 text, or base64 with encoding=base64"},
        "encoding": {"type": "string", "enum": ["text", "base64"], "default": "text"},
        "key": {"type": "string", "maxLength": PROPERTY_CHARS_MAX,
                "description": "partition key (routing, key-shared dispatch)"},
        "ordering_key": {"type": "string", "minLength": 1, "maxLength": PROPERTY_CHARS_MAX,
                         "description": "key-shared dispatch key, when not the key"},
        "properties": {"type": "object", "maxProperties": PROPERTIES_MAX,
                       "propertyNames": {"minLength": 1, "maxLength": NAME_CHARS_MAX},
                       "additionalProperties": {"type": "string", "maxLength": PROPERTY_CHARS_MAX}},
        "event_time_ms": {"type": "integer", "minimum": 0, "maximum": TIME_MS_MAX},
        "deliver_at_ms": {"type": "integer", "minimum": 0, "maximum": TIME_MS_MAX,
                          "description": "not handed out by gateway pulls before this Unix time"},
        "deliver_after_ms": {"type": "integer", "minimum": 0, "maximum": TIME_MS_MAX,
                             "description": "deliver_at_ms as a delay from now (not with deliver_at_ms)"}}
    # Only one deliver time; a base64 payload is base64 (standard alphabet, padded).
    message_rules = {"not": {"required": ["deliver_at_ms", "deliver_after_ms"]},
                     "if": {"required": ["encoding"], "properties": {"encoding": {"const": "base64"}}},
                     "then": {"properties": {"payload": {"pattern": BASE64_PATTERN}}}}
    producer = {"type": "string", "minLength": 1, "maxLength": PRODUCER_NAME_CHARS_MAX,
                "pattern": "^[^\\x00-\\x1f\\x7f]+$",
                "description": "idempotent produce: the producer whose sequence ids the broker's deduplication "
                               "keeps (namespace policy deduplication must be on)"}
    sequence_id = {"type": "integer", "minimum": 0, "maximum": SEQUENCE_ID_MAX,
                   "description": "idempotent produce: increasing per producer; a message sent again with its "
                                  "sequence id is answered duplicate and not stored twice"}
    return {
        "Error": {
            "type": "object", "required": ["code", "error", "message", "retriable"],
            "properties": {"code": {"type": "integer", "description": "catalogue code (common/errors.py)"},
                           "error": {"type": "string"}, "message": {"type": "string"},
                           "retriable": {"type": "boolean"}}},
        "OutgoingMessage": {
            "type": "object", "required": ["payload"], "additionalProperties": False,
            "properties": message_properties, **message_rules},
        "ProduceOneRequest": {
            "type": "object", "required": ["payload"], "additionalProperties": False,
            "properties": {**message_properties, "producer": producer, "sequence_id": sequence_id}, **message_rules,
            "dependentRequired": {"producer": ["sequence_id"], "sequence_id": ["producer"]}},
        "BatchMessage": {
            "type": "object", "required": ["payload"], "additionalProperties": False,
            "properties": {**message_properties, "sequence_id": sequence_id}, **message_rules},
        "ProduceBatchRequest": {
            "type": "object", "required": ["messages"], "additionalProperties": False,
            "properties": {"messages": {"type": "array", "minItems": 1, "maxItems": config.batch_messages_max,
                                        "items": _ref("BatchMessage")},
                           "producer": producer},
            # With a producer every message has its sequence_id; without, none has.
            "if": {"required": ["producer"]},
            "then": {"properties": {"messages": {"items": {"required": ["sequence_id"]}}}},
            "else": {"properties": {"messages": {"items": {"not": {"required": ["sequence_id"]}}}}}},
        "Stored": {"type": "object", "required": ["message_id"],
                   "properties": {"message_id": {"type": ["string", "null"],
                                                 "description": "ledger:entry:partition:batch (null: a duplicate)"},
                                  "duplicate": {"type": "boolean",
                                                "description": "idempotent produce: the broker had this message "
                                                               "already and did not store it again"}}},
        "ProduceResult": {
            "type": "object", "required": ["status"],
            "properties": {"status": {"type": "string", "enum": ["stored", "duplicate", "error"]},
                           "message_id": {"type": "string"}, "error": _ref("Error")}},
        "ProduceBatchResponse": {
            "type": "object", "required": ["results"],
            "properties": {"results": {"type": "array", "items": _ref("ProduceResult")}}},
        "SubscriptionRequest": {
            "type": "object", "additionalProperties": False,
            "properties": {"mode": {"type": "string", "enum": list(MODES), "default": "shared"},
                           "initial_position": {"type": "string", "enum": ["earliest", "latest"],
                                                "default": "latest"},
                           "member": {**CONSUMER_NAME,
                                      "description": "broadcast (and only broadcast): the member whose cursor "
                                                     "to create"},
                           "consumer": {**CONSUMER_NAME,
                                        "description": "key_shared, exclusive, failover: the consumer's name"}},
            **MODE_RULES},
        "Subscription": {
            "type": "object", "required": ["topic", "subscription"],
            "properties": {"topic": {"type": "string"}, "subscription": {"type": "string"},
                           "mode": {"type": "string"}, "initial_position": {"type": "string"},
                           "member": {"type": "string"}, "deleted": {"type": "boolean"}}},
        "PullRequest": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "mode": {"type": "string", "enum": list(MODES), "default": "shared"},
                "member": {**CONSUMER_NAME, "description": "broadcast (and only broadcast): the member pulling"},
                "consumer": {**CONSUMER_NAME, "description": "key_shared, exclusive, failover: the consumer "
                                                             "keeping its keys or turn"},
                "max_messages": {"type": "integer", "minimum": 1, "maximum": config.pull_messages_max, "default": 1},
                "wait_ms": {"type": "integer", "minimum": 0, "maximum": config.wait_ms_max, "default": 0,
                            "description": "long poll: wait up to this long for the first message"},
                "lease_ms": {"type": "integer", "minimum": config.lease_ms_min, "maximum": config.lease_ms_max,
                             "default": config.lease_ms_default,
                             "description": "the lease, from when the response is written"},
                "encoding": {"type": "string", "enum": ["text", "base64"], "default": "text"},
                "initial_position": {"type": "string", "enum": ["earliest", "latest"], "default": "latest"},
                "max_deliveries": {"type": "integer", "minimum": 1, "maximum": 1_000_000,
                                   "description": "dead-letter a message instead of delivering it again"},
                "dead_letter_topic": {**DEAD_LETTER_TOPIC,
                                      "description": "default: {topic}-{subscription}-DLQ"},
                "ordered": {"type": "boolean", "default": False,
                            "description": "ordering keys: at most one message per key (ordering_key, else key), "
                                           "and none of a key while one of it is leased through this gateway "
                                           "consumer"}},
            "dependentRequired": {"dead_letter_topic": ["max_deliveries"]},
            **MODE_RULES},
        "EventsQuery": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "mode": {"type": "string", "enum": list(MODES), "default": "shared"},
                "member": {**CONSUMER_NAME, "description": "broadcast (and only broadcast): the member"},
                "consumer": {**CONSUMER_NAME, "description": "key_shared, exclusive, failover: the consumer"},
                "credits": {"type": "integer", "minimum": 1, "maximum": config.sse_credits_max, "default": 10,
                            "description": "messages leased and not settled at most"},
                "lease_ms": {"type": "integer", "minimum": config.lease_ms_min, "maximum": config.lease_ms_max,
                             "default": config.lease_ms_default},
                "duration_ms": {"type": "integer", "minimum": 1, "maximum": SSE_DURATION_MS_MAX,
                                "default": SSE_DURATION_MS_MAX},
                "encoding": {"type": "string", "enum": ["text", "base64"], "default": "text"},
                "initial_position": {"type": "string", "enum": ["earliest", "latest"], "default": "latest"},
                "max_deliveries": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                "dead_letter_topic": DEAD_LETTER_TOPIC},
            "dependentRequired": {"dead_letter_topic": ["max_deliveries"]},
            **MODE_RULES},
        "ReceivedMessage": {
            "type": "object",
            "required": ["message_id", "payload", "encoding", "properties", "publish_time_ms", "delivery_attempt",
                         "receipt", "lease_deadline_ms"],
            "properties": {
                "message_id": {"type": "string"}, "payload": {"type": "string"},
                "encoding": {"type": "string", "enum": ["text", "base64"]},
                "key": {"type": "string"}, "ordering_key": {"type": "string"},
                "properties": {"type": "object", "additionalProperties": {"type": "string"}},
                "event_time_ms": {"type": "integer"}, "publish_time_ms": {"type": "integer"},
                "deliver_at_ms": {"type": "integer"},
                "delivery_attempt": {"type": "integer", "minimum": 1},
                "receipt": {"type": "string", "description": "ack, nack or extend with it, through any gateway"},
                "lease_deadline_ms": {"type": "integer", "description": "the lease runs at least until this"},
                "compression": {"type": "string", "description": "set when the payload is handed over as stored "
                                                                 "(a codec this gateway does not decode)"}}},
        "PullResponse": {
            "type": "object", "required": ["messages"],
            "properties": {"messages": {"type": "array", "items": _ref("ReceivedMessage")}}},
        "ReceiptsRequest": {
            "type": "object", "required": ["receipts"], "additionalProperties": False,
            "properties": {"receipts": {"type": "array", "minItems": 1, "maxItems": RECEIPTS_PER_REQUEST_MAX,
                                        "items": {"type": "string"}}}},
        "NackRequest": {
            "type": "object", "required": ["receipts"], "additionalProperties": False,
            "properties": {"receipts": {"type": "array", "minItems": 1, "maxItems": RECEIPTS_PER_REQUEST_MAX,
                                        "items": {"type": "string"}},
                           "delay_ms": {"type": "integer", "minimum": 0, "maximum": NACK_DELAY_MS_MAX,
                                        "default": 0}}},
        "ExtendRequest": {
            "type": "object", "required": ["receipts"], "additionalProperties": False,
            "properties": {"receipts": {"type": "array", "minItems": 1, "maxItems": RECEIPTS_PER_REQUEST_MAX,
                                        "items": {"type": "string"}},
                           "lease_ms": {"type": "integer", "minimum": config.lease_ms_min,
                                        "maximum": config.lease_ms_max, "default": config.lease_ms_default}}},
        "RejectRequest": {
            "type": "object", "required": ["receipts"], "additionalProperties": False,
            "properties": {"receipts": {"type": "array", "minItems": 1, "maxItems": RECEIPTS_PER_REQUEST_MAX,
                                        "items": {"type": "string"}},
                           "dead_letter_topic": {**DEAD_LETTER_TOPIC,
                                                 "description": "default: {topic}-{subscription}-DLQ"}}},
        "SettleResult": {
            "type": "object", "required": ["status"],
            "properties": {"status": {"type": "string", "enum": ["acked", "nacked", "extended", "rejected", "error"]},
                           "dead_letter_topic": {"type": "string", "description": "rejected: where it went"},
                           "late": {"type": "boolean"}, "receipt": {"type": "string"},
                           "lease_deadline_ms": {"type": "integer"}, "error": _ref("Error")}},
        "SettleResponse": {
            "type": "object", "required": ["results"],
            "properties": {"results": {"type": "array", "items": _ref("SettleResult")}}},
        "Backlog": {
            "type": "object", "required": ["topic", "subscription", "backlog", "unacked", "consumers"],
            "properties": {"topic": {"type": "string"}, "subscription": {"type": "string"},
                           "member": {"type": "string"}, "backlog": {"type": "integer"},
                           "unacked": {"type": "integer"}, "consumers": {"type": "integer"}}},
        "PeekedMessage": {
            "type": "object", "required": ["message_id", "payload", "encoding", "properties"],
            "properties": {"message_id": {"type": "string"}, "payload": {"type": "string"},
                           "encoding": {"type": "string", "enum": ["text", "base64"]},
                           "key": {"type": "string"}, "properties": {"type": "object"},
                           "publish_time_ms": {"type": ["integer", "null"]}, "event_time_ms": {"type": "integer"},
                           "producer": {"type": "string"}}},
        "PeekResponse": {
            "type": "object", "required": ["messages"],
            "properties": {"messages": {"type": "array", "items": _ref("PeekedMessage")}}},
        "TopicStats": {"type": "object", "description": "the broker's topic stats (Pulsar's field names)"},
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    }


def _operation(summary: str, parameters: list, responses: dict, request: str | None = None,
               request_content: dict | None = None, description: str = "", request_required: bool = True) -> dict:
    operation: dict[str, Any] = {"summary": summary, "parameters": parameters,
                                 "responses": {**responses, **COMMON_ERRORS}}
    if description:
        operation["description"] = description
    if request is not None:
        operation["requestBody"] = {"required": request_required, "content": _json(_ref(request))}
    if request_content is not None:
        operation["requestBody"] = {"required": request_required, "content": request_content}
    return operation


# Idempotent produce's own answers (gateway/idempotent.py).
PRODUCE_ERRORS = {
    "409": _error("idempotent produce: another gateway still holds this producer (retriable)"),
    "412": _error("idempotent produce: the namespace does not deduplicate (policy deduplication is off)"),
}
SUBSCRIPTION_ERRORS = {
    "409": _error("the subscription exists in another mode, or its exclusive consumer is busy"),
}


def _ok(schema: str, description: str = "OK") -> dict:
    return {"200": {"description": description, "content": _json(_ref(schema))}}


# One Server-Sent Event as OpenAPI 3.1 tools read a text/event-stream schema (each event,
# its fields as SSE names them): "messages" events, whose data is the JSON text of
# {"messages": [...]} (PullResponse) and whose id is the first message's id.
SSE_EVENT = {"type": "object", "required": ["event", "data"],
             "properties": {"event": {"type": "string", "enum": ["messages"]},
                            "data": {"type": "string", "contentMediaType": "application/json",
                                     "contentSchema": _ref("PullResponse")},
                            "id": {"type": "string"}, "retry": {"type": "integer", "minimum": 0}}}


OPERATIONS: dict[tuple[str, str], dict] = {
    ("GET", "/v1/openapi.json"): _operation(
        "This document", [], {"200": {"description": "OpenAPI 3.1", "content": _json({"type": "object"})}}),
    ("POST", f"{TOPIC_BASE}/message"): _operation(
        "Produce one message", TOPIC_PARAMETERS, {**_ok("Stored", "stored on the bookies"), **PRODUCE_ERRORS}, "ProduceOneRequest",
        description="Answers once the broker's receipt says the message is durable. With producer and "
                    "sequence_id, sending it again is safe: a message stored already is answered duplicate."),
    ("POST", f"{TOPIC_BASE}/messages"): _operation(
        "Produce a batch", TOPIC_PARAMETERS, {**_ok("ProduceBatchResponse", "a result per message, in order"), **PRODUCE_ERRORS},
        "ProduceBatchRequest", description="Stored as one batch entry per partition touched; with producer "
                                           "(idempotent), one entry per message."),
    ("POST", f"{TOPIC_BASE}/messages/stream"): _operation(
        "Produce a stream of NDJSON lines", TOPIC_PARAMETERS + [PRODUCER_QUERY],
        {"200": {"description": "one NDJSON result line per input line, as each is stored",
                 "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}, **PRODUCE_ERRORS},
        request_content={"application/x-ndjson": {"schema": {"type": "string"}}}),
    ("GET", f"{TOPIC_BASE}/stats"): _operation("Topic stats (the broker's)", TOPIC_PARAMETERS, _ok("TopicStats")),
    ("PUT", SUBSCRIPTION_BASE): _operation(
        "Create a subscription (or a broadcast member's cursor)", SUBSCRIPTION_PARAMETERS,
        {**_ok("Subscription"), **SUBSCRIPTION_ERRORS},
        "SubscriptionRequest", request_required=False),
    ("DELETE", SUBSCRIPTION_BASE): _operation(
        "Delete a subscription (or, with member, a member's cursor)", SUBSCRIPTION_PARAMETERS + [MEMBER_QUERY],
        _ok("Subscription")),
    ("GET", f"{SUBSCRIPTION_BASE}/backlog"): _operation(
        "Messages not acknowledged yet", SUBSCRIPTION_PARAMETERS + [MEMBER_QUERY], _ok("Backlog")),
    ("GET", f"{SUBSCRIPTION_BASE}/peek"): _operation(
        "The next messages not acknowledged yet, without taking them (no lease, no delivery)",
        SUBSCRIPTION_PARAMETERS + [
            {"name": "max_messages", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": PEEK_MESSAGES_MAX}},
            {"name": "encoding", "in": "query", "required": False,
             "schema": {"type": "string", "enum": ["text", "base64"]}}],
        _ok("PeekResponse")),
    ("POST", f"{SUBSCRIPTION_BASE}/pull"): _operation(
        "Receive messages, each with a leased receipt (long polling)", SUBSCRIPTION_PARAMETERS,
        _ok("PullResponse"), "PullRequest", request_required=False,
        description="The lease of each message starts when the response is written."),
    ("POST", f"{SUBSCRIPTION_BASE}/ack"): _operation(
        "Acknowledge by receipt (through any gateway)", SUBSCRIPTION_PARAMETERS, _ok("SettleResponse"),
        "ReceiptsRequest"),
    ("POST", f"{SUBSCRIPTION_BASE}/nack"): _operation(
        "Give messages back, now or after delay_ms", SUBSCRIPTION_PARAMETERS, _ok("SettleResponse"), "NackRequest"),
    ("POST", f"{SUBSCRIPTION_BASE}/extend"): _operation(
        "Extend leases; each result carries a new receipt", SUBSCRIPTION_PARAMETERS, _ok("SettleResponse"),
        "ExtendRequest"),
    ("POST", f"{SUBSCRIPTION_BASE}/reject"): _operation(
        "Send leased messages straight to the dead-letter topic, then acknowledge them", SUBSCRIPTION_PARAMETERS,
        _ok("SettleResponse"), "RejectRequest"),
    ("GET", f"{SUBSCRIPTION_BASE}/events"): _operation(
        "Push: Server-Sent Events with receipts, credit-based", SUBSCRIPTION_PARAMETERS + [
            {"name": "stream", "in": "query", "required": False, "style": "form", "explode": True,
             "schema": _ref("EventsQuery"),
             "description": "the query parameters, each its own (?mode=broadcast&member=m&credits=10)"}],
        {"200": {"description": "an event stream", "content": {"text/event-stream": {"schema": SSE_EVENT}}}}),
    ("GET", "/health"): _operation("200 while serving, 503 when stopping", [], _ok("Health")),
    ("GET", "/live"): _operation("200 while the process answers (a liveness probe)", [], _ok("Health")),
    ("GET", "/metrics"): _operation(
        "Prometheus metrics", [], {"200": {"description": "Prometheus text format",
                                           "content": {"text/plain": {"schema": {"type": "string"}}}}}),
}


# operationIds: what OpenAPI links name, and what generated clients call their methods.
OPERATION_IDS = {
    ("GET", "/v1/openapi.json"): "getDocument",
    ("POST", f"{TOPIC_BASE}/message"): "produceOne",
    ("POST", f"{TOPIC_BASE}/messages"): "produceBatch",
    ("POST", f"{TOPIC_BASE}/messages/stream"): "produceStream",
    ("GET", f"{TOPIC_BASE}/stats"): "topicStats",
    ("PUT", SUBSCRIPTION_BASE): "createSubscription",
    ("DELETE", SUBSCRIPTION_BASE): "deleteSubscription",
    ("GET", f"{SUBSCRIPTION_BASE}/backlog"): "backlog",
    ("GET", f"{SUBSCRIPTION_BASE}/peek"): "peek",
    ("POST", f"{SUBSCRIPTION_BASE}/pull"): "pull",
    ("POST", f"{SUBSCRIPTION_BASE}/ack"): "ack",
    ("POST", f"{SUBSCRIPTION_BASE}/nack"): "nack",
    ("POST", f"{SUBSCRIPTION_BASE}/extend"): "extend",
    ("POST", f"{SUBSCRIPTION_BASE}/reject"): "reject",
    ("GET", f"{SUBSCRIPTION_BASE}/events"): "events",
    ("GET", "/health"): "health",
    ("GET", "/live"): "live",
    ("GET", "/metrics"): "metrics",
}
assert set(OPERATION_IDS) == set(OPERATIONS)
for _key, _operation_id in OPERATION_IDS.items():
    OPERATIONS[_key]["operationId"] = _operation_id


def _link(operation_id: str, description: str, names: tuple[str, ...], body: dict | None = None) -> dict:
    """A link to ``operation_id`` with the path parameters ``names`` taken from this
    request's path, and ``body`` (with runtime expressions) sent as the whole body
    (x-schemathesis merge_body false: a generated body merged in could break the
    mode rules the link's body keeps)."""
    link: dict[str, Any] = {"operationId": operation_id, "description": description,
                            "parameters": {f"path.{name}": f"$request.path.{name}" for name in names}}
    if body is not None:
        link["requestBody"] = body
        link["x-schemathesis"] = {"merge_body": False}
    return link


_TOPIC_NAMES = ("tenant", "namespace", "topic")
_SUBSCRIPTION_NAMES = _TOPIC_NAMES + ("subscription",)
_RECEIPT = "$response.body#/messages/0/receipt"
# The work-queue cycle as links (OpenAPI 3.1 "links"): produce, create a subscription at
# the earliest position, pull, then settle the pulled message by its receipt (ack, nack,
# extend - whose new receipt can be acked - or reject); a subscription's backlog, and
# its deletion, after which its backlog is gone. schemathesis's stateful tests walk them
# (tests/integration/test_gateway_bad_input.py).
LINKS: dict[tuple[str, str], dict[str, dict]] = {
    ("POST", f"{TOPIC_BASE}/message"): {
        "CreateSubscription": _link("createSubscription", "a subscription that sees the message", _TOPIC_NAMES,
                                    {"mode": "shared", "initial_position": "earliest"})},
    ("POST", f"{TOPIC_BASE}/messages"): {
        "CreateSubscription": _link("createSubscription", "a subscription that sees the messages", _TOPIC_NAMES,
                                    {"mode": "shared", "initial_position": "earliest"})},
    ("PUT", SUBSCRIPTION_BASE): {
        "Pull": _link("pull", "pull from the subscription", _SUBSCRIPTION_NAMES,
                      {"mode": "shared", "max_messages": 10, "wait_ms": 1_000, "lease_ms": 30_000}),
        "Backlog": _link("backlog", "the subscription's backlog", _SUBSCRIPTION_NAMES),
        "Delete": _link("deleteSubscription", "delete the subscription", _SUBSCRIPTION_NAMES),
    },
    ("DELETE", SUBSCRIPTION_BASE): {
        "Backlog": _link("backlog", "a deleted subscription has no backlog (404)", _SUBSCRIPTION_NAMES)},
    ("POST", f"{SUBSCRIPTION_BASE}/pull"): {
        "Ack": _link("ack", "acknowledge the first message pulled", _SUBSCRIPTION_NAMES, {"receipts": [_RECEIPT]}),
        "Nack": _link("nack", "give the first message pulled back", _SUBSCRIPTION_NAMES,
                      {"receipts": [_RECEIPT], "delay_ms": 0}),
        "Extend": _link("extend", "extend the first message's lease", _SUBSCRIPTION_NAMES,
                        {"receipts": [_RECEIPT], "lease_ms": 60_000}),
        "Reject": _link("reject", "dead-letter the first message pulled", _SUBSCRIPTION_NAMES,
                        {"receipts": [_RECEIPT]}),
    },
    ("POST", f"{SUBSCRIPTION_BASE}/extend"): {
        "Ack": _link("ack", "acknowledge by the extension's new receipt", _SUBSCRIPTION_NAMES,
                     {"receipts": ["$response.body#/results/0/receipt"]})},
    ("POST", f"{SUBSCRIPTION_BASE}/nack"): {
        "Pull": _link("pull", "pull the message given back", _SUBSCRIPTION_NAMES,
                      {"mode": "shared", "max_messages": 10, "wait_ms": 1_000})},
}
for _key, _links in LINKS.items():
    OPERATIONS[_key]["responses"]["200"]["links"] = _links


def build(app: web.Application, config: GatewayConfig) -> dict:
    """The document for the routes of ``app``; AssertionError if a route has no
    operation here or an operation has no route."""
    paths: dict[str, dict] = {}
    seen = set()
    for route in app.router.routes():
        if route.method in ("HEAD", "OPTIONS") or route.resource is None:
            continue
        path = route.resource.canonical
        key = (route.method, path)
        assert key in OPERATIONS, f"route {route.method} {path} has no OpenAPI operation"
        seen.add(key)
        paths.setdefault(path, {})[route.method.lower()] = OPERATIONS[key]
    missing = set(OPERATIONS) - seen
    assert not missing, f"OpenAPI operations without a route: {sorted(missing)}"
    return {
        "openapi": "3.1.0",
        "info": {"title": "Magnetar HTTP gateway", "version": __version__,
                 "description": "Produce and consume over HTTP; shared subscriptions as work queues; receipts "
                                "any gateway instance can settle. Errors are {code, error, message, retriable} "
                                "with catalogue codes."},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": schemas(config), "securitySchemes": SECURITY_SCHEMES},
        **({"security": [{PROVIDER_SCHEMES[name]: []} for name in config.providers]}
           if config.authentication_enabled else {}),
    }


# How callers authenticate when the gateway runs with --authentication-enabled
# (gateway/auth.py): the document then requires one of the schemes of its providers.
SECURITY_SCHEMES = {
    "token": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
              "description": "provider token: a Pulsar token (JWT) the brokers accept"},
    "basic": {"type": "http", "scheme": "basic",
              "description": "provider basic: a user and password of the brokers' password file"},
    "clientCertificate": {"type": "mutualTLS",
                          "description": "provider tls: an HTTPS client certificate signed by "
                                         "--tls-trust-certs-file; its CN is the role"},
}
PROVIDER_SCHEMES = {"token": "token", "basic": "basic", "tls": "clientCertificate"}
