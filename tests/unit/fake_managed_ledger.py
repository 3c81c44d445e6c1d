"""An in-memory stand-in for managed_ledger.managed_ledger.ManagedLedger, for the subscription
unit tests (test_cursor.py, test_dispatcher_selection.py).

It provides only what a cursor (``subscriptions.ports.PositionSource``), a subscription
and its dispatchers call on their managed ledger: the last confirmed position,
``normalize`` / ``next_position`` / ``first_position`` / ``end_position``, entry
counts, ``read`` and ``wait_for_entries``. It is a double of that edge, not of the
code under test.

Positions and counts follow ManagedLedger's rules through the same functions
(common.position.normalize and entries_between): a position past the end of a closed
ledger (or in a deleted one) normalizes to entry 0 of the next ledger that exists;
positions in the current ledger are left as they are, written or not.
"""

from __future__ import annotations

import asyncio

from common.position import ManagedEntry
from common.position import Position, entries_between, normalize


class FakeManagedLedger:
    def __init__(self, first_ledger_id: int = 10) -> None:
        # ledger_id -> stored payloads (insertion order is ledger id order).
        self._ledgers: dict[int, list[bytes]] = {first_ledger_id: []}
        self._current = first_ledger_id
        self.last_confirmed = Position(-1, -1)
        self.terminated = False
        self._waiters: list[asyncio.Future[None]] = []
        self.reads = 0
        self.cached = True         # read_cached answers (False: as if nothing were cached)
        self.cached_reads = 0

    # --- writing (the test drives these) -------------------------------------------------

    def append(self, data: bytes = b"") -> Position:
        entries = self._ledgers[self._current]
        entries.append(data)
        self.last_confirmed = Position(self._current, len(entries) - 1)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        return self.last_confirmed

    def append_many(self, count: int, data: bytes = b"") -> list[Position]:
        assert 0 <= count <= 10_000_000
        return [self.append(data) for _ in range(count)]

    def roll(self, ledger_id: int | None = None) -> int:
        """Closes the current ledger and starts ``ledger_id`` (default: the next id)."""
        new_id = self._current + 1 if ledger_id is None else ledger_id
        assert new_id > self._current
        self._ledgers[new_id] = []
        self._current = new_id
        return new_id

    def delete_ledger(self, ledger_id: int) -> None:
        assert ledger_id != self._current
        del self._ledgers[ledger_id]

    # --- what the cursor and dispatchers call ---------------------------------------------

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    def last_entry_of(self, ledger_id: int) -> int:
        return len(self._ledgers.get(ledger_id, ())) - 1

    _last_entry_of = last_entry_of

    def normalize(self, position: Position) -> Position:
        return normalize(position, self._ledgers, self._last_entry_of, lambda ledger_id: ledger_id == self._current)

    def next_position(self, position: Position) -> Position:
        return self.normalize(Position(position.ledger_id, position.entry_id + 1))

    @property
    def first_position(self) -> Position:
        return self.normalize(Position(-1, 0))

    @property
    def end_position(self) -> Position:
        return self.next_position(self.last_confirmed) if self.last_confirmed.entry_id >= 0 else self.first_position

    def number_of_entries(self) -> int:
        return sum(len(entries) for entries in self._ledgers.values())

    def entries_between(self, after: Position, upto: Position) -> int:
        """Entries in (after, upto]: what broker.topic.PersistentTopic.entries_between
        answers, through the same function (common.position.entries_between)."""
        return entries_between(self._ledgers, self._last_entry_of, after, upto)

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        self.reads += 1
        return self._collect(start, count_max, bytes_max)

    def _collect(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        assert count_max > 0
        entries: list[ManagedEntry] = []
        size = 0
        position = self.normalize(start)
        while len(entries) < count_max and size < bytes_max and position <= self.last_confirmed:
            stored = self._ledgers.get(position.ledger_id)
            if stored is None or position.entry_id >= len(stored) or position.entry_id < 0:
                break
            data = stored[position.entry_id]
            entries.append(ManagedEntry(position, data))
            size += len(data)
            position = self.next_position(position)
        return entries

    def read_cached(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry] | None:
        """As ``read`` (everything here is in memory), unless ``cached`` is False: then
        None, as a managed ledger whose entries must come from the bookies."""
        if not self.cached:
            return None
        self.cached_reads += 1
        return self._collect(start, count_max, bytes_max)

    def wait_for_entries(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.terminated:
            waiter.set_result(None)
        else:
            self._waiters.append(waiter)
        return waiter
