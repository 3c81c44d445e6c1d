"""The archive file format: one Arrow IPC *file* per archived ledger slice, one row per
message. Pure: schemas, footer metadata, checksums and names; no files, no clock.

An archive file is a plain Arrow IPC file (``pyarrow.ipc.open_file`` reads it, and so do
Spark, DuckDB and Polars); what makes it ours is the footer's custom metadata:

    offset  size  field                        meaning
    0       8     "ARROW1\\0\\0"                  Arrow's file magic (Arrow's, not ours)
    8       s     schema message               SCHEMA below (Arrow IPC encapsulated message)
    8+s     b_i   record batch i (i = 0..n-1)  rows of whole entries, in (entry_id,
                                               batch_index) order; buffers optionally
                                               LZ4_FRAME or ZSTD compressed (Arrow's own
                                               buffer compression)
    ...     f     footer                       Arrow's footer: schema, block table, and
                                               custom metadata with two keys:
                                                 FOOTER_KEY           JSON FileMetadata
                                                 FOOTER_CHECKSUM_KEY  CRC32C of that JSON,
                                                                      8 hex digits
    end-10  4     footer size                  (Arrow's)
    end-6   6     "ARROW1"                     (Arrow's)

The JSON under FOOTER_KEY carries ``"magic": MAGIC`` and ``"format_version"``, the
file's topic, ledger and entry range, row count, min/max publish time, and one object
per record batch (BatchMetadata: rows, entry range, publish time range, key range, a
key filter, and the CRC32C of the batch). That is what a reader prunes with (by
publish time, by ledger/entry range, by key) before it reads any batch.

Checksums. A record batch's CRC32C is taken over its canonical serialization
(``RecordBatch.serialize()`` without compression: Arrow's encapsulated IPC message
of the batch's logical content), so the writer computes it from the batch it builds
and a reader recomputes it from the batch it decoded: a flipped byte in the stored
bytes either fails Arrow's decoding or changes the content and so the checksum; both
are reported as ArchiveCorrupt naming the file and the batch. A truncated file loses
Arrow's footer and is reported naming the file. The manifest (archive/manifest.py)
also keeps every file's size and whole-file CRC32C, which ``verify`` checks, so even
bytes no reader decodes (padding, the leading schema copy) are covered.

Rows and entries. Every row is one message: batches are unpacked (archive/rows.py).
The columns ``entry_metadata``, ``single_metadata``, ``entry_payload`` and
``entry_checksum`` keep what rebuilding the stored entry byte for byte needs
(archive/entries.py): the entry's MessageMetadata bytes and the producer's CRC32C on the
entry's first row, each batched message's SingleMessageMetadata bytes, and the
original payload of an entry whose messages cannot be joined back exactly (a
compressed batch). A rebuilt entry must match the kept CRC32C or it is not served.

Versions:
    1  first version (Magnetar 2026-11): SCHEMA below, FileMetadata/BatchMetadata JSON.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from dataclasses import asdict, dataclass, field
from typing import Iterable

import crc32c
import pyarrow as pa

from common.errors import ArchiveCorrupt, ArchiveFormatUnsupported, InvalidArgument

MAGIC = "magnetar-archive"
FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1

FOOTER_KEY = b"magnetar.archive"
FOOTER_CHECKSUM_KEY = b"magnetar.archive.crc32c"
FILE_SUFFIX = ".arrow"
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"

# Arrow buffer compression by the policy's name for it (None: uncompressed).
COMPRESSIONS: dict[str, str | None] = {"none": None, "lz4": "lz4", "zstd": "zstd"}

# The footer JSON is read whole before anything else; a file whose footer claims more
# than this is not ours (a ledger slice of 64 MiB in batches of 8,192 rows has a few
# KiB of footer; 4,096 batches with full key filters stay under 40 MiB).
FOOTER_BYTES_MAX = 64 * 1024 * 1024
# Record batches per file: bounded so the footer stays small (see above).
FILE_BATCHES_MAX = 4096

UTC_MS = pa.timestamp("ms", tz="UTC")

# name, type, nullable, meaning (the README's schema table is this table).
COLUMNS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    ("topic", pa.string(), False, "persistent://tenant/namespace/name (a partition's own name)"),
    ("partition", pa.int32(), False, "partition index; -1 for a topic that is not partitioned"),
    ("ledger_id", pa.int64(), False, "message id: the ledger"),
    ("entry_id", pa.int64(), False, "message id: the entry in the ledger"),
    ("batch_index", pa.int32(), False, "message id: index in the producer's batch; -1 when not batched"),
    ("batch_size", pa.int32(), False, "messages in the entry's batch; 0 when not batched"),
    ("publish_time", UTC_MS, False, "when the producer published it (UTC)"),
    ("event_time", UTC_MS, True, "the application's event time (UTC), if set"),
    ("key", pa.string(), True, "partition key, if set"),
    ("ordering_key", pa.binary(), True, "ordering key, if set"),
    ("properties", pa.map_(pa.string(), pa.string()), False, "message properties"),
    ("producer_name", pa.string(), False, "the producer's name"),
    ("sequence_id", pa.int64(), False, "the producer's sequence id of the message"),
    ("payload", pa.binary(), False, "the message bytes (an encrypted entry's whole payload)"),
    ("entry_metadata", pa.binary(), True, "rebuild: the entry's MessageMetadata bytes (first row of an entry)"),
    ("single_metadata", pa.binary(), True, "rebuild: the message's SingleMessageMetadata bytes (batched)"),
    ("entry_payload", pa.binary(), True, "rebuild: the entry's original payload when it was compressed"),
    ("entry_checksum", pa.int64(), True, "rebuild: the producer's CRC32C of the entry (first row of an entry)"),
)
SCHEMA = pa.schema([pa.field(name, data_type, nullable=nullable, metadata={"description": meaning})
                    for name, data_type, nullable, meaning in COLUMNS])
COLUMN_INDEX = {name: index for index, (name, *_rest) in enumerate(COLUMNS)}


# --- metadata ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchMetadata:
    """What a reader knows of a record batch before reading it."""

    row_count: int
    first_entry_id: int
    last_entry_id: int
    publish_time_ms_min: int
    publish_time_ms_max: int
    key_min: str | None            # None: no row of the batch has a key
    key_max: str | None
    key_filter: str | None         # base64 of a KeyFilter over the batch's keys
    crc32c: int                    # of batch_checksum(batch)

    def overlaps_time(self, time_ms_min: int | None, time_ms_max: int | None) -> bool:
        """Whether some row may have publish_time in [min, max] (None: unbounded)."""
        return ((time_ms_max is None or self.publish_time_ms_min <= time_ms_max)
                and (time_ms_min is None or self.publish_time_ms_max >= time_ms_min))

    def overlaps_entries(self, entry_id_min: int | None, entry_id_max: int | None) -> bool:
        return ((entry_id_max is None or self.first_entry_id <= entry_id_max)
                and (entry_id_min is None or self.last_entry_id >= entry_id_min))

    def may_contain_key(self, key: str) -> bool:
        """False only when no row of the batch has this key."""
        if self.key_min is None or self.key_max is None:
            return False
        if not self.key_min <= key <= self.key_max:
            return False
        if self.key_filter is None:
            return True
        return KeyFilter.decode(self.key_filter).may_contain(key)


@dataclass(frozen=True)
class FileMetadata:
    """The footer of an archive file: the slice of a ledger it holds, and its batches."""

    topic: str
    partition: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    row_count: int
    payload_bytes: int
    publish_time_ms_min: int
    publish_time_ms_max: int
    compression: str
    batches: tuple[BatchMetadata, ...] = field(default_factory=tuple)
    format_version: int = FORMAT_VERSION
    writer_version: str = ""

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    def check(self) -> None:
        """Asserts the invariants a writer must keep (the reader checks the same ones
        through ``decode_footer`` and reports them as corruption)."""
        problem = _metadata_problem(self)
        assert problem is None, problem

    def overlaps_time(self, time_ms_min: int | None, time_ms_max: int | None) -> bool:
        return ((time_ms_max is None or self.publish_time_ms_min <= time_ms_max)
                and (time_ms_min is None or self.publish_time_ms_max >= time_ms_min))

    def batch_for_entry(self, entry_id: int) -> int:
        """Index of the record batch holding ``entry_id`` (entries never span batches)."""
        low, high = 0, len(self.batches)
        while low < high:
            middle = (low + high) // 2
            if self.batches[middle].last_entry_id < entry_id:
                low = middle + 1
            else:
                high = middle
        if low == len(self.batches) or self.batches[low].first_entry_id > entry_id:
            raise InvalidArgument(f"entry {entry_id} is not in ledger {self.ledger_id} "
                                  f"entries {self.first_entry_id}..{self.last_entry_id} of this file")
        return low


def _metadata_problem(metadata: FileMetadata) -> str | None:
    """What is inconsistent in a file's metadata, or None."""
    batches = metadata.batches
    if not batches:
        return "the file lists no record batches"
    if len(batches) > FILE_BATCHES_MAX:
        return f"{len(batches)} record batches exceed {FILE_BATCHES_MAX}"
    if metadata.ledger_id < 0 or metadata.first_entry_id < 0 or metadata.last_entry_id < metadata.first_entry_id:
        return f"bad ledger range {metadata.ledger_id}:{metadata.first_entry_id}..{metadata.last_entry_id}"
    if metadata.compression not in COMPRESSIONS:
        return f"unknown compression {metadata.compression!r}"
    expected_first = metadata.first_entry_id
    rows = 0
    for index, batch in enumerate(batches):
        if batch.first_entry_id != expected_first or batch.last_entry_id < batch.first_entry_id:
            return (f"record batch {index} covers entries {batch.first_entry_id}..{batch.last_entry_id}, "
                    f"expected to start at {expected_first}")
        if batch.row_count < batch.last_entry_id - batch.first_entry_id + 1:
            return f"record batch {index} has fewer rows than entries"
        if batch.publish_time_ms_min > batch.publish_time_ms_max:
            return f"record batch {index} has publish time min above max"
        expected_first = batch.last_entry_id + 1
        rows += batch.row_count
    if expected_first != metadata.last_entry_id + 1:
        return f"record batches end at entry {expected_first - 1}, not {metadata.last_entry_id}"
    if rows != metadata.row_count:
        return f"record batches hold {rows} rows, the file says {metadata.row_count}"
    if metadata.publish_time_ms_min != min(b.publish_time_ms_min for b in batches) or \
            metadata.publish_time_ms_max != max(b.publish_time_ms_max for b in batches):
        return "file publish time range does not match its batches'"
    return None


def encode_footer(metadata: FileMetadata) -> dict[bytes, bytes]:
    """The footer custom metadata of a file (pyarrow.ipc.new_file(metadata=...))."""
    metadata.check()
    doc = asdict(metadata)
    doc["magic"] = MAGIC
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return {FOOTER_KEY: text, FOOTER_CHECKSUM_KEY: f"{crc32c.crc32c(text):08x}".encode()}


def decode_footer(url: str, custom: dict[bytes, bytes] | None) -> FileMetadata:
    """The FileMetadata of a file's footer; ArchiveCorrupt (naming ``url``) when it is
    missing, damaged or inconsistent, ArchiveFormatUnsupported for a version this
    reader does not read."""
    if not custom or FOOTER_KEY not in custom:
        raise ArchiveCorrupt(url, "no magnetar.archive footer metadata: not an archive file")
    text = custom[FOOTER_KEY]
    if len(text) > FOOTER_BYTES_MAX:
        raise ArchiveCorrupt(url, f"footer metadata of {len(text)} bytes exceeds {FOOTER_BYTES_MAX}")
    stored = custom.get(FOOTER_CHECKSUM_KEY, b"")
    computed = f"{crc32c.crc32c(text):08x}".encode()
    if stored != computed:
        raise ArchiveCorrupt(url, f"footer metadata checksum {stored!r} does not match {computed!r}")
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("magic") != MAGIC:
            raise ArchiveCorrupt(url, f"footer magic is not {MAGIC!r}")
        version = doc.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ArchiveCorrupt(url, "footer has no format_version")
        if not FORMAT_VERSION_MIN <= version <= FORMAT_VERSION:
            raise ArchiveFormatUnsupported(url, version, (FORMAT_VERSION_MIN, FORMAT_VERSION))
        batches = tuple(BatchMetadata(**batch) for batch in doc.pop("batches"))
        doc.pop("magic")
        metadata = FileMetadata(batches=batches, **doc)
    except (ValueError, TypeError, KeyError) as error:
        raise ArchiveCorrupt(url, f"footer metadata does not parse: {error}") from None
    problem = _metadata_problem(metadata)
    if problem is not None:
        raise ArchiveCorrupt(url, problem)
    return metadata


def batch_checksum(batch: pa.RecordBatch) -> int:
    """CRC32C of a record batch's canonical (uncompressed) IPC serialization: the same
    for the batch a writer built and the batch a reader decoded from its file."""
    return crc32c.crc32c(batch.serialize())


def check_schema(url: str, schema: pa.Schema) -> None:
    """ArchiveCorrupt unless ``schema`` is SCHEMA (names, types, nullability)."""
    if not schema.equals(SCHEMA, check_metadata=False):
        raise ArchiveCorrupt(url, f"schema is not the archive schema of format {FORMAT_VERSION}: {schema}")


# --- key filter -------------------------------------------------------------------------------

_FILTER_HEAD = struct.Struct(">BI")       # hash count, bit count
# A batch's key filter: about 10 bits per distinct key (1% false positives with 7
# hashes), between 64 bits and 64 Kibit (8 KiB; 8,192 distinct keys at 8 bits each).
KEY_FILTER_BITS_MIN = 64
KEY_FILTER_BITS_MAX = 64 * 1024
KEY_FILTER_HASHES = 7


class KeyFilter:
    """A Bloom filter over strings (keys), for pruning record batches by key equality:
    ``may_contain`` is False only for a key the batch does not hold. Hashes by double
    hashing of two CRC32C values, so any reader can rebuild it from the spec."""

    def __init__(self, bit_count: int, hash_count: int = KEY_FILTER_HASHES, bits: bytearray | None = None) -> None:
        assert bit_count > 0 and bit_count % 8 == 0, bit_count
        assert 1 <= hash_count <= 16, hash_count
        self.bit_count = bit_count
        self.hash_count = hash_count
        self.bits = bits if bits is not None else bytearray(bit_count // 8)
        assert len(self.bits) * 8 == bit_count

    @classmethod
    def of(cls, keys: Iterable[str]) -> "KeyFilter":
        distinct = set(keys)
        bit_count = KEY_FILTER_BITS_MIN
        while bit_count < len(distinct) * 10 and bit_count < KEY_FILTER_BITS_MAX:
            bit_count *= 2
        built = cls(bit_count)
        for key in distinct:
            built.add(key)
        return built

    def _positions(self, key: str) -> Iterable[int]:
        data = key.encode()
        first = crc32c.crc32c(data)
        second = crc32c.crc32c(data, 0x9E3779B9) | 1
        for index in range(self.hash_count):
            yield (first + index * second) % self.bit_count

    def add(self, key: str) -> None:
        for position in self._positions(key):
            self.bits[position >> 3] |= 1 << (position & 7)

    def may_contain(self, key: str) -> bool:
        return all(self.bits[p >> 3] & (1 << (p & 7)) for p in self._positions(key))

    def encode(self) -> str:
        return base64.b64encode(_FILTER_HEAD.pack(self.hash_count, self.bit_count) + bytes(self.bits)).decode()

    @classmethod
    def decode(cls, text: str) -> "KeyFilter":
        data = base64.b64decode(text)
        hash_count, bit_count = _FILTER_HEAD.unpack_from(data, 0)
        if not (KEY_FILTER_BITS_MIN <= bit_count <= KEY_FILTER_BITS_MAX and bit_count % 8 == 0
                and 1 <= hash_count <= 16 and len(data) == _FILTER_HEAD.size + bit_count // 8):
            raise ValueError("bad key filter")
        return cls(bit_count, hash_count, bytearray(data[_FILTER_HEAD.size:]))


# --- names ------------------------------------------------------------------------------------

_FILE_NAME = re.compile(r"^(\d{20})-(\d{20})-([0-9a-f]{8,32})\.arrow$")


def file_name(ledger_id: int, first_entry_id: int, token: str) -> str:
    """``<ledger_id>-<first_entry_id>-<token>.arrow``, ids zero-padded to 20 digits so
    names sort in topic order. ``token`` (hex) is unique per write attempt: two brokers
    archiving the same slice, or a re-run after a crash, never replace a file the
    manifest already names."""
    assert ledger_id >= 0 and first_entry_id >= 0, (ledger_id, first_entry_id)
    assert re.fullmatch(r"[0-9a-f]{8,32}", token), token
    return f"{ledger_id:020d}-{first_entry_id:020d}-{token}{FILE_SUFFIX}"


def parse_file_name(name: str) -> tuple[int, int, str] | None:
    """(ledger_id, first_entry_id, token) of an archive file name, None for another."""
    match = _FILE_NAME.match(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), match.group(3)


def temp_name(name: str) -> str:
    """Where a file is written before its rename: hidden, and never a file name."""
    return f"{TEMP_PREFIX}{name}{TEMP_SUFFIX}"


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)
