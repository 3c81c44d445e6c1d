"""A position in a managed ledger: (ledger_id, entry_id), the entry found there, and the
compacted copy of one. Pure.

Positions order by ledger id, then entry id; a managed ledger's ledgers get increasing
ids from the cluster-wide counter, so that order is the order of the topic.
``EARLIEST`` sorts before every real position (entry -1 of ledger -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable, NamedTuple


class Position(NamedTuple):
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        ledger, _, entry = text.partition(":")
        return cls(int(ledger), int(entry))


EARLIEST = Position(-1, -1)

# A ledger of a topic holds at most this many entries: a cursor's ack bitmap
# (subscriptions/ack_set.py) covers at most this many per ledger, and a managed ledger
# refuses a rollover bound above it (managed ledgers roll over at 50,000 entries by
# default; this allows generous overrides): 16 Mi entries = a 2 MiB bitmap.
ENTRIES_PER_LEDGER_MAX = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ManagedEntry:
    """An entry of a topic at its position: what a managed ledger reads and a
    dispatcher sends. ``data`` is the stored payload (what the producer sent, from the
    0x0e01 magic on), never re-encoded on its way to consumers."""

    position: Position
    data: bytes | memoryview


@dataclass(frozen=True)
class CompactedEntry:
    """One entry of a compacted ledger: what compaction (managed_ledger/compaction.py)
    writes and a ``read_compacted`` subscription reads (subscriptions/compacted_view.py)."""

    position: Position          # where it is in the topic (its message id)
    batch_size: int             # 0: deliver it whole
    keep_bits: int              # with batch_size: the messages to deliver (bit i: message i)
    stored: memoryview          # the topic entry's stored bytes, unchanged


def normalize(position: Position, ledger_ids: Collection[int], last_entry_of: Callable[[int], int],
              may_grow: Callable[[int], bool]) -> Position:
    """The same place in a topic whose ledgers are ``ledger_ids`` (iterated in ascending
    order; a dict keyed by ledger id does, without a copy), moved off
    the end of a finished ledger (or off a deleted one) to the first entry of the next
    ledger holding one. Positions in a ledger that ``may_grow`` are left as they are,
    written or not; past the last ledger, too."""
    ledger_id, entry_id = position
    while True:
        if may_grow(ledger_id):
            return Position(ledger_id, entry_id)
        if ledger_id in ledger_ids and entry_id <= last_entry_of(ledger_id):
            return Position(ledger_id, entry_id)
        for following in ledger_ids:    # a loop, not next(genexpr): no generator per call
            if following > ledger_id:
                break
        else:
            return Position(ledger_id, entry_id)
        ledger_id, entry_id = following, 0


def entries_between(ledger_ids: Iterable[int], last_entry_of: Callable[[int], int], after: Position,
                    upto: Position) -> int:
    """How many entries lie in (after, upto] of a topic whose ledgers are ``ledger_ids``
    (ascending), ledger ``l`` holding entries 0..``last_entry_of(l)`` (-1: none). Entries
    of a ledger missing from ``ledger_ids`` (deleted) do not count; neither do
    positions past a ledger's last entry."""
    total = 0
    for ledger_id in ledger_ids:
        if ledger_id < after.ledger_id:
            continue
        if ledger_id > upto.ledger_id:
            break
        last = last_entry_of(ledger_id)
        if last < 0:
            continue
        first = max(0, after.entry_id + 1) if ledger_id == after.ledger_id else 0
        end = min(last, upto.entry_id) if ledger_id == upto.ledger_id else last
        total += max(0, end - first + 1)
    assert total >= 0
    return total
