"""What a ``read_compacted`` subscription reads of the compacted part of a topic: the
port through which the dispatcher asks the topic's compaction (implemented by
``managed_ledger/compaction.py``, which reads the compacted ledger). Pure.

Up to the compaction horizon a ``read_compacted`` consumer is served the compacted
ledger's entries — each a copy of a topic entry with its original position, and for a
batch of which only some messages survive the bits of those (a set bit is a message to
deliver) — and after the horizon the topic itself.
"""

from __future__ import annotations

from typing import Protocol

# The entry itself is vocabulary (common/position.py): the managed ledger's compaction
# writes it without importing this sibling package.
from common.position import CompactedEntry, Position

__all__ = ["CompactedEntry", "CompactedSource"]


class CompactedSource(Protocol):
    @property
    def horizon(self) -> Position:
        """The last topic entry the compacted ledger covers."""
        ...

    async def read_compacted(self, start: Position, count_max: int) -> list[CompactedEntry]:
        """Up to ``count_max`` compacted entries whose topic position is at or after
        ``start``, in topic order; empty when none is left before the horizon."""
        ...
