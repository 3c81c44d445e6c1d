"""A topic's backlog and retention, for ``PersistentTopic``: how far its durable
subscriptions have consumed, the backlog estimates the namespace policies check
(broker/policy_enforcement.py), and the ledgers retention deletes (the rule:
managed_ledger/retention.py), holding back what deduplication and compaction still read."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Callable, Protocol

from common.position import Position

if TYPE_CHECKING:
    from broker.deduplication import Deduplication
    from broker.topic_deduplication import TopicDeduplication
    from broker.topic_positions import TopicPositions
    from managed_ledger.compaction import TopicCompaction
    from managed_ledger.managed_ledger import ManagedLedger
    from subscriptions.subscription import Subscription


class RetainingTopic(Protocol):
    """What backlog and retention need of their topic (``PersistentTopic``)."""

    ledger: ManagedLedger
    subscriptions: dict[str, Subscription]
    closing: bool
    dedup: Deduplication | None
    deduplication: TopicDeduplication
    compaction: TopicCompaction
    positions: TopicPositions

    def entries_between(self, after: Position, upto: Position) -> int: ...


class TopicRetention:
    def __init__(self, topic: RetainingTopic) -> None:
        self._topic = topic

    def mean_entry_bytes(self) -> float:
        entries = self._topic.ledger.number_of_entries()
        return self._topic.ledger.total_size() / entries if entries > 0 else 0.0

    def backlog_bytes(self) -> int:
        """The slowest durable subscription's unconsumed entries times the mean entry
        size (Pulsar's estimate); 0 with no durable subscription."""
        return int(self.backlog_entries() * self.mean_entry_bytes())

    def backlog_entries(self, *, pending: bool = False) -> int:
        """The slowest durable subscription's unconsumed entries (0 with no durable
        subscription); with ``pending``, appends not yet confirmed count too (what the
        backlog is about to be)."""
        if not any(s.cursor.durable for s in self._topic.subscriptions.values()):
            return 0
        backlog = self._topic.entries_between(self.consumed_upto(), self._topic.ledger.last_confirmed)
        return backlog + self._topic.ledger.pending_appends if pending else backlog

    async def oldest_unconsumed_publish_ms(self) -> int | None:
        """The publish time of the slowest durable subscription's next entry (None: no
        backlog)."""
        if not any(s.cursor.durable for s in self._topic.subscriptions.values()):
            return None
        upto = self.consumed_upto()
        if upto >= self._topic.ledger.last_confirmed:
            return None
        published = await self._topic.positions.publish_time(self._topic.ledger.next_position(upto))
        return published if published >= 0 else None

    def consumed_upto(self) -> Position:
        """The lowest mark-delete position of the durable subscriptions (with none, the
        last stored entry: retention alone then decides)."""
        marks = [s.cursor.mark_delete_position for s in self._topic.subscriptions.values() if s.cursor.durable]
        # (The compacted ledger holds copies of what it serves up to its horizon; what
        # comes after it trim_ledgers keeps, but that is not backlog.)
        return min(marks) if marks else self._topic.ledger.last_confirmed

    async def trim_ledgers(self, retention_minutes: int, retention_mb: int,
                           may_delete: Callable[[int], bool] | None = None) -> list[int]:
        """Deletes the ledgers every durable cursor has passed that retention no longer
        protects (see managed_ledger/retention.py), oldest first and, given ``may_delete`` (the
        archive's gate: archived ledgers only), no further than the first it refuses.
        None holding entries after the last deduplication snapshot written (a quiet
        topic's stale snapshot is renewed here) or after the compaction horizon.
        Returns their ids."""
        from managed_ledger.retention import LedgerSpan, ledgers_to_delete

        if self._topic.closing:
            return []
        dedup = self._topic.dedup
        if dedup is not None and dedup.snapshot_stale(time.monotonic() - self._topic.deduplication.snapshot_written_at):
            self._topic.deduplication.start_snapshot(dedup)     # moves the hold below on (next time)
        ledger = self._topic.ledger
        now_ms = int(time.time() * 1000)
        # A ledger not closed yet (the current one, or one whose close is in progress)
        # is as young as can be.
        spans = [LedgerSpan(info.ledger_id, ledger.last_entry_of(info.ledger_id), max(info.size_bytes, 0),
                            info.closed_ms if info.closed_ms > 0 else now_ms) for info in ledger.ledger_infos()]
        upto = self.consumed_upto()
        if self._topic.deduplication.snapshot_written is not None:
            # A new owner replays the entries after the last snapshot written.
            upto = min(upto, self._topic.deduplication.snapshot_written)
        compacted = self._topic.compaction.record
        if compacted is not None:
            # The next compaction reads the entries after the horizon (Pulsar's
            # __compaction cursor holds them the same way).
            upto = min(upto, compacted.horizon)
        doomed = ledgers_to_delete(spans, ledger.current_ledger_id, tuple(upto), retention_minutes, retention_mb,
                                   now_ms)
        if may_delete is not None:
            doomed = list(itertools.takewhile(may_delete, doomed))
        if not doomed:
            return []
        await ledger.delete_ledgers_before(doomed[-1] + 1)
        return doomed
