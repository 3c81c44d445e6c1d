"""Dispatchers move entries from a subscription's cursor to its consumers.

Theory of operation (shared by every mode): one task per subscription waits until a
consumer can take messages (permits left, connection writable) and reads entries from
the cursor's read position (the entry cache, else the bookies), skipping those already
acknowledged, and sends them through each consumer's port (subscriptions/ports.py).
When caught up it waits for the managed ledger to confirm new entries. Entries to send again (redeliveries) are served before
new ones. Flow control is Pulsar's: a consumer's permits count messages, a batch entry
takes as many as it holds, and nothing is sent to a consumer without permits.

``SingleActiveDispatcher`` serves exclusive and failover subscriptions: all messages go
to one active consumer (failover: the first by priority level, then name; for a
partition, the one its index picks, so partitions spread over consumers), others stand
by and are told so with ACTIVE_CONSUMER_CHANGE. When the active consumer changes, the
cursor rewinds to the first unacknowledged entry, so the new one starts there.

How many entries a round reads: a consumer's permits count messages and a batch entry
holds many, so a read of ``permits`` entries sends up to ``permits`` times the batch size
(1,000 permits and batches of 128 1 KiB messages: the read stops only at the 4 MiB byte
cap, 32 entries, about 4,100 messages against 1,000 permits). A round reads the permits over the mean messages per entry seen so far
(Pulsar's avgMessagesPerEntry), and stops sending once the permits are used up (the
entries read and not sent are read again later, from the cache), so a consumer gets
what it asked for and at most one batch more, and a connection shared by several
consumers is not flooded past its write buffer by one.

The loop never dies quietly (the fan-out stall of issue 14): whatever a round raises,
other than a cancellation, is logged and the round retried after a bounded back-off.
Before, an error other than a MagnetarError (a timeout, an assertion) ended the task,
and only the next event (a FLOW, new entries) started it again; a consumer that had
received everything it was sent sends no FLOW, and a prefilled topic gets no new
entries, so such a subscription stayed stalled with backlog and permits for good.
Independently, ``DispatchWatch`` (dispatch_watch.py) checks from outside that a
dispatcher with work gets a read within a bounded time, and wakes it if not.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol

from runtime.eager_future import call_when_done
from common.errors import MagnetarError
from common.position import ManagedEntry, Position
from runtime.tasks import cancel_and_wait
from protocol.batch import message_count
from protocol.codec import stored_metadata
from subscriptions.compacted_view import CompactedSource
from subscriptions.cursor import ManagedCursor, int_to_ack_set_words
from subscriptions.dispatch_watch import DispatchWatch
from subscriptions.ports import ConsumerPort, EntrySource

log = logging.getLogger(__name__)

# Back-off after a failed round: the first retry after RETRY_DELAY_S, doubling up to
# RETRY_DELAY_S_MAX (a failing bookie read is retried twice a second at first, then every
# 5 s, so a long outage does not spin; any event still wakes the loop at once).
RETRY_DELAY_S = 0.5
RETRY_DELAY_S_MAX = 5.0
# Weight of the newest entry in the running mean of messages per entry.
_MEAN_WEIGHT = 0.2


class DispatchedSubscription(Protocol):
    """What a dispatcher needs of the subscription it serves (subscription.py)."""

    full_name: str
    cursor: ManagedCursor
    ledger: EntrySource
    partition_index: int

    def redelivery_count(self, position: Position) -> int: ...

    def count_redelivery(self, position: Position) -> None: ...

    def count_redelivery_range(self, start: Position, end_exclusive: Position) -> None: ...


@dataclass(eq=False)
class ConsumerState:
    """What a dispatcher keeps about one of its consumers."""

    # Shared and key-shared: entries sent to this consumer and not acknowledged yet
    # (position -> message count), redelivered to others if it goes away.
    pending: dict[Position, int] = field(default_factory=dict)
    unacked_messages: int = 0
    told_end_of_topic: bool = False


class Dispatcher(abc.ABC):
    def __init__(self, subscription: DispatchedSubscription, entries_max: int, bytes_max: int) -> None:
        self.subscription = subscription
        self.consumers: list[ConsumerPort] = []
        self._states: dict[ConsumerPort, ConsumerState] = {}
        self._entries_max = entries_max
        self._bytes_max = bytes_max
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # True while the task runs a round (it may be awaiting a read): nothing else
        # dispatches meanwhile.
        self._in_round = False
        self._waiting_for_entries = False
        # Set when new entries woke a caught-up dispatcher: its next send of the newest
        # entry is timed (the "dispatch" stage), then it is cleared.
        self._woken_by_entries = False
        self.messages_dispatched = 0
        # Reads started, whether one is in progress, and failed rounds (for the watch).
        self.reads_started = 0
        self.reading = False
        self.round_failures = 0
        self.watch = DispatchWatch()
        # The ledger's last confirmed position when the latest read started.
        self._confirmed_at_read: Position | None = None
        # Running mean of the messages an entry holds (batches), sizing reads to permits.
        self.messages_per_entry = 1.0
        # The wake-up set while a dispatch rate limit holds this dispatcher back.
        self._throttle_timer: asyncio.TimerHandle | None = None

    # --- events ---------------------------------------------------------------------------

    def wake(self) -> None:
        self._wakeup.set()
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def add_consumer(self, consumer: ConsumerPort) -> None:
        self._attach(consumer)
        self.wake()

    def remove_consumer(self, consumer: ConsumerPort) -> None:
        self._detach(consumer)
        self.wake()

    def _attach(self, consumer: ConsumerPort) -> None:
        assert consumer not in self._states, consumer.name
        self.consumers.append(consumer)
        self._states[consumer] = ConsumerState()

    def _detach(self, consumer: ConsumerPort) -> ConsumerState | None:
        """Forgets a consumer; returns what was kept about it (None: not attached)."""
        state = self._states.pop(consumer, None)
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        assert len(self._states) == len(self.consumers), (len(self._states), len(self.consumers))
        return state

    def on_flow(self, consumer: ConsumerPort) -> None:
        """The consumer's client granted permits."""
        self.wake()

    def on_cursor_reset(self) -> None:
        """The cursor was moved (seek, reset): what follows it is read again."""

    def unacked_messages(self, consumer: ConsumerPort) -> int:
        """Messages sent to ``consumer`` and not acknowledged yet (shared modes; 0 for
        exclusive and failover, whose acks are cumulative)."""
        state = self._states.get(consumer)
        return state.unacked_messages if state is not None else 0

    def consumer_states(self) -> Iterator[tuple[ConsumerPort, ConsumerState]]:
        return iter(self._states.items())

    @abc.abstractmethod
    def redeliver(self, consumer: ConsumerPort, positions: list[Position] | None, *, counted: bool = True) -> None:
        """Sends the given unacknowledged entries again (None: all of the consumer's),
        their redelivery counts raised unless not ``counted``."""

    @abc.abstractmethod
    def release(self, positions: list[Position], *, through: Position | None = None,
                leave_sent: bool = False) -> None:
        """Entries held back for an open transaction (ports.HeldAcks) are released (it
        aborted): ``positions``, and every entry up to ``through`` when given (a
        cumulative acknowledgement), are delivered again unless acknowledged, their
        redelivery counts raised (``leave_sent``: not those a consumer still holds)."""

    async def close(self) -> None:
        if self._throttle_timer is not None:
            self._throttle_timer.cancel()
            self._throttle_timer = None
        self._closed = True
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def retire(self) -> asyncio.Task[None] | None:
        """Stops this dispatcher at once (its subscription changed mode and made
        another); returns its loop's task, cancelled, for the caller to await."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        delay_s = RETRY_DELAY_S
        try:
            while not self._closed:
                await self._wakeup.wait()
                self._wakeup.clear()
                try:
                    self._in_round = True
                    try:
                        await self._dispatch_round()
                    finally:
                        self._in_round = False
                    delay_s = RETRY_DELAY_S
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    # Not only MagnetarError: a round that dies here would leave the
                    # subscription with backlog and permits and nobody to wake it (see the
                    # module docstring). A broken invariant is logged with its traceback.
                    self.round_failures += 1
                    if isinstance(error, MagnetarError):
                        log.warning("dispatch failed, retrying: subscription=%s error=%s delay_s=%.1f",
                                    self.subscription.full_name, error, delay_s)
                    else:
                        log.exception("dispatch round raised, retrying: subscription=%s delay_s=%.1f",
                                      self.subscription.full_name, delay_s)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX)
                    self._wakeup.set()
        finally:
            self.reading = False
            self._task = None

    async def _read(self, start: Position, count_max: int) -> list[ManagedEntry]:
        """Reads for a round, counted for the watch."""
        self.reads_started += 1
        self.reading = True
        self._confirmed_at_read = self.subscription.ledger.last_confirmed
        try:
            return await self.subscription.ledger.read(start, count_max, self._bytes_max)
        finally:
            self.reading = False

    def _entries_for(self, permits: int) -> int:
        """Entries to read for ``permits`` messages: the permits over the mean batch
        size, rounded up, within [1, entries_max]."""
        wanted = -(-permits // max(1, int(self.messages_per_entry)))
        return max(1, min(wanted, self._entries_max))

    def _time_tail(self, position: Position) -> None:
        """The "dispatch" stage (docs/performance.md): when ``position``, just sent, is
        the newest confirmed entry, how long it took from confirmed to sent. Ledgers
        that keep no stage histograms (tests' fakes) are not timed."""
        if not self._woken_by_entries:
            return   # not tailing: a backlog read (its entries were confirmed long ago)
        ledger = self.subscription.ledger
        # The first entry sent after the wake-up settles it: the newest one is timed; an
        # older one means this round reads a backlog, which is not the tail's latency.
        self._woken_by_entries = False
        stages = getattr(ledger, "stages", None)
        if stages is not None and position == ledger.last_confirmed:
            stages.observe("dispatch", time.perf_counter() - ledger.last_confirmed_at)

    def _count_entry(self, message_count: int) -> None:
        self.messages_per_entry += _MEAN_WEIGHT * (max(1, message_count) - self.messages_per_entry)

    # --- the dispatch rate limit (ports.DispatchThrottle) ------------------------------------------

    def _throttle(self):
        return getattr(self.subscription, "dispatch_throttle", None)

    def _permits_now(self, permits: int) -> int:
        """``permits``, or fewer while a dispatch rate limit allows fewer."""
        throttle = self._throttle()
        return permits if throttle is None else min(permits, throttle.allowance())

    def _throttled(self) -> bool:
        """True (and a wake-up is set for when it allows some) while a dispatch rate
        limit allows nothing; the watch does not count that as a stall (has_work)."""
        throttle = self._throttle()
        if throttle is None or throttle.allowance() > 0:
            return False
        if self._throttle_timer is None and not self._closed:
            self._throttle_timer = asyncio.get_running_loop().call_later(throttle.retry_after_s(),
                                                                        self._on_throttle_timer)
        return True

    def _on_throttle_timer(self) -> None:
        self._throttle_timer = None
        self.wake()

    def _count_dispatch(self, count: int, size_bytes: int) -> None:
        self.messages_dispatched += count
        throttle = self._throttle()
        if throttle is not None:
            throttle.consume(count, size_bytes)

    # --- the invariant ------------------------------------------------------------------------

    @abc.abstractmethod
    def has_work(self) -> bool:
        """True when a consumer can take messages now and there is something to read."""

    def check_progress(self, now_s: float) -> bool:
        """One sample of the invariant (a consumer with permits and a subscription with
        backlog get a read within ``watch.bound_s``); on a stall, wakes the loop and
        returns True (the caller logs and counts it)."""
        if self._closed:
            return False
        stalled = self.watch.observe(now_s, has_work=self.has_work(), reading=self.reading,
                                     reads_started=self.reads_started)
        if stalled:
            log.warning("dispatcher stalled with backlog and permits, waking it: subscription=%s waited_s=%.1f "
                        "task_alive=%s", self.subscription.full_name, self.watch.wait_s_max, self._task is not None)
            self.wake()
        return stalled

    def _backlog_to_read(self) -> bool:
        subscription = self.subscription
        return subscription.cursor.read_position <= subscription.ledger.last_confirmed

    @abc.abstractmethod
    async def _dispatch_round(self) -> None:
        """Sends what the consumers can take now; returns when nothing more can go."""

    def _wait_for_entries(self) -> None:
        if self._waiting_for_entries:
            return
        self._waiting_for_entries = True
        waiter = self.subscription.ledger.wait_for_entries()

        def on_entries(_future: asyncio.Future[None]) -> None:
            self._waiting_for_entries = False
            self._woken_by_entries = True
            if not self._dispatch_tail_now():
                self.wake()

        # Inside the managed ledger's settling of the entries, before their receipts
        # (runtime/eager_future.py); on_entries does not call back into the appends.
        call_when_done(waiter, on_entries)
        if self.subscription.ledger.last_confirmed != self._confirmed_at_read:
            # Entries were confirmed while the read that came back empty was in flight,
            # before this waiter existed: it would only fire on the next append, which
            # a prefilled topic never gets. Go round again. (Only then: were an empty
            # read to meet unread entries for another reason, waking here every time
            # would spin; the watch reports such a case as a stall instead.)
            self.wake()

    def _dispatch_tail_now(self) -> bool:
        """New entries confirmed for a caught-up subscription: sends them in this
        callback when that needs no await (see SingleActiveDispatcher); False when the
        task must (it is then woken)."""
        return False

    def _prepare(self, entry: ManagedEntry) -> tuple[int, list[int] | None] | None:
        """(message count, ack_set to send) for an entry still to deliver; None if it
        is acknowledged already, or held acknowledged by an open transaction."""
        cursor = self.subscription.cursor
        if cursor.is_acked(entry.position):
            return None
        held = getattr(self.subscription, "held_acks", None)
        unheld = None
        if held is not None:
            if held.holds(entry.position):
                return None   # acknowledged in an open transaction (ports.HeldAcks)
            unheld = held.unheld_bits(entry.position)
        try:
            count = message_count(stored_metadata(entry.data))
        except MagnetarError as error:
            log.error("unreadable stored entry skipped: subscription=%s position=%s error=%s",
                      self.subscription.full_name, entry.position, error)
            return None
        partial = cursor.unacked_batch_bits(entry.position)
        if partial is None and unheld is None:
            return count, None
        size, bits = partial if partial is not None else (count, (1 << count) - 1)
        if unheld is not None:
            bits &= unheld    # a batch held in part: its held messages are not sent
            if not bits:
                return None
        return count, int_to_ack_set_words(bits, max(size, count))

    def _check_end_of_topic(self) -> None:
        subscription = self.subscription
        ledger = subscription.ledger
        if ledger.terminated and subscription.cursor.read_position > ledger.last_confirmed:
            for consumer, state in self._states.items():
                if not state.told_end_of_topic:
                    state.told_end_of_topic = True
                    consumer.notify_end_of_topic()


class SingleActiveDispatcher(Dispatcher):
    def __init__(self, subscription: DispatchedSubscription, entries_max: int, bytes_max: int, *, failover: bool) -> None:
        super().__init__(subscription, entries_max, bytes_max)
        self.failover = failover
        self.active: ConsumerPort | None = None
        # read_compacted: the mark-delete position for which a read found no copy of a
        # deleted ledger's entry before the first stored entry (_gaps_acknowledgeable).
        self._no_copies_before_stored: Position | None = None

    def _choose_active(self) -> ConsumerPort | None:
        if not self.consumers:
            return None
        ordered = sorted(self.consumers, key=lambda c: (c.priority_level, c.name, c.consumer_id))
        if self.failover and self.subscription.partition_index >= 0:
            top_priority = ordered[0].priority_level
            candidates = [c for c in ordered if c.priority_level == top_priority]
            return candidates[self.subscription.partition_index % len(candidates)]
        return ordered[0]

    def _update_active(self) -> None:
        chosen = self._choose_active()
        if chosen is self.active:
            return
        previous, self.active = self.active, chosen
        # The new active consumer starts from the first unacknowledged entry.
        self.subscription.cursor.rewind()
        self._hold_compacted_start()
        if self.failover:
            for consumer in self.consumers:
                consumer.notify_active(consumer is chosen)
        log.info("active consumer changed: subscription=%s from=%s to=%s", self.subscription.full_name,
                 previous.name if previous else None, chosen.name if chosen else None)

    def add_consumer(self, consumer: ConsumerPort) -> None:
        self._attach(consumer)
        # Exclusive: one consumer at a time (Subscription.add_consumer refuses a second
        # with ConsumerBusy), so no entry can go to two consumers of the subscription.
        assert self.failover or len(self.consumers) == 1, [c.name for c in self.consumers]
        if self.failover and self.active is not None:
            consumer.notify_active(False)
        self._update_active()
        self.wake()

    def remove_consumer(self, consumer: ConsumerPort) -> None:
        self._detach(consumer)
        if consumer is self.active:
            self.active = None
        self._update_active()
        self.wake()

    def redeliver(self, consumer: ConsumerPort, positions: list[Position] | None, *, counted: bool = True) -> None:
        """Exclusive and failover redeliver by rewinding to the first unacknowledged
        entry (what Pulsar does); the counts of what was in flight go up (if
        ``counted``)."""
        if consumer is not self.active:
            return
        cursor = self.subscription.cursor
        start = self.subscription.ledger.next_position(cursor.mark_delete_position)
        if counted:
            self.subscription.count_redelivery_range(start, cursor.read_position)
        cursor.rewind()
        self._hold_compacted_start()
        self.wake()

    def release(self, positions: list[Position], *, through: Position | None = None,
                leave_sent: bool = False) -> None:
        """As ``redeliver``: a rewind to the first unacknowledged entry (the order of
        an exclusive subscription allows no other), the released entries counted."""
        cursor = self.subscription.cursor
        for position in positions:
            if not cursor.is_acked(position) and (through is None or position > through):
                self.subscription.count_redelivery(position)
        if through is not None:
            ledger = self.subscription.ledger
            self.subscription.count_redelivery_range(ledger.next_position(cursor.mark_delete_position),
                                                     ledger.next_position(through))
        cursor.rewind()
        self._hold_compacted_start()
        self.wake()

    def has_work(self) -> bool:
        consumer = self.active
        return (consumer is not None and consumer.permits > 0 and consumer.writable
                and self._backlog_to_read() and not self._throttled())

    async def _dispatch_round(self) -> None:
        subscription = self.subscription
        cursor = subscription.cursor
        while not self._closed:
            consumer = self.active
            if consumer is None or consumer.permits <= 0 or not consumer.writable:
                return
            if self._throttled():
                return   # its timer wakes the task when the rate allows more
            start = cursor.read_position
            compacted = self._compacted_from(start)
            if compacted is not None:
                await self._dispatch_compacted(consumer, *compacted, start)
                continue
            entries = await self._read(start, self._entries_for(self._permits_now(consumer.permits)))
            if consumer is not self.active or cursor.read_position != start:
                continue  # the consumer changed or the cursor moved while reading
            if not entries:
                self._check_end_of_topic()
                self._wait_for_entries()
                return
            self._send_entries(consumer, entries)

    def on_cursor_reset(self) -> None:
        self._hold_compacted_start()

    def _hold_compacted_start(self) -> None:
        """After a rewind or a reset of a read_compacted subscription: a read position on
        the first stored entry right after the mark-delete position becomes the position
        right after the mark itself, so that the compacted ledger is read from there
        (see ``_compacted_from``) even if retention deletes more ledgers before the next
        round: moved onto the stored entries then, it would no longer be the first after
        the mark, and the copies before it would be skipped."""
        compacted = self._compacted_from(self.subscription.cursor.read_position)
        if compacted is not None:
            self.subscription.cursor.skip_next_read(compacted[1])

    def _compacted_from(self, start: Position) -> tuple[CompactedSource, Position] | None:
        """(the compacted view, where its read begins), when the subscription reads one
        (read_compacted: optional in the protocol, a subscription without one reads the
        topic) and the read begins before its horizon; else None. The read begins at
        ``start``, the cursor's read position — or right after the mark-delete position
        when the cursor sits on the first stored entry after it and the ledgers between
        are gone: retention deleted them, and the compacted ledger may still hold copies
        of their entries ("earliest" on such a topic, a rewind, a reader back after a
        reconnect; broker/topic.py, ``_compacted_start``)."""
        view = self._compacted_view()
        if view is None:
            return None
        mark = self.subscription.cursor.mark_delete_position
        after_mark = Position(mark.ledger_id, mark.entry_id + 1)
        if after_mark < start and self.subscription.ledger.next_position(mark) == start:
            start = after_mark
        return (view, start) if start <= view.horizon else None

    def _compacted_view(self) -> CompactedSource | None:
        compacted_view = getattr(self.subscription, "compacted_view", None)
        return compacted_view() if compacted_view is not None else None

    def _gaps_acknowledgeable(self, read_from: Position, chosen: list) -> bool:
        """Whether the entries compaction dropped may be acknowledged in this round: yes
        once the mark-delete position is within the stored entries (nothing between it
        and them), or when this read began right after it and found no copy before the
        first stored entry (remembered for that mark); no while copies of deleted
        ledgers may be out unacknowledged."""
        ledger = self.subscription.ledger
        mark = self.subscription.cursor.mark_delete_position
        first = ledger.first_position
        if Position(mark.ledger_id, mark.entry_id + 1) >= first or self._no_copies_before_stored == mark:
            return True
        if read_from == Position(mark.ledger_id, mark.entry_id + 1) and (not chosen or chosen[0].position >= first):
            self._no_copies_before_stored = mark
            return True
        return False

    def _send_entries(self, consumer: ConsumerPort, entries: list[ManagedEntry]) -> None:
        """Sends ``entries`` (read from the cursor's read position) while the consumer has
        permits, and moves the read position past the last one sent or skipped."""
        subscription = self.subscription
        # A round's entries go to the active consumer alone, each once, in topic order
        # (the read position then moves past them: the next round starts after).
        assert consumer is self.active, consumer.name
        done = None
        for entry in entries:
            if consumer.permits <= 0:
                break   # the rest is read again when permits come (from the cache)
            assert done is None or entry.position > done.position, (done.position, entry.position)
            done = entry
            prepared = self._prepare(entry)
            if prepared is None:
                continue
            count, ack_set = prepared
            self._count_entry(count)
            consumer.send_entry(entry, count, redelivery_count=subscription.redelivery_count(entry.position),
                                ack_set=ack_set)
            self._count_dispatch(count, len(entry.data))
        assert done is not None, "a round with permits sent nothing of what it read"
        self._time_tail(done.position)
        subscription.cursor.skip_next_read(subscription.ledger.next_position(done.position))

    def _dispatch_tail_now(self) -> bool:
        """The tail, sent in the callback that learnt of it (docs/performance.md, step 16):
        a caught-up consumer with permits gets entries just confirmed without a loop turn
        to wake the task, when they are all in the entry cache (they are: the managed
        ledger caches an entry as it confirms it). Anything else is the task's: a round
        running or due, no consumer ready, the compacted view, a read that must await."""
        if self._closed or self._in_round or self._wakeup.is_set():
            return False
        consumer = self.active
        if consumer is None or consumer.permits <= 0 or not consumer.writable:
            return False
        if self._throttle() is not None:
            return False   # rate limited: the task's rounds pace it
        ledger = self.subscription.ledger
        start = self.subscription.cursor.read_position
        if self._compacted_from(start) is not None:
            return False
        confirmed = ledger.last_confirmed
        entries = ledger.read_cached(start, self._entries_for(consumer.permits), self._bytes_max)
        if entries is None:
            return False
        self.reads_started += 1     # a read, for the watch, as _read counts them
        self._confirmed_at_read = confirmed
        if not entries:
            self._check_end_of_topic()
            self._wait_for_entries()
            return True
        self._send_entries(consumer, entries)
        if consumer.permits > 0 and self._backlog_to_read():
            self.wake()             # the read stopped at its count or byte bound: the task goes on
        elif consumer.permits > 0:
            self._wait_for_entries()
        # Out of permits: a FLOW wakes the task, as after a round.
        return True

    async def _dispatch_compacted(self, consumer: ConsumerPort, source: CompactedSource, read_from: Position,
                                  start: Position) -> None:
        """read_compacted, before the horizon: the compacted ledger's entries from
        ``read_from`` on (a batch with only its surviving messages), then on to after the
        horizon. ``start`` is the cursor's read position the round began with."""
        subscription = self.subscription
        cursor = subscription.cursor
        ledger = subscription.ledger
        self.reads_started += 1   # a read for the watch, like _read's
        self.reading = True
        self._confirmed_at_read = ledger.last_confirmed
        horizon = source.horizon
        try:
            chosen = await source.read_compacted(read_from, min(consumer.permits, self._entries_max))
        finally:
            self.reading = False
        if consumer is not self.active or cursor.read_position != start or self._closed:
            return  # the consumer changed or the cursor moved while reading
        view = self._compacted_view()
        if view is None or view.horizon != horizon:
            # A compaction was committed meanwhile: what was read may be of the ledger it
            # replaced, and gaps or the end measured against the new horizon would pass
            # entries only the new one holds. The next round reads the new one.
            return
        # What lies between the compacted entries compaction dropped: the subscription
        # is never sent it, so it is acknowledged as it is passed (else the mark-delete
        # position, the backlog and retention would stay behind it for ever) — when
        # that cannot also pass a copy sent from a ledger retention deleted (those
        # positions are not the topic's: their acks do not count, so only the mark
        # still before them keeps them for a redelivery).
        acks_gaps = self._gaps_acknowledgeable(read_from, chosen)
        if not chosen:
            if acks_gaps:
                cursor.ack_range(read_from, Position(source.horizon.ledger_id, source.horizon.entry_id + 1))
            cursor.skip_next_read(ledger.next_position(source.horizon))
            return
        gap_from = read_from
        for compacted in chosen:
            if consumer.permits <= 0:
                return   # the rest is read again when permits come
            if acks_gaps:
                cursor.ack_range(gap_from, compacted.position)
                gap_from = Position(compacted.position.ledger_id, compacted.position.entry_id + 1)
            entry = ManagedEntry(compacted.position, compacted.stored)
            prepared = self._prepare(entry)
            if prepared is not None:
                count, ack_set = prepared
                self._count_entry(count)
                if compacted.batch_size:
                    ack_set = int_to_ack_set_words(compacted.keep_bits, compacted.batch_size)
                consumer.send_entry(entry, count, redelivery_count=subscription.redelivery_count(entry.position),
                                    ack_set=ack_set)
                self._count_dispatch(count, len(entry.data))
            # Not ledger.next_position: the entry's topic ledger may be trimmed already,
            # and moving to the next stored ledger would skip compacted entries of it.
            cursor.skip_next_read(Position(compacted.position.ledger_id, compacted.position.entry_id + 1))
