"""Whether a stream's offset points at messages retention deleted (``failOnDataLoss``).
Pure: no IO.

A stream's offset for a partition is the last entry it read, ``(ledger_id, entry_id)``.
What a partition still stores is its archived ledgers (the manifest) and the ledgers of
its managed ledger (internal stats). Retention deletes a topic's ledgers oldest first,
so while the offset's ledger is stored, nothing after it was deleted. When the
offset's ledger is gone the entries after the offset may be gone with it, and so may
whole ledgers between it and the oldest one still stored; ledger ids come from one
counter for the whole cluster, so a gap in ids proves nothing. The reader's own memory
of the partition's ledgers (``LedgerHistory``, what earlier listings showed) settles
the common case: the offset was the last entry of a closed ledger, and every ledger
the listing showed after it is still stored or was empty. Without that memory (a query
restarted from its checkpoint after the deletion) the loss cannot be ruled out, and it
is reported, as Spark's Kafka source reports data that "may have been lost".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

Position = tuple[int, int]

# Ledgers remembered per partition: a ledger rolls over every few minutes at most in
# practice, so a thousand covers far more than the gap between two micro-batches.
LEDGERS_REMEMBERED_MAX = 1000


@dataclass(frozen=True)
class Loss:
    topic: str
    after: Position                  # the offset: the last entry read
    upto: Position | None            # the oldest stored position after it (None: none)


class LedgerHistory:
    """A partition's ledgers as listings showed them, oldest first: ``(ledger_id,
    entries)`` with ``entries`` None while the ledger was still being written."""

    def __init__(self, ledgers_max: int = LEDGERS_REMEMBERED_MAX) -> None:
        assert ledgers_max > 0
        self.ledgers_max = ledgers_max
        self._by_topic: dict[str, dict[int, int | None]] = {}

    def observe(self, topic: str, ledgers: Sequence[tuple[int, int | None]]) -> None:
        known = self._by_topic.setdefault(topic, {})
        for ledger_id, entries in ledgers:
            if entries is not None or ledger_id not in known:
                known[ledger_id] = entries       # a count, once known, stays
        while len(known) > self.ledgers_max:
            del known[min(known)]
        assert len(known) <= self.ledgers_max

    def ledgers(self, topic: str) -> list[tuple[int, int | None]]:
        return sorted(self._by_topic.get(topic, {}).items())


def find_loss(topic: str, after: Position | None, stored: Mapping[int, int], seen: Sequence[tuple[int, int | None]]
              ) -> Loss | None:
    """The loss behind offset ``after`` of ``topic``, or None when nothing after it can
    have been deleted. ``stored`` maps each stored ledger (archive and topic) to its
    entry count; ``seen`` is LedgerHistory.ledgers(topic)."""
    if after is None:
        return None                      # earliest: whatever is stored is the start
    ledger_id, entry_id = after
    if ledger_id in stored:
        return None
    later = [stored_id for stored_id in stored if stored_id > ledger_id]
    upto = (min(later), 0) if later else None
    ids = [seen_id for seen_id, _entries in seen]
    if ledger_id in ids:
        index = ids.index(ledger_id)
        entries = seen[index][1]
        if entries is not None and entry_id == entries - 1:
            # The offset was its ledger's last entry: what came next was the following
            # ledgers; nothing is lost if each is stored or held nothing.
            for next_id, next_entries in seen[index + 1:]:
                if next_id in stored:
                    return None
                if next_entries != 0:
                    break
    return Loss(topic, after, upto)
