"""Reading the MessageMetadata of a stored entry on the dispatch path
(broker/codec.py stored_metadata).

What it proves: the dispatch-path parse trusts what SEND validated (decode_stored
refuses metadata that lacks required fields; stored_metadata, run for every entry
dispatched, parses it without checking that again), still returns the fields the
dispatchers read, and still raises MalformedFrame, and nothing else, for bytes that
are no stored payload or do not parse.

How: stored payloads assembled by hand (encode_stored refuses incomplete metadata).
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from protocol.codec import decode_stored, encode_stored, stored_metadata
from protocol.proto import pulsar_api_pb2 as pb
from common.errors import MalformedFrame


def _stored(metadata_bytes: bytes, payload: bytes = b"payload") -> bytes:
    sized = struct.pack(">I", len(metadata_bytes)) + metadata_bytes
    return struct.pack(">HI", 0x0E01, crc32c.crc32c(payload, crc32c.crc32c(sized))) + sized + payload


def test_dispatch_parse_returns_what_send_stored():
    """The fields dispatchers use come back as the producer wrote them."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1_700_000_000_000,
                                  num_messages_in_batch=4, partition_key="k", ordering_key=b"o")
    parsed = stored_metadata(encode_stored(metadata, b"x"))
    assert parsed == metadata
    assert parsed.num_messages_in_batch == 4 and parsed.ordering_key == b"o" and parsed.partition_key == "k"
    assert stored_metadata(memoryview(encode_stored(metadata, b"x"))) == metadata


def test_dispatch_parse_does_not_validate_again():
    """Metadata without its required fields is refused on SEND (decode_stored) but
    parsed as trusted on dispatch (before, every dispatch re-ran the full validation)."""
    partial = pb.MessageMetadata(num_messages_in_batch=2).SerializePartialToString()
    stored = _stored(partial)
    with pytest.raises(MalformedFrame):
        decode_stored(stored)
    assert stored_metadata(stored).num_messages_in_batch == 2


@pytest.mark.parametrize("stored", [
    b"",                                            # no head
    b"\x0e\x01\x00\x00\x00\x00\x00\x00",            # head cut short
    b"\x0e\x02" + bytes(8),                         # wrong magic
    b"\x0e\x01" + bytes(4) + struct.pack(">I", 99) + b"short",   # metadata_size past the end
    _stored(b"\xff\xff\xff"),                       # metadata that does not parse
])
def test_dispatch_parse_refuses_what_is_no_stored_payload(stored: bytes):
    """Bytes that are no stored payload raise MalformedFrame, nothing else."""
    with pytest.raises(MalformedFrame):
        stored_metadata(stored)
