"""The archive file format, rows and the byte-exact rebuild of entries (archive/format.py,
archive/rows.py, archive/entries.py): pure, no files.

Proves: every kind of entry (single, batch, compressed batch, encrypted, empty payload)
unpacks into one row per message with the documented columns, and every entry rebuilds
from its rows to exactly the stored bytes; a record batch's checksum is the same after
an IPC round trip (with and without compression); the footer metadata round-trips and
every way of damaging it is refused naming the file; a rebuild that does not match the
producer's CRC32C is refused; the key filter never says no to a key it holds; file
names sort in topic order and are told apart from temporary names.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from archive import format as archive_format
from archive.entries import entries_of_batch
from archive.format import (
    FOOTER_CHECKSUM_KEY,
    FOOTER_KEY,
    SCHEMA,
    KeyFilter,
    batch_checksum,
    decode_footer,
    encode_footer,
    file_name,
    is_temp_name,
    parse_file_name,
    temp_name,
)
from archive.rows import BatchBuilder
from archive.writer import SliceBuilder, WriterConfig
from common.errors import ArchiveCorrupt, ArchiveFormatUnsupported, MalformedFrame
from protocol.codec import PayloadChecksumMismatch
from tests.unit import archive_entries

TOPIC = "persistent://public/default/orders"


def build(entries: list[bytes], ledger_id: int = 7) -> tuple[pa.RecordBatch, archive_format.BatchMetadata]:
    builder = BatchBuilder(TOPIC, -1, ledger_id)
    for entry_id, stored in enumerate(entries):
        builder.add_entry(entry_id, stored)
    return builder.finish()


def test_every_kind_of_entry_rebuilds_byte_for_byte():
    """Singles, batches, compressed batches (zlib, LZ4, ZSTD), encrypted and empty
    payloads: each entry comes back from its rows exactly as stored."""
    entries = archive_entries.mixed(40)
    batch, _metadata = build(entries)
    rebuilt = entries_of_batch(batch, "memory://t", 0)
    assert [entry_id for entry_id, _ in rebuilt] == list(range(40))
    for (entry_id, data), original in zip(rebuilt, entries):
        assert data == original, entry_id


def test_rows_hold_one_message_each_with_its_fields():
    """A batch of five becomes five rows with batch indexes, keys, properties, event
    times, ordering keys and sequence ids of the messages; a single message one row
    with batch_index -1; an encrypted batch one opaque row."""
    entries = [archive_entries.single(0, key="k0", properties={"a": "1"}), archive_entries.batch(1, 5),
               archive_entries.encrypted(2), archive_entries.single(3, key=None, properties={})]
    batch, metadata = build(entries)
    rows = batch.to_pylist()
    assert len(rows) == 1 + 5 + 1 + 1
    first = rows[0]
    assert (first["topic"], first["partition"], first["ledger_id"], first["entry_id"]) == (TOPIC, -1, 7, 0)
    assert (first["batch_index"], first["batch_size"], first["key"]) == (-1, 0, "k0")
    assert first["properties"] == [("a", "1")]
    assert first["payload"] == b"single-0"
    assert first["event_time"] is None
    batched = rows[1:6]
    assert [r["batch_index"] for r in batched] == [0, 1, 2, 3, 4]
    assert {r["batch_size"] for r in batched} == {5}
    assert [r["key"] for r in batched] == ["key-0", "key-1", "key-2", "key-0", "key-1"]
    assert [r["properties"] for r in batched] == [[("index", str(i))] for i in range(5)]
    assert batched[2]["ordering_key"] == b"\x00order"
    assert [r["sequence_id"] for r in batched] == [1005 + i for i in range(5)]
    assert batched[0]["event_time"].timestamp() == 10**12 / 1000
    assert batched[0]["entry_metadata"] is not None and batched[1]["entry_metadata"] is None
    assert all(r["single_metadata"] is not None for r in batched)
    opaque = rows[6]
    assert (opaque["batch_index"], opaque["batch_size"], opaque["payload"]) == (-1, 3, b"\x8f" * 40)
    assert rows[7]["key"] is None and rows[7]["properties"] == []
    assert metadata.row_count == 8 and (metadata.first_entry_id, metadata.last_entry_id) == (0, 3)
    assert metadata.key_min == "k0" and metadata.key_max == "key-2"
    assert batch.schema.equals(SCHEMA)


def test_compressed_batches_are_unpacked_for_analytics():
    """The rows of a compressed batch hold its messages decompressed; the compressed
    payload is kept once, for the rebuild."""
    from protocol.proto.pulsar_api_pb2 import CompressionType

    for codec in (CompressionType.ZLIB, CompressionType.LZ4, CompressionType.ZSTD):
        batch, _ = build([archive_entries.batch(0, 4, compression=codec)])
        rows = batch.to_pylist()
        assert [r["payload"] for r in rows] == [b"m0-%d|" % i + b"x" * i for i in range(4)]
        assert rows[0]["entry_payload"] is not None and rows[1]["entry_payload"] is None


def test_a_batch_that_does_not_split_is_kept_opaque():
    """The broker never looked inside a batch: one whose sizes lie is archived as a
    single opaque row, and still rebuilds exactly."""
    from protocol.codec import encode_stored
    from protocol.proto.pulsar_api_pb2 import MessageMetadata

    metadata = MessageMetadata(producer_name="p", sequence_id=1, publish_time=5, num_messages_in_batch=3)
    stored = encode_stored(metadata, b"\x00\x00\x00\xffgarbage")
    batch, _ = build([stored])
    rows = batch.to_pylist()
    assert len(rows) == 1 and rows[0]["batch_index"] == -1 and rows[0]["batch_size"] == 3
    assert entries_of_batch(batch, "memory://t", 0) == [(0, stored)]


@pytest.mark.parametrize("damage", ["checksum", "magic", "short"])
def test_corrupt_entries_are_never_archived(damage):
    """An entry whose CRC32C, magic or length is wrong is refused before any row."""
    stored = bytearray(archive_entries.single(0))
    if damage == "checksum":
        stored[-1] ^= 1
        expected = PayloadChecksumMismatch
    elif damage == "magic":
        stored[0] ^= 1
        expected = MalformedFrame
    else:
        stored = stored[:5]
        expected = MalformedFrame
    builder = BatchBuilder(TOPIC, -1, 1)
    with pytest.raises(expected):
        builder.add_entry(0, bytes(stored))
    assert builder.row_count == 0


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_batch_checksum_survives_an_ipc_round_trip(compression):
    """The checksum a writer computes equals the one a reader computes from the decoded
    batch, whatever the buffer compression."""
    batch, metadata = build(archive_entries.mixed(24))
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, SCHEMA, options=ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_batch(batch)
    decoded = ipc.open_file(sink.getvalue()).get_batch(0)
    assert batch_checksum(decoded) == metadata.crc32c


def test_a_rebuild_that_differs_from_the_producers_bytes_is_refused():
    """A row changed after the fact (a payload) makes the rebuilt entry's CRC32C differ
    from the producer's: ArchiveCorrupt naming the file and batch, no data."""
    batch, _ = build([archive_entries.single(0), archive_entries.single(1)])
    payloads = batch.column(SCHEMA.get_field_index("payload")).to_pylist()
    payloads[1] = b"tampered"
    columns = list(batch.columns)
    columns[SCHEMA.get_field_index("payload")] = pa.array(payloads, pa.binary())
    tampered = pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
    with pytest.raises(ArchiveCorrupt) as raised:
        entries_of_batch(tampered, "file:///archive/x.arrow", 3)
    assert raised.value.batch_index == 3
    assert "file:///archive/x.arrow record batch 3" in str(raised.value)


def slice_metadata(entry_count: int = 30, batch_rows_max: int = 10) -> archive_format.FileMetadata:
    builder = SliceBuilder(WriterConfig(batch_rows_max=batch_rows_max), TOPIC, -1, 9)
    for entry_id, stored in enumerate(archive_entries.mixed(entry_count)):
        builder.add_entry(entry_id, stored)
    return builder.finish()[1]


def test_footer_round_trips_and_describes_the_slice():
    """encode_footer / decode_footer give back the same metadata; batches tile the
    entry range, never splitting an entry."""
    metadata = slice_metadata()
    assert len(metadata.batches) > 1
    assert decode_footer("memory://f", encode_footer(metadata)) == metadata
    assert metadata.batches[0].first_entry_id == 0 and metadata.batches[-1].last_entry_id == 29
    for before, after in zip(metadata.batches, metadata.batches[1:]):
        assert after.first_entry_id == before.last_entry_id + 1
    assert metadata.batch_for_entry(0) == 0
    assert metadata.batch_for_entry(29) == len(metadata.batches) - 1


def _rewritten(footer: dict[bytes, bytes], change) -> dict[bytes, bytes]:
    doc = json.loads(footer[FOOTER_KEY])
    change(doc)
    text = json.dumps(doc).encode()
    from crc32c import crc32c

    return {FOOTER_KEY: text, FOOTER_CHECKSUM_KEY: f"{crc32c(text):08x}".encode()}


def test_damaged_footers_are_refused_naming_the_file():
    """Missing metadata, a flipped byte (checksum), a foreign magic, a newer version, a
    gap between batches and a wrong row count: each an error naming the file."""
    footer = encode_footer(slice_metadata())
    url = "file:///archive/f.arrow"
    flipped = dict(footer)
    flipped[FOOTER_KEY] = footer[FOOTER_KEY].replace(b'"row_count"', b'"row_countX"', 1)
    cases = [
        None,
        {b"other": b"x"},
        flipped,
        _rewritten(footer, lambda d: d.__setitem__("magic", "something-else")),
        _rewritten(footer, lambda d: d["batches"][1].__setitem__("first_entry_id", d["batches"][1]["first_entry_id"] + 1)),
        _rewritten(footer, lambda d: d.__setitem__("row_count", d["row_count"] + 1)),
        _rewritten(footer, lambda d: d.__setitem__("batches", [])),
    ]
    for custom in cases:
        with pytest.raises(ArchiveCorrupt) as raised:
            decode_footer(url, custom)
        assert url in str(raised.value)
    with pytest.raises(ArchiveFormatUnsupported) as raised:
        decode_footer(url, _rewritten(footer, lambda d: d.__setitem__("format_version", 99)))
    assert url in str(raised.value)


def test_key_filter_has_no_false_negatives_and_few_false_positives():
    """Every key put in is found; of keys never put in, about 1% or fewer pass."""
    keys = [f"user-{i}" for i in range(2000)]
    key_filter = KeyFilter.decode(KeyFilter.of(keys).encode())
    assert all(key_filter.may_contain(key) for key in keys)
    false_positives = sum(key_filter.may_contain(f"other-{i}") for i in range(10_000))
    assert false_positives < 300


def test_batch_metadata_prunes_by_time_entries_and_key():
    """overlaps_time / overlaps_entries / may_contain_key answer False only when no row
    can match."""
    batch = slice_metadata(8, batch_rows_max=1000).batches[0]
    assert batch.overlaps_time(None, None)
    assert not batch.overlaps_time(batch.publish_time_ms_max + 1, None)
    assert not batch.overlaps_time(None, batch.publish_time_ms_min - 1)
    assert batch.overlaps_entries(3, 3) and not batch.overlaps_entries(100, None)
    assert batch.may_contain_key("key-1")
    assert not batch.may_contain_key("zzz-not-there")
    no_keys = dataclasses.replace(batch, key_min=None, key_max=None, key_filter=None)
    assert not no_keys.may_contain_key("key-1")


def test_file_names_sort_in_topic_order_and_temp_names_are_apart():
    """Names carry zero-padded ids and a per-attempt token; temporary names are hidden
    and never parse as file names."""
    names = [file_name(2, 0, "aa" * 4), file_name(10, 0, "bb" * 4), file_name(10, 500, "cc" * 4)]
    assert names == sorted(names)
    assert parse_file_name(names[2]) == (10, 500, "cc" * 4)
    assert is_temp_name(temp_name(names[0])) and not is_temp_name(names[0])
    assert parse_file_name(temp_name(names[0])) is None
    assert parse_file_name("notes.txt") is None
