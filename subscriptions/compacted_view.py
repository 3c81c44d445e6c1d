"""What a ``read_compacted`` subscription reads of the compacted part of a topic: the
port through which the dispatcher asks the topic's compaction (implemented by
``broker/compaction.py``, which reads the compacted ledger). Pure.

Up to the compaction horizon a ``read_compacted`` consumer is served the compacted
ledger's entries — each a copy of a topic entry with its original position, and for a
batch of which only some messages survive the bits of those (a set bit is a message to
deliver) — and after the horizon the topic itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from common.position import Position


@dataclass(frozen=True)
class CompactedEntry:
    """One entry of a compacted ledger."""

    position: Position          # where it is in the topic (its message id)
    batch_size: int             # 0: deliver it whole
    keep_bits: int              # with batch_size: the messages to deliver (bit i: message i)
    stored: memoryview          # the topic entry's stored bytes, unchanged


class CompactedSource(Protocol):
    @property
    def horizon(self) -> Position:
        """The last topic entry the compacted ledger covers."""
        ...

    async def read_compacted(self, start: Position, count_max: int) -> list[CompactedEntry]:
        """Up to ``count_max`` compacted entries whose topic position is at or after
        ``start``, in topic order; empty when none is left before the horizon."""
        ...
