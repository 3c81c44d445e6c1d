"""Batch payloads: many messages of one producer in the payload of a single SEND, stored
as one entry and dispatched as one MESSAGE. Pure: bytes in, views and protobufs out.

A payload is a batch exactly when its MessageMetadata has ``num_messages_in_batch`` set;
a batch of one still has it (set to 1) and still uses this layout. Otherwise the payload
is a single message's bytes. A batch payload, when uncompressed and unencrypted, is
``num_messages_in_batch`` records back to back, big-endian:

    offset  size  field                   meaning
    0       4     metadata_size           u32, size of the next field
    4       s     SingleMessageMetadata   protobuf; payload_size says how many bytes follow
    4+s     p     payload                 this message's bytes

The broker never needs to look inside a batch to store or dispatch it: it counts
messages from the metadata (:func:`message_count`) and sends the entry unchanged.
:func:`parse_batch` exists for what does need the messages (tests, the gateway, the
archive). It reads uncompressed, unencrypted payloads only and says so with a typed
error otherwise, because decompressing and decrypting are the consumer's job.

Every record must be whole and the records must fill the payload exactly: trailing bytes
mean the count or a size is wrong, so the batch is refused rather than half-read.
"""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

from google.protobuf.unknown_fields import UnknownFieldSet

from protocol.codec import parse_proto, parse_proto_or_none
from protocol.proto.pulsar_api_pb2 import CompressionType, MessageMetadata, SingleMessageMetadata
from common.errors import MalformedFrame

_U32 = struct.Struct(">I")
# The smallest record: a 4-byte size, then SingleMessageMetadata holding only
# payload_size = 0 (one tag byte and one varint byte), then no payload bytes.
RECORD_BYTES_MIN = _U32.size + 2
_COMPRESSION_FIELD_NUMBER = MessageMetadata.DESCRIPTOR.fields_by_name["compression"].number


class UnsupportedCompression(MalformedFrame):
    """The batch payload is compressed; parse_batch reads uncompressed payloads only."""

    def __init__(self, compression: int) -> None:
        self.compression = compression
        if compression in CompressionType.values():
            name = CompressionType.Name(compression)
        else:
            name = f"unknown codec {compression}"
        self.codec = name
        super().__init__(f"batch payload is {name}-compressed; only NONE can be parsed here")


class EncryptedPayload(MalformedFrame):
    """The batch payload is encrypted end to end; only a consumer holding the key can
    split it."""

    def __init__(self) -> None:
        super().__init__("batch payload is encrypted; it cannot be split without the key")


class SingleMessage(NamedTuple):
    """One message of a batch. A NamedTuple: one is made per message a batch holds, on
    every consumer's and the compactor's path (a frozen dataclass sets each field
    through object.__setattr__)."""

    batch_index: int
    metadata: "SingleMessageMetadata | PlainRecord"     # PlainRecord only with parse_batch(plain=True)
    payload: memoryview
    # The SingleMessageMetadata as it was stored (the archive keeps it to rebuild the
    # batch byte for byte; re-serializing ``metadata`` need not give the same bytes).
    metadata_bytes: memoryview | None = None


class PlainRecord(NamedTuple):
    """The SingleMessageMetadata of a message with nothing but its size and, maybe, its
    sequence id (no key, no properties, no event time): what both Magnetar's and the
    official clients write for a plain message. ``parse_batch(..., plain=True)`` reads
    such records by hand instead of through protobuf (a third of the cost of splitting)."""

    payload_size: int
    sequence_id: int | None


_PAYLOAD_SIZE_TAG = 0x18                 # field 3, varint
_SEQUENCE_ID_TAG = 0x40                  # field 8, varint
# Varints read by hand at most this long (payload_size < 2**28, sequence_id < 2**63), so
# the value is exactly what protobuf reads (longer ones are truncated by the field's
# width there); anything else goes to protobuf.
_SIZE_VARINT_BYTES_MAX = 4
_SEQUENCE_VARINT_BYTES_MAX = 9


def _plain_record(view: memoryview, start: int, end: int) -> PlainRecord | None:
    """``view[start:end]`` read as a record of exactly payload_size, then optionally
    sequence_id, each once; None for any other record (protobuf reads it)."""
    if end - start < 2 or view[start] != _PAYLOAD_SIZE_TAG:
        return None
    size, index = _varint(view, start + 1, min(end, start + 1 + _SIZE_VARINT_BYTES_MAX))
    if index < 0:
        return None
    if index == end:
        return tuple.__new__(PlainRecord, (size, None))
    if view[index] != _SEQUENCE_ID_TAG:
        return None
    sequence_id, index = _varint(view, index + 1, min(end, index + 1 + _SEQUENCE_VARINT_BYTES_MAX))
    return tuple.__new__(PlainRecord, (size, sequence_id)) if index == end else None


def _varint(view: memoryview, index: int, limit: int) -> tuple[int, int]:
    """The varint at ``view[index]`` ending before ``limit``, and the index after it;
    index -1 when it does not end there. One- and two-byte varints (most sizes and
    sequence ids of a batch) are read without the loop."""
    if index >= limit:
        return 0, -1
    byte = view[index]
    if byte < 0x80:
        return byte, index + 1
    value, shift = byte & 0x7F, 7
    index += 1
    while index < limit:
        byte = view[index]
        index += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index
        shift += 7
    return 0, -1


def is_batch(metadata: MessageMetadata) -> bool:
    return metadata.HasField("num_messages_in_batch")


def message_count(metadata: MessageMetadata) -> int:
    """How many messages the payload holds, from the metadata alone (works on compressed
    and encrypted payloads too): what a consumer's permits are charged."""
    if not is_batch(metadata):
        return 1
    count = metadata.num_messages_in_batch
    if count < 1:
        raise MalformedFrame(f"num_messages_in_batch {count} is below 1")
    return count


def parse_batch(metadata: MessageMetadata, payload: bytes | memoryview, *, plain: bool = False) -> list[SingleMessage]:
    """Splits an uncompressed, unencrypted batch payload into its messages; the payloads
    returned are views of ``payload``. Raises MalformedFrame or a subclass. With
    ``plain`` (the client's consumers), a message whose record holds only its size and
    sequence id has a PlainRecord as its ``metadata`` instead of a SingleMessageMetadata."""
    if not is_batch(metadata):
        raise MalformedFrame("payload is not a batch: num_messages_in_batch is not set")
    if metadata.compression != CompressionType.NONE:
        raise UnsupportedCompression(metadata.compression)
    # A codec newer than our .proto is kept as an unknown field and ``compression`` then
    # reads NONE; look for it there rather than parse compressed bytes as records.
    for unknown in UnknownFieldSet(metadata):
        if unknown.field_number == _COMPRESSION_FIELD_NUMBER:
            raise UnsupportedCompression(unknown.data)
    if len(metadata.encryption_keys) > 0:
        raise EncryptedPayload()
    count = message_count(metadata)
    view = memoryview(payload)
    # Bound the count by the bytes present before building anything of that size.
    if count > len(view) // RECORD_BYTES_MIN:
        raise MalformedFrame(f"batch declares {count} messages but has only {len(view)} bytes")
    messages = []
    offset = 0
    make = tuple.__new__   # a NamedTuple's own __new__ is a Python-level wrapper
    for batch_index in range(count):
        if len(view) - offset < _U32.size:
            raise MalformedFrame(f"batch message {batch_index} is truncated before its size")
        (metadata_size,) = _U32.unpack_from(view, offset)
        metadata_start = offset + _U32.size
        if metadata_size > len(view) - metadata_start:
            raise MalformedFrame(f"batch message {batch_index} metadata_size {metadata_size} "
                                 f"exceeds the {len(view) - metadata_start} bytes left")
        payload_start = metadata_start + metadata_size
        metadata_view = view[metadata_start:payload_start]
        single = _plain_record(view, metadata_start, payload_start) if plain else None
        if single is None:
            single = parse_proto_or_none(SingleMessageMetadata, metadata_view)
        if single is None:   # parsed again: raises the MalformedFrame that says what is wrong
            single = parse_proto(SingleMessageMetadata, metadata_view, f"SingleMessageMetadata of batch message {batch_index}")
        payload_size = single.payload_size
        if not 0 <= payload_size <= len(view) - payload_start:
            raise MalformedFrame(f"batch message {batch_index} payload_size {payload_size} does not fit "
                                 f"the {len(view) - payload_start} bytes left")
        offset = payload_start + payload_size
        messages.append(make(SingleMessage, (batch_index, single, view[payload_start:offset], metadata_view)))
    if offset != len(view):
        raise MalformedFrame(f"batch has {len(view) - offset} bytes after its {count} messages")
    assert len(messages) == count
    return messages


def encode_batch(messages: Iterable[tuple[SingleMessageMetadata, bytes | memoryview]]) -> bytes:
    """The batch payload of ``messages``. ``payload_size`` is filled in when unset (on a
    copy; the caller's metadata is not changed) and must match the payload when set.
    The caller sets ``num_messages_in_batch`` in the MessageMetadata to the count."""
    parts: list[bytes | memoryview] = []
    for single, payload in messages:
        if single.HasField("payload_size"):
            assert single.payload_size == len(payload), (single.payload_size, len(payload))
        else:
            filled = SingleMessageMetadata()
            filled.CopyFrom(single)
            filled.payload_size = len(payload)
            single = filled
        assert single.IsInitialized(), single.FindInitializationErrors()
        metadata_bytes = single.SerializeToString()
        parts.append(_U32.pack(len(metadata_bytes)) + metadata_bytes)
        parts.append(payload)
    return b"".join(parts)
