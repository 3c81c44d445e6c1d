"""Which ledgers to archive, whose bookie copies to delete, and which archived ledgers
the archive's own retention lets go. Pure: lists and numbers in, ledger ids out.

- ``ledgers_to_archive``: closed ledgers not yet archived, oldest first, chosen by the
  namespace's offload policy as Pulsar chooses them: while the topic's size not yet
  archived passes ``threshold_bytes``, the oldest go (0: every closed ledger); any
  closed ``threshold_seconds`` ago or more goes; -1 turns a trigger off. An operator's
  request (``requested_upto``: a position) adds every closed ledger whose last entry
  is at or before it. The open (current) ledger never goes, nor any after a ledger
  whose close is still under way: the archive is always the oldest part of the topic.
- ``ledgers_to_release``: archived ledgers whose bookie copy may now be deleted: the
  deletion lag has passed since their archive was recorded.
- ``ledgers_to_collect``: archived ledgers that left the topic (ack-based retention
  trimmed them) and that the archive's retention (time since archived, total size;
  -1: no limit on that axis) no longer keeps, oldest first. A ledger still in the
  topic is never collected: its archive may be the only copy a consumer can read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerState:
    ledger_id: int
    last_entry_id: int        # -1: none (empty, or not closed)
    size_bytes: int
    closed_ms: int            # 0: not closed
    archived: bool


def ledgers_to_archive(ledgers: list[LedgerState], *, threshold_bytes: int, threshold_seconds: int,
                       requested_upto: tuple[int, int] | None, now_ms: int) -> list[int]:
    """Ids of the ledgers to archive now, oldest first (``ledgers`` in topic order)."""
    pending = [ledger for ledger in ledgers if not ledger.archived]
    unarchived_bytes = sum(max(ledger.size_bytes, 0) for ledger in pending)
    chosen: list[int] = []
    for ledger in pending:
        if ledger.closed_ms <= 0:
            # Open, or its close still under way (a roll-over): nothing after it goes
            # either, so the archive stays the oldest part of the topic — what readers
            # of archive + live tail count on (spark/stream.py; a tail read from after
            # the last archived ledger skipped one archived later, out of order).
            break
        if ledger.last_entry_id < 0:
            continue              # empty: nothing to archive
        by_size = threshold_bytes >= 0 and unarchived_bytes > threshold_bytes
        by_age = threshold_seconds >= 0 and now_ms - ledger.closed_ms >= threshold_seconds * 1000
        by_request = requested_upto is not None and (ledger.ledger_id, ledger.last_entry_id) <= requested_upto
        if by_size or by_age or by_request:
            chosen.append(ledger.ledger_id)
            unarchived_bytes -= max(ledger.size_bytes, 0)
    return chosen


@dataclass(frozen=True)
class ArchivedLedger:
    ledger_id: int
    size_bytes: int
    archived_ms: int
    bookie_deleted_ms: int    # 0: the bookies still hold it
    in_topic: bool            # still listed by the topic's managed ledger


def ledgers_to_release(archived: list[ArchivedLedger], *, deletion_lag_ms: int, now_ms: int) -> list[int]:
    """Archived ledgers whose bookie copy may be deleted now."""
    assert deletion_lag_ms >= 0
    return [ledger.ledger_id for ledger in archived
            if ledger.bookie_deleted_ms == 0 and now_ms - ledger.archived_ms >= deletion_lag_ms]


def ledgers_to_collect(archived: list[ArchivedLedger], *, retention_minutes: int, retention_mb: int,
                       now_ms: int) -> list[int]:
    """Archived ledgers gone from the topic whose archive may be deleted, oldest first."""
    gone = sorted((ledger for ledger in archived if not ledger.in_topic), key=lambda l: l.ledger_id)
    if retention_minutes < 0 and retention_mb < 0:
        return []
    total = sum(ledger.size_bytes for ledger in gone)
    doomed: list[int] = []
    for ledger in gone:
        expired = retention_minutes >= 0 and now_ms - ledger.archived_ms > retention_minutes * 60_000
        over_size = retention_mb >= 0 and total > retention_mb * 1024 * 1024
        if not (expired or over_size):
            break
        doomed.append(ledger.ledger_id)
        total -= ledger.size_bytes
    return doomed
