"""The acknowledgement bitmap (subscriptions/ack_set.py): entries acknowledged
individually past a cursor's mark-delete position, one bitmap per ledger.

What it proves: an empty set answers every question with "nothing"; marks are counted
once; runs of marks come back as merged inclusive ranges, holes split them, and filling
a hole joins its neighbours; the bitmap grows both ways; ``first_unset`` finds the first
hole from any place (including over long all-ones stretches); ``discard_up_to`` (the
mark-delete position moving) forgets exactly what is at or below it and keeps the count
right; ``update`` is a union that leaves its argument alone; ``encode``/``decode`` round
trip exactly and compactly; every malformed encoding raises MalformedFrame and nothing
else; a bitmap never spans more than ENTRIES_PER_LEDGER_MAX entries (so what encodes
always decodes); 100,000 holes stay fast and small.

How: hand cases, a seeded random sequence of operations checked against a plain Python
set after every step, a table of corrupt encodings, and every truncation and many seeded
mutations of a valid one.
"""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from common.errors import MalformedFrame
from subscriptions.ack_set import ENTRIES_PER_LEDGER_MAX, AckSet
from tests.unit.ack_sets import ack_set_of, marked

_HEAD = struct.Struct(">I")
_LEDGER = struct.Struct(">qqI")


def runs_of(entry_ids: set[int]) -> list[tuple[int, int]]:
    """Reference: inclusive runs of a set of integers."""
    runs: list[tuple[int, int]] = []
    for entry_id in sorted(entry_ids):
        if runs and runs[-1][1] == entry_id - 1:
            runs[-1] = (runs[-1][0], entry_id)
        else:
            runs.append((entry_id, entry_id))
    return runs


def raw_encoding(ledgers: list[tuple[int, int, bytes]], *, count: int | None = None, tail: bytes = b"") -> bytes:
    """Builds an encoding by hand: (ledger_id, base, bitmap) blocks, zlib-compressed."""
    parts = [_HEAD.pack(len(ledgers) if count is None else count)]
    for ledger_id, base, bitmap in ledgers:
        parts.append(_LEDGER.pack(ledger_id, base, len(bitmap)) + bitmap)
    return zlib.compress(b"".join(parts) + tail)


# --- empty and single --------------------------------------------------------------------------

def test_empty_set_has_nothing():
    """A new set: no ledgers, no ranges, nothing contained, every place is unset."""
    ack_set = AckSet()
    assert len(ack_set) == 0
    assert ack_set.ledgers() == []
    assert list(ack_set.ranges(1)) == []
    assert ack_set.range_count() == 0
    assert not ack_set.contains(1, 0)
    assert ack_set.first_unset(1, 0) == 0
    assert ack_set.first_unset(1, 12345) == 12345
    ack_set.discard_up_to(5, 100)     # nothing to discard: no error, still empty
    assert len(ack_set) == 0
    decoded = AckSet.decode(ack_set.encode())
    assert len(decoded) == 0
    assert decoded.ledgers() == []


@pytest.mark.parametrize("entry_id", [0, 1, 7, 8, 9, 63, 64, 1_000_003])
def test_single_mark(entry_id):
    """One mark: counted once, found, its neighbours are not, one range of one entry."""
    ack_set = AckSet()
    assert ack_set.add(3, entry_id) is True
    assert ack_set.add(3, entry_id) is False          # already marked: not counted twice
    assert len(ack_set) == 1
    assert ack_set.contains(3, entry_id)
    assert not ack_set.contains(3, entry_id + 1)
    assert entry_id == 0 or not ack_set.contains(3, entry_id - 1)
    assert not ack_set.contains(4, entry_id)          # other ledgers are separate
    assert list(ack_set.ranges(3)) == [(entry_id, entry_id)]
    assert ack_set.first_unset(3, entry_id) == entry_id + 1
    assert ack_set.ledgers() == [3]


# --- ranges: merging and holes --------------------------------------------------------------------

def test_filling_a_hole_merges_adjacent_ranges():
    """5 and 7 are two ranges; marking 6 joins them into one."""
    ack_set = ack_set_of((1, 5), (1, 7))
    assert list(ack_set.ranges(1)) == [(5, 5), (7, 7)]
    assert ack_set.range_count() == 2
    ack_set.add(1, 6)
    assert list(ack_set.ranges(1)) == [(5, 7)]
    assert ack_set.range_count() == 1
    assert len(ack_set) == 3


@pytest.mark.parametrize("entry_ids, expected", [
    ({0, 1, 2, 3, 4, 5, 6, 7}, [(0, 7)]),                          # exactly one full byte
    ({7, 8}, [(7, 8)]),                                            # run across a byte boundary
    (set(range(0, 24)) - {8}, [(0, 7), (9, 23)]),                  # hole at a byte's first bit
    (set(range(0, 24)) - {15}, [(0, 14), (16, 23)]),               # hole at a byte's last bit
    (set(range(3, 100)), [(3, 99)]),                               # run through whole 0xFF bytes
    ({0, 2, 4, 6, 8}, [(0, 0), (2, 2), (4, 4), (6, 6), (8, 8)]),   # every other entry
    ({1, 100, 1000}, [(1, 1), (100, 100), (1000, 1000)]),          # through zero bytes
])
def test_ranges_table(entry_ids, expected):
    """Runs come back inclusive, merged, in order, whatever byte boundaries they cross."""
    ack_set = ack_set_of(*((9, e) for e in entry_ids))
    assert list(ack_set.ranges(9)) == expected
    assert len(ack_set) == len(entry_ids)
    assert ack_set.range_count() == len(expected)


def test_grows_downwards_when_acks_arrive_out_of_order():
    """A mark below the first one seen extends the bitmap down; both stay marked."""
    ack_set = ack_set_of((1, 1000), (1, 3))
    assert ack_set.contains(1, 3) and ack_set.contains(1, 1000)
    assert not ack_set.contains(1, 500)
    assert list(ack_set.ranges(1)) == [(3, 3), (1000, 1000)]
    assert ack_set.first_unset(1, 3) == 4
    assert ack_set.first_unset(1, 0) == 0
    assert len(ack_set) == 2


def test_several_ledgers_are_independent():
    """Marks in different ledgers never merge; ledgers() is sorted."""
    ack_set = ack_set_of((20, 0), (5, 0), (5, 1), (20, 1), (7, 3))
    assert ack_set.ledgers() == [5, 7, 20]
    assert list(ack_set.ranges(5)) == [(0, 1)]
    assert list(ack_set.ranges(7)) == [(3, 3)]
    assert list(ack_set.ranges(20)) == [(0, 1)]
    assert ack_set.range_count() == 3


# --- first_unset --------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry_ids, start, expected", [
    (set(), 4, 4),
    (set(range(10)) - {4}, 0, 4),
    (set(range(10)) - {4}, 4, 4),
    (set(range(10)) - {4}, 5, 10),
    (set(range(16, 32)), 0, 0),             # below the bitmap's base
    (set(range(16, 32)), 16, 32),           # the bitmap ends on a byte boundary
    (set(range(16, 30)), 20, 30),           # ends inside a byte
    ({1, 2, 3}, 9, 9),                      # past the bitmap
    (set(range(0, 10_000)), 0, 10_000),     # a long all-ones stretch (the scanning path)
    (set(range(0, 10_000)) - {9_001}, 3, 9_001),
    (set(range(0, 10_000)) - {9_001}, 9_002, 10_000),
])
def test_first_unset_table(entry_ids, start, expected):
    """The first entry at or after ``start`` that is not marked."""
    ack_set = ack_set_of(*((2, e) for e in entry_ids))
    assert ack_set.first_unset(2, start) == expected


def test_first_unset_from_every_place_matches_reference():
    """For a seeded random pattern, every start agrees with a linear scan."""
    rng = random.Random(7)
    entry_ids = {e for e in range(40, 600) if rng.random() < 0.8}
    ack_set = ack_set_of(*((1, e) for e in entry_ids))
    for start in range(0, 650):
        expected = start
        while expected in entry_ids:
            expected += 1
        assert ack_set.first_unset(1, start) == expected, start


# --- discard_up_to (the mark-delete position moving) ------------------------------------------------

@pytest.mark.parametrize("cut", [-1, 0, 2, 7, 8, 9, 15, 16, 31, 40, 63, 100])
def test_discard_up_to_forgets_exactly_what_is_at_or_below(cut):
    """Entries <= cut go, the rest stay, and the count matches what is left."""
    entry_ids = {0, 1, 2, 5, 7, 8, 9, 15, 16, 17, 30, 31, 33, 40, 41, 62}
    ack_set = ack_set_of(*((4, e) for e in entry_ids))
    ack_set.discard_up_to(4, cut)
    left = {e for e in entry_ids if e > cut}
    assert marked(ack_set) == {(4, e) for e in left}
    assert len(ack_set) == len(left)
    if not left:
        assert ack_set.ledgers() == []
    for entry_id in range(0, 70):
        assert ack_set.contains(4, entry_id) == (entry_id in left)


def test_discard_up_to_drops_earlier_ledgers_and_keeps_later_ones():
    """A mark-delete position in ledger 5 forgets ledgers 3 and 4 whole and leaves 6 alone."""
    ack_set = ack_set_of((3, 100), (4, 0), (4, 9), (5, 1), (5, 8), (6, 0), (6, 2))
    ack_set.discard_up_to(5, 4)
    assert marked(ack_set) == {(5, 8), (6, 0), (6, 2)}
    assert len(ack_set) == 3
    assert ack_set.ledgers() == [5, 6]


def test_discard_up_to_in_a_ledger_without_marks_still_drops_earlier_ones():
    ack_set = ack_set_of((1, 0), (3, 5))
    ack_set.discard_up_to(2, 1_000)
    assert marked(ack_set) == {(3, 5)}
    assert len(ack_set) == 1


def test_discard_below_base_keeps_everything():
    """A cut below the bitmap's first byte changes nothing (acking below mark-delete)."""
    ack_set = ack_set_of((1, 64), (1, 65))
    ack_set.discard_up_to(1, 10)
    assert marked(ack_set) == {(1, 64), (1, 65)}
    assert len(ack_set) == 2


def test_marks_after_a_discard_work_from_the_new_base():
    """After the bitmap was cut at the front, adding below and above still works."""
    ack_set = ack_set_of(*((1, e) for e in range(0, 40, 3)))
    ack_set.discard_up_to(1, 20)
    ack_set.add(1, 22)
    ack_set.add(1, 100)
    ack_set.add(1, 21)
    assert marked(ack_set) == {(1, e) for e in [21, 22, 24, 27, 30, 33, 36, 39, 100]}
    assert len(ack_set) == 9


# --- update (union) ---------------------------------------------------------------------------------

def test_update_is_a_union_with_a_correct_count():
    """Overlapping, below-base, above-end and new-ledger marks all merge; shared marks count once."""
    target = ack_set_of((1, 40), (1, 41), (1, 50), (2, 3))
    source = ack_set_of((1, 5), (1, 41), (1, 200), (3, 7))
    target.update(source)
    expected = {(1, 5), (1, 40), (1, 41), (1, 50), (1, 200), (2, 3), (3, 7)}
    assert marked(target) == expected
    assert len(target) == len(expected)
    assert marked(source) == {(1, 5), (1, 41), (1, 200), (3, 7)}    # the argument is unchanged


def test_update_copies_rather_than_shares_bitmaps():
    """Marking the result later must not mark the set it was built from."""
    source = ack_set_of((8, 1))
    target = AckSet()
    target.update(source)
    target.add(8, 2)
    target.discard_up_to(8, 1)
    assert marked(source) == {(8, 1)}
    assert len(source) == 1
    assert marked(target) == {(8, 2)}


def test_update_with_empty_sets():
    empty = AckSet()
    filled = ack_set_of((1, 1))
    filled.update(empty)
    empty.update(AckSet())
    assert marked(filled) == {(1, 1)} and len(filled) == 1
    assert len(empty) == 0 and empty.ledgers() == []


# --- against a reference model ------------------------------------------------------------------------

def test_random_operations_match_a_set_model():
    """A seeded mix of add / discard_up_to / update, checked against a Python set after each step."""
    rng = random.Random(20240607)
    ack_set = AckSet()
    model: set[tuple[int, int]] = set()
    for step in range(1_500):
        choice = rng.random()
        if choice < 0.75:
            pair = (rng.choice([1, 2, 3]), rng.randrange(0, 300))
            assert ack_set.add(*pair) == (pair not in model), step
            model.add(pair)
        elif choice < 0.85:
            cut = (rng.choice([1, 2, 3]), rng.randrange(-1, 300))
            ack_set.discard_up_to(*cut)
            model = {p for p in model if p > cut}
        else:
            other_pairs = {(rng.choice([1, 2, 3, 4]), rng.randrange(0, 300)) for _ in range(rng.randrange(0, 20))}
            ack_set.update(ack_set_of(*other_pairs))
            model |= other_pairs
        assert len(ack_set) == len(model), step
        if step % 50 == 0:
            assert marked(ack_set) == model, step
            for ledger_id in (1, 2, 3, 4):
                entries = {e for l, e in model if l == ledger_id}
                assert list(ack_set.ranges(ledger_id)) == runs_of(entries), step
                start = rng.randrange(0, 310)
                expected = start
                while expected in entries:
                    expected += 1
                assert ack_set.first_unset(ledger_id, start) == expected, step
            decoded = AckSet.decode(ack_set.encode())
            assert marked(decoded) == model and len(decoded) == len(model), step


# --- encoding ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pairs", [
    [],
    [(1, 0)],
    [(1, 7), (1, 8)],
    [(0, 0), (2**62, 5), (-3, 9)],              # extreme and negative ledger ids survive
    [(5, e) for e in range(1000, 1100)],
    [(5, e) for e in range(0, 5000, 7)] + [(6, 3)],
])
def test_encode_decode_round_trip(pairs):
    """Decoding an encoding gives the same marks, count and ranges; encoding is deterministic."""
    original = ack_set_of(*pairs)
    data = original.encode()
    decoded = AckSet.decode(data)
    assert marked(decoded) == set(pairs)
    assert len(decoded) == len(set(pairs))
    assert decoded.ledgers() == original.ledgers()
    assert decoded.encode() == data
    # The decoded set is fully usable: it grows and cuts like the original.
    decoded.add(1, 3)
    original.add(1, 3)
    assert marked(decoded) == marked(original)


def test_decode_accepts_bytes_like_input():
    data = ack_set_of((1, 2), (1, 9)).encode()
    assert marked(AckSet.decode(bytearray(data))) == {(1, 2), (1, 9)}


def test_decode_of_hand_built_encoding():
    """The layout the module documents: count, then (ledger, base, size) + bitmap per ledger."""
    data = raw_encoding([(4, 16, bytes([0b0000_0101, 0b1000_0000]))])
    decoded = AckSet.decode(data)
    assert marked(decoded) == {(4, 16), (4, 18), (4, 31)}
    assert len(decoded) == 3


_VALID_BLOCK = (4, 16, b"\x05")

CORRUPT = [
    ("not zlib", b"not compressed at all"),
    ("empty input", b""),
    ("truncated zlib stream", ack_set_of((1, 1), (2, 2)).encode()[:-3]),
    ("no head", zlib.compress(b"\x00\x00")),
    ("count beyond blocks", raw_encoding([_VALID_BLOCK], count=2)),
    ("count far beyond blocks", raw_encoding([], count=0xFFFFFFFF)),
    ("bitmap shorter than its size",
     zlib.compress(_HEAD.pack(1) + _LEDGER.pack(4, 16, 10) + b"\x01\x02")),
    ("ledger head cut short", zlib.compress(_HEAD.pack(1) + _LEDGER.pack(4, 16, 1)[:10])),
    ("base not a multiple of 8", raw_encoding([(4, 12, b"\x01")])),
    ("negative base", raw_encoding([(4, -8, b"\x01")])),
    ("bitmap larger than the limit",
     zlib.compress(_HEAD.pack(1) + _LEDGER.pack(4, 0, ENTRIES_PER_LEDGER_MAX // 8 + 1)
                   + bytes(ENTRIES_PER_LEDGER_MAX // 8 + 1))),
    ("trailing bytes", raw_encoding([_VALID_BLOCK], tail=b"\x00")),
    ("same ledger twice", raw_encoding([(4, 0, b"\x01"), (4, 0, b"\x03")])),
]


@pytest.mark.parametrize("name, data", CORRUPT, ids=[name for name, _ in CORRUPT])
def test_corrupt_encodings_raise_malformed_frame(name, data):
    """Each kind of damage is refused with MalformedFrame, never accepted or crashing."""
    with pytest.raises(MalformedFrame):
        AckSet.decode(data)


def test_every_truncation_of_the_decompressed_form_is_refused():
    """Cut the inner layout at every byte (recompressed): always MalformedFrame."""
    raw = zlib.decompress(ack_set_of((1, 3), (1, 70), (9, 0)).encode())
    for length in range(len(raw)):
        with pytest.raises(MalformedFrame):
            AckSet.decode(zlib.compress(raw[:length]))


def test_mutated_encodings_raise_only_malformed_frame():
    """Seeded byte flips, insertions and cuts of a valid encoding: each either decodes to a
    consistent set (count equals marks) or raises MalformedFrame, never anything else."""
    rng = random.Random(11)
    valid_raw = zlib.decompress(ack_set_of(*((l, e) for l in (1, 2) for e in range(0, 90, 4))).encode())
    for _ in range(1_500):
        raw = bytearray(valid_raw)
        for _ in range(rng.randrange(1, 4)):
            index = rng.randrange(len(raw))
            action = rng.random()
            if action < 0.6:
                raw[index] = rng.randrange(256)
            elif action < 0.8:
                raw.insert(index, rng.randrange(256))
            else:
                del raw[index]
        compressed = zlib.compress(bytes(raw)) if rng.random() < 0.8 else bytes(raw)
        try:
            decoded = AckSet.decode(compressed)
        except MalformedFrame:
            continue
        assert len(decoded) == len(marked(decoded))


# --- the limit --------------------------------------------------------------------------------------

def test_marks_beyond_the_bitmap_limit_are_refused():
    """One ledger's bitmap covers at most ENTRIES_PER_LEDGER_MAX entries from its base."""
    ack_set = ack_set_of((1, 0))
    ack_set.add(1, ENTRIES_PER_LEDGER_MAX - 1)         # the last entry that fits
    with pytest.raises(ValueError):
        ack_set.add(1, ENTRIES_PER_LEDGER_MAX)
    assert len(ack_set) == 2
    assert AckSet.decode(ack_set.encode()).contains(1, ENTRIES_PER_LEDGER_MAX - 1)


def test_growing_downwards_past_the_limit_is_refused_and_leaves_the_set_as_it_was():
    """The limit holds when the bitmap grows down too, so whatever encodes also decodes."""
    ack_set = ack_set_of((1, ENTRIES_PER_LEDGER_MAX + 100))
    with pytest.raises(ValueError):
        ack_set.add(1, 0)
    assert marked(ack_set) == {(1, ENTRIES_PER_LEDGER_MAX + 100)}
    assert len(ack_set) == 1
    ack_set.add(1, 200)                                  # still within the limit: fine
    assert marked(AckSet.decode(ack_set.encode())) == {(1, 200), (1, ENTRIES_PER_LEDGER_MAX + 100)}


# --- many holes ----------------------------------------------------------------------------------------

def test_one_hundred_thousand_holes_stay_exact_fast_and_small():
    """Every other entry of 200,000 acknowledged (100,000 holes): exact, quick to build,
    scan, encode, decode and cut, and the regular pattern compresses to almost nothing."""
    ack_set = AckSet()
    for entry_id in range(1, 200_000, 2):
        ack_set.add(7, entry_id)
    assert len(ack_set) == 100_000
    assert ack_set.range_count() == 100_000
    assert ack_set.first_unset(7, 1) == 2
    assert ack_set.contains(7, 199_999) and not ack_set.contains(7, 199_998)
    data = ack_set.encode()
    assert len(data) < 2_000, len(data)               # the bitmap is 25,000 bytes raw
    decoded = AckSet.decode(data)
    assert len(decoded) == 100_000
    decoded.discard_up_to(7, 99_999)
    assert len(decoded) == 50_000
    assert list(decoded.ranges(7))[:2] == [(100_001, 100_001), (100_003, 100_003)]
    # Filling every hole leaves one range, and first_unset crosses it in one scan.
    for entry_id in range(0, 200_000, 2):
        ack_set.add(7, entry_id)
    assert list(ack_set.ranges(7)) == [(0, 199_999)]
    assert ack_set.first_unset(7, 0) == 200_000


def test_random_holes_cost_about_one_bit_per_entry():
    """100,000 random holes over 1,000,000 entries: the encoding stays near the raw
    bitmap's 125,000 bytes (no per-hole overhead), and round trips exactly."""
    rng = random.Random(3)
    holes = set(rng.sample(range(1_000_000), 100_000))
    ack_set = AckSet()
    ack_set.update(_bitmap_set(11, 1_000_000, holes))
    assert len(ack_set) == 900_000
    data = ack_set.encode()
    assert len(data) < 130_000, len(data)
    decoded = AckSet.decode(data)
    assert len(decoded) == 900_000
    first_hole = min(holes)
    assert decoded.first_unset(11, 0) == first_hole
    # A run starts at entry 0 (if marked) and right after each hole that a mark follows.
    run_count = (0 not in holes) + sum(1 for h in holes if h + 1 < 1_000_000 and h + 1 not in holes)
    assert sum(1 for _ in decoded.ranges(11)) == run_count


def _bitmap_set(ledger_id: int, entry_count: int, holes: set[int]) -> AckSet:
    """An AckSet with every entry in [0, entry_count) marked except ``holes``, built through
    the public encoding so the test does not spend a million ``add`` calls."""
    assert entry_count % 8 == 0
    bitmap = bytearray(b"\xff" * (entry_count // 8))
    for hole in holes:
        bitmap[hole >> 3] &= ~(1 << (hole & 7)) & 0xFF
    return AckSet.decode(raw_encoding([(ledger_id, 0, bytes(bitmap))]))


def test_decode_refuses_a_record_that_inflates_past_the_limit(monkeypatch):
    import subscriptions.ack_set as ack_set_module

    monkeypatch.setattr(ack_set_module, "DECODED_BYTES_MAX", 4096)
    bomb = zlib.compress(bytes(1 << 20))
    with pytest.raises(MalformedFrame, match="more than 4096"):
        AckSet.decode(bomb)


def test_decode_refuses_trailing_bytes_and_truncated_streams():
    ack_set = AckSet()
    ack_set.add(1, 5)
    encoded = ack_set.encode()
    with pytest.raises(MalformedFrame, match="after its end"):
        AckSet.decode(encoded + b"junk")
    with pytest.raises(MalformedFrame):
        AckSet.decode(encoded[:-3])


@pytest.mark.parametrize("marked, first, last", [
    ((), 0, 0), ((), 3, 21), ((5, 9), 0, 15), ((30,), 7, 7), ((100, 2), 40, 64), ((8, 16), 9, 15),
])
def test_a_range_marks_what_single_marks_would_and_counts_only_the_new(marked, first, last):
    ranged, single = AckSet(), AckSet()
    for entry_id in marked:
        ranged.add(4, entry_id)
        single.add(4, entry_id)
    new = ranged.add_range(4, first, last)
    assert new == sum(single.add(4, entry_id) for entry_id in range(first, last + 1))
    assert list(ranged.ranges(4)) == list(single.ranges(4))
    assert len(ranged) == len(single)


def test_a_range_wider_than_a_bitmap_is_refused_and_changes_nothing():
    from subscriptions.ack_set import ENTRIES_PER_LEDGER_MAX

    acks = AckSet()
    with pytest.raises(ValueError):
        acks.add_range(1, 0, ENTRIES_PER_LEDGER_MAX)
    assert len(acks) == 0
