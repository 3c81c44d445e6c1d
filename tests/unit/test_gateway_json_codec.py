"""The gateway's JSON (gateway/json_codec.py) and its agreement with the OpenAPI schemas.

What it proves: valid messages, batches, pulls and settle requests parse to the values
meant; every kind of bad input raises InvalidArgument naming the field, or
LimitExceeded naming the limit, and nothing else (also for arbitrary JSON, by
hypothesis); rendered messages use text when they can and base64 otherwise; and the
documents the gateway accepts and renders validate against the published schemas
(jsonschema_rs, which schemathesis brings).
"""

from __future__ import annotations

import base64

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.messages import MessageId, ReceivedMessage
from common.errors import InvalidArgument, LimitExceeded
from gateway import json_codec
from gateway.app import default_config
from gateway.openapi import schemas

SCHEMAS = schemas(default_config())
NOW_MS = 1_700_000_000_000


def _resolved(name: str) -> dict:
    """The schema with its $refs inlined (the components are a flat, acyclic set)."""
    def inline(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(SCHEMAS[node["$ref"].rsplit("/", 1)[1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node
    return inline(SCHEMAS[name])


def parse_message(document):
    return json_codec.parse_message(document, "body", bytes_max=1000, now_unix_ms=NOW_MS)


def test_a_full_message_parses():
    document = {"payload": "aGk=", "encoding": "base64", "key": "k", "ordering_key": "o", "properties": {"a": "b"},
                "event_time_ms": 5, "deliver_after_ms": 1000}
    assert jsonschema_rs.validator_for(_resolved("OutgoingMessage")).is_valid(document)
    message = parse_message(document)
    assert message.payload == b"hi" and message.key == "k" and message.ordering_key == b"o"
    assert message.properties == {"a": "b"} and message.event_time_ms == 5
    assert message.deliver_at_ms == NOW_MS + 1000


@pytest.mark.parametrize("document, error, words", [
    ({}, InvalidArgument, "body.payload is required"),
    ({"payload": 1}, InvalidArgument, "payload must be a string"),
    ({"payload": "x", "encoding": "hex"}, InvalidArgument, "encoding must be one of"),
    ({"payload": "%%%", "encoding": "base64"}, InvalidArgument, "not valid base64"),
    ({"payload": "x", "properties": []}, InvalidArgument, "properties must be an object"),
    ({"payload": "x", "properties": {"a": None}}, InvalidArgument, "must be a string"),
    ({"payload": "x", "event_time_ms": -1}, InvalidArgument, "must be >= 0"),
    ({"payload": "x", "event_time_ms": True}, InvalidArgument, "must be an integer"),
    ({"payload": "x", "deliver_at_ms": 1, "deliver_after_ms": 1}, InvalidArgument, "both"),
    ({"payload": "x", "extra": 1}, InvalidArgument, "unknown field 'extra'"),
    ({"payload": "\ud800"}, InvalidArgument, "lone surrogate"),
    ({"payload": "x" * 1001}, LimitExceeded, "body.payload bytes"),
    ({"payload": base64.b64encode(b"x" * 1001).decode(), "encoding": "base64"}, LimitExceeded, "bytes"),
    ("text", InvalidArgument, "must be a JSON object"),
])
def test_bad_messages_name_their_field(document, error, words):
    with pytest.raises(error, match=words):
        parse_message(document)


def test_batches_are_bounded():
    messages, sequenced = json_codec.parse_batch({"messages": [{"payload": "a"}] * 3}, messages_max=3,
                                                 bytes_max=10, now_unix_ms=0)
    assert len(messages) == 3 and sequenced is None
    with pytest.raises(LimitExceeded, match="messages per request 4 exceeds the limit of 3"):
        json_codec.parse_batch({"messages": [{"payload": "a"}] * 4}, messages_max=3, bytes_max=10, now_unix_ms=0)
    with pytest.raises(InvalidArgument, match=r"messages\[1\].payload"):
        json_codec.parse_batch({"messages": [{"payload": "a"}, {}]}, messages_max=3, bytes_max=10, now_unix_ms=0)


def test_an_idempotent_batch_names_its_producer_and_numbers_every_message():
    messages, sequenced = json_codec.parse_batch(
        {"producer": "orders-1", "messages": [{"payload": "a", "sequence_id": 4}, {"payload": "b", "sequence_id": 9}]},
        messages_max=3, bytes_max=10, now_unix_ms=0)
    assert [m.payload for m in messages] == [b"a", b"b"]
    assert sequenced == json_codec.Sequenced("orders-1", [4, 9])
    # Not increasing: that message answers its own error, the others are stored (the
    # document cannot say "increasing", so the request as a whole is not refused).
    _, sequenced = json_codec.parse_batch(
        {"producer": "p", "messages": [{"payload": "a", "sequence_id": 2}, {"payload": "b", "sequence_id": 2},
                                       {"payload": "c", "sequence_id": 3}]},
        messages_max=3, bytes_max=10, now_unix_ms=0)
    assert sequenced is not None and list(sequenced.refused) == [1]
    assert "messages[1].sequence_id 2 is not above" in sequenced.refused[1].message
    for body, words in [
        ({"producer": "p", "messages": [{"payload": "a"}]}, r"messages\[0\].sequence_id is required"),
        ({"producer": "p", "messages": [{"payload": "a", "sequence_id": -1}]}, "must be >= 0"),
        ({"producer": "p", "messages": [{"payload": "a", "sequence_id": True}]}, "must be an integer"),
        ({"producer": "p", "messages": [{"payload": "a", "sequence_id": 2**63}]}, "must be <="),
        ({"producer": "", "messages": [{"payload": "a", "sequence_id": 1}]}, "must not be empty"),
        ({"producer": "a\nb", "messages": [{"payload": "a", "sequence_id": 1}]}, "control character"),
        ({"producer": 7, "messages": [{"payload": "a", "sequence_id": 1}]}, "must be a string"),
        ({"producer": "x" * 257, "messages": [{"payload": "a", "sequence_id": 1}]}, "longer than 256"),
    ]:
        with pytest.raises(InvalidArgument, match=words):
            json_codec.parse_batch(body, messages_max=3, bytes_max=10, now_unix_ms=0)


def test_one_idempotent_message_needs_both_producer_and_sequence_id():
    message, sequenced = json_codec.parse_one({"payload": "a", "producer": "p", "sequence_id": 0}, bytes_max=10,
                                              now_unix_ms=0)
    assert message.payload == b"a" and sequenced == json_codec.Sequenced("p", [0])
    assert json_codec.parse_one({"payload": "a"}, bytes_max=10, now_unix_ms=0)[1] is None
    with pytest.raises(InvalidArgument, match="sequence_id needs body.producer"):
        json_codec.parse_one({"payload": "a", "sequence_id": 0}, bytes_max=10, now_unix_ms=0)
    with pytest.raises(InvalidArgument, match="sequence_id is required"):
        json_codec.parse_one({"payload": "a", "producer": "p"}, bytes_max=10, now_unix_ms=0)
    # A message of the plain forms knows neither field; a stream names its producer in
    # the query, and its lines then carry a sequence_id each.
    with pytest.raises(InvalidArgument, match="unknown field 'producer'"):
        parse_message({"payload": "a", "producer": "p"})
    assert json_codec.parse_sequenced_line({"payload": "a", "sequence_id": 3}, "line 1", bytes_max=10,
                                           now_unix_ms=0)[1] == 3
    with pytest.raises(InvalidArgument, match="line 1.sequence_id is required"):
        json_codec.parse_sequenced_line({"payload": "a"}, "line 1", bytes_max=10, now_unix_ms=0)
    assert json_codec.parse_producer_name(None) is None
    with pytest.raises(InvalidArgument, match="control character"):
        json_codec.parse_producer_name("a\x00b")


PULL_LIMITS = dict(messages_max=100, wait_ms_max=30_000, lease_ms_min=100, lease_ms_max=60_000,
                   lease_ms_default=30_000)


def test_pull_defaults_and_modes():
    spec = json_codec.parse_pull(None, **PULL_LIMITS)
    assert (spec.mode, spec.max_messages, spec.wait_ms, spec.lease_ms) == ("shared", 1, 0, 30_000)
    spec = json_codec.parse_pull({"mode": "broadcast", "member": "m1", "max_messages": 100}, **PULL_LIMITS)
    assert spec.member == "m1" and spec.max_messages == 100
    with pytest.raises(LimitExceeded, match="max_messages 101"):
        json_codec.parse_pull({"max_messages": 101}, **PULL_LIMITS)
    with pytest.raises(LimitExceeded, match="wait_ms"):
        json_codec.parse_pull({"wait_ms": 30_001}, **PULL_LIMITS)
    with pytest.raises(InvalidArgument, match="consumer is required in exclusive"):
        json_codec.parse_pull({"mode": "exclusive"}, **PULL_LIMITS)
    with pytest.raises(InvalidArgument, match="only for broadcast"):
        json_codec.parse_pull({"member": "m"}, **PULL_LIMITS)
    # As the document's pattern says: no ':' at all, no control characters.
    for name in ("a::b", "a:b", "a\tb"):
        with pytest.raises(InvalidArgument, match="may not contain ':' or control characters"):
            json_codec.parse_pull({"mode": "failover", "consumer": name}, **PULL_LIMITS)


def test_settle_requests():
    assert json_codec.parse_nack({"receipts": ["a"], "delay_ms": 5}) == (["a"], 5)
    assert json_codec.parse_extend({"receipts": ["a"]}, lease_ms_min=1, lease_ms_max=9, lease_ms_default=7) == (["a"], 7)
    with pytest.raises(LimitExceeded, match="receipts per request"):
        json_codec.parse_receipts({"receipts": ["a"] * 1001})
    with pytest.raises(InvalidArgument, match="non-empty array"):
        json_codec.parse_receipts({"receipts": []})


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.sampled_from(["payload", "encoding", "key", "properties", "messages",
                                                       "mode", "max_messages", "receipts", "producer",
                                                       "sequence_id", "x"]), children,
                                      max_size=5), max_leaves=20))
def test_arbitrary_json_raises_only_catalogue_errors(document):
    """Whatever JSON arrives, the parsers answer with a value or one of two errors."""
    for parse in (parse_message,
                  lambda d: json_codec.parse_batch(d, messages_max=5, bytes_max=100, now_unix_ms=0),
                  lambda d: json_codec.parse_one(d, bytes_max=100, now_unix_ms=0),
                  lambda d: json_codec.parse_pull(d, **PULL_LIMITS),
                  json_codec.parse_receipts, json_codec.parse_subscription):
        try:
            parse(document)
        except (InvalidArgument, LimitExceeded):
            pass


def test_rendered_messages_match_the_schema():
    """Text when the payload is UTF-8, else base64; the document validates."""
    validate = jsonschema_rs.validator_for(_resolved("ReceivedMessage"))
    for payload, encoding in ((b"hello", "text"), (b"\xff\x00", "base64")):
        message = ReceivedMessage(MessageId(1, 2, -1, 0, 2), payload, "k", b"\xfe", {"a": "b"}, 7, 8, "p", 9,
                                  deliver_at_ms=10)
        rendered = json_codec.render_message(message, "text", receipt="r", attempt=1, lease_deadline_ms=11)
        assert rendered["encoding"] == encoding
        assert rendered["message_id"] == "1:2:-1:0"
        validate.validate(rendered)
    assert json_codec.render_payload(b"hi", "base64") == ("aGk=", "base64")
