"""The admin API's entry answer (protocol/admin_entry.py), written as the broker writes
it and read back as the gateway and the CLI read it.

Proves that: a message stored alone comes back with payload, key, properties (any
key, as one JSON header), publish and event time to the millisecond, producer (even
outside ASCII) and sequence id; a batch comes back as its messages, each with its own
key, properties and event time, sharing the entry's publish time and producer; times
print as ISO 8601 UTC and parse back; a bad time reads as absent.
"""

from __future__ import annotations

from client.messages import OutgoingMessage, batch_payload
from protocol.admin_entry import entry_headers, entry_messages, time_ms, time_text
from protocol.proto import pulsar_api_pb2 as pb

PUBLISHED_MS = 1_795_830_000_123


def test_a_message_stored_alone_reads_back_whole():
    metadata = pb.MessageMetadata(producer_name="écrivain 1", sequence_id=41, publish_time=PUBLISHED_MS,
                                  event_time=PUBLISHED_MS - 5, partition_key="customer/7",
                                  properties=[pb.KeyValue(key="trace id", value="t-1")])
    headers = entry_headers(12, 3, metadata, 5)
    assert all(value.isascii() for value in headers.values())
    (message,) = entry_messages(headers, b"hello")
    assert (message.ledger_id, message.entry_id, message.batch_index) == (12, 3, -1)
    assert message.payload == b"hello" and message.key == "customer/7"
    assert message.properties == {"trace id": "t-1"}
    assert (message.publish_time_ms, message.event_time_ms) == (PUBLISHED_MS, PUBLISHED_MS - 5)
    assert (message.producer, message.sequence_id) == ("écrivain 1", 41)


def test_a_batch_reads_back_as_its_messages():
    metadata, payload = batch_payload("writer", 7, PUBLISHED_MS, [
        OutgoingMessage(b"a", key="k1", properties={"i": "0"}, event_time_ms=1_000),
        OutgoingMessage(b"b", properties={"i": "1"})])
    messages = entry_messages(entry_headers(5, 0, metadata, len(payload)), payload)
    assert [(m.payload, m.key, m.properties, m.batch_index, m.batch_size) for m in messages] == [
        (b"a", "k1", {"i": "0"}, 0, 2), (b"b", None, {"i": "1"}, 1, 2)]
    assert [m.event_time_ms for m in messages] == [1_000, None]
    assert {(m.publish_time_ms, m.producer, m.sequence_id) for m in messages} == {(PUBLISHED_MS, "writer", 7)}


def test_times_print_as_iso_utc_and_parse_back():
    assert time_text(PUBLISHED_MS) == "2026-11-28T01:40:00.123+0000"
    assert time_ms(time_text(PUBLISHED_MS)) == PUBLISHED_MS
    assert time_ms("yesterday") is None and time_ms(None) is None
