"""The entry format (common/entry.py): what the writer encodes is what every reader gets
back, and any damage is reported as MalformedFrame or DigestMismatch, never as data and
never as another exception.

How: round trips over a table of field values; one golden encoding built byte by byte
from the documented layout; every truncation and extension of an entry; every
single-bit and whole-byte flip at every offset, each checked against a table saying
which of the two errors that offset must produce; and a seeded fuzz of multi-byte
damage (insertions, deletions, overwrites, random bytes).
"""

from __future__ import annotations

import random

import crc32c
import pytest

from common.entry import (
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    FORMAT_VERSION,
    NO_ENTRY,
    EntryHeader,
    decode_header,
    encode_entry,
    entry_ids,
    entry_payload,
    verify_entry,
)
from common.errors import DigestMismatch, MalformedFrame

U64_MAX = 2**64 - 1

# (ledger_id, entry_id, last_add_confirmed, length_bytes, payload)
ROUND_TRIP_CASES = [
    (0, 0, NO_ENTRY, 0, b""),
    (1, 0, NO_ENTRY, 5, b"hello"),
    (1, 1, 0, 10, b"world"),
    (7, 1000, 998, 10**12, b"\x00" * 100),
    (U64_MAX, U64_MAX, 2**63 - 1, U64_MAX, b"\xff" * 3),
    (42, 5, 4, 65536, bytes(range(256)) * 256),
]


@pytest.mark.parametrize("ledger_id, entry_id, last_add_confirmed, length_bytes, payload", ROUND_TRIP_CASES)
def test_round_trip_returns_every_field(ledger_id, entry_id, last_add_confirmed, length_bytes, payload):
    """encode -> verify gives back each header field, the payload and the ids."""
    data = encode_entry(ledger_id, entry_id, last_add_confirmed, length_bytes, payload)
    assert len(data) == ENTRY_HEADER_SIZE + len(payload)
    expected = EntryHeader(ledger_id, entry_id, last_add_confirmed, length_bytes, len(payload))
    assert verify_entry(data) == expected
    assert decode_header(data) == expected
    assert bytes(entry_payload(data)) == payload
    assert entry_ids(data) == (ledger_id, entry_id)


def test_round_trip_accepts_memoryview_and_bytearray():
    """Readers pass slices of larger buffers; a memoryview or bytearray verifies the same."""
    data = encode_entry(3, 4, 2, 100, memoryview(b"payload"))
    header = verify_entry(data)
    assert verify_entry(memoryview(data)) == header
    assert verify_entry(bytearray(data)) == header
    framed = b"xx" + data + b"yy"
    assert verify_entry(memoryview(framed)[2:-2]) == header


def test_golden_layout_matches_the_documented_table():
    """The bytes on the wire follow the layout table in the module docstring exactly."""
    payload = b"abc"
    head = (
        b"\x4d\x45"                           # magic "ME"
        + bytes([FORMAT_VERSION])             # format_version
        + b"\x00"                             # flags
        + (0x0102030405060708).to_bytes(8, "big")   # ledger_id
        + (9).to_bytes(8, "big")              # entry_id
        + (8).to_bytes(8, "big", signed=True)  # last_add_confirmed
        + (300).to_bytes(8, "big")            # length_bytes
        + (3).to_bytes(4, "big")              # payload_size
    )
    assert len(head) == 40
    digest = crc32c.crc32c(head + payload).to_bytes(4, "big")
    assert encode_entry(0x0102030405060708, 9, 8, 300, payload) == head + digest + payload
    assert ENTRY_MAGIC == 0x4D45
    assert ENTRY_HEADER_SIZE == 44


def test_no_last_add_confirmed_is_encoded_as_minus_one():
    """The first entry of a ledger carries last_add_confirmed -1 as a signed i64."""
    data = encode_entry(1, 0, NO_ENTRY, 0, b"")
    assert data[20:28] == b"\xff" * 8
    assert verify_entry(data).last_add_confirmed == -1


@pytest.mark.parametrize("args", [
    (1, 5, 5, 10, b"x"),       # last_add_confirmed must be below entry_id
    (1, 5, -2, 10, b"x"),      # last_add_confirmed below -1
    (1, 5, 4, 0, b"x"),        # length_bytes below the payload size
    (-1, 5, 4, 10, b"x"),      # negative ledger id
])
def test_encode_refuses_impossible_headers_as_programmer_errors(args):
    """Encoding a header no reader would accept is a bug in the writer: it asserts."""
    with pytest.raises(AssertionError):
        encode_entry(*args)


# --- truncation and extension ------------------------------------------------------------

SAMPLE = encode_entry(7, 2**40, NO_ENTRY, 2**40 + 16, bytes(range(16)))


@pytest.mark.parametrize("length", range(len(SAMPLE)))
def test_every_truncation_is_malformed(length):
    """Any prefix shorter than the whole entry (including the empty one and both halves)
    is MalformedFrame: payload_size no longer matches, or the header is incomplete."""
    with pytest.raises(MalformedFrame):
        verify_entry(SAMPLE[:length])
    with pytest.raises(MalformedFrame):
        decode_header(SAMPLE[:length])


def test_second_half_alone_is_malformed():
    """The tail half of an entry, fed on its own, is rejected too."""
    with pytest.raises(MalformedFrame):
        verify_entry(SAMPLE[len(SAMPLE) // 2:])


@pytest.mark.parametrize("extra", [b"\x00", b"\x01\x02", b"z" * 100])
def test_trailing_bytes_are_malformed(extra):
    """Bytes past payload_size are not silently ignored."""
    with pytest.raises(MalformedFrame):
        verify_entry(SAMPLE + extra)


# --- every flipped byte --------------------------------------------------------------------

# For SAMPLE (ledger 7, entry 2**40, last_add_confirmed -1, length 2**40 + 16, 16-byte
# payload) every change to one byte has one possible outcome, by field:
#   magic, version, last_add_confirmed (any change of -1 leaves [-1, entry_id)) and
#   payload_size are checked by decode_header -> MalformedFrame;
#   flags, ledger_id, entry_id, length_bytes (stays >= 16), digest and payload pass the
#   header checks and fail the CRC -> DigestMismatch.
def _expected_error_at(offset: int) -> type[Exception]:
    if offset < 3:          # magic, version
        return MalformedFrame
    if 20 <= offset < 28:   # last_add_confirmed
        return MalformedFrame
    if 36 <= offset < 40:   # payload_size
        return MalformedFrame
    return DigestMismatch


FLIP_MASKS = [1 << bit for bit in range(8)] + [0xFF]


@pytest.mark.parametrize("offset", range(len(SAMPLE)))
def test_every_flipped_byte_is_detected_with_the_expected_error(offset):
    """Each single-bit flip and whole-byte inversion at ``offset`` raises exactly the
    error the layout predicts, and never returns a header."""
    expected = _expected_error_at(offset)
    for mask in FLIP_MASKS:
        damaged = bytearray(SAMPLE)
        damaged[offset] ^= mask
        with pytest.raises((MalformedFrame, DigestMismatch)) as caught:
            verify_entry(bytes(damaged))
        assert type(caught.value) is expected, (offset, mask, caught.value)


def test_digest_mismatch_names_the_entry():
    """A DigestMismatch carries the ids from the header so the reader can report them."""
    damaged = bytearray(SAMPLE)
    damaged[-1] ^= 0x10
    with pytest.raises(DigestMismatch) as caught:
        verify_entry(bytes(damaged))
    assert caught.value.ledger_id == 7
    assert caught.value.entry_id == 2**40


def test_decode_header_does_not_check_the_digest():
    """decode_header is the cheap check: a payload flip passes it, verify_entry does not."""
    damaged = bytearray(SAMPLE)
    damaged[ENTRY_HEADER_SIZE] ^= 1
    assert decode_header(bytes(damaged)).entry_id == 2**40
    with pytest.raises(DigestMismatch):
        verify_entry(bytes(damaged))


# --- table of hand-made bad headers ---------------------------------------------------------

def _with(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


GOOD = encode_entry(5, 10, 9, 1000, b"0123456789")

BAD_HEADERS = [
    (b"", MalformedFrame),
    (b"ME", MalformedFrame),
    (GOOD[:ENTRY_HEADER_SIZE - 1], MalformedFrame),
    (_with(GOOD, 0, b"XX"), MalformedFrame),                                  # magic
    (_with(GOOD, 2, b"\x00"), MalformedFrame),                                # version 0
    (_with(GOOD, 2, b"\x02"), MalformedFrame),                                # version 2 (newer)
    (_with(GOOD, 20, (10).to_bytes(8, "big")), MalformedFrame),               # lac == entry_id
    (_with(GOOD, 20, (-2).to_bytes(8, "big", signed=True)), MalformedFrame),  # lac < -1
    (_with(GOOD, 28, (9).to_bytes(8, "big")), MalformedFrame),                # length < payload
    (_with(GOOD, 36, (11).to_bytes(4, "big")), MalformedFrame),               # payload_size
    (_with(GOOD, 3, b"\x01"), DigestMismatch),                                # flags
    (_with(GOOD, 4, (6).to_bytes(8, "big")), DigestMismatch),                 # ledger_id
    (_with(GOOD, 40, b"\x00\x00\x00\x00"), DigestMismatch),                   # digest
    (GOOD[:-1] + b"!", DigestMismatch),                                       # payload
]


@pytest.mark.parametrize("data, expected", BAD_HEADERS)
def test_bad_entry_table(data, expected):
    """Each hand-made bad entry raises the error its table row names."""
    with pytest.raises((MalformedFrame, DigestMismatch)) as caught:
        verify_entry(data)
    assert type(caught.value) is expected


def test_seeded_fuzz_raises_only_our_two_errors():
    """Thousands of seeded multi-byte mutations (overwrite, insert, delete, splice, random
    bytes) either still verify unchanged or raise MalformedFrame / DigestMismatch."""
    rng = random.Random(20240601)
    originals = [encode_entry(*case) for case in ROUND_TRIP_CASES[:5]]
    for _ in range(3000):
        data = bytearray(rng.choice(originals))
        kind = rng.randrange(5)
        if kind == 0 and data:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            position = rng.randint(0, len(data))
            data[position:position] = rng.randbytes(rng.randint(1, 8))
        elif kind == 2 and data:
            position = rng.randrange(len(data))
            del data[position:position + rng.randint(1, 8)]
        elif kind == 3:
            other = rng.choice(originals)
            cut = rng.randint(0, min(len(data), len(other)))
            data = data[:cut] + other[cut:]
        else:
            data = bytearray(rng.randbytes(rng.randint(0, 120)))
        try:
            header = verify_entry(bytes(data))
        except (MalformedFrame, DigestMismatch):
            continue
        # The only way to pass is to be an intact entry (e.g. a splice of two equal
        # prefixes, or an overwrite with the same value).
        assert bytes(data) in originals, header
