"""Records of cursor state, as written to a cursor ledger (one record per entry) and
kept inline in etcd for a cursor that never needed a ledger. Pure.

Layout (big-endian):

    offset  size  field            meaning
    0       2     magic            0x4D43 ("MC", Magnetar Cursor)
    2       1     format_version   FORMAT_VERSION
    3       1     kind             KIND_SNAPSHOT: the whole state
                                   KIND_DELTA: entries acknowledged since the last record
    4       8     mark_delete      ledger id (i64)
    12      8     mark_delete      entry id (i64)
    20      4     acked_size       u32
    24      n     acked            AckSet.encode(): snapshot, every individually acked
                                   entry; delta, those acknowledged since the last record
    24+n    4     batches_size     u32, then that many bytes of JSON:
                                   [[ledger, entry, batch size, "unacked bits"], ...]
                                   (partly acknowledged batches; always the full set)
    ...     4     properties_size  u32, then JSON {name: int}

Versions:
    1  first version.

Replaying a ledger: start from the last snapshot, then for each delta add its acked
entries, take its mark-delete position and batches.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from common.position import Position
from common.errors import MalformedFrame
from subscriptions.ack_set import AckSet

MAGIC = 0x4D43
FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1
KIND_SNAPSHOT = 1
KIND_DELTA = 2

_HEAD = struct.Struct(">HBBqqI")
_U32 = struct.Struct(">I")


@dataclass
class CursorRecord:
    kind: int
    mark_delete: Position
    acked: AckSet
    batches: dict[Position, tuple[int, int]]
    properties: dict[str, int]


def encode_record(record: CursorRecord) -> bytes:
    acked = record.acked.encode()
    batches = json.dumps([[p.ledger_id, p.entry_id, size, str(bits)]
                          for p, (size, bits) in sorted(record.batches.items())]).encode()
    properties = json.dumps(record.properties, sort_keys=True).encode()
    return b"".join((
        _HEAD.pack(MAGIC, FORMAT_VERSION, record.kind, record.mark_delete.ledger_id, record.mark_delete.entry_id,
                   len(acked)),
        acked, _U32.pack(len(batches)), batches, _U32.pack(len(properties)), properties))


def decode_record(data: bytes | memoryview) -> CursorRecord:
    view = memoryview(data)
    if len(view) < _HEAD.size:
        raise MalformedFrame("cursor record truncated")
    magic, version, kind, ledger_id, entry_id, acked_size = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise MalformedFrame(f"cursor record magic {magic:#06x} is not {MAGIC:#06x}")
    if not FORMAT_VERSION_MIN <= version <= FORMAT_VERSION:
        raise MalformedFrame(f"cursor record version {version} is not supported")
    if kind not in (KIND_SNAPSHOT, KIND_DELTA):
        raise MalformedFrame(f"cursor record kind {kind} is unknown")
    offset = _HEAD.size
    acked = AckSet.decode(bytes(_take(view, offset, acked_size)))
    offset += acked_size
    batches_size = _u32(view, offset)
    offset += 4
    try:
        raw = _take(view, offset, batches_size)
        # Most records have no partly acknowledged batch: "[]" needs no JSON parser.
        raw_batches = [] if raw == b"[]" else json.loads(bytes(raw))
        batches = {Position(int(l), int(e)): (int(size), int(bits)) for l, e, size, bits in raw_batches}
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        # OverflowError: int() of a JSON Infinity; RecursionError: JSON nested too deep.
        raise MalformedFrame(f"cursor record batches: {error}") from None
    offset += batches_size
    properties_size = _u32(view, offset)
    offset += 4
    try:
        raw = _take(view, offset, properties_size)
        raw_properties = {} if raw == b"{}" else json.loads(bytes(raw))
        properties = {str(k): int(v) for k, v in raw_properties.items()}
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as error:
        raise MalformedFrame(f"cursor record properties: {error}") from None
    offset += properties_size
    if offset != len(view):
        raise MalformedFrame("cursor record has trailing bytes")
    return CursorRecord(kind, Position(ledger_id, entry_id), acked, batches, properties)


def _take(view: memoryview, offset: int, size: int) -> memoryview:
    if offset + size > len(view):
        raise MalformedFrame("cursor record truncated")
    return view[offset:offset + size]


def _u32(view: memoryview, offset: int) -> int:
    if offset + 4 > len(view):
        raise MalformedFrame("cursor record truncated")
    return _U32.unpack_from(view, offset)[0]


def apply_delta(acked: AckSet, record: CursorRecord) -> None:
    """Adds a delta's acknowledged entries to ``acked`` (the caller then discards what
    the record's mark-delete position covers)."""
    acked.update(record.acked)
