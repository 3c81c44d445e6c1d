"""The compacted view of a topic: which stored messages a ``read_compacted`` consumer
sees of the part of the topic that was compacted, up to the compaction horizon. Pure.

The view is an index over the topic's own entries, not a copy: for each entry that
still holds a latest value (or a message without a key), its position and, for a batch
of which only some messages survive, the bits of those messages (Pulsar's ack-set
convention: a set bit is a message to deliver). A consumer reading compacted is served
these entries, with that ack set, up to the horizon, and the topic itself after it.
The entries the view names must stay stored: the topic counts the first of them as
consumed no further (retention keeps them).

Encoding (kept in the managed-ledger properties): JSON
``{"format_version": 1, "horizon": [l, e], "entries": [[l, e, size, bits_hex | null], ...]}``.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from common.errors import MalformedFrame
from common.position import Position

FORMAT_VERSION = 1
# Entries a view may name: it lives in the managed-ledger record in etcd (values up to
# 1.5 MiB; about 40 bytes an entry as JSON).
ENTRIES_MAX = 20_000


@dataclass(frozen=True)
class CompactedEntry:
    position: Position
    batch_size: int = 0          # 0: not a partly kept batch (deliver it whole)
    keep_bits: int = 0           # the batch messages to deliver (bit i: message i)


@dataclass
class CompactedView:
    horizon: Position
    entries: list[CompactedEntry] = field(default_factory=list)     # sorted by position

    def __post_init__(self) -> None:
        assert len(self.entries) <= ENTRIES_MAX, len(self.entries)
        self._positions = [entry.position for entry in self.entries]
        assert self._positions == sorted(self._positions)

    def entries_from(self, position: Position, count_max: int) -> list[CompactedEntry]:
        """Up to ``count_max`` entries of the view at or after ``position``."""
        index = bisect.bisect_left(self._positions, position)
        return self.entries[index:index + count_max]

    @property
    def first_position(self) -> Position | None:
        return self._positions[0] if self._positions else None

    def encode(self) -> str:
        return json.dumps({
            "format_version": FORMAT_VERSION, "horizon": list(self.horizon),
            "entries": [[e.position.ledger_id, e.position.entry_id, e.batch_size,
                         format(e.keep_bits, "x") if e.batch_size else None] for e in self.entries],
        }, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> "CompactedView":
        try:
            doc = json.loads(text)
            if doc.get("format_version", 0) > FORMAT_VERSION:
                raise ValueError("unknown format")
            horizon = Position(int(doc["horizon"][0]), int(doc["horizon"][1]))
            entries = [CompactedEntry(Position(int(l), int(e)), int(size), int(bits, 16) if bits else 0)
                       for l, e, size, bits in doc["entries"]]
            if len(entries) > ENTRIES_MAX or [x.position for x in entries] != sorted(x.position for x in entries):
                raise ValueError("entries out of order or too many")
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise MalformedFrame(f"bad compacted view: {error}") from None
        return cls(horizon, entries)
