"""The managed cursor (subscriptions/cursor.py): a subscription's read position and
acknowledgement state.

What it proves: the read position starts right after the mark-delete position; individual
acknowledgements leave holes and the mark-delete position advances exactly when a hole
fills (across ledgers, over deleted ledgers, never past the last confirmed entry);
acknowledgements at or below the mark-delete position, past the last confirmed entry,
off the end of a ledger or repeated change nothing and say so; cumulative
acknowledgements move the mark and absorb the individual acknowledgements they cover;
rewind / seek / reset put the read position where Pulsar does; batch acknowledgements
AND bitsets together and count the entry once no bit is left, also when the first
unacknowledged batch is acknowledged cumulatively in part; the backlog is the entries
after the mark-delete position minus those acknowledged singly; 100,000 holes stay
fast; persistence sends deltas, snapshots after a reset, keeps a failed delta for the
next save, flushes on close and never saves after it; a save in flight is never
cancelled by close() or delete() and a cancelled flush keeps its changes for the next
one; a cursor the store reports taken over (TopicFenced) stops saving and says so once.

How: a real ManagedCursor over FakeManagedLedger (an in-memory stand-in for the managed
ledger edge: positions, normalization, entry counts) and, for persistence, a recording
CursorStore; asyncio.run only where the cursor schedules its flushes.
"""

from __future__ import annotations

import asyncio

import pytest

from common.position import Position
from common.errors import PersistenceError, TopicFenced
from subscriptions.ack_set import AckSet
from subscriptions.cursor import CursorState, ManagedCursor, ack_set_words_to_int, int_to_ack_set_words
from tests.unit.fake_managed_ledger import FakeManagedLedger

EARLIEST = Position(-1, -1)


def P(ledger_id: int, entry_id: int) -> Position:
    return Position(ledger_id, entry_id)


def ledger_with(*ledger_sizes: int, first_ledger_id: int = 10) -> FakeManagedLedger:
    """Ledgers 10, 11, ... holding the given numbers of entries; the last one is current."""
    ledger = FakeManagedLedger(first_ledger_id)
    for index, size in enumerate(ledger_sizes):
        if index:
            ledger.roll()
        ledger.append_many(size)
    return ledger


def cursor_on(ledger: FakeManagedLedger, mark_delete: Position = EARLIEST) -> ManagedCursor:
    """A cursor without a store: nothing is scheduled, no event loop is needed."""
    return ManagedCursor("sub", ledger, CursorState(mark_delete), None)


def acked_entries(cursor: ManagedCursor, ledger: FakeManagedLedger) -> list[Position]:
    """Every stored position the cursor counts as acknowledged."""
    positions = [P(l, e) for l in ledger.ledger_ids() for e in range(ledger._last_entry_of(l) + 1)]
    return [p for p in positions if cursor.is_acked(p)]


# --- the starting read position ------------------------------------------------------------------

@pytest.mark.parametrize("sizes, mark_delete, expected", [
    ((5,), EARLIEST, P(10, 0)),
    ((5,), P(10, 2), P(10, 3)),
    ((3, 4), P(10, 2), P(11, 0)),         # the end of a closed ledger: the next ledger
    ((3, 4), P(11, 3), P(11, 4)),         # the end of the current ledger: the next entry to be written
    ((0,), EARLIEST, P(10, 0)),           # an empty topic
])
def test_read_position_starts_after_mark_delete(sizes, mark_delete, expected):
    cursor = cursor_on(ledger_with(*sizes), mark_delete)
    assert cursor.read_position == expected
    assert cursor.mark_delete_position == mark_delete


# --- individual acknowledgements ------------------------------------------------------------------------

def test_mark_delete_advances_only_when_holes_fill():
    """Acks 2, 4, 3 leave a hole at 0; acking 0 moves the mark to 0, acking 1 moves it over 2-4."""
    ledger = ledger_with(10)
    cursor = cursor_on(ledger)
    for entry_id in (2, 4, 3):
        assert cursor.ack(P(10, entry_id)) is True
    assert cursor.mark_delete_position == EARLIEST
    assert cursor.individually_acked_count == 3
    assert [cursor.is_acked(P(10, e)) for e in range(6)] == [False, False, True, True, True, False]
    assert cursor.ack(P(10, 0)) is True
    assert cursor.mark_delete_position == P(10, 0)
    assert cursor.individually_acked_count == 3
    assert cursor.ack(P(10, 1)) is True
    assert cursor.mark_delete_position == P(10, 4)
    assert cursor.individually_acked_count == 0        # absorbed into the mark-delete position
    assert acked_entries(cursor, ledger) == [P(10, e) for e in range(5)]


def test_mark_delete_crosses_ledgers():
    """Ledgers 10 (3 entries) and 11 (2) are closed, 12 is current (2): acking everything
    backwards moves the mark to the last entry of ledger 12 in one step."""
    ledger = ledger_with(3, 2, 2)
    cursor = cursor_on(ledger)
    everything = [P(10, 0), P(10, 1), P(10, 2), P(11, 0), P(11, 1), P(12, 0), P(12, 1)]
    for position in reversed(everything[1:]):
        assert cursor.ack(position)
    assert cursor.mark_delete_position == EARLIEST
    assert cursor.individually_acked_count == 6
    assert cursor.ack(P(10, 0))
    assert cursor.mark_delete_position == P(12, 1)
    assert cursor.individually_acked_count == 0
    assert cursor.read_position == P(12, 2)


def test_mark_delete_stops_at_a_hole_in_a_later_ledger():
    ledger = ledger_with(2, 3)
    cursor = cursor_on(ledger)
    for position in (P(10, 1), P(11, 0), P(11, 2)):
        cursor.ack(position)
    cursor.ack(P(10, 0))
    assert cursor.mark_delete_position == P(11, 0)
    assert cursor.individually_acked_count == 1
    assert not cursor.is_acked(P(11, 1))
    assert cursor.is_acked(P(11, 2))


def test_mark_delete_skips_a_deleted_ledger():
    """With ledger 11 gone, the entry after (10, 1) is (12, 0)."""
    ledger = ledger_with(2, 2, 2)
    ledger.delete_ledger(11)
    cursor = cursor_on(ledger, P(10, 0))
    cursor.ack(P(12, 0))
    assert cursor.mark_delete_position == P(10, 0)
    cursor.ack(P(10, 1))
    assert cursor.mark_delete_position == P(12, 0)


def test_mark_delete_never_passes_the_last_confirmed_entry():
    """Everything confirmed acknowledged: the mark is the last confirmed entry; entries
    written later are unacknowledged and become acknowledgeable."""
    ledger = ledger_with(3)
    cursor = cursor_on(ledger)
    for entry_id in (2, 1, 0):
        cursor.ack(P(10, entry_id))
    assert cursor.mark_delete_position == P(10, 2)
    new = ledger.append()
    assert new == P(10, 3)
    assert not cursor.is_acked(new)
    assert cursor.read_position == P(10, 3)
    assert cursor.ack(new)
    assert cursor.mark_delete_position == new


@pytest.mark.parametrize("position, why", [
    (P(10, 3), "at the mark-delete position"),
    (P(10, 0), "below the mark-delete position"),
    (P(9, 50), "in an earlier ledger"),
    (P(11, 2), "past the last confirmed entry"),
    (P(12, 0), "in a ledger that does not exist yet"),
    (P(10, 5), "past the end of a closed ledger (not an entry of the topic)"),
])
def test_acks_that_change_nothing_say_so(position, why):
    """Closed ledger 10 has entries 0-4, current ledger 11 has 0-1; the mark is (10, 3)."""
    ledger = ledger_with(5, 2)
    cursor = cursor_on(ledger, P(10, 3))
    cursor.ack(P(11, 1))
    before = (cursor.mark_delete_position, cursor.individually_acked_count, cursor.read_position)
    assert cursor.ack(position) is False, why
    assert (cursor.mark_delete_position, cursor.individually_acked_count, cursor.read_position) == before


def test_acking_the_same_entry_twice_changes_nothing_the_second_time():
    cursor = cursor_on(ledger_with(5))
    assert cursor.ack(P(10, 3)) is True
    assert cursor.ack(P(10, 3)) is False
    assert cursor.individually_acked_count == 1


# --- cumulative acknowledgements ----------------------------------------------------------------------

def test_cumulative_ack_moves_the_mark_and_absorbs_individual_acks():
    """Individual acks 5, 6, 8; cumulative ack of 4 moves the mark over 5 and 6 too."""
    ledger = ledger_with(10)
    cursor = cursor_on(ledger)
    for entry_id in (5, 6, 8):
        cursor.ack(P(10, entry_id))
    assert cursor.ack_cumulative(P(10, 4)) is True
    assert cursor.mark_delete_position == P(10, 6)
    assert cursor.individually_acked_count == 1
    assert acked_entries(cursor, ledger) == [P(10, e) for e in (0, 1, 2, 3, 4, 5, 6, 8)]


def test_cumulative_ack_at_or_below_the_mark_changes_nothing():
    cursor = cursor_on(ledger_with(10), P(10, 5))
    assert cursor.ack_cumulative(P(10, 5)) is False
    assert cursor.ack_cumulative(P(10, 2)) is False
    assert cursor.mark_delete_position == P(10, 5)


def test_cumulative_ack_past_the_last_confirmed_entry_stops_there():
    ledger = ledger_with(4)
    cursor = cursor_on(ledger)
    assert cursor.ack_cumulative(P(10, 1_000)) is True
    assert cursor.mark_delete_position == P(10, 3)
    assert not cursor.is_acked(ledger.append())


def test_cumulative_ack_across_ledgers_drops_earlier_ledgers_acks():
    ledger = ledger_with(3, 3, 3)
    cursor = cursor_on(ledger)
    for position in (P(10, 2), P(11, 1), P(12, 1)):
        cursor.ack(position)
    cursor.ack_cumulative(P(11, 2))
    assert cursor.mark_delete_position == P(11, 2)
    assert cursor.individually_acked_count == 1        # only (12, 1) is left past the mark
    assert cursor.is_acked(P(12, 1)) and not cursor.is_acked(P(12, 0))


# --- the read position -----------------------------------------------------------------------------------

def test_mark_delete_passing_the_read_position_pushes_it_forward():
    """Entries at or before the mark are never read again; a read position ahead stays."""
    ledger = ledger_with(10)
    cursor = cursor_on(ledger)
    cursor.skip_next_read(P(10, 3))              # entries 0-2 were dispatched
    cursor.ack_cumulative(P(10, 5))
    assert cursor.read_position == P(10, 6)
    cursor.skip_next_read(P(10, 9))
    cursor.ack_cumulative(P(10, 7))
    assert cursor.read_position == P(10, 9)


def test_rewind_goes_back_to_the_first_entry_after_the_mark():
    """Redelivery: after rewind the read position is the first unacknowledged entry's
    place (individually acked entries after it are skipped by the dispatcher, not here)."""
    ledger = ledger_with(10)
    cursor = cursor_on(ledger)
    cursor.ack(P(10, 0))
    cursor.ack(P(10, 2))
    cursor.skip_next_read(P(10, 8))
    cursor.rewind()
    assert cursor.read_position == P(10, 1)


def test_seek_read_normalizes_off_the_end_of_a_ledger():
    ledger = ledger_with(3, 3)
    cursor = cursor_on(ledger)
    cursor.seek_read(P(10, 3))
    assert cursor.read_position == P(11, 0)
    cursor.seek_read(P(10, 1))
    assert cursor.read_position == P(10, 1)
    assert cursor.mark_delete_position == EARLIEST    # seeking the read position acks nothing


def test_reset_acks_everything_before_and_nothing_after():
    """Pulsar's reset-cursor: even entries individually acknowledged after the new place
    count as unacknowledged again, and the mark can move backwards."""
    ledger = ledger_with(10)
    cursor = cursor_on(ledger)
    cursor.ack_cumulative(P(10, 6))
    cursor.ack(P(10, 8))
    cursor.ack(P(10, 9), [0b10], 2)
    cursor.reset(P(10, 3))
    assert cursor.mark_delete_position == P(10, 2)
    assert cursor.read_position == P(10, 3)
    assert cursor.individually_acked_count == 0
    assert cursor.unacked_batch_bits(P(10, 9)) is None
    assert acked_entries(cursor, ledger) == [P(10, 0), P(10, 1), P(10, 2)]


@pytest.mark.parametrize("target, mark_delete, read_position", [
    (P(11, 0), P(11, -1), P(11, 0)),     # the first entry of a ledger: nothing of it acked
    (P(10, 3), P(11, -1), P(11, 0)),     # off the end of closed ledger 10: normalized first
    (P(10, 0), P(10, -1), P(10, 0)),     # the very beginning: nothing acked at all
])
def test_reset_to_ledger_boundaries(target, mark_delete, read_position):
    ledger = ledger_with(3, 3)
    cursor = cursor_on(ledger)
    cursor.reset(target)
    assert cursor.mark_delete_position == mark_delete
    assert cursor.read_position == read_position
    assert not cursor.is_acked(read_position)


# --- batch acknowledgements ---------------------------------------------------------------------------

def test_batch_index_acks_and_together_until_no_bit_is_left():
    """A 4-message batch at (10, 1): its ack sets are the bits still *unacknowledged*."""
    ledger = ledger_with(3)
    cursor = cursor_on(ledger, P(10, 0))
    assert cursor.ack(P(10, 1), [0b1110], 4) is True          # message 0 acked
    assert not cursor.is_acked(P(10, 1))
    assert cursor.unacked_batch_bits(P(10, 1)) == (64, 0b1110)
    assert cursor.ack(P(10, 1), [0b1011], 4) is True          # message 2 acked: 1110 & 1011
    assert cursor.unacked_batch_bits(P(10, 1)) == (64, 0b1010)
    assert cursor.ack(P(10, 1), [0b1110], 4) is False         # nothing new (message 0 again)
    assert cursor.unacked_batch_bits(P(10, 1)) == (64, 0b1010)
    assert cursor.mark_delete_position == P(10, 0)
    assert cursor.ack(P(10, 1), [0b0101], 4) is True          # messages 1 and 3: none left
    assert cursor.is_acked(P(10, 1))
    assert cursor.unacked_batch_bits(P(10, 1)) is None
    assert cursor.mark_delete_position == P(10, 1)


def test_batch_size_beyond_one_word_is_kept():
    cursor = cursor_on(ledger_with(3))
    words = int_to_ack_set_words(((1 << 100) - 1) & ~1, 100)
    assert cursor.ack(P(10, 2), words, 100) is True
    assert cursor.unacked_batch_bits(P(10, 2)) == (128, ((1 << 100) - 1) & ~1)


def test_whole_entry_ack_clears_a_partly_acked_batch():
    cursor = cursor_on(ledger_with(3))
    cursor.ack(P(10, 2), [0b10], 2)
    assert cursor.ack(P(10, 2)) is True
    assert cursor.is_acked(P(10, 2))
    assert cursor.unacked_batch_bits(P(10, 2)) is None


def test_batch_acks_of_a_fully_acked_entry_change_nothing():
    """Once an entry is acknowledged whole, a late batch ack (a client resending the last
    index, or an index after an entry ack) must neither report a change nor leave a
    partly-acked batch behind for an entry that is already gone."""
    cursor = cursor_on(ledger_with(5))
    cursor.ack(P(10, 3), [0b01], 2)
    assert cursor.ack(P(10, 3), [0b00], 2) is True            # the last index: entry acked
    assert cursor.ack(P(10, 3), [0b00], 2) is False           # the same ack again
    assert cursor.individually_acked_count == 1
    cursor.ack(P(10, 4))
    assert cursor.ack(P(10, 4), [0b10], 2) is False           # an index of an acked entry
    assert cursor.unacked_batch_bits(P(10, 4)) is None


def test_cumulative_ack_inside_a_batch():
    """A cumulative ack with an ack set acknowledges everything before the batch and the
    batch's messages not left set; with no bit left it covers the batch too."""
    ledger = ledger_with(10)
    cursor = cursor_on(ledger)
    assert cursor.ack_cumulative(P(10, 4), [0b1100]) is True
    assert cursor.mark_delete_position == P(10, 3)
    assert cursor.unacked_batch_bits(P(10, 4)) == (64, 0b1100)
    assert not cursor.is_acked(P(10, 4))
    assert cursor.ack_cumulative(P(10, 4), [0]) is True
    assert cursor.mark_delete_position == P(10, 4)
    assert cursor.unacked_batch_bits(P(10, 4)) is None


def test_cumulative_ack_inside_the_first_unacked_batch_is_a_change():
    """Mark at (10, 3); a cumulative ack of message 1 of the batch at (10, 4) moves no mark
    but does acknowledge messages: it must report a change and get persisted (the next
    flush saves the batch bits; repeating the same ack saves nothing)."""
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store, P(10, 3))
        assert cursor.ack_cumulative(P(10, 4), [0b1100]) is True
        assert cursor.unacked_batch_bits(P(10, 4)) == (64, 0b1100)
        await cursor.flush()
        assert [s["batches"] for s in store.saves] == [{P(10, 4): (64, 0b1100)}]
        assert cursor.ack_cumulative(P(10, 4), [0b1100]) is False     # the same again: no change
        await cursor.flush()
        assert len(store.saves) == 1
        assert cursor.ack_cumulative(P(10, 4), [0b1000]) is True
        assert cursor.unacked_batch_bits(P(10, 4)) == (64, 0b1000)
        assert cursor.mark_delete_position == P(10, 3)
        await cursor.close()

    asyncio.run(scenario())


def test_cumulative_batch_ack_below_the_mark_leaves_no_batch_behind():
    cursor = cursor_on(ledger_with(10), P(10, 5))
    assert cursor.ack_cumulative(P(10, 2), [0b10]) is False
    assert cursor.unacked_batch_bits(P(10, 2)) is None


def test_partly_acked_batches_are_forgotten_when_the_mark_passes_them():
    cursor = cursor_on(ledger_with(10))
    cursor.ack(P(10, 3), [0b10], 2)
    cursor.ack(P(10, 6), [0b10], 2)
    cursor.ack_cumulative(P(10, 4))
    assert cursor.unacked_batch_bits(P(10, 3)) is None
    assert cursor.unacked_batch_bits(P(10, 6)) == (64, 0b10)


@pytest.mark.parametrize("value, batch_size, words", [
    (0, 1, [0]),
    (0b1011, 4, [0b1011]),
    ((1 << 63) - 1, 63, [(1 << 63) - 1]),
    (1 << 63, 64, [-(1 << 63)]),                       # int64 on the wire: the top bit is the sign
    ((1 << 64) - 1, 64, [-1]),
    ((1 << 64) | 1, 65, [1, 1]),
    ((1 << 100) - 1, 100, [-1, (1 << 36) - 1]),
])
def test_ack_set_words_round_trip(value, batch_size, words):
    """Bitsets travel as signed 64-bit words, least significant word first."""
    assert int_to_ack_set_words(value, batch_size) == words
    assert ack_set_words_to_int(words) == value
    assert all(-(1 << 63) <= word < (1 << 63) for word in words)


# --- backlog ------------------------------------------------------------------------------------------------

def test_backlog_counts_unacked_entries_across_ledgers():
    """Ledgers of 4, 0 and 3 entries: 7 entries; acks subtract, the mark subtracts."""
    ledger = ledger_with(4, 0, 3)
    cursor = cursor_on(ledger)
    assert cursor.backlog_entries(ledger.entries_between) == 7
    cursor.ack(P(12, 1))
    cursor.ack(P(10, 3))
    assert cursor.backlog_entries(ledger.entries_between) == 5
    cursor.ack_cumulative(P(10, 2))                # absorbs (10, 3) too
    assert cursor.mark_delete_position == P(10, 3)
    assert cursor.backlog_entries(ledger.entries_between) == 2
    cursor.ack(P(12, 0))
    cursor.ack(P(12, 2))
    assert cursor.backlog_entries(ledger.entries_between) == 0
    assert cursor.mark_delete_position == P(12, 2)


def test_backlog_of_an_empty_topic_and_of_a_caught_up_cursor_is_zero():
    empty = ledger_with(0)
    assert cursor_on(empty).backlog_entries(empty.entries_between) == 0
    ledger = ledger_with(3)
    cursor = cursor_on(ledger, P(10, 2))
    assert cursor.backlog_entries(ledger.entries_between) == 0
    ledger.append()
    assert cursor.backlog_entries(ledger.entries_between) == 1


# --- many holes --------------------------------------------------------------------------------------------

def test_one_hundred_thousand_holes_filled_in_order_move_the_mark_to_the_end():
    """Ack every odd entry of 200,000 (100,000 holes): the mark stays, the backlog is
    exact; filling the holes in order moves the mark to the end."""
    ledger = ledger_with(200_000)
    cursor = cursor_on(ledger)
    for entry_id in range(1, 200_000, 2):
        cursor.ack(P(10, entry_id))
    assert cursor.mark_delete_position == EARLIEST
    assert cursor.individually_acked_count == 100_000
    assert cursor.backlog_entries(ledger.entries_between) == 100_000
    for entry_id in range(0, 200_000, 2):
        cursor.ack(P(10, entry_id))
    assert cursor.mark_delete_position == P(10, 199_999)
    assert cursor.individually_acked_count == 0
    assert cursor.backlog_entries(ledger.entries_between) == 0


# --- persistence -------------------------------------------------------------------------------------------

class RecordingStore:
    """A CursorStore (the persistence edge) that records what each save was given. Like
    the real store it captures the state before its first await."""

    def __init__(self) -> None:
        self.saves: list[dict] = []
        self.failures_left = 0
        self.closed = False

    async def load(self) -> CursorState | None:
        return None

    async def save(self, state: CursorState, delta: AckSet | None) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise PersistenceError("bookies unavailable")
        self.saves.append({
            "mark_delete": state.mark_delete,
            "acked": _pairs(state.acked),
            "delta": None if delta is None else _pairs(delta),
            "batches": dict(state.batches),
            "after_close": self.closed,
        })
        await asyncio.sleep(0)

    async def close(self) -> None:
        self.closed = True

    async def delete(self) -> None:
        pass


def _pairs(ack_set: AckSet) -> set[tuple[int, int]]:
    return {(l, e) for l in ack_set.ledgers() for first, last in ack_set.ranges(l) for e in range(first, last + 1)}


def durable_cursor(ledger: FakeManagedLedger, store: RecordingStore, mark_delete: Position = EARLIEST,
                   flush_interval_s: float = 60.0) -> ManagedCursor:
    return ManagedCursor("sub", ledger, CursorState(mark_delete), store, flush_interval_s=flush_interval_s)


def test_flush_sends_only_what_changed_since_the_last_save():
    """First save_now is a snapshot; then each flush carries the new acks as its delta,
    and a flush with nothing new writes nothing."""
    async def scenario() -> None:
        ledger = ledger_with(10)
        store = RecordingStore()
        cursor = durable_cursor(ledger, store)
        await cursor.save_now()
        cursor.ack(P(10, 3))
        cursor.ack(P(10, 5))
        await cursor.flush()
        cursor.ack(P(10, 7))
        await cursor.flush()
        await cursor.flush()
        await cursor.close()
        assert [s["delta"] for s in store.saves] == [None, {(10, 3), (10, 5)}, {(10, 7)}]
        assert store.saves[-1]["acked"] == {(10, 3), (10, 5), (10, 7)}
        assert store.closed

    asyncio.run(scenario())


def test_delta_forgets_what_the_mark_delete_position_covers():
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store)
        cursor.ack(P(10, 1))
        cursor.ack(P(10, 4))
        cursor.ack(P(10, 0))
        await cursor.flush()
        assert store.saves[0]["mark_delete"] == P(10, 1)
        assert store.saves[0]["delta"] == {(10, 4)}
        await cursor.close()

    asyncio.run(scenario())


def test_save_after_a_reset_is_a_snapshot():
    """A reset takes acknowledgements back, which a delta cannot express."""
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store)
        cursor.ack(P(10, 4))
        await cursor.flush()
        cursor.reset(P(10, 2))
        cursor.ack(P(10, 6))
        await cursor.flush()
        cursor.ack(P(10, 8))
        await cursor.flush()
        await cursor.close()
        assert [s["delta"] for s in store.saves] == [{(10, 4)}, None, {(10, 8)}]
        assert store.saves[1]["mark_delete"] == P(10, 1)
        assert store.saves[1]["acked"] == {(10, 6)}

    asyncio.run(scenario())


def test_failed_save_keeps_its_delta_for_the_next_one():
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store)
        cursor.ack(P(10, 3))
        store.failures_left = 1
        await cursor.flush()
        assert cursor.flush_errors == 1
        assert store.saves == []
        cursor.ack(P(10, 6))
        await cursor.flush()
        assert store.saves[0]["delta"] == {(10, 3), (10, 6)}
        await cursor.close()

    asyncio.run(scenario())


def test_changes_are_flushed_on_the_interval():
    """With a short interval the store sees the ack without an explicit flush."""
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store, flush_interval_s=0.001)
        cursor.ack(P(10, 2))
        for _ in range(500):                         # bounded: at most ~0.5 s
            if store.saves:
                break
            await asyncio.sleep(0.001)
        assert store.saves and store.saves[0]["delta"] == {(10, 2)}
        await cursor.close()

    asyncio.run(scenario())


def test_close_flushes_a_partial_cumulative_batch_ack():
    """A clean close loses no acknowledgement, also when the only change was part of the
    first unacknowledged batch acknowledged cumulatively."""
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store, P(10, 3))
        cursor.ack_cumulative(P(10, 4), [0b1100])
        await cursor.close()
        assert store.saves and store.saves[-1]["batches"] == {P(10, 4): (64, 0b1100)}

    asyncio.run(scenario())


def test_nothing_is_saved_after_close_even_when_the_last_flush_failed():
    """A cursor whose final flush fails must not keep saving to its closed store from a
    leftover flush task (the topic may be owned by another broker by then)."""
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(10), store, flush_interval_s=0.001)
        cursor.ack(P(10, 2))
        await asyncio.sleep(0)                       # the interval flush task is now waiting
        store.failures_left = 1
        await cursor.close()
        assert cursor.flush_errors == 1
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert [s for s in store.saves if s["after_close"]] == []

    asyncio.run(scenario())


def test_cursor_without_a_store_needs_no_event_loop():
    """Non-durable cursors (and durable=False) never schedule flushes."""
    cursor = cursor_on(ledger_with(5))
    assert not cursor.durable
    assert cursor.ack(P(10, 0))
    assert cursor.ack_cumulative(P(10, 3))
    cursor.reset(P(10, 1))

    store = RecordingStore()
    ephemeral = ManagedCursor("sub", ledger_with(5), CursorState(EARLIEST), store, durable=False)
    assert ephemeral.ack(P(10, 0))
    asyncio.run(ephemeral.flush())
    assert store.saves == []


def test_each_change_and_only_a_change_is_persisted():
    """A flush after each call saves exactly when the call changed something, with the
    mark-delete position as it stands after the change."""
    async def scenario() -> None:
        store = RecordingStore()
        cursor = durable_cursor(ledger_with(5), store)
        for step in (lambda: cursor.ack(P(10, 1)),
                     lambda: cursor.ack(P(10, 1)),             # no change
                     lambda: cursor.ack(P(10, 0)),
                     lambda: cursor.ack_cumulative(P(10, 0))):  # no change
            step()
            await cursor.flush()
        assert [s["mark_delete"] for s in store.saves] == [EARLIEST, P(10, 1)]
        await cursor.close()

    asyncio.run(scenario())


# --- saves in flight: close, cancellation, delete ---------------------------------------------------

class BlockingStore(RecordingStore):
    """A RecordingStore whose saves wait for ``release`` once ``block`` is set, recording
    when each starts and whether it finished, was cancelled or failed."""

    def __init__(self) -> None:
        super().__init__()
        self.block = False
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.events: list[str] = []

    async def save(self, state: CursorState, delta: AckSet | None) -> None:
        self.events.append("save started")
        if self.block:
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.events.append("save cancelled")
                raise
        await super().save(state, delta)
        self.events.append("save done")

    async def delete(self) -> None:
        self.events.append("delete")


def _saved(store: RecordingStore) -> set[tuple[int, int]]:
    """Every acknowledgement some finished save carried (a delta, or a snapshot's set)."""
    found: set[tuple[int, int]] = set()
    for save in store.saves:
        found |= save["acked"] if save["delta"] is None else save["delta"]
    return found


def test_close_during_an_interval_save_waits_for_it_and_loses_no_ack():
    """The interval flush is saving (blocked in the store) when close() comes: close
    must let that save finish rather than cancel it, then save what came after. The bug
    was a cancelled save whose delta was dropped: (10, 2) never reached the store."""
    async def scenario() -> None:
        store = BlockingStore()
        store.block = True
        cursor = durable_cursor(ledger_with(10), store, flush_interval_s=0.001)
        cursor.ack(P(10, 2))
        await asyncio.wait_for(store.started.wait(), 1.0)
        cursor.ack(P(10, 5))                              # arrives while the save is in flight
        closing = asyncio.create_task(cursor.close())
        await asyncio.sleep(0.01)
        assert not closing.done()                         # waiting for the save, not cancelling it
        store.release.set()
        await asyncio.wait_for(closing, 1.0)
        assert "save cancelled" not in store.events
        assert _saved(store) == {(10, 2), (10, 5)}
        assert store.closed

    asyncio.run(scenario())


def test_a_cancelled_flush_gives_its_changes_to_the_next_one():
    """A flush cancelled while its save is in flight keeps its delta: the next flush
    carries it (the bug restored it only on MagnetarError)."""
    async def scenario() -> None:
        store = BlockingStore()
        store.block = True
        cursor = durable_cursor(ledger_with(10), store)
        cursor.ack(P(10, 3))
        flushing = asyncio.create_task(cursor.flush())
        await asyncio.wait_for(store.started.wait(), 1.0)
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        assert store.saves == []
        store.block = False
        await cursor.flush()
        assert [s["delta"] for s in store.saves] == [{(10, 3)}]
        await cursor.close()

    asyncio.run(scenario())


def test_a_cancelled_snapshot_save_is_retried_as_a_snapshot():
    """After a reset the next save must be a snapshot; a cancelled one keeps that need."""
    async def scenario() -> None:
        store = BlockingStore()
        cursor = durable_cursor(ledger_with(10), store)
        cursor.reset(P(10, 4))
        store.block = True
        flushing = asyncio.create_task(cursor.flush())
        await asyncio.wait_for(store.started.wait(), 1.0)
        flushing.cancel()
        await asyncio.gather(flushing, return_exceptions=True)
        store.block = False
        cursor.ack(P(10, 6))
        await cursor.flush()
        assert [s["delta"] for s in store.saves] == [None]
        assert store.saves[0]["mark_delete"] == P(10, 3) and store.saves[0]["acked"] == {(10, 6)}
        await cursor.close()

    asyncio.run(scenario())


def test_close_cancels_an_interval_flush_that_is_still_sleeping():
    """With a long interval, close() does not wait it out: it cancels the sleeping flush
    and saves at once, exactly once."""
    async def scenario() -> None:
        store = BlockingStore()
        cursor = durable_cursor(ledger_with(10), store, flush_interval_s=60.0)
        cursor.ack(P(10, 1))
        await asyncio.sleep(0)
        await asyncio.wait_for(cursor.close(), 1.0)
        assert [s["delta"] for s in store.saves] == [{(10, 1)}]

    asyncio.run(scenario())


def test_delete_waits_for_a_save_in_flight_before_deleting():
    """A save in flight when the subscription is deleted finishes first, so its write
    cannot bring the deleted pointer back; nothing is saved after the delete."""
    async def scenario() -> None:
        store = BlockingStore()
        store.block = True
        cursor = durable_cursor(ledger_with(10), store, flush_interval_s=0.001)
        cursor.ack(P(10, 2))
        await asyncio.wait_for(store.started.wait(), 1.0)
        deleting = asyncio.create_task(cursor.delete())
        await asyncio.sleep(0.01)
        assert "delete" not in store.events
        store.release.set()
        await asyncio.wait_for(deleting, 1.0)
        cursor.ack(P(10, 3))
        await asyncio.sleep(0.01)
        await cursor.flush()
        assert store.events == ["save started", "save done", "delete"]

    asyncio.run(scenario())


# --- another broker took the cursor over --------------------------------------------------------------

class FencedStore(RecordingStore):
    """Saves succeed until ``fenced`` is set; then every save raises TopicFenced."""

    def __init__(self) -> None:
        super().__init__()
        self.fenced = False
        self.attempts = 0

    async def save(self, state: CursorState, delta: AckSet | None) -> None:
        self.attempts += 1
        if self.fenced:
            raise TopicFenced("cursor taken over")
        await super().save(state, delta)


def test_a_fenced_cursor_stops_saving_and_tells_its_owner_once():
    """TopicFenced from the store is not retried: no flush is scheduled again, close()
    saves nothing, and on_fenced hears of it exactly once."""
    async def scenario() -> None:
        store = FencedStore()
        told: list[Exception] = []
        cursor = ManagedCursor("sub", ledger_with(10), CursorState(EARLIEST), store, flush_interval_s=0.001,
                               on_fenced=told.append)
        cursor.ack(P(10, 1))
        await cursor.flush()
        store.fenced = True
        cursor.ack(P(10, 2))
        await cursor.flush()
        assert isinstance(cursor.fenced_error, TopicFenced)
        attempts = store.attempts
        cursor.ack(P(10, 3))
        for _ in range(10):
            await asyncio.sleep(0.002)                # several intervals: no retry
        await cursor.close()
        assert store.attempts == attempts
        assert len(told) == 1 and told[0] is cursor.fenced_error
        assert cursor.flush_errors == 0               # not counted as a retriable failure
        assert _saved(store) == {(10, 1)}

    asyncio.run(scenario())


def test_save_now_on_a_fenced_cursor_raises():
    """A new subscription whose first save finds another owner fails its creation."""
    async def scenario() -> None:
        store = FencedStore()
        store.fenced = True
        cursor = durable_cursor(ledger_with(10), store)
        with pytest.raises(TopicFenced):
            await cursor.save_now()
        await cursor.close()

    asyncio.run(scenario())


# --- ranges a read_compacted subscription passes ------------------------------------------------

def test_a_range_is_acknowledged_across_ledgers_and_moves_the_mark():
    """[(10, 1), (12, 1)) over ledgers 10 (3 entries), 11 (deleted), 12: (10, 1), (10, 2)
    and (12, 0) acknowledged; with (10, 0) acked too the mark reaches (12, 0)."""
    ledger = ledger_with(3, 2, 3)
    ledger.delete_ledger(11)
    cursor = cursor_on(ledger)
    assert cursor.ack_range(P(10, 1), P(12, 1)) is True
    assert acked_entries(cursor, ledger) == [P(10, 1), P(10, 2), P(12, 0)]
    assert cursor.mark_delete_position == EARLIEST
    cursor.ack(P(10, 0))
    assert cursor.mark_delete_position == P(12, 0)
    assert cursor.ack_range(P(10, 0), P(12, 1)) is False          # nothing new


def test_a_range_stops_at_the_last_confirmed_entry_and_drops_partial_batches():
    ledger = ledger_with(4)
    cursor = cursor_on(ledger)
    cursor.ack(P(10, 2), [0b10], 2)                                  # half a batch acked
    assert cursor.unacked_batch_bits(P(10, 2)) is not None
    assert cursor.ack_range(EARLIEST, P(99, 0)) is True
    assert cursor.mark_delete_position == P(10, 3)
    assert cursor.unacked_batch_bits(P(10, 2)) is None
    ledger.append_many(2)
    assert not cursor.is_acked(P(10, 4))                             # written after: not in it
