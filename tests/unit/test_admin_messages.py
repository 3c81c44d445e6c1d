"""How the admin API answers a stored entry (broker/admin/messages.py ``entry_response``):
the payload uncompressed, the metadata in Pulsar's X-Pulsar-* headers.

Proves that: a single message answers its payload with id, publish time (ISO 8601,
UTC), producer, sequence id, properties as one JSON header, key and ordering key; a
ZSTD-compressed batch answers the uncompressed batch payload with its message count;
a non-ASCII producer name is percent-encoded; an entry whose checksum does not match is
a broker error naming the position, not a crash.
"""

from __future__ import annotations

import base64
import json
import zlib

import pytest

from broker.admin.messages import entry_response
from common.errors import BrokerError
from common.position import Position
from protocol.codec import encode_stored
from protocol.proto import pulsar_api_pb2 as pb


def _metadata(**fields) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name=fields.pop("producer_name", "writer-1"), sequence_id=41,
                                  publish_time=1_795_830_000_123, **fields)
    return metadata


def test_a_single_message_answers_its_payload_and_metadata():
    metadata = _metadata(partition_key="customer-7", ordering_key=b"\x01\x02", event_time=1_795_830_000_000,
                         properties=[pb.KeyValue(key="trace id", value="t-1"), pb.KeyValue(key="n", value="é")])
    response = entry_response(Position(12, 3), encode_stored(metadata, b"hello"))
    assert response.body == b"hello"
    assert response.content_type == "application/octet-stream"
    headers = response.headers
    assert headers["X-Pulsar-Message-ID"] == "12:3"
    assert headers["X-Pulsar-publish-time"] == "2026-11-28T01:40:00.123+0000"
    assert headers["X-Pulsar-event-time"] == "2026-11-28T01:40:00.000+0000"
    assert headers["X-Pulsar-producer-name"] == "writer-1" and headers["X-Pulsar-sequence-id"] == "41"
    assert json.loads(headers["X-Pulsar-PROPERTY"]) == {"trace id": "t-1", "n": "é"}
    assert headers["X-Pulsar-PROPERTY"].isascii()
    assert headers["X-Pulsar-partition-key"] == "customer-7"
    assert base64.b64decode(headers["X-Pulsar-Base64-ordering-key"]) == b"\x01\x02"
    assert "X-Pulsar-num-batch-message" not in headers


def test_a_compressed_batch_answers_uncompressed_with_its_count():
    batch_payload = b"\x00\x00\x00\x04" + b"meta" + b"x" * 300          # opaque here: passed through
    metadata = _metadata(num_messages_in_batch=3, compression=pb.ZLIB, uncompressed_size=len(batch_payload))
    response = entry_response(Position(5, 0), encode_stored(metadata, zlib.compress(batch_payload)))
    assert response.body == batch_payload
    assert response.headers["X-Pulsar-num-batch-message"] == "3"
    assert response.headers["X-Pulsar-batch-size"] == str(len(batch_payload))


def test_odd_producer_names_are_encoded_and_a_corrupt_entry_is_named():
    response = entry_response(Position(1, 1), encode_stored(_metadata(producer_name="écrivain\n"), b"x"))
    assert response.headers["X-Pulsar-producer-name"] == "%C3%A9crivain%0A"
    stored = bytearray(encode_stored(_metadata(), b"payload"))
    stored[-1] ^= 0xFF
    with pytest.raises(BrokerError, match="entry 9:9 does not decode"):
        entry_response(Position(9, 9), bytes(stored))
