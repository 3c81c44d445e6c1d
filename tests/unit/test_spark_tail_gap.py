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
