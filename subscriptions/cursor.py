"""A subscription's cursor: where it has read to and what it has acknowledged.

State: the mark-delete position (every entry at or before it is acknowledged), the
individually acknowledged entries past it (``AckSet``), and the acknowledged message
indexes of partly acknowledged batches. The read position (next entry to dispatch) is
not persisted: a new owner starts reading from just after the mark-delete position and
skips what was acknowledged individually, so a restarted consumer resumes exactly after
its acknowledgements.

Persistence is through a ``CursorStore`` (see cursor_store.py). Changes are flushed on
an interval (``flush_interval_s``) and on close, so acknowledgements made within one
interval before a broker crash may be redelivered (documented and bounded); a clean
unload or shutdown loses none. To keep that promise:
- a flush hands the store what changed and takes it back if the save does not finish,
  whatever stopped it (a store error or a cancellation): the next save carries it.
  Saving something twice is harmless (replay merges acknowledgements by OR);
- close() cancels the interval flush only while it sleeps. A save in flight is waited
  for, never cancelled: its outcome would be unknown.
When the store says another broker owns the cursor now (``TopicFenced``: a lost
compare-and-set of the etcd pointer, or the cursor ledger fenced by the new owner's
recovery), the cursor stops saving for good and tells ``on_fenced``: the new owner's
state must not be overwritten, and this broker's copy of the topic should close.

Batch acknowledgements follow Pulsar's convention: an ``ack_set`` is the bitset of the
batch's messages still *unacknowledged*; acknowledging with one ANDs it in, and the
entry counts as acknowledged once no bit is left.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable, Protocol

from common.position import Position
from common.errors import MagnetarError, TopicFenced
from runtime.tasks import cancel_and_wait
from subscriptions.ack_set import AckSet
from subscriptions.ports import PositionSource

log = logging.getLogger(__name__)


@dataclass
class CursorState:
    mark_delete: Position
    acked: AckSet = field(default_factory=AckSet)
    # position -> (batch size, bitset of unacknowledged indexes)
    batches: dict[Position, tuple[int, int]] = field(default_factory=dict)
    properties: dict[str, int] = field(default_factory=dict)


class CursorStore(Protocol):
    async def load(self) -> CursorState | None: ...

    async def save(self, state: CursorState, delta: AckSet | None) -> None:
        """``delta``: entries acknowledged since the last save; None: write it all."""

    async def close(self) -> None: ...

    async def delete(self) -> None: ...


def ack_set_words_to_int(words: list[int]) -> int:
    value = 0
    for index, word in enumerate(words):
        value |= (word & 0xFFFFFFFFFFFFFFFF) << (64 * index)
    return value


def int_to_ack_set_words(value: int, batch_size: int) -> list[int]:
    words = []
    for index in range((batch_size + 63) // 64):
        word = (value >> (64 * index)) & 0xFFFFFFFFFFFFFFFF
        words.append(word - (1 << 64) if word >= 1 << 63 else word)  # int64 on the wire
    return words


class ManagedCursor:
    def __init__(self, name: str, ledger: PositionSource, state: CursorState, store: CursorStore | None,
                 *, flush_interval_s: float = 1.0, durable: bool = True,
                 on_fenced: Callable[[MagnetarError], None] | None = None) -> None:
        self.name = name
        self._ledger = ledger
        self._state = state
        self._store = store
        self.durable = durable and store is not None
        self._flush_interval_s = flush_interval_s
        self._dirty = False
        # Entries acknowledged since the last save, and whether the next save must be a
        # whole snapshot (after a reset, acknowledgements were taken back).
        self._delta = AckSet()
        self._snapshot_needed = False
        self._flush_task: asyncio.Task[None] | None = None
        # True while the flush task waits out its interval (it may be cancelled then);
        # False once it is saving (it is waited for then, never cancelled mid-save).
        self._flush_task_sleeping = False
        # Set by close(): no flush may be scheduled after it (the store is closed, and
        # the topic may be owned by another broker by then).
        self._closed = False
        self._flush_lock = asyncio.Lock()
        self.read_position = ledger.next_position(state.mark_delete)
        self.flush_errors = 0
        # Set when the store reports that another broker took this cursor over (TopicFenced):
        # nothing is saved any more, and ``on_fenced`` (if given) is told once.
        self.fenced_error: MagnetarError | None = None
        self._on_fenced = on_fenced

    # --- state -------------------------------------------------------------------------

    @property
    def mark_delete_position(self) -> Position:
        return self._state.mark_delete

    @property
    def individually_acked_count(self) -> int:
        return len(self._state.acked)

    def is_acked(self, position: Position) -> bool:
        if position <= self._state.mark_delete:
            return True
        return self._state.acked.contains(position.ledger_id, position.entry_id)

    def unacked_batch_bits(self, position: Position) -> tuple[int, int] | None:
        """For a partly acknowledged batch: (batch size, bits still unacknowledged)."""
        return self._state.batches.get(position)

    # --- acknowledgements ----------------------------------------------------------------

    def ack(self, position: Position, ack_set: list[int] | None = None, batch_size: int = 0) -> bool:
        """Individual acknowledgement (of a whole entry, or of batch indexes when
        ``ack_set`` is given). Returns True if something changed."""
        if position <= self._state.mark_delete or position > self._ledger.last_confirmed:
            return False
        if self._ledger.normalize(position) != position:
            return False  # not an entry of this topic (past its ledger's end, or deleted)
        if self._state.acked.contains(position.ledger_id, position.entry_id):
            return False  # acknowledged whole already (a late batch-index ack changes nothing)
        if ack_set:
            remaining = ack_set_words_to_int(ack_set)
            size = max(batch_size, len(ack_set) * 64)
            previous = self._state.batches.get(position)
            if previous is not None:
                remaining &= previous[1]
                size = previous[0]
            if remaining:
                if previous is None or previous[1] != remaining:
                    self._state.batches[position] = (size, remaining)
                    self._mark_dirty()
                    return True
                return False
        self._state.batches.pop(position, None)
        self._state.acked.add(position.ledger_id, position.entry_id)
        self._delta.add(position.ledger_id, position.entry_id)
        self._advance_mark_delete()
        self._mark_dirty()
        return True

    def ack_range(self, start: Position, end: Position) -> bool:
        """Every stored entry at or after ``start`` and before ``end`` is acknowledged
        (a read_compacted subscription's entries that compaction dropped: it is never
        sent them). Returns True if something changed."""
        ledger = self._ledger
        last_confirmed = ledger.last_confirmed
        position = max(ledger.normalize(start), ledger.next_position(self._state.mark_delete))
        changed = False
        while position < end and position <= last_confirmed:
            ledger_id = position.ledger_id
            last = ledger.last_entry_of(ledger_id)
            if end.ledger_id == ledger_id:
                last = min(last, end.entry_id - 1)
            if last < position.entry_id:
                break     # nothing confirmed past here yet
            if self._state.acked.add_range(ledger_id, position.entry_id, last):
                self._delta.add_range(ledger_id, position.entry_id, last)
                changed = True
            for batch_position in [p for p in self._state.batches
                                   if p.ledger_id == ledger_id and position.entry_id <= p.entry_id <= last]:
                del self._state.batches[batch_position]
            position = ledger.next_position(Position(ledger_id, last))
        if changed:
            self._advance_mark_delete()
            self._mark_dirty()
        return changed

    def ack_cumulative(self, position: Position, ack_set: list[int] | None = None) -> bool:
        """Everything up to ``position`` is acknowledged (with ``ack_set``: everything
        before it, and the batch at it up to the bits left set)."""
        position = min(position, self._ledger.last_confirmed)
        if position <= self._state.mark_delete:
            return False  # all acknowledged already: keep no batch bits for it
        batch_changed = False
        if ack_set:
            remaining = ack_set_words_to_int(ack_set)
            if remaining:
                batch = (len(ack_set) * 64, remaining)
                batch_changed = self._state.batches.get(position) != batch
                self._state.batches[position] = batch
                target = self._previous(position)
            else:
                target = position
        else:
            target = position
        if target <= self._state.mark_delete:
            # Only part of the first unacknowledged batch: no mark to move, but its bits
            # changed and must be persisted like any acknowledgement.
            if batch_changed:
                self._mark_dirty()
            return batch_changed
        self._set_mark_delete(target)
        self._advance_mark_delete()
        self._mark_dirty()
        return True

    def _previous(self, position: Position) -> Position:
        if position.entry_id > 0:
            return Position(position.ledger_id, position.entry_id - 1)
        return Position(position.ledger_id, -1)

    def _set_mark_delete(self, position: Position) -> None:
        assert position >= self._state.mark_delete, (position, self._state.mark_delete)
        self._state.mark_delete = position
        self._state.acked.discard_up_to(position.ledger_id, position.entry_id)
        self._delta.discard_up_to(position.ledger_id, position.entry_id)
        for batch_position in [p for p in self._state.batches if p <= position]:
            del self._state.batches[batch_position]
        if self.read_position <= position:
            self.read_position = self._ledger.next_position(position)

    def _advance_mark_delete(self) -> None:
        """Moves the mark-delete position over contiguously acknowledged entries."""
        acked = self._state.acked
        mark = self._state.mark_delete
        last = self._ledger.last_confirmed
        while True:
            following = self._ledger.next_position(mark)
            if following > last or not acked.contains(following.ledger_id, following.entry_id):
                break
            end = acked.first_unset(following.ledger_id, following.entry_id) - 1
            assert end >= following.entry_id, (following, end)   # ``following`` is acknowledged
            if following.ledger_id == last.ledger_id:
                end = min(end, last.entry_id)
            mark = Position(following.ledger_id, end)
            # The mark moves over acknowledged entries only: it never passes a hole.
            assert following <= mark <= last, (following, mark, last)
            # If ``end`` is past the ledger's last entry, next_position moves to the next
            # ledger on the next round; an entry beyond a ledger's end is never marked.
        if mark != self._state.mark_delete:
            self._set_mark_delete(mark)

    # --- moving the read position -----------------------------------------------------------

    def rewind(self) -> None:
        """Reads again from the first entry after the mark-delete position."""
        self.read_position = self._ledger.next_position(self._state.mark_delete)

    def seek_read(self, position: Position) -> None:
        self.read_position = self._ledger.normalize(position)

    def reset(self, position: Position) -> None:
        """Pulsar's reset-cursor: ``position`` is the next to deliver; everything
        before it counts as acknowledged, nothing after it does."""
        stored = self._ledger.normalize(position)
        self._state.acked = AckSet()
        self._state.batches.clear()
        # Before the oldest stored entry, just before ``position`` itself rather than the
        # entry it normalizes to (the same point of the topic): a read_compacted
        # subscription sought into ledgers retention deleted still gets the compacted
        # ledger's copies of their entries (Dispatcher._compacted_from reads from right
        # after the mark-delete position).
        self._state.mark_delete = self._previous(position if position < self._ledger.first_position else stored)
        self.read_position = stored
        self._delta = AckSet()
        self._snapshot_needed = True
        self._mark_dirty()

    def skip_next_read(self, next_position: Position) -> None:
        self.read_position = next_position

    # --- backlog --------------------------------------------------------------------------------

    def backlog_entries(self, entries_between: Callable[[Position, Position], int]) -> int:
        """Unacknowledged entries: those after mark-delete minus those acked singly."""
        last = self._ledger.last_confirmed
        if last <= self._state.mark_delete:
            return 0
        total = entries_between(self._state.mark_delete, last)
        return max(0, total - len(self._state.acked))

    # --- persistence ------------------------------------------------------------------------------

    def _mark_dirty(self) -> None:
        self._dirty = True
        if self._flush_task is None:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self.durable and not self._closed and self.fenced_error is None:
            self._flush_task_sleeping = True
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self._flush_interval_s)
            self._flush_task_sleeping = False
            await self.flush()
        finally:
            self._flush_task = None
            if self._dirty:
                self._schedule_flush()

    async def flush(self) -> None:
        if not self.durable or self._store is None or self.fenced_error is not None:
            return
        async with self._flush_lock:
            if not self._dirty or self.fenced_error is not None:
                return
            self._dirty = False
            delta, self._delta = self._delta, AckSet()
            snapshot_needed, self._snapshot_needed = self._snapshot_needed, False
            try:
                # The store encodes the state before its first await, so acknowledgements
                # arriving meanwhile go to the next save (they are in the new delta).
                await self._store.save(self._state, None if snapshot_needed else delta)
            except TopicFenced as error:
                self._on_store_fenced(error)
            except BaseException as error:
                # Whatever stopped the save (a store error, or a cancellation while it
                # was in flight), its changes go to the next one. The save may have
                # landed anyway; saving the delta again is harmless, because replay
                # merges acknowledgements by OR and the mark-delete only moves forward.
                self._dirty = True
                self._delta.update(delta)
                self._snapshot_needed = self._snapshot_needed or snapshot_needed
                if not isinstance(error, MagnetarError):
                    raise
                self.flush_errors += 1
                log.warning("cursor flush failed: cursor=%s error=%s", self.name, error)

    def _on_store_fenced(self, error: TopicFenced) -> None:
        """Another broker owns the cursor now: stop saving for good (its state is the
        new owner's to write), and tell the topic once."""
        self.fenced_error = error
        log.warning("cursor taken over by another broker, no longer saved: cursor=%s error=%s", self.name, error)
        if self._on_fenced is not None:
            self._on_fenced(error)

    async def _stop_flush_task(self) -> None:
        """Ends the interval flush task: cancelled while it sleeps, waited for while it
        saves. A save cancelled half way leaves its outcome unknown (a cursor ledger
        entry or etcd write may land later), so it is allowed to finish."""
        task = self._flush_task
        if task is None:
            return
        if self._flush_task_sleeping:
            await cancel_and_wait(task)
        else:
            await asyncio.wait([task])   # not cancelled with the caller: the save finishes
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()   # flush() handles store errors itself: this is a bug
        self._flush_task = None

    async def close(self) -> None:
        self._closed = True
        await self._stop_flush_task()
        await self.flush()
        if self._store is not None:
            await self._store.close()

    async def save_now(self) -> None:
        """Persists the current state (a new subscription's starting position); raises
        TopicFenced if another broker owns the cursor."""
        self._dirty = True
        self._snapshot_needed = True
        await self.flush()
        if self.fenced_error is not None:
            raise self.fenced_error

    async def delete(self) -> None:
        self._closed = True
        await self._stop_flush_task()
        self.durable = False
        if self._store is not None:
            # After any save in flight: deleting first would let its write bring the
            # pointer back.
            async with self._flush_lock:
                await self._store.delete()
