"""Cursor state records (subscriptions/cursor_record.py): what a cursor ledger entry (or
the inline etcd copy) holds.

What it proves: snapshots and deltas round trip exactly (mark-delete position, acked
entries, partly acknowledged batches with bitsets wider than 64 bits, properties); the
head follows the documented layout; encoding is deterministic; a record is compact
(an empty one is a few dozen bytes, 100,000 regular holes about a kilobyte); every
truncation, a wrong magic, version or kind, trailing bytes, and garbage in each section
raise MalformedFrame and nothing else; ``apply_delta`` adds a delta's entries.

How: a table of records to round trip, a table of corrupt records built by splicing
sections, every prefix of a valid record, and seeded random mutations.
"""

from __future__ import annotations

import json
import random
import struct

import pytest

from common.position import Position
from common.errors import MalformedFrame
from subscriptions.ack_set import AckSet
from subscriptions.cursor_record import (
    FORMAT_VERSION,
    KIND_DELTA,
    KIND_SNAPSHOT,
    MAGIC,
    CursorRecord,
    apply_delta,
    decode_record,
    encode_record,
)
from tests.unit.ack_sets import ack_set_of, marked

_HEAD = struct.Struct(">HBBqqI")
_U32 = struct.Struct(">I")


def assert_same_record(left: CursorRecord, right: CursorRecord) -> None:
    assert left.kind == right.kind
    assert left.mark_delete == right.mark_delete
    assert isinstance(right.mark_delete, Position)
    assert marked(left.acked) == marked(right.acked)
    assert len(left.acked) == len(right.acked)
    assert left.batches == right.batches
    assert left.properties == right.properties


def spliced(*, magic: int = MAGIC, version: int = FORMAT_VERSION, kind: int = KIND_SNAPSHOT,
            mark_delete: tuple[int, int] = (3, 4), acked: bytes | None = None, batches: bytes = b"[]",
            properties: bytes = b"{}", tail: bytes = b"") -> bytes:
    """A record assembled section by section, so one section at a time can be spoiled."""
    acked = AckSet().encode() if acked is None else acked
    return (_HEAD.pack(magic, version, kind, *mark_delete, len(acked)) + acked
            + _U32.pack(len(batches)) + batches + _U32.pack(len(properties)) + properties + tail)


RECORDS = [
    ("empty snapshot", CursorRecord(KIND_SNAPSHOT, Position(-1, -1), AckSet(), {}, {})),
    ("delta with acks", CursorRecord(KIND_DELTA, Position(5, 9), ack_set_of((5, 11), (5, 12), (6, 0)), {}, {})),
    ("batches", CursorRecord(KIND_SNAPSHOT, Position(5, 9), AckSet(), {
        Position(5, 10): (10, 0b1011_0000_00),
        Position(5, 14): (200, (1 << 199) | (1 << 64) | 1),           # wider than one 64-bit word
        Position(4, 3): (64, (1 << 64) - 1),
    }, {})),
    ("properties", CursorRecord(KIND_DELTA, Position(0, 0), AckSet(), {},
                                {"zeta": -5, "alpha": 2**62, "ünïcode": 1})),
    ("everything", CursorRecord(KIND_SNAPSHOT, Position(2**40, 2**31), ack_set_of(*((2**40, e) for e in range(
        2**31 + 2, 2**31 + 500, 3))), {Position(2**40, 2**31 + 1): (3, 0b100)}, {"count": 7})),
]


@pytest.mark.parametrize("name, record", RECORDS, ids=[name for name, _ in RECORDS])
def test_round_trip(name, record):
    """decode(encode(r)) equals r field by field, and re-encoding gives the same bytes."""
    data = encode_record(record)
    decoded = decode_record(data)
    assert_same_record(record, decoded)
    assert encode_record(decoded) == data
    assert_same_record(record, decode_record(memoryview(data)))         # views decode too
    assert_same_record(record, decode_record(bytearray(data)))


def test_head_follows_the_documented_layout():
    """magic | version | kind | mark-delete ledger, entry | acked size, then the sections."""
    record = CursorRecord(KIND_DELTA, Position(0x0102030405060708, 9), ack_set_of((1, 1)), {}, {"a": 1})
    data = encode_record(record)
    assert data[0:2] == b"\x4d\x43"
    assert data[2] == FORMAT_VERSION
    assert data[3] == KIND_DELTA
    assert data[4:12] == bytes.fromhex("0102030405060708")
    assert data[12:20] == (9).to_bytes(8, "big")
    (acked_size,) = _U32.unpack_from(data, 20)
    assert AckSet.decode(data[24:24 + acked_size]).contains(1, 1)
    offset = 24 + acked_size
    (batches_size,) = _U32.unpack_from(data, offset)
    assert json.loads(data[offset + 4:offset + 4 + batches_size]) == []
    offset += 4 + batches_size
    (properties_size,) = _U32.unpack_from(data, offset)
    assert json.loads(data[offset + 4:]) == {"a": 1}
    assert offset + 4 + properties_size == len(data)


def test_negative_mark_delete_entry_is_signed_on_the_wire():
    """A mark-delete position of (ledger, -1) (nothing of the ledger acknowledged yet) survives."""
    record = CursorRecord(KIND_SNAPSHOT, Position(7, -1), AckSet(), {}, {})
    assert decode_record(encode_record(record)).mark_delete == Position(7, -1)


def test_encoding_is_deterministic_whatever_the_insertion_order():
    """Batches are sorted by position and properties by name before encoding."""
    first = CursorRecord(KIND_SNAPSHOT, Position(1, 1), AckSet(),
                         {Position(1, 5): (2, 1), Position(1, 3): (2, 2)}, {"b": 1, "a": 2})
    second = CursorRecord(KIND_SNAPSHOT, Position(1, 1), AckSet(),
                          {Position(1, 3): (2, 2), Position(1, 5): (2, 1)}, {"a": 2, "b": 1})
    assert encode_record(first) == encode_record(second)


# --- compactness ---------------------------------------------------------------------------------

def test_empty_record_is_small():
    data = encode_record(CursorRecord(KIND_SNAPSHOT, Position(1, 2), AckSet(), {}, {}))
    assert len(data) <= 64, len(data)


def test_many_regular_holes_encode_compactly():
    """100,000 holes (every other entry of 200,000 acknowledged) fit in about a kilobyte,
    where a range list would need over a megabyte."""
    acked = AckSet()
    for entry_id in range(1, 200_000, 2):
        acked.add(3, entry_id)
    data = encode_record(CursorRecord(KIND_SNAPSHOT, Position(3, 0), acked, {}, {}))
    assert len(data) < 2_000, len(data)
    decoded = decode_record(data)
    assert len(decoded.acked) == 100_000
    assert decoded.acked.contains(3, 199_999) and not decoded.acked.contains(3, 199_998)


# --- corruption ------------------------------------------------------------------------------------

def test_the_splicing_helper_builds_valid_records():
    """The base of the corrupt table decodes, so each corrupt case differs in one thing only."""
    record = decode_record(spliced(batches=b'[[3, 5, 2, "1"]]', properties=b'{"x": 1}'))
    assert record.mark_delete == Position(3, 4)
    assert record.batches == {Position(3, 5): (2, 1)}
    assert record.properties == {"x": 1}


_DEEP = b"[" * 100_000 + b"]" * 100_000

CORRUPT = [
    ("empty", b""),
    ("head only partly there", spliced()[:10]),
    ("wrong magic", spliced(magic=0x4D44)),
    ("byte-swapped magic", spliced(magic=0x434D)),
    ("version zero", spliced(version=0)),
    ("version from the future", spliced(version=FORMAT_VERSION + 1)),
    ("kind zero", spliced(kind=0)),
    ("unknown kind", spliced(kind=3)),
    ("acked not zlib", spliced(acked=b"garbage!")),
    ("acked size beyond the record", _HEAD.pack(MAGIC, FORMAT_VERSION, 1, 0, 0, 1_000)),
    ("batches not JSON", spliced(batches=b"[[1, 2,")),
    ("batches not UTF-8", spliced(batches=b'[[1, 2, 3, "\xff"]]')),
    ("batches an object", spliced(batches=b'{"a": 1}')),
    ("batches a number", spliced(batches=b"5")),
    ("batches null", spliced(batches=b"null")),
    ("batch with three fields", spliced(batches=b"[[1, 2, 3]]")),
    ("batch bits not a number", spliced(batches=b'[[1, 2, 3, "ff"]]')),
    ("batch ledger a list", spliced(batches=b'[[[1], 2, 3, "1"]]')),
    ("batch bits infinite", spliced(batches=b"[[1, 2, 3, Infinity]]")),
    ("batch size NaN", spliced(batches=b'[[1, 2, NaN, "1"]]')),
    ("batches nested too deep", spliced(batches=_DEEP)),
    ("properties not JSON", spliced(properties=b"{")),
    ("properties a list", spliced(properties=b"[1, 2]")),
    ("properties a string", spliced(properties=b'"abc"')),
    ("property value not a number", spliced(properties=b'{"a": "b"}')),
    ("property value a list", spliced(properties=b'{"a": [1]}')),
    ("property value infinite", spliced(properties=b'{"a": Infinity}')),
    ("properties nested too deep", spliced(properties=_DEEP)),
    ("trailing bytes", spliced(tail=b"\x00")),
    ("batches size beyond the record", spliced()[:-7] + _U32.pack(0xFFFFFFFF)),
]


@pytest.mark.parametrize("name, data", CORRUPT, ids=[name for name, _ in CORRUPT])
def test_corrupt_records_raise_malformed_frame(name, data):
    """Each kind of damage is refused with our error type, never an obscure crash."""
    with pytest.raises(MalformedFrame):
        decode_record(data)


def test_every_truncation_is_refused():
    """Every strict prefix of a valid record with all sections filled is MalformedFrame."""
    record = CursorRecord(KIND_SNAPSHOT, Position(3, 4), ack_set_of((3, 6), (3, 9)),
                          {Position(3, 5): (4, 0b1010)}, {"a": 1})
    data = encode_record(record)
    for length in range(len(data)):
        with pytest.raises(MalformedFrame):
            decode_record(data[:length])


def test_random_mutations_raise_only_malformed_frame():
    """Seeded byte flips, insertions and cuts: each either decodes or raises MalformedFrame."""
    rng = random.Random(5)
    record = CursorRecord(KIND_DELTA, Position(3, 4), ack_set_of(*((3, e) for e in range(6, 60, 5))),
                          {Position(3, 5): (4, 0b1010), Position(3, 70): (130, 1 << 129)}, {"a": 1, "b": 22})
    valid = encode_record(record)
    decoded_count = 0
    for _ in range(3_000):
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            index = rng.randrange(len(data))
            action = rng.random()
            if action < 0.6:
                data[index] = rng.randrange(256)
            elif action < 0.8:
                data.insert(index, rng.randrange(256))
            else:
                del data[index]
        try:
            decode_record(bytes(data))
            decoded_count += 1
        except MalformedFrame:
            pass
    assert decoded_count < 3_000          # the mutations did reach the checks


# --- deltas ------------------------------------------------------------------------------------------

def test_apply_delta_adds_the_delta_entries():
    """Replaying snapshot + deltas gives the union of what each acknowledged."""
    snapshot = decode_record(encode_record(CursorRecord(KIND_SNAPSHOT, Position(1, 4), ack_set_of((1, 6)), {}, {})))
    state = snapshot.acked
    for pairs in ([(1, 8), (1, 9)], [(1, 6), (2, 0)], []):
        delta = decode_record(encode_record(CursorRecord(KIND_DELTA, Position(1, 4), ack_set_of(*pairs), {}, {})))
        apply_delta(state, delta)
    assert marked(state) == {(1, 6), (1, 8), (1, 9), (2, 0)}
    assert len(state) == 4
