"""The Spark tail reader never returns a range short: when the broker delivers an entry
past the range's end before the end itself (entries skipped: their ledger moved to the
archive while the read ran), it raises TailGap after the rows before the gap, naming
the last entry it saw. The reader's loop is driven with entries handed to its listener
as the broker's MESSAGE frames would be (the socket side is tests/integration's)."""

from __future__ import annotations

import asyncio

import pytest

from client.messages import MessageId, ReceivedEntry, ReceivedMessage
from common.errors import TailGap
from spark.tail import TailReader, _TailListener


class _Consumer:
    permits_outstanding = 1000
    start_message_id = None

    def flow(self, permits: int) -> None:
        pass


def _entry(ledger_id: int, entry_id: int) -> ReceivedEntry:
    message = ReceivedMessage(MessageId(ledger_id, entry_id), b"x", None, None, {}, 0, 1_000, "p", entry_id)
    return ReceivedEntry(ledger_id, entry_id, -1, 0, 0, (message,))


def _drain(reader: TailReader, positions: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Rows' positions the reader yields for entries delivered in this order."""
    listener = _TailListener()
    for position in positions:
        listener.on_entry(_entry(*position))
    seen: list[tuple[int, int]] = []

    async def run() -> None:
        while True:
            rows, done = await reader._next_rows(_Consumer(), listener)
            seen.extend((row[2], row[3]) for row in rows)
            if reader._pending_gap is not None:
                raise reader._pending_gap
            if done:
                return

    asyncio.run(run())
    return seen


def test_a_whole_range_is_read_and_stops_at_its_end():
    reader = TailReader("pulsar://unused:6650", "t", (1, 9), (1, 12), 1_000)
    assert _drain(reader, [(1, 9), (1, 10), (1, 11), (1, 12), (1, 13)]) == [(1, 10), (1, 11), (1, 12)]


def test_an_entry_past_the_end_before_the_end_is_a_gap_never_a_short_range():
    # Nothing of the range delivered: the broker went on at the next ledger.
    with pytest.raises(TailGap) as raised:
        _drain(TailReader("pulsar://unused:6650", "t", (1, 9), (1, 19), 1_000), [(2, 0), (2, 1)])
    assert raised.value.last_seen == (1, 9) and raised.value.delivered == (2, 0) and raised.value.code == 6006
    # Part of it delivered: those rows come first, then the gap names the last one seen.
    reader = TailReader("pulsar://unused:6650", "t", (1, 9), (1, 19), 1_000)
    with pytest.raises(TailGap) as raised:
        _drain(reader, [(1, 10), (1, 11), (2, 0)])
    assert raised.value.last_seen == (1, 11)


# --- a move to a later ledger inside the range -------------------------------------------
# Retention removes an archived ledger from a topic no durable subscription holds; a
# reader placed in it goes on at the next ledger (tests/integration/
# test_reader_start_in_archived_ledger.py). Before ``ledgers_now``, a range reaching into
# the next ledger was then returned without the removed ledger's rest, silently.

def _ledgers_now(topic_ledgers, archived_counts):
    calls = []

    def ledgers_now():
        calls.append(1)
        return topic_ledgers, [{"topic": "t", "ledger_id": l, "entry_count": c} for l, c in archived_counts.items()]

    return ledgers_now, calls


def test_a_move_to_the_next_ledger_inside_the_range_past_unread_entries_is_a_gap():
    # Ledger 1 (40 entries) archived and removed from the topic; the read started after 1:9.
    ledgers_now, calls = _ledgers_now([(2, None)], {1: 40})
    reader = TailReader("pulsar://unused:6650", "t", (1, 9), (2, 5), 1_000, ledgers_now=ledgers_now)
    with pytest.raises(TailGap) as raised:
        _drain(reader, [(2, 0), (2, 1)])
    assert raised.value.last_seen == (1, 9) and raised.value.delivered == (2, 0)
    assert "later ledger" in str(raised.value)
    # Without the check (what the reader did before), the range came back short.
    assert _drain(TailReader("pulsar://unused:6650", "t", (1, 9), (2, 1), 1_000), [(2, 0), (2, 1)]) == \
        [(2, 0), (2, 1)]
    assert calls == [1]


def test_a_move_after_the_last_entry_of_a_ledger_reads_on_and_asks_once_per_move():
    ledgers_now, calls = _ledgers_now([(1, 3), (2, None)], {})
    reader = TailReader("pulsar://unused:6650", "t", (1, 1), (2, 1), 1_000, ledgers_now=ledgers_now)
    assert _drain(reader, [(1, 2), (2, 0), (2, 1)]) == [(1, 2), (2, 0), (2, 1)]
    assert calls == [1]
    # The ledger left the topic, but the archive shows 1:2 was its last entry.
    ledgers_now, calls = _ledgers_now([(2, None)], {1: 3})
    reader = TailReader("pulsar://unused:6650", "t", (1, 1), (2, 1), 1_000, ledgers_now=ledgers_now)
    assert _drain(reader, [(1, 2), (2, 0), (2, 1)]) == [(1, 2), (2, 0), (2, 1)]


def test_skips_entries_rules():
    from spark.tail import skips_entries

    def archived(**counts):
        return [{"topic": "t", "ledger_id": int(l[1:]), "entry_count": c} for l, c in counts.items()] + \
            [{"topic": "other", "ledger_id": 1, "entry_count": 5}]

    listed = [(1, None), (3, None)]
    assert not skips_entries("t", (1, 4), (3, 0), listed, archived())              # 1 still listed
    assert skips_entries("t", (1, 4), (3, 2), listed, archived())                  # 3 entered past 0
    assert skips_entries("t", (1, 4), (3, 0), listed, archived(l2=7))              # 2 left the topic whole
    assert not skips_entries("t", (1, 4), (3, 0), listed, archived(l2=0))          # 2 held nothing
    assert not skips_entries("t", (1, 4), (3, 0), [(3, None)], archived(l1=5))     # 1:4 was 1's last
    assert skips_entries("t", (1, 3), (3, 0), [(3, None)], archived(l1=5))         # 1:4 unread
    assert skips_entries("t", (1, 4), (3, 0), [(3, None)], [])                     # 1 gone, unknown where
    assert skips_entries("t", (1, 4), (3, 0), [(3, None)], archived())             # only another partition's record


def test_a_range_from_the_first_entry_checks_its_first_entry():
    from spark.tail import skips_entries

    # Nothing archived when planned; ledger 1 archived and trimmed before the read.
    assert skips_entries("t", None, (2, 0), [(2, None)], [{"topic": "t", "ledger_id": 1, "entry_count": 40}])
    assert not skips_entries("t", None, (2, 0), [(2, None)], [])
    assert skips_entries("t", None, (2, 3), [(2, None)], [])
    ledgers_now, calls = _ledgers_now([(1, None)], {})
    reader = TailReader("pulsar://unused:6650", "t", None, (1, 2), 1_000, ledgers_now=ledgers_now)
    assert _drain(reader, [(1, 0), (1, 1), (1, 2)]) == [(1, 0), (1, 1), (1, 2)]
    assert calls == [1]
