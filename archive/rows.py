"""Stored entries unpacked into rows, one per message, and rows built into record
batches of the archive schema (archive/format.py). Pure: bytes in, Arrow out.

An entry is the stored payload of one SEND (protocol/codec.py): the producer's
MessageMetadata and a payload that is one message or a batch of them
(protocol/batch.py). Each message becomes a row. What the row columns do not hold
exactly as stored is kept beside them so archive/entries.py can rebuild the entry
byte for byte: the MessageMetadata bytes and the producer's CRC32C (first row of the
entry), each batched message's SingleMessageMetadata bytes, and, for a compressed
payload, the original compressed bytes (the rows hold the messages decompressed, for
analytics; compressing them again need not give the same bytes).

An entry that cannot be unpacked (encrypted end to end, or compressed with a codec
this module cannot undo) is archived as a single row with ``batch_index`` -1 and the
entry's payload as it was stored: nothing is lost, and it is rebuilt from that row.

Invariants: an entry's rows are contiguous and in batch-index order, and a record
batch holds whole entries only (``BatchBuilder`` never splits one), so any record
batch rebuilds into whole entries.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import crc32c
import pyarrow as pa
from google.protobuf.message import DecodeError

from archive.format import COLUMN_INDEX, SCHEMA, BatchMetadata, KeyFilter, batch_checksum
from common.errors import MalformedFrame
from protocol.batch import RECORD_BYTES_MIN
from protocol.codec import MAGIC_CHECKSUM, STORED_HEAD_SIZE, PayloadChecksumMismatch
from protocol.proto.pulsar_api_pb2 import CompressionType, MessageMetadata, SingleMessageMetadata

_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">HI")    # magic, checksum
_STORED_HEAD = struct.Struct(">HII")   # magic, checksum, metadata_size
assert _STORED_HEAD.size == STORED_HEAD_SIZE
# Looked up once: attribute access on a protobuf enum wrapper runs Python code.
_COMPRESSION_NONE = CompressionType.NONE
_parse_metadata = MessageMetadata.FromString

_INT64_SIGN = 1 << 63
_UINT64 = 1 << 64
# A decompressed payload may be at most this large: the producer's uncompressed_size
# is peer input, and a broker's max_message_size (at most 64 MiB, broker/config.py)
# bounds what a producer could have sent uncompressed.
UNCOMPRESSED_BYTES_MAX = 64 * 1024 * 1024


def _signed(value: int) -> int:
    """A protobuf uint64 as the int64 column holds it (two's complement)."""
    return value - _UINT64 if value >= _INT64_SIGN else value


def _decompress(metadata: MessageMetadata, payload: memoryview) -> bytes | None:
    """The payload decompressed, or None when this module cannot (unknown codec, a
    size out of bounds, bytes that do not decompress)."""
    size = metadata.uncompressed_size
    if not 0 <= size <= UNCOMPRESSED_BYTES_MAX:
        return None
    codec_names = {CompressionType.LZ4: "lz4_raw", CompressionType.ZSTD: "zstd",
                   CompressionType.SNAPPY: "snappy"}
    try:
        if metadata.compression == CompressionType.ZLIB:
            data = zlib.decompress(payload)
        elif metadata.compression in codec_names:
            data = pa.Codec(codec_names[metadata.compression]).decompress(
                payload, decompressed_size=size, asbytes=True)
        else:
            return None
    except (zlib.error, pa.ArrowException, ValueError, OSError):
        return None
    return data if len(data) == size else None


@dataclass
class _Messages:
    """The per-message columns of one batch, split (``_split_batch``)."""

    keys: list[str | None] = field(default_factory=list)
    ordering_keys: list[bytes | None] = field(default_factory=list)
    event_times: list[int | None] = field(default_factory=list)
    sequence_ids: list[int] = field(default_factory=list)
    property_counts: list[int] = field(default_factory=list)
    property_keys: list[str] = field(default_factory=list)
    property_values: list[str] = field(default_factory=list)
    payloads: list[memoryview] = field(default_factory=list)
    singles: list[memoryview] = field(default_factory=list)


def _split_batch(payload: bytes | memoryview, count: int, first_sequence_id: int) -> _Messages | None:
    """The messages of an uncompressed batch payload as columns, or None when it does
    not split exactly into ``count`` records whose string fields are valid UTF-8. The
    broker never looked inside the batch when it stored it, so this is peer input; an
    entry that does not split is archived opaque rather than refused. (protocol/batch.py's
    parse_batch does the same with stricter, slower checks; this loop runs once per
    archived message, so it binds everything it calls to locals.)"""
    view = memoryview(payload)
    end = len(view)
    if count < 1 or count > end // RECORD_BYTES_MIN:
        return None
    out = _Messages()
    keys, ordering_keys, event_times = out.keys.append, out.ordering_keys.append, out.event_times.append
    sequence_ids, property_counts = out.sequence_ids.append, out.property_counts.append
    property_keys, property_values = out.property_keys.append, out.property_values.append
    payloads, singles = out.payloads.append, out.singles.append
    parse = SingleMessageMetadata.FromString
    unpack = _U32.unpack_from
    offset = 0
    for batch_index in range(count):
        if end - offset < 4:
            return None
        metadata_start = offset + 4
        payload_start = metadata_start + unpack(view, offset)[0]
        if payload_start > end:
            return None
        metadata_bytes = view[metadata_start:payload_start]
        try:
            single = parse(metadata_bytes)
        except (DecodeError, ValueError, TypeError, RecursionError):
            return None
        has = single.HasField
        if not has("payload_size"):
            return None
        payload_size = single.payload_size
        offset = payload_start + payload_size
        if payload_size < 0 or offset > end:
            return None
        if has("partition_key") and not single.null_partition_key:
            key = single.partition_key
            if type(key) is not str:
                return None
            keys(key)
        else:
            keys(None)
        ordering_keys(single.ordering_key if has("ordering_key") else None)
        event_time = single.event_time
        event_times((event_time - _UINT64 if event_time >= _INT64_SIGN else event_time) if event_time else None)
        sequence_id = single.sequence_id if has("sequence_id") else (first_sequence_id + batch_index) % _UINT64
        sequence_ids(sequence_id - _UINT64 if sequence_id >= _INT64_SIGN else sequence_id)
        pairs = single.properties
        property_counts(len(pairs))
        for pair in pairs:
            name, value = pair.key, pair.value
            if type(name) is not str or type(value) is not str:
                return None
            property_keys(name)
            property_values(value)
        payloads(view[payload_start:offset])
        singles(metadata_bytes)
    return out if offset == end else None


def _strings_valid(metadata: MessageMetadata) -> bool:
    """The string fields a row keeps decoded as UTF-8 (the runtime hands back bytes
    for a proto2 string that is not)."""
    if type(metadata.partition_key) is not str:
        return False
    for pair in metadata.properties:
        if type(pair.key) is not str or type(pair.value) is not str:
            return False
    return True


class BatchBuilder:
    """Accumulates the rows of whole entries of one ledger, then builds a record batch
    and its BatchMetadata (``finish``)."""

    def __init__(self, topic: str, partition: int, ledger_id: int) -> None:
        self.topic = topic
        self.partition = partition
        self.ledger_id = ledger_id
        self.entry_ids: list[int] = []
        self.batch_indexes: list[int] = []
        self.batch_sizes: list[int] = []
        self.publish_times: list[int] = []
        self.event_times: list[int | None] = []
        self.keys: list[str | None] = []
        self.ordering_keys: list[bytes | None] = []
        self.property_offsets: list[int] = [0]
        self.property_keys: list[str] = []
        self.property_values: list[str] = []
        self.producer_names: list[str] = []
        self.sequence_ids: list[int] = []
        self.payloads: list[bytes | memoryview] = []
        self.entry_metadatas: list[bytes | memoryview | None] = []
        self.single_metadatas: list[bytes | memoryview | None] = []
        self.entry_payloads: list[bytes | memoryview | None] = []
        self.entry_checksums: list[int | None] = []
        self.first_entry_id = -1
        self.last_entry_id = -1
        self.size_bytes = 0           # payload and metadata bytes added (the batch's rough size)
        self.payload_bytes = 0

    @property
    def row_count(self) -> int:
        return len(self.entry_ids)

    def add_entry(self, entry_id: int, stored: bytes | memoryview) -> int:
        """Adds one entry's rows; returns how many. The entry's CRC32C is verified first:
        corrupt bytes are never archived. Raises MalformedFrame (PayloadChecksumMismatch
        for a checksum) for an entry that is not a stored payload. The MessageMetadata is
        parsed as trusted (as protocol.codec.stored_metadata does): the broker checked it
        whole when the SEND arrived."""
        assert entry_id >= 0, entry_id
        assert self.last_entry_id < 0 or entry_id == self.last_entry_id + 1, (entry_id, self.last_entry_id)
        view = memoryview(stored)
        if len(view) < STORED_HEAD_SIZE:
            raise MalformedFrame(f"entry {entry_id} of {len(view)} bytes is shorter than a stored payload head")
        magic, checksum, metadata_size = _STORED_HEAD.unpack_from(view, 0)
        if magic != MAGIC_CHECKSUM:
            raise MalformedFrame(f"entry {entry_id} lacks the 0x0e01 magic")
        computed = crc32c.crc32c(view[_HEAD.size:])
        if computed != checksum:
            raise PayloadChecksumMismatch(checksum, computed)
        payload_start = STORED_HEAD_SIZE + metadata_size
        if payload_start > len(view):
            raise MalformedFrame(f"entry {entry_id} metadata_size {metadata_size} exceeds the entry")
        metadata_bytes = view[STORED_HEAD_SIZE:payload_start]
        try:
            metadata = _parse_metadata(metadata_bytes)
        except (DecodeError, ValueError, TypeError, RecursionError) as error:
            raise MalformedFrame(f"entry {entry_id} MessageMetadata does not parse: {error}") from None
        payload = view[payload_start:]
        batched = metadata.HasField("num_messages_in_batch")
        count = metadata.num_messages_in_batch if batched else 1
        if count < 1:
            raise MalformedFrame(f"entry {entry_id} declares {count} messages")
        encrypted = len(metadata.encryption_keys) > 0
        compressed = metadata.compression != _COMPRESSION_NONE
        plain: bytes | memoryview | None = payload
        if compressed and not encrypted:
            plain = _decompress(metadata, payload)
        messages = None
        if not encrypted and plain is not None and batched:
            messages = _split_batch(plain, count, metadata.sequence_id)
        opaque = encrypted or plain is None or (batched and messages is None) or not _strings_valid(metadata)
        rows = 1 if opaque or messages is None else count
        # The entry's own columns: the same on each of its rows, or on its first row only.
        self.entry_metadatas.append(metadata_bytes)
        self.entry_checksums.append(checksum)
        self.entry_payloads.append(payload if compressed and not opaque else None)
        if rows == 1:
            self.entry_ids.append(entry_id)
            self.batch_sizes.append(count if batched else 0)
            self.publish_times.append(_signed(metadata.publish_time))
            self.producer_names.append(metadata.producer_name)
        else:
            self.entry_ids.extend([entry_id] * rows)
            self.batch_sizes.extend([count] * rows)
            self.publish_times.extend([_signed(metadata.publish_time)] * rows)
            self.producer_names.extend([metadata.producer_name] * rows)
            self.entry_metadatas.extend([None] * (rows - 1))
            self.entry_checksums.extend([None] * (rows - 1))
            self.entry_payloads.extend([None] * (rows - 1))
        if messages is not None and not opaque:
            self.batch_indexes.extend(range(count))
            self.keys.extend(messages.keys)
            self.ordering_keys.extend(messages.ordering_keys)
            self.event_times.extend(messages.event_times)
            self.sequence_ids.extend(messages.sequence_ids)
            self.property_keys.extend(messages.property_keys)
            self.property_values.extend(messages.property_values)
            offsets = self.property_offsets
            total = offsets[-1]
            for property_count in messages.property_counts:
                total += property_count
                offsets.append(total)
            self.payloads.extend(messages.payloads)
            self.single_metadatas.extend(messages.singles)
            self.payload_bytes += sum(len(p) for p in messages.payloads)
        else:
            # One row: a message not in a batch, or an entry kept opaque (its payload as stored).
            row_payload = payload if opaque else plain
            assert row_payload is not None
            self.batch_indexes.append(-1)
            event_time = metadata.event_time
            self.event_times.append(_signed(event_time) if event_time else None)
            self.sequence_ids.append(_signed(metadata.sequence_id))
            if opaque:
                self.keys.append(None)
                self.ordering_keys.append(None)
            else:
                has_key = metadata.HasField("partition_key") and not metadata.null_partition_key
                self.keys.append(metadata.partition_key if has_key else None)
                self.ordering_keys.append(metadata.ordering_key if metadata.HasField("ordering_key") else None)
                for pair in metadata.properties:
                    self.property_keys.append(pair.key)
                    self.property_values.append(pair.value)
            self.property_offsets.append(len(self.property_keys))
            self.payloads.append(row_payload)
            self.single_metadatas.append(None)
            self.payload_bytes += len(row_payload)
        if self.first_entry_id < 0:
            self.first_entry_id = entry_id
        self.last_entry_id = entry_id
        self.size_bytes += len(view)
        assert len(self.entry_ids) == len(self.payloads) == len(self.entry_metadatas), entry_id
        return rows

    def finish(self) -> tuple[pa.RecordBatch, BatchMetadata]:
        """The record batch of the rows added, and its metadata (checksum included)."""
        rows = self.row_count
        assert rows > 0, "an empty record batch is never written"
        columns: list[pa.Array] = [None] * len(SCHEMA)  # type: ignore[list-item]

        def put(name: str, values: object) -> None:
            columns[COLUMN_INDEX[name]] = pa.array(values, SCHEMA.field(name).type)

        columns[COLUMN_INDEX["topic"]] = pa.repeat(pa.scalar(self.topic, pa.string()), rows)
        columns[COLUMN_INDEX["partition"]] = pa.repeat(pa.scalar(self.partition, pa.int32()), rows)
        columns[COLUMN_INDEX["ledger_id"]] = pa.repeat(pa.scalar(self.ledger_id, pa.int64()), rows)
        put("entry_id", self.entry_ids)
        put("batch_index", self.batch_indexes)
        put("batch_size", self.batch_sizes)
        put("publish_time", self.publish_times)
        put("event_time", self.event_times)
        put("key", self.keys)
        put("ordering_key", self.ordering_keys)
        columns[COLUMN_INDEX["properties"]] = pa.MapArray.from_arrays(
            pa.array(self.property_offsets, pa.int32()), pa.array(self.property_keys, pa.string()),
            pa.array(self.property_values, pa.string()), type=SCHEMA.field("properties").type)
        put("producer_name", self.producer_names)
        put("sequence_id", self.sequence_ids)
        put("payload", self.payloads)
        put("entry_metadata", self.entry_metadatas)
        put("single_metadata", self.single_metadatas)
        put("entry_payload", self.entry_payloads)
        put("entry_checksum", self.entry_checksums)
        batch = pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
        keys = [key for key in self.keys if key is not None]
        key_filter = KeyFilter.of(keys).encode() if keys else None
        metadata = BatchMetadata(
            row_count=rows, first_entry_id=self.first_entry_id, last_entry_id=self.last_entry_id,
            publish_time_ms_min=min(self.publish_times), publish_time_ms_max=max(self.publish_times),
            key_min=min(keys) if keys else None, key_max=max(keys) if keys else None, key_filter=key_filter,
            crc32c=batch_checksum(batch))
        assert batch.num_rows == rows
        return batch, metadata


def rows_of_entry(topic: str, partition: int, ledger_id: int, entry_id: int,
                  stored: bytes | memoryview) -> pa.RecordBatch:
    """The rows of a single entry (a convenience for tools and tests)."""
    builder = BatchBuilder(topic, partition, ledger_id)
    builder.add_entry(entry_id, stored)
    return builder.finish()[0]

