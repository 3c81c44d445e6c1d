"""Helpers shared by the ack-set and cursor-record unit tests."""

from __future__ import annotations

from subscriptions.ack_set import AckSet


def ack_set_of(*pairs: tuple[int, int]) -> AckSet:
    ack_set = AckSet()
    for ledger_id, entry_id in pairs:
        ack_set.add(ledger_id, entry_id)
    return ack_set


def marked(ack_set: AckSet) -> set[tuple[int, int]]:
    """Every marked (ledger_id, entry_id), read back through ``ranges``."""
    return {(ledger_id, entry_id)
            for ledger_id in ack_set.ledgers()
            for first, last in ack_set.ranges(ledger_id)
            for entry_id in range(first, last + 1)}
