"""The bookie's on-disk byte layouts (bookie/format.py): file headers, journal records,
entry log records, the checkpoint and file names.

What it proves: each encoder produces the documented layout and its decoder gives the
values back; journal replay (iter_journal_records) yields exactly the records wholly
present and intact, and stops - without raising - at a torn tail, zero fill or a CRC
mismatch; entry log scans stop at a truncated record; a checkpoint with any damage is
MalformedFrame; file names round-trip and sort in id order.

How: tables of (bytes, expected), every prefix of a record stream (whole input, halves,
single bytes), every flipped byte of a record or checkpoint.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from bookie.format import (
    CHECKPOINT_MAGIC,
    CHECKPOINT_SIZE,
    ENTRY_LOG_MAGIC,
    ENTRY_LOG_RECORD_HEAD_SIZE,
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    JOURNAL_MAGIC,
    JOURNAL_RECORD_HEAD_SIZE,
    RECORD_ADD,
    RECORD_FENCE,
    JournalPosition,
    decode_checkpoint,
    decode_file_header,
    encode_checkpoint,
    encode_file_header,
    entry_log_file_name,
    entry_log_record_head,
    iter_entry_log_records,
    iter_journal_records,
    journal_add_record,
    journal_fence_record,
    journal_file_name,
    parse_file_id,
)
from common.entry import encode_entry
from common.errors import MalformedFrame

U64_MAX = 2**64 - 1


# --- file headers ---------------------------------------------------------------------------

@pytest.mark.parametrize("magic", [JOURNAL_MAGIC, ENTRY_LOG_MAGIC])
@pytest.mark.parametrize("file_id", [0, 1, 0xABCDEF, U64_MAX])
def test_file_header_round_trip(magic, file_id):
    """A file header decodes to its id when read with the same magic."""
    header = encode_file_header(magic, file_id)
    assert len(header) == FILE_HEADER_SIZE == 16
    assert decode_file_header(header, magic) == file_id
    # Readers pass the first bytes of a whole file; what follows is not their concern.
    assert decode_file_header(header + b"\x00" * 100, magic) == file_id


def test_file_header_layout():
    """magic (4), version (2), reserved (2), file id (8), big-endian."""
    assert encode_file_header(JOURNAL_MAGIC, 0x0102) == (
        b"MGJL" + FORMAT_VERSION.to_bytes(2, "big") + b"\x00\x00" + (0x0102).to_bytes(8, "big"))


def _header_with(version: int) -> bytes:
    return b"MGJL" + version.to_bytes(2, "big") + b"\x00\x00" + (1).to_bytes(8, "big")


BAD_FILE_HEADERS = [
    (b"", "truncated"),
    (b"MGJL", "truncated"),
    (encode_file_header(JOURNAL_MAGIC, 1)[:15], "truncated"),
    (encode_file_header(ENTRY_LOG_MAGIC, 1), "magic"),     # an entry log read as a journal
    (b"\x00" * 16, "magic"),                               # zero-filled file
    (_header_with(0), "version"),
    (_header_with(FORMAT_VERSION + 1), "version"),
    (_header_with(0xFFFF), "version"),
]


@pytest.mark.parametrize("data, why", BAD_FILE_HEADERS)
def test_bad_file_headers_are_malformed(data, why):
    """Truncated headers, wrong magic and unsupported versions raise MalformedFrame."""
    with pytest.raises(MalformedFrame):
        decode_file_header(data, JOURNAL_MAGIC)


# --- journal records -------------------------------------------------------------------------

def _entry(ledger_id: int, entry_id: int, payload: bytes = b"data") -> bytes:
    return encode_entry(ledger_id, entry_id, entry_id - 1, 10_000, payload)


def _add(entry: bytes) -> bytes:
    return b"".join(journal_add_record(entry))


def test_add_record_layout():
    """ADD: body_size = 1 + entry size, CRC32C over type byte and entry, then type 1."""
    entry = _entry(1, 0)
    buffers = journal_add_record(entry)
    assert buffers[-1] is entry, "the entry is passed on for a vectored write, not copied"
    record = b"".join(buffers)
    body_size, crc = struct.unpack_from(">II", record)
    assert body_size == 1 + len(entry)
    assert crc == crc32c.crc32c(b"\x01" + entry)
    assert record[8] == RECORD_ADD
    assert record[9:] == entry


def test_fence_record_layout():
    """FENCE: body_size 9, CRC32C over type byte and ledger id, then type 2 and a u64."""
    record = journal_fence_record(0x1122334455667788)
    assert len(record) == JOURNAL_RECORD_HEAD_SIZE + 9
    body = b"\x02" + (0x1122334455667788).to_bytes(8, "big")
    assert record == struct.pack(">II", 9, crc32c.crc32c(body)) + body


def _stream() -> tuple[bytes, list[tuple[int, int, int, bytes, int]]]:
    """A journal file body of mixed records, and what each record should decode to:
    (type, offset, end_offset, entry, ledger_id)."""
    data = encode_file_header(JOURNAL_MAGIC, 3)
    expected = []
    parts = [("add", _entry(1, 0)), ("fence", 1), ("add", _entry(2, 0, b"")),
             ("add", _entry(2, 1, b"x" * 300)), ("fence", U64_MAX), ("add", _entry(1, 1))]
    for kind, value in parts:
        offset = len(data)
        if kind == "add":
            data += _add(value)
            expected.append((RECORD_ADD, offset, len(data), value, -1))
        else:
            data += journal_fence_record(value)
            expected.append((RECORD_FENCE, offset, len(data), b"", value))
    return data, expected


STREAM, STREAM_RECORDS = _stream()


def _decoded(data, start: int = FILE_HEADER_SIZE) -> list[tuple[int, int, int, bytes, int]]:
    return [(r.record_type, r.offset, r.end_offset, r.entry, r.ledger_id)
            for r in iter_journal_records(data, start)]


def test_whole_stream_yields_every_record_with_offsets():
    """Each record comes back with its type, body and exact [offset, end_offset)."""
    assert _decoded(STREAM) == STREAM_RECORDS
    assert STREAM_RECORDS[-1][2] == len(STREAM)


def test_stream_accepts_bytes_like_inputs():
    """Replay reads an mmap; a memoryview or bytearray decodes the same as bytes."""
    assert _decoded(memoryview(STREAM)) == STREAM_RECORDS
    assert _decoded(bytearray(STREAM)) == STREAM_RECORDS


@pytest.mark.parametrize("index", range(len(STREAM_RECORDS)))
def test_replay_from_a_record_boundary_yields_the_rest(index):
    """Starting at a record's offset (a checkpoint position) skips everything before."""
    start = STREAM_RECORDS[index][1]
    assert _decoded(STREAM, start) == STREAM_RECORDS[index:]


def test_replay_from_the_end_yields_nothing():
    """A checkpoint at the end of the data (or past it) has nothing left to replay."""
    assert _decoded(STREAM, len(STREAM)) == []
    assert _decoded(STREAM, len(STREAM) + 100) == []


def test_every_prefix_yields_exactly_the_whole_records():
    """A torn tail of any length (every cut point, which includes halves and single
    bytes of each record) yields the records that end inside the prefix, and no more."""
    for cut in range(FILE_HEADER_SIZE, len(STREAM) + 1):
        expected = [record for record in STREAM_RECORDS if record[2] <= cut]
        assert _decoded(STREAM[:cut]) == expected, cut


@pytest.mark.parametrize("fill_size", [1, 4, 7, 8, 9, 4096])
def test_zero_fill_after_records_stops_replay(fill_size):
    """Zeroed space after the last record (a preallocated or extended file) ends
    replay: a body size of 0 marks the end of written data."""
    assert _decoded(STREAM + b"\x00" * fill_size) == STREAM_RECORDS


@pytest.mark.parametrize("index", range(len(STREAM_RECORDS)))
def test_any_flipped_byte_in_a_record_stops_replay_there(index):
    """Damage anywhere in record ``index`` (size, CRC, type or body) makes replay yield
    exactly the records before it and stop without raising."""
    _type, offset, end_offset, _entry_bytes, _ledger = STREAM_RECORDS[index]
    for position in range(offset, end_offset):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(STREAM)
            damaged[position] ^= mask
            assert _decoded(bytes(damaged)) == STREAM_RECORDS[:index], (position, mask)


def test_garbage_after_records_stops_replay():
    """Bytes that do not form a record with a matching CRC end replay quietly."""
    garbage = bytes(range(7, 250))
    assert _decoded(STREAM + garbage) == STREAM_RECORDS


def _raw_record(body: bytes) -> bytes:
    return struct.pack(">II", len(body), crc32c.crc32c(body)) + body


@pytest.mark.parametrize("body", [
    b"\x03" + b"\x00" * 8,               # unknown type
    b"\x00",                             # type 0
    b"\xff" + b"abc",                    # type 255
    b"\x02" + b"\x00" * 4,               # FENCE with a short ledger id
    b"\x02" + b"\x00" * 9,               # FENCE with a long body
])
def test_checksummed_record_of_unknown_shape_is_malformed(body):
    """A record whose CRC matches but whose type or size is unknown is not a torn
    write: it comes from a newer bookie, and replay must not skip it silently."""
    data = STREAM + _raw_record(body)
    records = iter_journal_records(data, FILE_HEADER_SIZE)
    for _ in STREAM_RECORDS:
        next(records)
    with pytest.raises(MalformedFrame):
        next(records)


# --- entry log records ---------------------------------------------------------------------------

def _entry_log() -> tuple[bytes, list[tuple[int, bytes]]]:
    data = encode_file_header(ENTRY_LOG_MAGIC, 9)
    expected = []
    for ledger_id, entry_id, payload in [(1, 0, b"a"), (1, 1, b""), (2, 0, b"q" * 500), (1, 2, b"zz")]:
        entry = _entry(ledger_id, entry_id, payload)
        data += entry_log_record_head(len(entry))
        expected.append((len(data), entry))
        data += entry
    return data, expected


ENTRY_LOG, ENTRY_LOG_RECORDS = _entry_log()


def test_entry_log_record_head_is_a_u32_size():
    """The record head is the entry size as a big-endian u32."""
    assert entry_log_record_head(0x01020304) == b"\x01\x02\x03\x04"
    assert ENTRY_LOG_RECORD_HEAD_SIZE == 4


def test_entry_log_scan_yields_entry_offsets_and_bytes():
    """Each record yields the offset of the entry bytes (after its head) and the entry."""
    found = [(offset, bytes(entry)) for offset, entry in iter_entry_log_records(ENTRY_LOG)]
    assert found == ENTRY_LOG_RECORDS
    for offset, entry in ENTRY_LOG_RECORDS:
        assert ENTRY_LOG[offset:offset + len(entry)] == entry


def test_entry_log_every_prefix_yields_only_whole_records():
    """A log flushed partly before a crash yields the complete records only."""
    for cut in range(FILE_HEADER_SIZE, len(ENTRY_LOG) + 1):
        expected = [(o, e) for o, e in ENTRY_LOG_RECORDS if o + len(e) <= cut]
        found = [(o, bytes(e)) for o, e in iter_entry_log_records(ENTRY_LOG[:cut])]
        assert found == expected, cut


def test_entry_log_zero_size_stops_the_scan():
    """A zero record head (unwritten space) ends the scan."""
    found = list(iter_entry_log_records(ENTRY_LOG + b"\x00" * 64))
    assert len(found) == len(ENTRY_LOG_RECORDS)


def test_entry_log_scan_from_an_offset():
    """Scanning from a record boundary skips the records before it."""
    second_head = ENTRY_LOG_RECORDS[1][0] - ENTRY_LOG_RECORD_HEAD_SIZE
    found = [(o, bytes(e)) for o, e in iter_entry_log_records(ENTRY_LOG, second_head)]
    assert found == ENTRY_LOG_RECORDS[1:]


# --- checkpoint ----------------------------------------------------------------------------------

@pytest.mark.parametrize("position", [
    JournalPosition(0, 0), JournalPosition(1, 16), JournalPosition(7, 123_456_789),
    JournalPosition(U64_MAX, U64_MAX),
])
def test_checkpoint_round_trip(position):
    """A checkpoint decodes to the position it was made from."""
    data = encode_checkpoint(position)
    assert len(data) == CHECKPOINT_SIZE == 28
    assert decode_checkpoint(data) == position


def test_checkpoint_layout():
    """magic, version, reserved, journal id, offset, then CRC32C over the first 24 bytes."""
    data = encode_checkpoint(JournalPosition(3, 4096))
    body = CHECKPOINT_MAGIC + FORMAT_VERSION.to_bytes(2, "big") + b"\x00\x00" + (3).to_bytes(8, "big") + (
        4096).to_bytes(8, "big")
    assert data == body + crc32c.crc32c(body).to_bytes(4, "big")


CHECKPOINT = encode_checkpoint(JournalPosition(5, 70_000))


@pytest.mark.parametrize("length", list(range(CHECKPOINT_SIZE)) + [CHECKPOINT_SIZE + 1, 64])
def test_checkpoint_of_wrong_length_is_malformed(length):
    """A truncated (torn) or over-long checkpoint file is MalformedFrame."""
    data = (CHECKPOINT + b"\x00" * 64)[:length]
    with pytest.raises(MalformedFrame):
        decode_checkpoint(data)


@pytest.mark.parametrize("offset", range(CHECKPOINT_SIZE))
def test_checkpoint_any_flipped_bit_is_malformed(offset):
    """Every single-bit flip and byte inversion anywhere in a checkpoint is caught (by
    the magic, version or CRC check) and never yields a wrong position."""
    for mask in [1 << bit for bit in range(8)] + [0xFF]:
        damaged = bytearray(CHECKPOINT)
        damaged[offset] ^= mask
        with pytest.raises(MalformedFrame):
            decode_checkpoint(bytes(damaged))


def test_journal_positions_order_by_file_then_offset():
    """Positions compare as (journal_id, offset), which applied_position relies on."""
    assert JournalPosition(1, 1_000_000) < JournalPosition(2, 16)
    assert JournalPosition(2, 16) < JournalPosition(2, 17)
    assert JournalPosition(2, 16) == JournalPosition(2, 16)


# --- file names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("file_id", [0, 1, 255, 2**40 + 3, U64_MAX])
def test_file_names_round_trip(file_id):
    """parse_file_id inverts journal_file_name and entry_log_file_name."""
    assert parse_file_id(journal_file_name(file_id), "journal") == file_id
    assert parse_file_id(entry_log_file_name(file_id), "entrylog") == file_id


def test_file_names_sort_in_id_order():
    """Zero-padded names list in the same order as their ids."""
    ids = [0, 1, 9, 10, 255, 4096, 2**40]
    assert sorted(journal_file_name(i) for i in ids) == [journal_file_name(i) for i in ids]


@pytest.mark.parametrize("name", [
    "checkpoint", "checkpoint.tmp", "index.sqlite", "journal-0000000000000001.tmp",
    "entrylog-0000000000000001.log", "journal-.log", "journal-xyz.log", "journal.log",
    "journal0000000000000001.log",
])
def test_parse_file_id_ignores_other_files(name):
    """Files that are not journals (other prefixes, suffixes, non-hex ids) give None."""
    assert parse_file_id(name, "journal") is None


NON_CANONICAL_NAMES = [
    "journal--1.log",                 # a negative id
    "journal-0x10.log",               # int(..., 16) accepts a 0x prefix
    "journal-+1.log",                 # ... a sign
    "journal-1_0.log",                # ... underscores
    "journal- 1.log",                 # ... whitespace
    "journal-1.log",                  # not the 16-digit name journal_file_name makes
]


def test_parse_file_id_accepts_only_names_the_bookie_writes():
    """Only names that journal_file_name produces are journals. Anything else parsed to
    an id makes list_journal_ids report an id whose canonical file does not exist (or
    report one id twice), and replay/trim then open or unlink the wrong path."""
    accepted = {name: parse_file_id(name, "journal") for name in NON_CANONICAL_NAMES}
    assert {name: file_id for name, file_id in accepted.items() if file_id is not None} == {}
