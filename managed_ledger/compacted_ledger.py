"""The byte layout of a compacted ledger's entries, and the compaction record kept in
the managed-ledger properties. Pure.

A compacted ledger (written by ``managed_ledger/compaction.py``) holds, in topic order, a copy
of every topic entry that still carries a latest value (or a message without a key)
as of the compaction horizon. Each of its entries is one such topic entry, stored
unchanged, behind a header naming where it came from and — for a batch of which only
some messages survive — which of its messages a ``read_compacted`` consumer gets
(Pulsar's ack-set convention: a set bit is a message to deliver). The consumer is sent
the stored bytes as they are, with their original message id.

Entry layout (big-endian):

| offset | size | field          | meaning                                           |
|--------|------|----------------|---------------------------------------------------|
| 0      | 2    | magic          | 0x0c0e                                            |
| 2      | 1    | format_version | FORMAT_VERSION                                    |
| 3      | 8    | ledger_id      | the topic entry's position: ledger                |
| 11     | 8    | entry_id       | the topic entry's position: entry                 |
| 19     | 4    | batch_size     | 0: deliver the whole entry; else the batch's size |
| 23     | n    | keep_bits      | ceil(batch_size / 8) bytes, little-endian bits     |
| 23 + n | rest | stored         | the topic entry's stored bytes (0x0e01 onwards)   |

Versions: 1 — the first layout. The ledger's own digest covers the whole entry; the
stored bytes carry the producer's checksum too.

Compaction record (property ``magnetar.compaction``), JSON:
``{"format_version": 2, "ledger_id": L, "horizon": [l, e], "entries": n}``.
Version 1 (an index over the topic's own entries, before compacted ledgers) is read as
"never compacted".
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from common.errors import MalformedFrame
from common.position import CompactedEntry, Position

MAGIC = 0x0C0E
FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1
_HEADER = struct.Struct(">HBqqI")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 23

RECORD_FORMAT_VERSION = 2


def encode_entry(position: Position, batch_size: int, keep_bits: int, stored: bytes | memoryview) -> bytes:
    assert batch_size >= 0
    assert keep_bits == 0 or batch_size > 0, "keep bits belong to a batch"
    assert keep_bits < (1 << batch_size) if batch_size else True
    bits_size = (batch_size + 7) // 8
    return b"".join((_HEADER.pack(MAGIC, FORMAT_VERSION, position.ledger_id, position.entry_id, batch_size),
                     keep_bits.to_bytes(bits_size, "little"), stored))


def decode_entry(data: bytes | memoryview) -> CompactedEntry:
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise MalformedFrame(f"compacted entry of {len(view)} bytes is shorter than its header")
    magic, version, ledger_id, entry_id, batch_size = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise MalformedFrame(f"compacted entry has magic {magic:#06x}, not {MAGIC:#06x}")
    if not FORMAT_VERSION_MIN <= version <= FORMAT_VERSION:
        raise MalformedFrame(f"compacted entry has format version {version}")
    bits_end = HEADER_SIZE + (batch_size + 7) // 8
    if len(view) < bits_end:
        raise MalformedFrame("compacted entry is shorter than its keep bits")
    keep_bits = int.from_bytes(view[HEADER_SIZE:bits_end], "little")
    return CompactedEntry(Position(ledger_id, entry_id), batch_size, keep_bits, view[bits_end:])


@dataclass(frozen=True)
class CompactionRecord:
    """What the last successful compaction left: its ledger and horizon."""

    ledger_id: int
    horizon: Position           # the last topic entry it covers
    entries: int                # entries of the compacted ledger (ids 0 .. entries - 1)

    def __post_init__(self) -> None:
        assert self.entries >= 0
        assert self.ledger_id >= 0

    def encode(self) -> str:
        return json.dumps({"format_version": RECORD_FORMAT_VERSION, "ledger_id": self.ledger_id,
                           "horizon": list(self.horizon), "entries": self.entries}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "CompactionRecord | None":
        """The record, or None for a version-1 record (an index, not a ledger)."""
        try:
            doc = json.loads(text)
            version = doc.get("format_version", 0)
            if version == 1:
                return None
            if version != RECORD_FORMAT_VERSION:
                raise ValueError(f"unknown format version {version}")
            ledger_id, entries = int(doc["ledger_id"]), int(doc["entries"])
            if ledger_id < 0 or entries < 0:
                raise ValueError("negative ledger id or entry count")
            record = cls(ledger_id, Position(int(doc["horizon"][0]), int(doc["horizon"][1])), entries)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise MalformedFrame(f"bad compaction record: {error}") from None
        return record
