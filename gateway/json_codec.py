"""The JSON of the HTTP API: request bodies checked field by field into typed values,
and messages rendered for responses. Pure: no aiohttp, no clock.

Every check raises InvalidArgument (a 400) naming the field by its path
(``messages[3].payload``) or LimitExceeded (a 413) naming the limit, and nothing else,
whatever the input: the HTTP shell turns those into the error document. The shapes are
the ones gateway/openapi.py publishes; tests/unit/test_gateway_json_codec.py checks the
two agree on examples, and the schemathesis run checks it on generated requests.

Payloads travel as text (``"encoding": "text"``, UTF-8) or base64
(``"encoding": "base64"``, standard alphabet with padding). A pull renders a message as
text when asked for text and its bytes are valid UTF-8, otherwise as base64, and says
which in each message's ``encoding``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Any

from client.messages import OutgoingMessage, ReceivedMessage
from common.errors import InvalidArgument, LimitExceeded
from gateway.receipts import MODES

ENCODINGS = ("text", "base64")
INITIAL_POSITIONS = ("earliest", "latest")
# Names (consumers, members, subscriptions, property keys) are bounded like Pulsar's.
NAME_CHARS_MAX = 256
PROPERTIES_MAX = 64
PROPERTY_CHARS_MAX = 4096
RECEIPTS_PER_REQUEST_MAX = 1_000
# A nack may ask to come back after at most this long (like a lease).
NACK_DELAY_MS_MAX = 12 * 3600 * 1000
# Deliver-at and event times are Unix ms; beyond year 9999 is surely a mistake.
TIME_MS_MAX = 253_402_300_799_999


# Whitespace as Python's str.isspace (and so common/topic_name.py) has it, spelled out
# for the document's patterns: a regex's \s differs between ECMAScript and Python
# (U+0085, U+001C-U+001F). tests/unit/test_gateway_openapi.py checks the two agree.
WHITESPACE_CLASS = r"\x09-\x0d\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_TENANT_CHARS = r"[-=:.A-Za-z0-9_]+"
DEAD_LETTER_TOPIC_PATTERN = (f"^(?:(?:persistent://)?{_TENANT_CHARS}/{_TENANT_CHARS}/)?"
                             f"[^/{WHITESPACE_CLASS}\\x00-\\x1f\\x7f]+$")
DEAD_LETTER_TOPIC_CHARS_MAX = 255
_DEAD_LETTER_TOPIC = re.compile(DEAD_LETTER_TOPIC_PATTERN)


def _dead_letter_topic(obj: dict, path: str) -> str | None:
    name = _string(obj, "dead_letter_topic", path, chars_max=DEAD_LETTER_TOPIC_CHARS_MAX)
    if name is not None and not _DEAD_LETTER_TOPIC.fullmatch(name):
        raise InvalidArgument(f"{path}.dead_letter_topic {name[:64]!r} is not a topic name: name, "
                              "tenant/namespace/name or persistent://tenant/namespace/name")
    return name


_KNOWN_SETS: dict[tuple[str, ...], frozenset[str]] = {}


def _object(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{path} must be a JSON object")
    return value


def _no_unknown(obj: dict, known: tuple[str, ...], path: str) -> None:
    if obj.keys() <= _KNOWN_SETS.setdefault(known, frozenset(known)):
        return
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise InvalidArgument(f"{path} has unknown field {unknown[0]!r}")


def _string(obj: dict, name: str, path: str, *, required: bool = False, chars_max: int = NAME_CHARS_MAX,
            allow_empty: bool = False) -> str | None:
    if name not in obj or obj[name] is None:
        if required:
            raise InvalidArgument(f"{path}.{name} is required")
        return None
    value = obj[name]
    if not isinstance(value, str):
        raise InvalidArgument(f"{path}.{name} must be a string")
    if not value and not allow_empty:
        raise InvalidArgument(f"{path}.{name} must not be empty")
    if len(value) > chars_max:
        raise InvalidArgument(f"{path}.{name} is longer than {chars_max} characters")
    return value


def _integer(obj: dict, name: str, path: str, *, default: int | None, minimum: int, maximum: int,
             limit: str | None = None) -> int | None:
    if name not in obj or obj[name] is None:
        return default
    value = obj[name]
    if type(value) is float and value.is_integer():
        value = int(value)   # JSON Schema's integer: 5.0 is one
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{path}.{name} must be an integer")
    if value < minimum:
        raise InvalidArgument(f"{path}.{name} must be >= {minimum}")
    if value > maximum:
        if limit is not None:
            raise LimitExceeded(limit, value, maximum)
        raise InvalidArgument(f"{path}.{name} must be <= {maximum}")
    return value


def _choice(obj: dict, name: str, path: str, choices: tuple[str, ...], default: str) -> str:
    value = _string(obj, name, path)
    if value is None:
        return default
    if value not in choices:
        raise InvalidArgument(f"{path}.{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


# --- produce ---------------------------------------------------------------------------------------

MESSAGE_FIELDS = ("payload", "encoding", "key", "ordering_key", "properties", "event_time_ms", "deliver_at_ms",
                  "deliver_after_ms")


def decode_payload(text: str, encoding: str, path: str, bytes_max: int) -> bytes:
    if encoding == "text":
        # Every character is at least one byte: a longer text is too large already.
        if len(text) > bytes_max:
            raise LimitExceeded(f"{path} bytes", len(text), bytes_max)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{path} is not valid Unicode text (lone surrogate)") from None
    else:
        if len(text) > (bytes_max + 2) // 3 * 4 + 4:
            raise LimitExceeded(f"{path} bytes", len(text) * 3 // 4, bytes_max)
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"{path} is not valid base64") from None
    if len(data) > bytes_max:
        raise LimitExceeded(f"{path} bytes", len(data), bytes_max)
    return data


def parse_message(value: Any, path: str, *, bytes_max: int, now_unix_ms: int) -> OutgoingMessage:
    # The common case first, cheaply (the profile of batched produce showed the checks
    # below per message): a text payload and nothing else.
    if type(value) is dict and len(value) == 1 and type(value.get("payload")) is str:
        text = value["payload"]
        if len(text) <= bytes_max:
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                pass   # the full checks name the problem
            else:
                if len(data) <= bytes_max:
                    return OutgoingMessage(data)
    obj = _object(value, path)
    _no_unknown(obj, MESSAGE_FIELDS, path)
    if "payload" not in obj or obj["payload"] is None:
        raise InvalidArgument(f"{path}.payload is required")
    if not isinstance(obj["payload"], str):
        raise InvalidArgument(f"{path}.payload must be a string (set encoding to base64 for bytes)")
    encoding = _choice(obj, "encoding", path, ENCODINGS, "text")
    payload = decode_payload(obj["payload"], encoding, f"{path}.payload", bytes_max)
    key = _string(obj, "key", path, chars_max=PROPERTY_CHARS_MAX, allow_empty=True)
    ordering_key = _string(obj, "ordering_key", path, chars_max=PROPERTY_CHARS_MAX)
    properties: dict[str, str] = {}
    if obj.get("properties") is not None:
        raw = obj["properties"]
        if not isinstance(raw, dict):
            raise InvalidArgument(f"{path}.properties must be an object of strings")
        if len(raw) > PROPERTIES_MAX:
            raise InvalidArgument(f"{path}.properties has more than {PROPERTIES_MAX} entries")
        for name, item in raw.items():
            if not name or len(name) > NAME_CHARS_MAX:
                raise InvalidArgument(f"{path}.properties has a name that is empty or too long")
            if not isinstance(item, str):
                raise InvalidArgument(f"{path}.properties[{name!r}] must be a string")
            if len(item) > PROPERTY_CHARS_MAX:
                raise InvalidArgument(f"{path}.properties[{name!r}] is longer than {PROPERTY_CHARS_MAX}")
            properties[name] = item
    for text in (key, ordering_key, *properties, *properties.values()):
        if text is not None:
            _check_unicode(text, path)
    event_time = _integer(obj, "event_time_ms", path, default=0, minimum=0, maximum=TIME_MS_MAX)
    deliver_at = _integer(obj, "deliver_at_ms", path, default=None, minimum=0, maximum=TIME_MS_MAX)
    deliver_after = _integer(obj, "deliver_after_ms", path, default=None, minimum=0, maximum=TIME_MS_MAX)
    if deliver_at is not None and deliver_after is not None:
        raise InvalidArgument(f"{path} has both deliver_at_ms and deliver_after_ms")
    if deliver_after is not None:
        deliver_at = now_unix_ms + deliver_after
    assert event_time is not None
    return OutgoingMessage(payload, key=key, ordering_key=ordering_key.encode() if ordering_key else None,
                           properties=properties, event_time_ms=event_time, deliver_at_ms=deliver_at)


def _check_unicode(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{path} holds text that is not valid Unicode (lone surrogate)") from None


# Idempotent produce: a producer name (the broker's deduplication is per producer name)
# and a sequence id per message. Sequence ids are signed 64-bit on the wire's receipts
# (-1 means "none yet"), so they stay below 2**63.
PRODUCER_NAME_CHARS_MAX = 256
SEQUENCE_ID_MAX = 2**63 - 2


@dataclass(frozen=True, slots=True)
class Sequenced:
    """An idempotent produce request: the producer and each message's sequence id."""

    producer: str
    sequence_ids: list[int]
    # Messages of a batch whose sequence id is not above the one before it: each answers
    # its own error, the others are stored (the document cannot say "increasing").
    refused: dict[int, InvalidArgument] = field(default_factory=dict)


def _producer_name(obj: dict, path: str) -> str:
    name = _string(obj, "producer", path, required=True, chars_max=PRODUCER_NAME_CHARS_MAX)
    assert name is not None
    _check_unicode(name, path)
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in name):
        raise InvalidArgument(f"{path}.producer holds a control character")
    return name


def _sequence_id(obj: dict, path: str) -> int:
    value = _integer(obj, "sequence_id", path, default=None, minimum=0, maximum=SEQUENCE_ID_MAX)
    if value is None:
        raise InvalidArgument(f"{path}.sequence_id is required with a producer (idempotent produce)")
    return value


def parse_one(body: Any, *, bytes_max: int, now_unix_ms: int) -> tuple[OutgoingMessage, Sequenced | None]:
    """The body of ``POST /message``: a message, with ``producer`` and ``sequence_id``
    for an idempotent produce (both or neither)."""
    obj = _object(body, "body")
    if "producer" not in obj and "sequence_id" not in obj:
        return parse_message(obj, "body", bytes_max=bytes_max, now_unix_ms=now_unix_ms), None
    if "producer" not in obj:
        raise InvalidArgument("body.sequence_id needs body.producer (idempotent produce)")
    sequenced = Sequenced(_producer_name(obj, "body"), [_sequence_id(obj, "body")])
    rest = {name: value for name, value in obj.items() if name not in ("producer", "sequence_id")}
    return parse_message(rest, "body", bytes_max=bytes_max, now_unix_ms=now_unix_ms), sequenced


def parse_producer_name(value: str | None) -> str | None:
    """A ``producer`` query parameter (the NDJSON stream's idempotent form), checked as
    the body field is; None when absent."""
    return None if value is None else _producer_name({"producer": value}, "query")


def parse_sequenced_line(document: Any, path: str, *, bytes_max: int, now_unix_ms: int,
                         ) -> tuple[OutgoingMessage, int]:
    """One line of an idempotent stream: a message with its ``sequence_id``."""
    obj = _object(document, path)
    sequence_id = _sequence_id(obj, path)
    rest = {name: value for name, value in obj.items() if name != "sequence_id"}
    return parse_message(rest, path, bytes_max=bytes_max, now_unix_ms=now_unix_ms), sequence_id


def parse_batch(body: Any, *, messages_max: int, bytes_max: int, now_unix_ms: int,
                ) -> tuple[list[OutgoingMessage], Sequenced | None]:
    """The body of ``POST /messages``; with ``producer``, every message carries a
    ``sequence_id``, increasing through the request."""
    obj = _object(body, "body")
    _no_unknown(obj, ("messages", "producer"), "body")
    messages = obj.get("messages")
    if not isinstance(messages, list):
        raise InvalidArgument("body.messages must be an array of messages")
    if not messages:
        raise InvalidArgument("body.messages must hold at least one message")
    if len(messages) > messages_max:
        raise LimitExceeded("messages per request", len(messages), messages_max)
    if obj.get("producer") is None:
        parsed = []
        for index, item in enumerate(messages):
            # parse_message's common case inline (a text payload and nothing else), so
            # that no path is formatted for a message that needs none.
            if type(item) is dict and len(item) == 1:
                text = item.get("payload")
                if type(text) is str and len(text) <= bytes_max:
                    try:
                        data = text.encode("utf-8")
                    except UnicodeEncodeError:
                        pass   # parse_message names the problem
                    else:
                        if len(data) <= bytes_max:
                            parsed.append(OutgoingMessage(data))
                            continue
            parsed.append(parse_message(item, f"messages[{index}]", bytes_max=bytes_max, now_unix_ms=now_unix_ms))
        return parsed, None
    producer = _producer_name(obj, "body")
    parsed: list[OutgoingMessage] = []
    sequence_ids: list[int] = []
    refused: dict[int, InvalidArgument] = {}
    highest = -1
    for index, item in enumerate(messages):
        path = f"messages[{index}]"
        item = _object(item, path)
        sequence_id = _sequence_id(item, path)
        if sequence_id <= highest:
            refused[index] = InvalidArgument(f"{path}.sequence_id {sequence_id} is not above the one before it "
                                             f"({highest}): a producer's sequence ids increase; not stored")
        highest = max(highest, sequence_id)
        sequence_ids.append(sequence_id)
        rest = {name: value for name, value in item.items() if name != "sequence_id"}
        parsed.append(parse_message(rest, path, bytes_max=bytes_max, now_unix_ms=now_unix_ms))
    return parsed, Sequenced(producer, sequence_ids, refused)


# --- subscriptions and pulls ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    mode: str
    initial_position: str
    member: str | None
    consumer: str | None


def parse_subscription(body: Any) -> SubscriptionSpec:
    obj = _object(body if body is not None else {}, "body")
    _no_unknown(obj, ("mode", "initial_position", "member", "consumer"), "body")
    mode = _choice(obj, "mode", "body", MODES, "shared")
    position = _choice(obj, "initial_position", "body", INITIAL_POSITIONS, "latest")
    member = _string(obj, "member", "body")
    consumer = _string(obj, "consumer", "body")
    _check_consumer(mode, member, consumer, "body")
    return SubscriptionSpec(mode, position, member, consumer)


def _check_consumer(mode: str, member: str | None, consumer: str | None, path: str) -> None:
    if mode == "broadcast" and member is None:
        raise InvalidArgument(f"{path}.member is required for a broadcast subscription (each member gets "
                              "every message)")
    if mode != "broadcast" and member is not None:
        raise InvalidArgument(f"{path}.member is only for broadcast subscriptions")
    if mode in ("key_shared", "exclusive", "failover") and consumer is None:
        raise InvalidArgument(f"{path}.consumer is required in {mode} mode (it names the consumer that keeps "
                              "its keys or its turn)")
    for name in (member, consumer):
        if name is not None:
            check_consumer_name(name, path)


_CONSUMER_NAME_BAD = re.compile(r"[:\x00-\x1f\x7f]")


def check_consumer_name(name: str, path: str) -> None:
    """A consumer or member name: no ':' (names are joined with it) and no control
    characters, as the document says."""
    _check_unicode(name, path)
    if _CONSUMER_NAME_BAD.search(name):
        raise InvalidArgument(f"{path}: consumer and member names may not contain ':' or control characters")


@dataclass(frozen=True, slots=True)
class PullSpec:
    mode: str
    member: str | None
    consumer: str | None
    max_messages: int
    wait_ms: int
    lease_ms: int
    encoding: str
    initial_position: str
    max_deliveries: int | None
    dead_letter_topic: str | None
    ordered: bool = False


PULL_FIELDS = ("mode", "member", "consumer", "max_messages", "wait_ms", "lease_ms", "encoding", "initial_position",
               "max_deliveries", "dead_letter_topic", "ordered")


def parse_pull(body: Any, *, messages_max: int, wait_ms_max: int, lease_ms_min: int, lease_ms_max: int,
               lease_ms_default: int) -> PullSpec:
    obj = _object(body if body is not None else {}, "body")
    _no_unknown(obj, PULL_FIELDS, "body")
    mode = _choice(obj, "mode", "body", MODES, "shared")
    member = _string(obj, "member", "body")
    consumer = _string(obj, "consumer", "body")
    _check_consumer(mode, member, consumer, "body")
    max_messages = _integer(obj, "max_messages", "body", default=1, minimum=1, maximum=messages_max,
                            limit="max_messages")
    wait_ms = _integer(obj, "wait_ms", "body", default=0, minimum=0, maximum=wait_ms_max, limit="wait_ms")
    lease_ms = _integer(obj, "lease_ms", "body", default=lease_ms_default, minimum=lease_ms_min,
                        maximum=lease_ms_max, limit="lease_ms")
    encoding = _choice(obj, "encoding", "body", ENCODINGS, "text")
    position = _choice(obj, "initial_position", "body", INITIAL_POSITIONS, "latest")
    max_deliveries = _integer(obj, "max_deliveries", "body", default=None, minimum=1, maximum=1_000_000)
    dead_letter_topic = _dead_letter_topic(obj, "body")
    if dead_letter_topic is not None and max_deliveries is None:
        raise InvalidArgument("body.dead_letter_topic needs body.max_deliveries")
    ordered = obj.get("ordered", False)
    if ordered is None:
        ordered = False
    if not isinstance(ordered, bool):
        raise InvalidArgument("body.ordered must be true or false")
    assert max_messages is not None and wait_ms is not None and lease_ms is not None
    return PullSpec(mode, member, consumer, max_messages, wait_ms, lease_ms, encoding, position, max_deliveries,
                    dead_letter_topic, ordered)


# --- settling ------------------------------------------------------------------------------------------

def parse_receipts(body: Any, extra: tuple[str, ...] = ()) -> tuple[list[str], dict]:
    """The receipt handles of an ack, nack or extend request (checked one by one later,
    each with its own result), and the request's other fields."""
    obj = _object(body, "body")
    _no_unknown(obj, ("receipts", *extra), "body")
    receipts = obj.get("receipts")
    if not isinstance(receipts, list) or not receipts:
        raise InvalidArgument("body.receipts must be a non-empty array of receipt handles")
    if len(receipts) > RECEIPTS_PER_REQUEST_MAX:
        raise LimitExceeded("receipts per request", len(receipts), RECEIPTS_PER_REQUEST_MAX)
    for index, receipt in enumerate(receipts):
        if not isinstance(receipt, str):
            raise InvalidArgument(f"body.receipts[{index}] must be a string")
    return receipts, obj


def parse_nack(body: Any) -> tuple[list[str], int]:
    receipts, obj = parse_receipts(body, ("delay_ms",))
    delay_ms = _integer(obj, "delay_ms", "body", default=0, minimum=0, maximum=NACK_DELAY_MS_MAX, limit="delay_ms")
    assert delay_ms is not None
    return receipts, delay_ms


def parse_reject(body: Any) -> tuple[list[str], str | None]:
    receipts, obj = parse_receipts(body, ("dead_letter_topic",))
    return receipts, _dead_letter_topic(obj, "body")


def parse_extend(body: Any, *, lease_ms_min: int, lease_ms_max: int, lease_ms_default: int) -> tuple[list[str], int]:
    receipts, obj = parse_receipts(body, ("lease_ms",))
    lease_ms = _integer(obj, "lease_ms", "body", default=lease_ms_default, minimum=lease_ms_min,
                        maximum=lease_ms_max, limit="lease_ms")
    assert lease_ms is not None
    return receipts, lease_ms


# --- rendering ------------------------------------------------------------------------------------------

def render_payload(payload: bytes, encoding: str) -> tuple[str, str]:
    """(text, encoding actually used)."""
    if encoding == "text":
        try:
            return payload.decode("utf-8"), "text"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(payload).decode("ascii"), "base64"


def render_message(message: ReceivedMessage, encoding: str, *, receipt: str, attempt: int,
                   lease_deadline_ms: int) -> dict:
    payload, used = render_payload(message.payload, encoding)
    rendered: dict[str, Any] = {
        "message_id": str(message.message_id),
        "payload": payload,
        "encoding": used,
        "properties": message.properties,
        "publish_time_ms": message.publish_time_ms,
        "delivery_attempt": attempt,
        "receipt": receipt,
        "lease_deadline_ms": lease_deadline_ms,
    }
    if message.key is not None:
        rendered["key"] = message.key
    if message.ordering_key is not None:
        rendered["ordering_key"], _ = render_payload(message.ordering_key, "text")
    if message.event_time_ms:
        rendered["event_time_ms"] = message.event_time_ms
    if message.deliver_at_ms is not None:
        rendered["deliver_at_ms"] = message.deliver_at_ms
    if message.compression is not None:
        rendered["compression"] = message.compression
    return rendered
