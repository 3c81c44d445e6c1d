"""A read_compacted subscription on a topic whose oldest ledgers retention deleted
(subscriptions/dispatcher.py, ``_compacted_from``): the compacted ledger still holds
copies of those ledgers' entries (the latest value of their keys), and a cursor that
sits on the first stored entry right after its mark-delete position reads them first.

What it proves, with a real Subscription, cursor and SingleActiveDispatcher over
FakeManagedLedger (ledgers 10 and 11, 10 deleted) and a compacted view holding copies of
10:1, 10:3 and 11:2 (horizon 11:4):
- a subscription from "earliest" (mark-delete before every position, as
  broker/topic.py's ``_compacted_start`` makes it) gets 10:1, 10:3, 11:2, then the
  topic after the horizon; before the fix it began at 11:2, the first stored entry;
- one that starts inside the deleted range (a reader back after a reconnect: mark-delete
  10:1) gets 10:3 on, not 10:1 again;
- a rewind (a redelivery) goes back before them again, as a rewind to the first
  unacknowledged entry must, and so does a seek (a cursor reset) to before every
  position (what broker/topic.py's ``seek_position`` gives "earliest" then);
- a subscription that does not read compacted reads the stored entries only;
- on a topic whose ledgers are all stored, the entries compaction dropped are
  acknowledged as the subscription passes them, so once the consumer acknowledges what
  it was sent the mark-delete position reaches the end (before, it stayed before the
  first dropped entry for ever: a backlog that never cleared and ledgers retention
  could never delete); where copies of deleted ledgers were sent, nothing is
  acknowledged for them, so a rewind still sends them again;
- a compaction committed while a read of the view is out makes the dispatcher read
  again rather than skip (or acknowledge) up to the new horizon.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from common.position import Position
from subscriptions.compacted_view import CompactedEntry
from subscriptions.cursor import CursorState, ManagedCursor
from subscriptions.mode import SubscriptionMode
from subscriptions.subscription import Subscription
from tests.unit.fake_consumer import FakeConsumer
from tests.unit.fake_managed_ledger import FakeManagedLedger
from tests.unit.test_dispatcher_progress import batch_entry, settle


@dataclass
class _View:
    entries: list[CompactedEntry]
    horizon: Position
    replacement: tuple[list[CompactedEntry], Position] | None = None

    async def read_compacted(self, start: Position, count_max: int) -> list[CompactedEntry]:
        return [entry for entry in self.entries if entry.position >= start][:count_max]


def _topic(*, delete_first: bool = True) -> tuple[FakeManagedLedger, _View]:
    ledger = FakeManagedLedger(first_ledger_id=10)
    for index in range(5):
        ledger.append(batch_entry(1, index))
    ledger.roll(11)
    for index in range(5, 10):
        ledger.append(batch_entry(1, index))
    if delete_first:
        ledger.delete_ledger(10)
    stored = memoryview(batch_entry(1, 99))
    view = _View([CompactedEntry(Position(*at), 0, 0, stored) for at in ((10, 1), (10, 3), (11, 2))],
                 horizon=Position(11, 4))
    return ledger, view


def _subscription(ledger: FakeManagedLedger, view: _View, mark_delete: Position, read_compacted: bool) -> Subscription:
    cursor = ManagedCursor("sub", ledger, CursorState(mark_delete), None, durable=False)
    subscription = Subscription("sub", "persistent://t/ns/topic", ledger, cursor, SubscriptionMode.EXCLUSIVE)
    subscription.compacted_source_of = lambda: view
    subscription.read_compacted = read_compacted
    return subscription


def _delivered(mark_delete: Position, read_compacted: bool = True, *, rewind: bool = False,
               reset_to: Position | None = None) -> list[tuple[int, int]]:
    async def scenario() -> list[tuple[int, int]]:
        ledger, view = _topic()
        subscription = _subscription(ledger, view, mark_delete, read_compacted)
        consumer = FakeConsumer(1, "c", permits=100)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        if rewind:
            subscription.dispatcher.redeliver(consumer, None)
            await settle()
        if reset_to is not None:
            subscription.reset_cursor(reset_to)
            await settle()
        ledger.append(batch_entry(1, 10))          # 11:5, after the horizon
        await settle()
        await subscription.dispatcher.close()
        return [(p.ledger_id, p.entry_id) for p in consumer.positions]

    return asyncio.run(scenario())


def test_earliest_reads_the_compacted_copies_of_deleted_ledgers_first():
    assert _delivered(Position(-1, -1)) == [(10, 1), (10, 3), (11, 2), (11, 5)]


def test_a_start_inside_the_deleted_range_goes_on_from_there():
    assert _delivered(Position(10, 1)) == [(10, 3), (11, 2), (11, 5)]


def test_a_rewind_goes_back_before_the_deleted_range():
    assert _delivered(Position(-1, -1), rewind=True) == [(10, 1), (10, 3), (11, 2), (10, 1), (10, 3), (11, 2),
                                                         (11, 5)]


def test_without_read_compacted_only_the_stored_entries_are_read():
    assert _delivered(Position(-1, -1), read_compacted=False) == [(11, i) for i in range(6)]


def test_a_reset_to_before_every_position_reads_the_compacted_copies_again():
    assert _delivered(Position(10, 3), reset_to=Position(-1, 0)) == [(11, 2), (10, 1), (10, 3), (11, 2), (11, 5)]


def test_the_entries_compaction_dropped_are_acknowledged_as_they_are_passed():
    async def scenario() -> None:
        ledger, view = _topic(delete_first=False)
        subscription = _subscription(ledger, view, Position(-1, -1), True)
        consumer = FakeConsumer(1, "c", permits=100)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        ledger.append(batch_entry(1, 10))          # 11:5, after the horizon
        await settle()
        assert [(p.ledger_id, p.entry_id) for p in consumer.positions] == [(10, 1), (10, 3), (11, 2), (11, 5)]
        cursor = subscription.cursor
        assert cursor.mark_delete_position == Position(10, 0)        # 10:1 sent, not acknowledged yet
        for position in consumer.positions:
            cursor.ack(position)
        assert cursor.mark_delete_position == Position(11, 5)
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_nothing_is_acknowledged_past_copies_of_deleted_ledgers():
    async def scenario() -> None:
        ledger, view = _topic()
        subscription = _subscription(ledger, view, Position(-1, -1), True)
        consumer = FakeConsumer(1, "c", permits=100)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        assert len(consumer.positions) == 3
        assert subscription.cursor.mark_delete_position == Position(-1, -1)
        assert not subscription.cursor.is_acked(Position(11, 0))
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_a_compaction_committed_during_a_read_is_read_again_not_skipped():
    """The compacted view holds 10:1 up to horizon 10:4 when the subscription reads from
    10:2; while that read is out, a compaction commits 10:1 and 11:2 up to 11:4. The
    empty answer of the old view must not send the cursor past the new horizon (nor
    acknowledge up to it): 11:2 is delivered."""

    class _Replaced(_View):
        async def read_compacted(self, start: Position, count_max: int) -> list[CompactedEntry]:
            answer = await super().read_compacted(start, count_max)
            if self.replacement is not None:
                self.entries, self.horizon = self.replacement
                self.replacement = None
            return answer

    async def scenario() -> list[tuple[int, int]]:
        ledger, _ = _topic(delete_first=False)
        stored = memoryview(batch_entry(1, 99))
        view = _Replaced([CompactedEntry(Position(10, 1), 0, 0, stored)], horizon=Position(10, 4))
        view.replacement = ([CompactedEntry(Position(10, 1), 0, 0, stored), CompactedEntry(Position(11, 2), 0, 0, stored)],
                            Position(11, 4))
        subscription = _subscription(ledger, view, Position(10, 1), True)
        consumer = FakeConsumer(1, "c", permits=100)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        await subscription.dispatcher.close()
        return [(p.ledger_id, p.entry_id) for p in consumer.positions]

    assert asyncio.run(scenario()) == [(11, 2)]


def test_ledgers_deleted_between_a_rewind_and_the_next_read_do_not_move_the_start():
    """Ledger 10 is gone when the consumer comes (its rewind puts the cursor on 11:0, the
    first stored entry), and retention deletes 11 before the first round reads: the
    round still starts before every copy (10:1, 10:3, 11:2 are delivered). Before, the
    cursor sat on 11:0, no longer the first stored entry after the mark, and the read
    began there: 10:1 and 10:3 were skipped."""
    async def scenario() -> list[tuple[int, int]]:
        ledger, view = _topic()
        ledger.roll(12)
        ledger.append(batch_entry(1, 10))          # 12:0
        subscription = _subscription(ledger, view, Position(-1, -1), True)
        consumer = FakeConsumer(1, "c", permits=100)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        ledger.delete_ledger(11)                   # before the dispatcher's first round
        await settle()
        await subscription.dispatcher.close()
        return [(p.ledger_id, p.entry_id) for p in consumer.positions]

    assert asyncio.run(scenario())[:3] == [(10, 1), (10, 3), (11, 2)]
