"""A position in a managed ledger: (ledger_id, entry_id). Pure.

Positions order by ledger id, then entry id; a managed ledger's ledgers get increasing
ids from the cluster-wide counter, so that order is the order of the topic.
``EARLIEST`` sorts before every real position (entry -1 of ledger -1).
"""

from __future__ import annotations

from typing import NamedTuple


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
