"""The lease table of one gateway consumer: every message the broker sent it that is not
settled yet, and what state each is in. Pure: the caller passes the time (monotonic
seconds, and Unix ms for deliver-at times) and carries out what comes back (which
entries to give back to the broker).

Why entries, not messages, are given back: the broker redelivers whole entries (a batch
is one entry), so a message whose lease ended can go back only when no other message of
its entry is still leased; otherwise the others would be delivered twice while their
leases run. Messages acknowledged meanwhile are known to the broker (the ack names their
batch index), so a returned batch comes back without them. The broker, not this table,
is the authority on what is acknowledged: a message acknowledged through another gateway
instance still looks leased here, and when its lease ends here the entry is given back
and the broker skips it. This is also why a message whose lease ended is never handed
out again from here: only the broker knows whether someone acknowledged it meanwhile.

States of a message (``Slot``):

    READY      held, not handed out, no lease running (what arrived beyond what a pull
               took: a batch's remainder, or permits a pull that gave up left behind)
    DEFERRED   held until its deliver-at time; then READY
    WRITING    in an HTTP response being written; its lease starts when the write ends
               (``written``), and if the write fails it is READY again (``unwritten``)
    LEASED     handed out; the lease ends at ``deadline_s`` unless extended
    SETTLED    acknowledged through this gateway
    RETURNING  the lease ended (expired or nacked); goes back with its entry

Invariants:
- ``active`` (WRITING + LEASED + DEFERRED) never exceeds ``leases_max``: ``take`` hands
  out no more than the room left.
- An entry leaves the table when every message is SETTLED (nothing to give back), or is
  given back once none of its messages is active and at least one is RETURNING, or all
  that is not settled has been READY for ``ready_hold_s`` (nobody pulled it: it goes back
  to the subscription for other consumers instead of waiting here).
- Deadlines are kept in a heap with lazy deletion (an extension pushes a new item; the
  old one is recognised as stale when it surfaces); the heap is rebuilt when stale items
  outnumber live ones, so its size stays bounded by the leases.
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
from dataclasses import dataclass, field

from client.messages import ReceivedEntry, ReceivedMessage

Position = tuple[int, int]


class State(enum.IntEnum):
    READY = 0
    DEFERRED = 1
    WRITING = 2
    LEASED = 3
    SETTLED = 4
    RETURNING = 5


_ACTIVE = (State.WRITING, State.LEASED, State.DEFERRED)


@dataclass(eq=False, slots=True, repr=False)
class Slot:
    message: ReceivedMessage
    held: "Held"
    state: State
    attempt: int
    deadline_s: float = 0.0

    @property
    def batch_index(self) -> int:
        return self.message.message_id.batch_index


@dataclass(eq=False, repr=False)
class Held:
    entry: ReceivedEntry
    ready_since_s: float
    slots: list[Slot] = field(default_factory=list)
    by_batch_index: dict[int, Slot] = field(default_factory=dict)
    unsettled: int = 0

    @property
    def position(self) -> Position:
        return self.entry.position

    def has_active(self) -> bool:
        return any(slot.state in _ACTIVE for slot in self.slots)


def ordering_key(message: ReceivedMessage) -> bytes | str | None:
    """What orders a message: its ordering key, else its (partition) key."""
    return message.ordering_key or message.key


class LeaseTable:
    def __init__(self, leases_max: int, ready_hold_s: float, deferral_s_max: float) -> None:
        assert leases_max >= 1, leases_max
        assert ready_hold_s > 0, ready_hold_s
        self.leases_max = leases_max
        self.ready_hold_s = ready_hold_s
        self.deferral_s_max = deferral_s_max
        self._held: dict[Position, Held] = {}
        # Leases that ended without an ack (ran out, or a nack came due), ever: for stats.
        self.leases_ended = 0
        # Entries with READY messages, oldest first (by when they became ready).
        self._ready: collections.OrderedDict[Position, Held] = collections.OrderedDict()
        self._deadlines: list[tuple[float, int, Slot]] = []
        self._sequence = itertools.count()
        self._counts = [0] * len(State)
        # Ordering keys (the message's ordering key, else its key) with a message
        # leased, being written or deferred: an ordered take skips their later messages.
        self._active_keys: collections.Counter = collections.Counter()

    # --- counts ----------------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return self._counts[State.WRITING] + self._counts[State.LEASED] + self._counts[State.DEFERRED]

    @property
    def ready(self) -> int:
        return self._counts[State.READY]

    @property
    def room(self) -> int:
        return self.leases_max - self.active

    def count(self, state: State) -> int:
        return self._counts[state]

    @property
    def entries(self) -> int:
        return len(self._held)

    def __contains__(self, position: Position) -> bool:
        return position in self._held

    def _set(self, slot: Slot, state: State) -> None:
        self._counts[slot.state] -= 1
        self._counts[state] += 1
        was_active, now_active = slot.state in _ACTIVE, state in _ACTIVE
        slot.state = state
        if was_active != now_active:
            key = ordering_key(slot.message)
            if key is not None:
                self._active_keys[key] += 1 if now_active else -1
                if not self._active_keys[key]:
                    del self._active_keys[key]

    # --- arrivals and hand-outs --------------------------------------------------------------------

    def add(self, entry: ReceivedEntry, now_s: float, now_unix_ms: int) -> None:
        """An entry the broker sent. An entry already held (the broker sent it again
        after a redelivery this table did not ask for) replaces the old one."""
        if entry.position in self._held:
            self._forget(self._held[entry.position])
        held = Held(entry, now_s)
        attempt = entry.redelivery_count + 1
        for message in entry.messages:
            slot = Slot(message, held, State.READY, attempt)
            self._counts[State.READY] += 1
            held.slots.append(slot)
            held.by_batch_index[message.message_id.batch_index] = slot
            held.unsettled += 1
            if message.deliver_at_ms is not None and message.deliver_at_ms > now_unix_ms:
                wait_s = min((message.deliver_at_ms - now_unix_ms) / 1000, self.deferral_s_max)
                self._set(slot, State.DEFERRED)
                self._arm(slot, now_s + wait_s)
        self._held[entry.position] = held
        if not held.slots:
            del self._held[entry.position]   # everything in it was acknowledged already
        elif any(slot.state == State.READY for slot in held.slots):
            self._ready[entry.position] = held

    def take(self, count_max: int, ordered: bool = False) -> list[Slot]:
        """Up to ``count_max`` READY messages, oldest first, now WRITING; never more
        than the room left under ``leases_max``. ``ordered``: at most one message per
        ordering key, and none of a key with a message leased, being written or
        deferred (Pub/Sub's ordering keys; keyless messages are not held back)."""
        count_max = min(count_max, self.room)
        taken: list[Slot] = []
        blocked = set(self._active_keys) if ordered else None
        for position in list(self._ready):
            if len(taken) >= count_max:
                break
            held = self._ready[position]
            for slot in held.slots:
                if len(taken) >= count_max:
                    break
                if slot.state == State.READY:
                    if blocked is not None:
                        key = ordering_key(slot.message)
                        if key is not None:
                            if key in blocked:
                                continue
                            blocked.add(key)
                    self._set(slot, State.WRITING)
                    taken.append(slot)
            if not any(slot.state == State.READY for slot in held.slots):
                del self._ready[position]
        assert self.active <= self.leases_max, (self.active, self.leases_max)
        return taken

    def written(self, slots: list[Slot], lease_s: float, now_s: float) -> None:
        """The response holding ``slots`` was written: their leases start now."""
        for slot in slots:
            if slot.state == State.WRITING:
                self._set(slot, State.LEASED)
                self._arm(slot, now_s + lease_s)

    def unwritten(self, slots: list[Slot], now_s: float) -> None:
        """The response holding ``slots`` was not written (the client went away): they
        are READY again, as if never handed out."""
        for slot in slots:
            if slot.state == State.WRITING and self._held.get(slot.held.position) is slot.held:
                self._set(slot, State.READY)
                if slot.held.position not in self._ready:
                    slot.held.ready_since_s = now_s
                    self._ready[slot.held.position] = slot.held
                    self._ready.move_to_end(slot.held.position, last=False)

    # --- settling -------------------------------------------------------------------------------------

    def find(self, position: Position, batch_index: int) -> Slot | None:
        held = self._held.get(position)
        return None if held is None else held.by_batch_index.get(batch_index)

    def ack(self, position: Position, batch_index: int) -> bool:
        """The message was acknowledged through this gateway; True if it was held."""
        slot = self.find(position, batch_index)
        if slot is None or slot.state == State.SETTLED:
            return False
        self._set(slot, State.SETTLED)
        held = slot.held
        held.unsettled -= 1
        assert held.unsettled >= 0, held.unsettled
        if held.unsettled == 0:
            self._forget(held)
        return True

    def extend(self, position: Position, batch_index: int, attempt: int, lease_s: float, now_s: float) -> Slot | None:
        """Moves the lease's end to ``now_s + lease_s``; None (nothing changed) unless
        the message is LEASED on this ``attempt``."""
        slot = self.find(position, batch_index)
        if slot is None or slot.state != State.LEASED or slot.attempt != attempt:
            return None
        self._arm(slot, now_s + lease_s)
        return slot

    def nack(self, position: Position, batch_index: int, attempt: int, delay_s: float, now_s: float) -> bool:
        """Ends the lease ``delay_s`` from now (0: at once, at the next ``expire``);
        False unless the message is LEASED on this ``attempt``."""
        slot = self.find(position, batch_index)
        if slot is None or slot.state != State.LEASED or slot.attempt != attempt:
            return False
        self._arm(slot, now_s + max(delay_s, 0.0))
        return True

    # --- time passing -----------------------------------------------------------------------------------

    def expire(self, now_s: float) -> list[Position]:
        """Ends the leases and deferrals due; returns the entries to give back to the
        broker (they are forgotten here)."""
        delivered, unused = self.expire_split(now_s)
        return delivered + unused

    def expire_split(self, now_s: float) -> tuple[list[Position], list[Position]]:
        """``expire``, the entries in two lists: those with a message whose lease ended
        (a delivery that failed: the broker counts it), and those none of whose messages
        reached anyone (read ahead or left behind, held past ``ready_hold_s``: given
        back without counting a delivery)."""
        touched: dict[Position, Held] = {}
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_s:
            deadline_s, _, slot = heapq.heappop(deadlines)
            if slot.deadline_s != deadline_s or self._held.get(slot.held.position) is not slot.held:
                continue   # stale: extended since, or its entry is gone
            if slot.state == State.LEASED:
                self._set(slot, State.RETURNING)
                self.leases_ended += 1
                touched[slot.held.position] = slot.held
            elif slot.state == State.DEFERRED:
                self._set(slot, State.READY)
                if slot.held.position not in self._ready:
                    slot.held.ready_since_s = now_s
                    self._ready[slot.held.position] = slot.held
        returned: list[Position] = []
        unused: list[Position] = []
        for position, held in touched.items():
            if not held.has_active():
                returned.append(position)
                self._forget(held)
        hold_limit_s = now_s - self.ready_hold_s
        # Scanned whole (entries made READY again by ``unwritten`` go to the front, out
        # of time order); it holds at most what recent pulls left unused.
        for position, held in list(self._ready.items()):
            if held.ready_since_s > hold_limit_s:
                continue
            if not held.has_active():
                delivered = any(slot.state == State.RETURNING for slot in held.slots)
                (returned if delivered else unused).append(position)
                self._forget(held)
        self._compact()
        return returned, unused

    def next_deadline_s(self) -> float | None:
        """The earliest moment ``expire`` may have something to do."""
        candidates = []
        if self._deadlines:
            candidates.append(self._deadlines[0][0])
        if self._ready:
            candidates.append(min(held.ready_since_s for held in self._ready.values()) + self.ready_hold_s)
        return min(candidates) if candidates else None

    def clear(self) -> int:
        """The consumer lost its broker connection: the broker gives everything it held
        to others, so nothing here is held any more. Returns how many messages were."""
        held_count = 0
        for held in self._held.values():
            for slot in held.slots:
                slot.state = State.RETURNING   # whoever still looks at it sees it gone
                held_count += 1
        self._held.clear()
        self._ready.clear()
        self._deadlines.clear()
        self._counts = [0] * len(State)
        self._active_keys.clear()
        return held_count

    # --- internals ------------------------------------------------------------------------------------

    def _arm(self, slot: Slot, deadline_s: float) -> None:
        slot.deadline_s = deadline_s
        heapq.heappush(self._deadlines, (deadline_s, next(self._sequence), slot))

    def _forget(self, held: Held) -> None:
        del self._held[held.position]
        self._ready.pop(held.position, None)
        for slot in held.slots:
            if slot.state in _ACTIVE:
                self._set(slot, State.RETURNING)
            self._counts[slot.state] -= 1
        assert all(count >= 0 for count in self._counts), self._counts

    def _compact(self) -> None:
        live = self.active
        if len(self._deadlines) > 2 * live + 1024:
            self._deadlines = [item for item in self._deadlines
                               if item[2].deadline_s == item[0] and item[2].state in (State.LEASED, State.DEFERRED)
                               and self._held.get(item[2].held.position) is item[2].held]
            heapq.heapify(self._deadlines)
