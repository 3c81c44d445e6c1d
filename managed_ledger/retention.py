"""Which ledgers of a topic may be deleted: the retention rule. Pure.

A ledger may go once it is fully consumed — every durable cursor's mark-delete
position is at or past its last entry (with no durable cursor at all, everything
stored counts as consumed: retention alone decides) — and the namespace's retention
policy no longer protects it. The policy keeps consumed data for a time
(``retention_minutes``) and up to a size (``retention_mb``), as Pulsar's does:
walking fully consumed ledgers oldest first, each is deleted if it was closed longer
ago than the time (a ledger's age counts from its close, when its last entry was
written, as Pulsar's does: counted from its creation, a ledger that stayed open for
hours would lose its newest entries before they were retained for the time) or if
keeping it would keep more than the size; the first one still protected
stops the walk. 0 and 0 (the default) delete consumed ledgers at once; -1 means no
limit on that axis. The current ledger is never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerSpan:
    ledger_id: int
    last_entry_id: int    # -1: empty
    size_bytes: int
    closed_ms: int        # when its last entry was written (now, for one not closed yet)


def ledgers_to_delete(ledgers: list[LedgerSpan], current_ledger_id: int, consumed_upto: tuple[int, int],
                      retention_minutes: int, retention_mb: int, now_ms: int) -> list[int]:
    """Ids of the ledgers to delete now, oldest first. ``consumed_upto`` is the lowest
    mark-delete position (ledger, entry) of the durable cursors."""
    total_size = sum(span.size_bytes for span in ledgers)
    doomed: list[int] = []
    for span in ledgers:
        if span.ledger_id == current_ledger_id:
            break
        consumed = (span.ledger_id, span.last_entry_id) <= consumed_upto
        if not consumed:
            break
        if retention_minutes == 0 and retention_mb == 0:
            doomed.append(span.ledger_id)
            total_size -= span.size_bytes
            continue
        expired = retention_minutes >= 0 and now_ms - span.closed_ms > retention_minutes * 60_000
        over_size = retention_mb >= 0 and total_size > retention_mb * 1024 * 1024
        if expired or over_size:
            doomed.append(span.ledger_id)
            total_size -= span.size_bytes
            continue
        break
    return doomed
