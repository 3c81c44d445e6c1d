"""Dispatchers for shared and key-shared subscriptions.

Shared: entries go round-robin to the consumers that have permits. Each entry sent is
remembered as pending at its consumer until acknowledged. Entries to send again — a
consumer closed or crashed with them, the client asked (negative acknowledgement, ack
timeout), or a key-shared entry was held back — wait in a replay set and are sent
before new entries, oldest first, each with its redelivery count raised. A consumer
with ``unacked_per_consumer_max`` messages pending gets nothing more until it
acknowledges (Pulsar's maxUnackedMessagesPerConsumer).

Key-shared: each entry's key (ordering key, else partition key, of its metadata) picks
one consumer through a hash ring (each consumer owns ``POINTS_PER_CONSUMER`` points,
placed by hashing its name), so a key sticks to a consumer and keys spread as consumers
come and go. Order per key survives membership changes by Pulsar's rule: a consumer
that joined when the read position was R receives no entry at or after R until every
entry before R is acknowledged (the mark-delete position reached R); until then such
entries wait in the replay set. Entries a departing consumer held are replayed, oldest
first, to the keys' new owners.

Delayed delivery (both modes, as in Pulsar; exclusive and failover deliver such
messages at once): an entry whose ``deliver_at_time`` is still ahead is not sent when
read but kept in the subscription's ``DelayedDeliveryTracker`` (delayed_delivery.py);
a timer wakes the dispatcher at the next due time and due entries join the replay set.
They stay unacknowledged, so a new owner after a restart reads them again from the
mark-delete position and tracks them anew. When the tracker is full, delayed entries
read from then on are not held in memory but left in the topic: an overflow range of
positions (delayed_overflow.py) that is read again — due entries to the replay set,
the others into the tracker — once the tracker has room or the overflow's earliest
entry comes due; entries without a delay keep flowing meanwhile.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import logging
import time
from typing import Callable

import crc32c

from common.position import ManagedEntry, Position
from protocol.codec import stored_metadata
from subscriptions.delayed_delivery import DelayedDeliveryTracker
from subscriptions.delayed_overflow import DelayedOverflow
from subscriptions.dispatcher import DispatchedSubscription, Dispatcher
from subscriptions.ports import ConsumerPort

log = logging.getLogger(__name__)

# Replayed entries read per dispatch round.
_REPLAY_BATCH = 100
# Entries held in the replay set before the dispatcher stops reading new ones (bounds
# memory when key-shared consumers fall behind).
REPLAY_ENTRIES_MAX = 100_000
POINTS_PER_CONSUMER = 100
# Due delayed entries moved into the replay set per dispatch round.
_DELAYED_RELEASE_MAX = 1000
# Entries read per step of a rescan of the delayed overflow, and the entries one rescan
# may read (then the round goes on; the next round continues it).
_RESCAN_READ_ENTRIES = 100
_RESCAN_ENTRIES_MAX = 10_000


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)
_HASH_RANGE = 1 << 32


class SharedDispatcher(Dispatcher):
    def __init__(self, subscription: DispatchedSubscription, entries_max: int, bytes_max: int,
                 unacked_per_consumer_max: int = 50_000, *, delayed_entries_max: int = 1_000_000,
                 clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        super().__init__(subscription, entries_max, bytes_max)
        self._unacked_per_consumer_max = unacked_per_consumer_max
        self.pending: dict[Position, ConsumerPort] = {}
        self._replay: list[Position] = []          # sorted
        self._replay_set: set[Position] = set()
        self._next_consumer = 0
        # deliver_at_time is the producer's wall-clock time (epoch ms).
        self._clock_ms = clock_ms
        self.delayed = DelayedDeliveryTracker(delayed_entries_max)
        self.delayed_overflow: DelayedOverflow | None = None
        self.delayed_overflow_opened = 0      # times the tracker overflowed (stats)
        self._delay_timer: asyncio.TimerHandle | None = None
        self._delay_timer_ms = 0

    # --- delayed delivery ---------------------------------------------------------------------

    @staticmethod
    def _deliver_at(entry: ManagedEntry) -> int | None:
        """The entry's deliver_at_time (None: it has none)."""
        metadata = stored_metadata(entry.data)
        return int(metadata.deliver_at_time) if metadata.HasField("deliver_at_time") else None

    def _hold_delayed(self, entry: ManagedEntry, deliver_at: int | None, now_ms: int) -> bool:
        """Keeps a delayed entry read from the topic (True), in the tracker or in the
        overflow; False: send it now."""
        if deliver_at is None:
            return False
        overflow = self.delayed_overflow
        if overflow is not None:
            overflow.extend(entry.position, deliver_at)   # due or not: see delayed_overflow.py
            return True
        if deliver_at <= now_ms:
            return False
        if self.delayed.full:
            self.delayed_overflow = DelayedOverflow(entry.position, entry.position, deliver_at, entries=1)
            self.delayed_overflow_opened += 1
            log.info("delayed-delivery tracker full, overflowing to the topic: subscription=%s tracked=%d "
                     "from=%s", self.subscription.full_name, len(self.delayed), entry.position)
            return True
        self.delayed.add(deliver_at, entry.position.ledger_id, entry.position.entry_id, now_ms)
        return True

    async def _rescan_overflow(self) -> None:
        """Drains the delayed overflow from its start, as far as the replay set and the
        tracker can take (see delayed_overflow.py)."""
        overflow = self.delayed_overflow
        if overflow is None:
            return
        now_ms = self._clock_ms()
        if not overflow.rescan_due(len(self.delayed), self.delayed.entries_max, now_ms):
            return
        ledger = self.subscription.ledger
        cursor = self.subscription.cursor
        position, taken, stopped, scanned = overflow.start, 0, False, 0
        while position <= overflow.end and not stopped and scanned < _RESCAN_ENTRIES_MAX:
            entries = await ledger.read(position, _RESCAN_READ_ENTRIES, self._bytes_max)
            if self.delayed_overflow is not overflow:
                return   # a cursor reset dropped it meanwhile
            if not entries:
                position = ledger.next_position(overflow.end)   # trimmed away: nothing to deliver
                break
            for entry in entries:
                if entry.position > overflow.end:
                    position = ledger.next_position(overflow.end)
                    break
                scanned += 1
                deliver_at = self._deliver_at(entry)
                if deliver_at is not None and not cursor.is_acked(entry.position) \
                        and entry.position not in self.pending and entry.position not in self._replay_set:
                    if deliver_at <= now_ms:
                        if len(self._replay) >= REPLAY_ENTRIES_MAX:
                            stopped = True
                        else:
                            self._add_replay(entry.position, count=False)
                    elif self.delayed.full:
                        stopped = True
                    else:
                        self.delayed.add(deliver_at, entry.position.ledger_id, entry.position.entry_id, now_ms)
                    if stopped:
                        position = entry.position
                        break
                    taken += 1
                position = ledger.next_position(entry.position)
        overflow.drained_to(max(position, overflow.start), taken, stopped=stopped)
        if overflow.drained:
            self.delayed_overflow = None
            log.info("delayed overflow drained: subscription=%s tracked=%d", self.subscription.full_name,
                     len(self.delayed))
        self._arm_delay_timer()

    def _release_due(self) -> None:
        """Moves due delayed entries into the replay set (bounded by it) and arms the
        timer for the next one."""
        if len(self.delayed):
            room = min(REPLAY_ENTRIES_MAX - len(self._replay), _DELAYED_RELEASE_MAX)
            if room > 0:
                for ledger_id, entry_id in self.delayed.pop_due(self._clock_ms(), room):
                    self._add_replay(Position(ledger_id, entry_id), count=False)
        self._arm_delay_timer()

    def _arm_delay_timer(self) -> None:
        due_ms = self.delayed.next_due_ms()
        overflow = self.delayed_overflow
        if overflow is not None and overflow.due_min_ms is not None:
            due_ms = overflow.due_min_ms if due_ms is None else min(due_ms, overflow.due_min_ms)
        timer = self._delay_timer
        if timer is not None and (due_ms is None or self._delay_timer_ms > due_ms):
            timer.cancel()
            self._delay_timer = timer = None
        if due_ms is None or timer is not None or self._closed:
            return
        self._delay_timer_ms = due_ms
        delay_s = max(0.0, (due_ms - self._clock_ms()) / 1000)
        self._delay_timer = asyncio.get_running_loop().call_later(delay_s, self._on_delay_timer)

    def _on_delay_timer(self) -> None:
        self._delay_timer = None
        self.wake()

    def on_cursor_reset(self) -> None:
        # Everything before the new position counts as acknowledged and everything from
        # it on is read again: nothing is left to replay (an entry kept for replay would
        # also be read afresh, and sent twice).
        for position in self._replay:
            self._on_replay_dropped(position)
        self._replay.clear()
        self._replay_set.clear()
        self.delayed.clear()
        self.delayed_overflow = None   # read again from the new position, like the tracker's
        self._arm_delay_timer()

    async def close(self) -> None:
        if self._delay_timer is not None:
            self._delay_timer.cancel()
            self._delay_timer = None
        await super().close()

    # --- membership ---------------------------------------------------------------------

    def remove_consumer(self, consumer: ConsumerPort) -> None:
        self._detach(consumer)
        held = [p for p, owner in self.pending.items() if owner is consumer]
        for position in held:
            del self.pending[position]
            self._add_replay(position, count=True)
        if held:
            log.info("consumer left with unacknowledged entries, replaying: subscription=%s consumer=%s entries=%d",
                     self.subscription.full_name, consumer.name, len(held))
        self.wake()

    # --- acknowledgements and redelivery -------------------------------------------------------

    def on_acked(self, positions: list[Position]) -> None:
        woke = False
        for position in positions:
            consumer = self.pending.pop(position, None)
            if consumer is not None:
                state = self._states[consumer]
                state.unacked_messages -= state.pending.pop(position, 0)
                woke = True
            if position in self._replay_set:
                self._drop_replay(position)
        if woke:
            self.wake()

    def redeliver(self, consumer: ConsumerPort, positions: list[Position] | None, *, counted: bool = True) -> None:
        if positions is None:
            chosen = [p for p, owner in self.pending.items() if owner is consumer]
        else:
            chosen = [p for p in positions if self.pending.get(p) is consumer]
        state = self._states.get(consumer)
        for position in chosen:
            del self.pending[position]
            assert state is not None, "an entry is pending at a consumer that is not attached"
            state.unacked_messages -= state.pending.pop(position, 0)
            self._add_replay(position, count=counted)
        if chosen:
            self.wake()

    def release(self, positions: list[Position], *, through: Position | None = None,
                leave_sent: bool = False) -> None:
        """Released entries join the replay set (cumulative acknowledgements, hence
        ``through``, do not exist on shared modes). One still pending at a consumer
        (acknowledged in part, so never held) is taken from it first."""
        assert through is None, "a cumulative acknowledgement on a shared subscription"
        cursor = self.subscription.cursor
        released = 0
        for position in positions:
            if cursor.is_acked(position) or (leave_sent and position in self.pending):
                continue
            consumer = self.pending.pop(position, None)
            if consumer is not None:
                state = self._states[consumer]
                state.unacked_messages -= state.pending.pop(position, 0)
            self._add_replay(position, count=True)
            released += 1
        if released:
            self.wake()

    def _add_replay(self, position: Position, *, count: bool) -> None:
        if count:
            self.subscription.count_redelivery(position)
        if position not in self._replay_set:
            self._replay_set.add(position)
            bisect.insort(self._replay, position)

    def _begin_replay_pass(self) -> None:
        """Hook: a pass over the replay set starts."""

    @property
    def replay_size(self) -> int:
        return len(self._replay)

    # --- choosing consumers -----------------------------------------------------------------

    def _can_take(self, consumer: ConsumerPort) -> bool:
        return (consumer.permits > 0 and consumer.writable
                and self._states[consumer].unacked_messages < self._unacked_per_consumer_max)

    def _available(self) -> list[ConsumerPort]:
        return [c for c in self.consumers if self._can_take(c)]

    def _choose(self, entry: ManagedEntry, available: list[ConsumerPort], *, replaying: bool = False,
                ) -> ConsumerPort | None:
        """Round robin over consumers that can take messages."""
        if not available:
            return None
        self._next_consumer = (self._next_consumer + 1) % len(available)
        return available[self._next_consumer]

    def _send(self, consumer: ConsumerPort, entry: ManagedEntry, count: int, ack_set: list[int] | None) -> None:
        position = entry.position
        assert position not in self.pending, position
        consumer.send_entry(entry, count, redelivery_count=self.subscription.redelivery_count(position),
                            ack_set=ack_set)
        state = self._states[consumer]
        state.pending[position] = count
        state.unacked_messages += count
        self.pending[position] = consumer
        self._count_dispatch(count, len(entry.data))

    # --- the round ------------------------------------------------------------------------------

    def has_work(self) -> bool:
        # Entries held back (key-shared order, full consumers) wait for acknowledgements,
        # not for a read: only new entries with a consumer free to take them count. A
        # full delayed-delivery tracker overflows to the topic and reads on.
        return (bool(self._available()) and len(self._replay) < REPLAY_ENTRIES_MAX
                and self._backlog_to_read() and not self._throttled())

    async def _dispatch_round(self) -> None:
        subscription = self.subscription
        cursor = subscription.cursor
        ledger = subscription.ledger
        while not self._closed:
            if not self._available():
                return
            self._release_due()
            if self.delayed_overflow is not None:
                await self._rescan_overflow()
                if self._closed:
                    return
            sent = await self._dispatch_replay() if self._replay else 0
            available = self._available()
            if not available:
                return
            if len(self._replay) >= REPLAY_ENTRIES_MAX:
                return  # too much held back: wait for acknowledgements
            if self._throttled():
                return  # its timer wakes the task when the rate allows more
            start = cursor.read_position
            total_permits = self._permits_now(sum(c.permits for c in available))
            entries = await self._read(start, self._entries_for(total_permits))
            if cursor.read_position != start:
                continue  # the cursor moved (reset) while reading
            if not entries:
                self._check_end_of_topic()
                self._wait_for_entries()
                return
            next_read = ledger.next_position(entries[-1].position)
            now_ms = self._clock_ms()
            for entry in entries:
                prepared = self._prepare(entry)
                if prepared is None or entry.position in self.pending or entry.position in self._replay_set:
                    continue   # sent and unacknowledged, or the replay pass sends it
                if self._hold_delayed(entry, self._deliver_at(entry), now_ms):
                    continue
                consumer = self._choose(entry, self._available(), replaying=False)
                if consumer is None:
                    # Nobody may take it now (key-shared: its consumer is full or must
                    # wait for older messages): keep it, in order, for later.
                    self._add_replay(entry.position, count=False)
                    continue
                count, ack_set = prepared
                self._count_entry(count)
                self._send(consumer, entry, count, ack_set)
                sent += 1
                self._time_tail(entry.position)
            cursor.skip_next_read(next_read)
            self._arm_delay_timer()
            if not sent and not self._available():
                return

    def _drop_replay(self, position: Position) -> None:
        self._replay_set.discard(position)
        index = bisect.bisect_left(self._replay, position)
        if index < len(self._replay) and self._replay[index] == position:
            del self._replay[index]
        self._on_replay_dropped(position)

    def _on_replay_dropped(self, position: Position) -> None:
        """Hook: a position left the replay set."""

    def _on_held(self, entry: ManagedEntry) -> None:
        """Hook: a replayed entry could not be sent in this pass."""

    async def _dispatch_replay(self) -> int:
        """Sends what it can of the replay set, oldest first; returns entries sent."""
        ledger = self.subscription.ledger
        sent = 0
        self._begin_replay_pass()
        for position in list(self._replay[:_REPLAY_BATCH]):
            if not self._available():
                break
            if self._throttled():
                break   # redeliveries count against a dispatch rate limit too; its timer wakes the round
            if position not in self._replay_set:
                continue
            if self.subscription.cursor.is_acked(position):
                self._drop_replay(position)
                continue
            entries = await ledger.read(position, 1, self._bytes_max)
            if position not in self._replay_set:
                continue
            if not entries or entries[0].position != position:
                self._drop_replay(position)  # trimmed away meanwhile: nothing to redeliver
                continue
            entry = entries[0]
            prepared = self._prepare(entry)
            if prepared is None:
                self._drop_replay(position)
                continue
            consumer = self._choose(entry, self._available(), replaying=True)
            if consumer is None:
                self._on_held(entry)
                continue  # held back; entries of other keys may still go
            self._drop_replay(position)
            count, ack_set = prepared
            self._send(consumer, entry, count, ack_set)
            sent += 1
        return sent


class KeySharedDispatcher(SharedDispatcher):
    """Order per key also holds for redeliveries: while an entry of a key waits in the
    replay set, no newer entry of that key is sent (new ones join the replay set), and a
    replayed entry that cannot go blocks the later replayed entries of its key in that
    pass. Key hashes of pending and replayed entries are remembered for that."""

    def __init__(self, subscription: DispatchedSubscription, entries_max: int, bytes_max: int,
                 unacked_per_consumer_max: int = 50_000, **kwargs) -> None:
        super().__init__(subscription, entries_max, bytes_max, unacked_per_consumer_max, **kwargs)
        self._ring_points: list[int] = []
        self._ring_owners: list[ConsumerPort] = []
        self._joined_at: dict[int, Position] = {}         # id(consumer) -> read position at join
        self._hash_of: dict[Position, int] = {}           # pending and replayed entries
        self._replay_hashes: collections.Counter[int] = collections.Counter()
        self._blocked: set[int] = set()

    def _rebuild_ring(self) -> None:
        ring = sorted(
            (crc32c.crc32c(f"{consumer.name}#{consumer.consumer_id}#{point}".encode()), order, consumer)
            for order, consumer in enumerate(self.consumers)
            for point in range(POINTS_PER_CONSUMER))
        self._ring_points = [point for point, _, _ in ring]
        self._ring_owners = [consumer for _, _, consumer in ring]

    def add_consumer(self, consumer: ConsumerPort) -> None:
        # Entries before the current read position may be in flight at other consumers.
        self._joined_at[id(consumer)] = self.subscription.cursor.read_position
        self._attach(consumer)
        self._rebuild_ring()
        self.wake()

    def remove_consumer(self, consumer: ConsumerPort) -> None:
        self._joined_at.pop(id(consumer), None)
        super().remove_consumer(consumer)   # replays what it held
        self._rebuild_ring()

    def owner_of(self, key: bytes) -> ConsumerPort | None:
        if not self._ring_points:
            return None
        index = bisect.bisect_left(self._ring_points, crc32c.crc32c(key))
        return self._ring_owners[index % len(self._ring_owners)]

    @staticmethod
    def key_of(entry: ManagedEntry) -> bytes:
        metadata = stored_metadata(entry.data)
        if metadata.HasField("ordering_key") and metadata.ordering_key:
            return bytes(metadata.ordering_key)
        if metadata.HasField("partition_key"):
            return metadata.partition_key.encode()
        return b""

    # --- replay bookkeeping ----------------------------------------------------------------

    def _add_replay(self, position: Position, *, count: bool) -> None:
        was_in = position in self._replay_set
        super()._add_replay(position, count=count)
        if not was_in and position in self._hash_of:
            self._replay_hashes[self._hash_of[position]] += 1

    def _on_replay_dropped(self, position: Position) -> None:
        key_hash = self._hash_of.get(position)
        if key_hash is not None and self._replay_hashes[key_hash] > 0:
            self._replay_hashes[key_hash] -= 1
            if not self._replay_hashes[key_hash]:
                del self._replay_hashes[key_hash]
        if position not in self.pending:
            self._hash_of.pop(position, None)

    def on_acked(self, positions: list[Position]) -> None:
        super().on_acked(positions)
        for position in positions:
            if position not in self._replay_set:
                self._hash_of.pop(position, None)

    def _begin_replay_pass(self) -> None:
        self._blocked = set()

    def _on_held(self, entry: ManagedEntry) -> None:
        self._blocked.add(self._hash_of.get(entry.position, crc32c.crc32c(self.key_of(entry))))

    # --- choosing -------------------------------------------------------------------------------

    def _choose(self, entry: ManagedEntry, available: list[ConsumerPort], *, replaying: bool = False,
                ) -> ConsumerPort | None:
        key = self.key_of(entry)
        key_hash = crc32c.crc32c(key)
        self._hash_of[entry.position] = key_hash
        if replaying:
            if key_hash in self._blocked:
                return None                       # an older entry of this key is still waiting
        elif self._replay_hashes.get(key_hash):
            return None                           # older entries of this key wait to be replayed
        owner = self.owner_of(key)
        if owner is None or owner not in available:
            return None
        joined_at = self._joined_at.get(id(owner))
        if joined_at is not None:
            mark_delete = self.subscription.cursor.mark_delete_position
            if self.subscription.ledger.next_position(mark_delete) >= joined_at:
                del self._joined_at[id(owner)]   # everything before its join is acknowledged
            elif entry.position >= joined_at:
                return None                       # would overtake older messages of its keys
        return owner
