"""Messages as a client sees them: what a producer sends (``OutgoingMessage``), the id a
message gets (``MessageId``), and what a consumer receives (``ReceivedEntry`` holding
``ReceivedMessage``s). Pure: protobufs and bytes in and out, no sockets, no clock (the
caller passes times in).

Encoding (producer side). One message is a stored payload whose ``MessageMetadata``
carries its key, ordering key, properties, event time and deliver-at time. A batch of
messages is one payload in Pulsar's batch layout (``protocol/batch.py``): each message's
own fields go in its ``SingleMessageMetadata``; the batch's ``MessageMetadata`` has
``num_messages_in_batch`` and the first and highest sequence ids. A batch is stored as
one entry, so its messages share (ledger_id, entry_id) and differ by batch index.

Decoding (consumer side). A MESSAGE frame is one entry. A batch entry is split into its
messages; the MESSAGE's ``ack_set`` (Pulsar's convention: the bits of the messages still
to deliver) drops the ones already acknowledged. Payloads compressed with ZLIB, LZ4, ZSTD or
SNAPPY are decompressed (client/compression.py; the size is checked against the
metadata); an unknown codec, and encrypted payloads, cannot be split here, so such an
entry is handed over whole as one opaque message with ``compression`` naming its codec:
nothing is dropped, and the receiver decides.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Protocol, Sequence

from client.compression import CODECS, decompress
from common.errors import InvalidArgument, MalformedFrame
from protocol.batch import EncryptedPayload, PlainRecord, UnsupportedCompression, is_batch, parse_batch
from protocol.proto import pulsar_api_pb2 as pb

_U32 = struct.Struct(">I")
NO_PARTITION = -1
NO_BATCH_INDEX = -1


class MessageId(NamedTuple):
    """Where a message is: its entry (ledger_id, entry_id), the topic partition (-1: not
    partitioned) and, in a batch entry, its index and the batch's size (-1 and 0 for a
    message stored alone). A NamedTuple: made once per message received, so it must be
    cheap to make (a frozen dataclass sets each field through object.__setattr__)."""

    ledger_id: int
    entry_id: int
    partition: int = NO_PARTITION
    batch_index: int = NO_BATCH_INDEX
    batch_size: int = 0

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> "MessageId":
        """The inverse of ``str``; raises InvalidArgument."""
        parts = text.split(":")
        if len(parts) != 4:
            raise InvalidArgument(f"message id {text!r} is not ledger:entry:partition:batch_index")
        try:
            ledger_id, entry_id, partition, batch_index = (int(part) for part in parts)
        except ValueError:
            raise InvalidArgument(f"message id {text!r} has a part that is not an integer") from None
        if ledger_id < 0 or entry_id < 0 or partition < NO_PARTITION or batch_index < NO_BATCH_INDEX:
            raise InvalidArgument(f"message id {text!r} is out of range")
        return cls(ledger_id, entry_id, partition, batch_index)

    @property
    def position(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)

    def to_proto(self) -> pb.MessageIdData:
        """The id as an ACK names it: for a batch message, the ack set of the whole
        batch with only this message's bit cleared (Pulsar's convention; the broker ANDs
        it into what it knows)."""
        data = pb.MessageIdData(ledgerId=self.ledger_id, entryId=self.entry_id)
        if self.partition != NO_PARTITION:
            data.partition = self.partition
        if self.batch_index != NO_BATCH_INDEX:
            assert 0 <= self.batch_index < self.batch_size, (self.batch_index, self.batch_size)
            data.batch_index = self.batch_index
            data.batch_size = self.batch_size
            data.ack_set.extend(ack_set_without(self.batch_size, [self.batch_index]))
        return data


def ack_set_without(batch_size: int, batch_indexes: Sequence[int]) -> list[int]:
    """Pulsar ack-set words (int64, little-endian bit order) for a batch of
    ``batch_size`` with every bit set except ``batch_indexes``."""
    assert batch_size >= 1, batch_size
    bits = (1 << batch_size) - 1
    for index in batch_indexes:
        assert 0 <= index < batch_size, (index, batch_size)
        bits &= ~(1 << index)
    words = []
    for word_index in range((batch_size + 63) // 64):
        word = (bits >> (64 * word_index)) & 0xFFFF_FFFF_FFFF_FFFF
        words.append(word - (1 << 64) if word >= 1 << 63 else word)
    return words


def ack_set_bits(words: Sequence[int]) -> int:
    """The ack-set words as one integer bitset (bit i set: message i still to deliver)."""
    value = 0
    for index, word in enumerate(words):
        value |= (word & 0xFFFF_FFFF_FFFF_FFFF) << (64 * index)
    return value


# --- producing ---------------------------------------------------------------------------------

@dataclass(slots=True)
class OutgoingMessage:
    """One message to send; read-only by convention (not frozen: the gateway makes one
    per message of a produce request, and frozen dataclasses are slow to make)."""

    payload: bytes
    key: str | None = None
    ordering_key: bytes | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    event_time_ms: int = 0              # 0: not set (Pulsar's convention)
    deliver_at_ms: int | None = None

    @property
    def size_bytes(self) -> int:
        """Bytes this message adds to a batch, roughly (payload, key, properties)."""
        if self.key is None and self.ordering_key is None and not self.properties:
            return len(self.payload)
        size = len(self.payload) + len(self.key or "") + len(self.ordering_key or b"")
        for name, value in self.properties.items():
            size += len(name) + len(value)
        return size


def _properties(properties: Mapping[str, str]) -> list[pb.KeyValue]:
    return [pb.KeyValue(key=name, value=value) for name, value in properties.items()]


def single_metadata(producer_name: str, sequence_id: int, publish_time_ms: int,
                    message: OutgoingMessage) -> pb.MessageMetadata:
    """The MessageMetadata of a message stored alone (not in a batch)."""
    metadata = pb.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                                  publish_time=publish_time_ms, properties=_properties(message.properties))
    if message.key is not None:
        metadata.partition_key = message.key
    if message.ordering_key is not None:
        metadata.ordering_key = message.ordering_key
    if message.event_time_ms:
        metadata.event_time = message.event_time_ms
    if message.deliver_at_ms is not None:
        metadata.deliver_at_time = message.deliver_at_ms
    return metadata


def _varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x20_0000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def batch_payload(producer_name: str, sequence_id: int, publish_time_ms: int,
                  messages: Sequence[OutgoingMessage]) -> tuple[pb.MessageMetadata, bytes]:
    """The MessageMetadata and payload of ``messages`` as one batch entry whose messages
    have sequence ids ``sequence_id`` … ``sequence_id + len - 1``. A batch's
    ``partition_key`` is its first message's key (key-shared dispatch reads it from the
    entry); each message keeps its own in its SingleMessageMetadata."""
    assert messages, "a batch holds at least one message"
    # The records are laid out here rather than by protocol.batch.encode_batch: its
    # checks per message (payload_size set or not, required fields) cost a sixth of the
    # gateway's batched produce in a profile, and this builds each field exactly once.
    parts: list[bytes] = []
    # Record heads of plain messages by payload size (a batch's sizes repeat).
    heads: dict[int, bytes] = {}
    for index, message in enumerate(messages):
        if (message.key is None and message.ordering_key is None and not message.properties
                and not message.event_time_ms):
            # A plain message's record has only payload_size (field 3) and sequence_id
            # (field 8), written here as protobuf writes them (tests/unit/
            # test_client_messages.py checks the bytes are the same).
            payload = message.payload
            head = heads.get(len(payload))
            if head is None:
                head = heads[len(payload)] = b"\x18" + _varint(len(payload)) + b"\x40"
            record = head + _varint(sequence_id + index)
            parts += (_U32.pack(len(record)), record, payload)
            continue
        single = pb.SingleMessageMetadata(payload_size=len(message.payload), sequence_id=sequence_id + index)
        if message.properties:
            single.properties.extend(_properties(message.properties))
        if message.key is not None:
            single.partition_key = message.key
        if message.ordering_key is not None:
            single.ordering_key = message.ordering_key
        if message.event_time_ms:
            single.event_time = message.event_time_ms
        record = single.SerializeToString()
        parts.append(_U32.pack(len(record)))
        parts.append(record)
        parts.append(message.payload)
    highest = sequence_id + len(messages) - 1
    metadata = pb.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                                  publish_time=publish_time_ms, num_messages_in_batch=len(messages),
                                  highest_sequence_id=highest)
    first = messages[0]
    if first.key is not None:
        metadata.partition_key = first.key
    if first.ordering_key is not None:
        metadata.ordering_key = first.ordering_key
    deliver_at = [m.deliver_at_ms for m in messages if m.deliver_at_ms is not None]
    if deliver_at:
        # Pulsar keeps one deliver-at time per entry; a batch is due when its last
        # message is.
        metadata.deliver_at_time = max(deliver_at)
    return metadata, b"".join(parts)


# --- consuming ---------------------------------------------------------------------------------

@dataclass(slots=True)
class ReceivedMessage:
    """One message received; read-only by convention (not frozen: one is made per
    message, and frozen dataclasses are slow to make)."""

    message_id: MessageId
    payload: bytes
    key: str | None
    ordering_key: bytes | None
    properties: dict[str, str]
    event_time_ms: int                  # 0: not set
    publish_time_ms: int
    producer_name: str
    sequence_id: int
    deliver_at_ms: int | None = None
    compression: str | None = None      # set only for an entry handed over undecoded


@dataclass(slots=True)
class ReceivedEntry:
    """One MESSAGE: an entry and the messages of it still to deliver."""

    ledger_id: int
    entry_id: int
    partition: int
    redelivery_count: int
    batch_size: int                     # 0: a message stored alone
    messages: tuple[ReceivedMessage, ...]

    @property
    def position(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)


class SplitBatch(NamedTuple):
    """A batch entry split into all its messages (the ack set not yet applied): what
    every consumer of the entry computes alike, so the consumers of one connection may
    share it (client/split_cache.py). Immutable through and through: tuples, ints, str
    and bytes; each consumer builds its own ReceivedMessages from it, with property
    dicts of their own.

    ``records`` holds per message (message_id, payload, key, ordering_key, properties
    as (name, value) pairs, event_time_ms, sequence_id)."""

    batch_size: int
    records: tuple[tuple, ...]
    publish_time_ms: int
    producer_name: str
    deliver_at_ms: int | None
    payload_bytes: int                  # the messages' payloads together


def decode_entry(message: pb.CommandMessage, metadata: pb.MessageMetadata, payload: bytes | memoryview,
                 partition: int = NO_PARTITION, splits: "SplitCacheLike | None" = None, topic: str = "",
                 stored: bytes | memoryview | None = None) -> ReceivedEntry:
    """Splits one received entry into its messages. Raises MalformedFrame.

    With ``splits`` (the connection's cache, given when several subscriptions of
    ``topic`` are read through it), a batch entry already split for another of them is
    taken from there when its ``stored`` bytes (the payload section as received:
    metadata and payload) are the same, and one split here is left there for the
    others. Only the split is shared: the ack set, the redelivery count and every
    object handed out are this call's own."""
    ledger_id, entry_id = message.message_id.ledgerId, message.message_id.entryId
    if message.message_id.HasField("partition") and message.message_id.partition >= 0:
        partition = message.message_id.partition
    if is_batch(metadata):
        key = None
        if splits is not None and stored is not None:
            key = (topic, partition, ledger_id, entry_id)
            split = splits.get(key, stored)
            if split is not None:
                return entry_of(split, message, partition)
        split = split_batch(metadata, payload, ledger_id, entry_id, partition)
        if not isinstance(split, SplitBatch):
            codec, metadata, payload = split
            return _opaque(message, metadata, payload, partition, codec)
        if key is not None:
            splits.put(key, stored, split)
        return entry_of(split, message, partition)
    deliver_at = metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    ordering_key = bytes(metadata.ordering_key) if metadata.HasField("ordering_key") else None
    if metadata.compression in CODECS and not metadata.encryption_keys:
        try:
            payload = decompress(metadata.compression, payload, metadata.uncompressed_size)
        except MalformedFrame:
            return _opaque(message, metadata, payload, partition, "UNREADABLE")
        compression = None
    elif metadata.compression != pb.NONE or metadata.encryption_keys:
        compression = "ENCRYPTED" if metadata.encryption_keys else pb.CompressionType.Name(metadata.compression)
    else:
        compression = None
    single = ReceivedMessage(
        MessageId(ledger_id, entry_id, partition), bytes(payload), key, ordering_key,
        {kv.key: kv.value for kv in metadata.properties}, metadata.event_time, metadata.publish_time,
        metadata.producer_name, metadata.sequence_id, deliver_at, compression)
    return ReceivedEntry(ledger_id, entry_id, partition, message.redelivery_count, 0, (single,))


class SplitCacheLike(Protocol):
    def get(self, key: tuple[str, int, int, int], stored: bytes | memoryview) -> SplitBatch | None: ...

    def put(self, key: tuple[str, int, int, int], stored: bytes | memoryview, split: SplitBatch) -> None: ...


def split_batch(metadata: pb.MessageMetadata, payload: bytes | memoryview, ledger_id: int, entry_id: int,
                partition: int) -> SplitBatch | tuple[str, pb.MessageMetadata, bytes | memoryview]:
    """A batch entry's messages (decompressed first), or, when it cannot be split,
    (why, metadata, payload) to hand it over whole: its codec (unknown here),
    ENCRYPTED, or UNREADABLE (a producer's bug: handed over rather than dropped, so the
    receiver sees it and can dead-letter it)."""
    if metadata.compression in CODECS and not metadata.encryption_keys:
        try:
            inflated = decompress(metadata.compression, payload, metadata.uncompressed_size)
        except MalformedFrame:
            return ("UNREADABLE", metadata, payload)
        payload = inflated
        metadata_plain = pb.MessageMetadata()
        metadata_plain.CopyFrom(metadata)
        metadata_plain.compression = pb.NONE
        metadata = metadata_plain
    try:
        parts = parse_batch(metadata, payload, plain=True)
    except UnsupportedCompression as error:
        return (error.codec, metadata, payload)
    except EncryptedPayload:
        return ("ENCRYPTED", metadata, payload)
    except MalformedFrame:
        return ("UNREADABLE", metadata, payload)
    batch_size = len(parts)
    first_sequence_id = metadata.sequence_id
    make_id = tuple.__new__   # a NamedTuple's own __new__ is a Python-level wrapper
    records = []
    payload_bytes = 0
    for batch_index, single, part_payload, _ in parts:
        data = bytes(part_payload)
        payload_bytes += len(data)
        if type(single) is PlainRecord:
            sequence_id = single.sequence_id
            records.append((make_id(MessageId, (ledger_id, entry_id, partition, batch_index, batch_size)), data,
                            None, None, (), 0,
                            first_sequence_id + batch_index if sequence_id is None else sequence_id))
            continue
        properties = single.properties
        has = single.HasField
        records.append((
            make_id(MessageId, (ledger_id, entry_id, partition, batch_index, batch_size)), data,
            single.partition_key if has("partition_key") else None,
            bytes(single.ordering_key) if has("ordering_key") else None,
            tuple([(kv.key, kv.value) for kv in properties]) if properties else (),
            single.event_time,
            single.sequence_id if has("sequence_id") else first_sequence_id + batch_index))
    deliver_at = metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
    return SplitBatch(batch_size, tuple(records), metadata.publish_time, metadata.producer_name, deliver_at,
                      payload_bytes)


def entry_of(split: SplitBatch, message: pb.CommandMessage, partition: int) -> ReceivedEntry:
    """The entry one consumer received: the messages of ``split`` its MESSAGE's ack set
    (Pulsar's convention: the bits of the messages still to deliver) keeps, as
    ReceivedMessages of its own."""
    batch_size = split.batch_size
    publish_time, producer_name, deliver_at = split.publish_time_ms, split.producer_name, split.deliver_at_ms
    received = ReceivedMessage
    records = split.records
    if len(message.ack_set):
        to_deliver = ack_set_bits(message.ack_set)
        records = [record for index, record in enumerate(records) if to_deliver >> index & 1]
    messages = tuple([received(message_id, data, key, ordering_key, dict(properties) if properties else {},
                               event_time, publish_time, producer_name, sequence_id, deliver_at)
                      for message_id, data, key, ordering_key, properties, event_time, sequence_id in records])
    ledger_id, entry_id = message.message_id.ledgerId, message.message_id.entryId
    return ReceivedEntry(ledger_id, entry_id, partition, message.redelivery_count, batch_size, messages)


def _opaque(message: pb.CommandMessage, metadata: pb.MessageMetadata, payload: bytes | memoryview,
            partition: int, compression: str) -> ReceivedEntry:
    """The entry as one message with its payload as stored, ``compression`` naming why
    it was not split or decoded."""
    ledger_id, entry_id = message.message_id.ledgerId, message.message_id.entryId
    opaque = ReceivedMessage(
        MessageId(ledger_id, entry_id, partition), bytes(payload),
        metadata.partition_key if metadata.HasField("partition_key") else None,
        bytes(metadata.ordering_key) if metadata.HasField("ordering_key") else None,
        {kv.key: kv.value for kv in metadata.properties}, metadata.event_time,
        publish_time_ms=metadata.publish_time, producer_name=metadata.producer_name,
        sequence_id=metadata.sequence_id,
        deliver_at_ms=metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None,
        compression=compression)
    return ReceivedEntry(ledger_id, entry_id, partition, message.redelivery_count, 0, (opaque,))
