"""A subscription of a topic: its cursor, its consumers and the dispatcher that
matches the subscription's mode.

Mode rules (Pulsar's): an exclusive subscription takes one consumer (a second gets
ConsumerBusy); every consumer of a subscription must ask for the same mode as the
first; unsubscribing is allowed only to the last consumer attached.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable, Sequence

from common.errors import ConsumerBusy, MagnetarError, NotAllowed
from common.position import Position
from runtime.tasks import cancel_and_wait
from subscriptions.compacted_view import CompactedSource
from subscriptions.cursor import ManagedCursor
from subscriptions.dispatcher import Dispatcher, SingleActiveDispatcher
from subscriptions.dispatcher_shared import KeySharedDispatcher, SharedDispatcher
from subscriptions.mode import SubscriptionMode
from subscriptions.ports import AckedMessage, ConsumerPort, EntrySource, HeldAcks

log = logging.getLogger(__name__)


class Subscription:
    def __init__(self, name: str, topic_name: str, ledger: EntrySource, cursor: ManagedCursor,
                 mode: SubscriptionMode, *, partition_index: int = -1, entries_max: int = 100,
                 bytes_max: int = 4 * 1024 * 1024, redelivery_counts_max: int = 100_000,
                 unacked_per_consumer_max: int = 50_000, delayed_entries_max: int = 1_000_000) -> None:
        self.name = name
        self.topic_name = topic_name
        self.full_name = f"{topic_name}/{name}"
        self.ledger = ledger
        self.cursor = cursor
        self.mode = mode
        self.partition_index = partition_index
        self._entries_max = entries_max
        self._bytes_max = bytes_max
        self._redelivery_counts: collections.OrderedDict[Position, int] = collections.OrderedDict()
        self._redelivery_counts_max = redelivery_counts_max
        self._unacked_per_consumer_max = unacked_per_consumer_max
        self._delayed_entries_max = delayed_entries_max
        self.dispatcher: Dispatcher = self._make_dispatcher(mode)
        self.messages_acked = 0
        # The topic's dispatch rate limit (a ports.DispatchThrottle), shared by its
        # subscriptions' dispatchers; None: no limit.
        self.dispatch_throttle = None
        # Compaction: whether the consumers read compacted (read_compacted, exclusive
        # and failover only), and the topic's compaction that serves it.
        self.read_compacted = False
        # Loops of dispatchers replaced by a mode change, until their cancellation ends.
        self._retired_loops: set[asyncio.Task[None]] = set()
        self.compacted_source_of: Callable[[], CompactedSource | None] = lambda: None
        # Acknowledgements pending in open transactions (ports.HeldAcks), set by the
        # broker once a transaction acknowledges here; None: nothing held.
        self.held_acks: HeldAcks | None = None

    def compacted_view(self) -> CompactedSource | None:
        """The compacted ledger to serve before the topic itself (None: read the
        topic)."""
        return self.compacted_source_of() if self.read_compacted else None

    def _make_dispatcher(self, mode: SubscriptionMode) -> Dispatcher:
        if mode in (SubscriptionMode.EXCLUSIVE, SubscriptionMode.FAILOVER):
            return SingleActiveDispatcher(self, self._entries_max, self._bytes_max,
                                          failover=mode == SubscriptionMode.FAILOVER)
        if mode == SubscriptionMode.SHARED:
            return SharedDispatcher(self, self._entries_max, self._bytes_max, self._unacked_per_consumer_max,
                                    delayed_entries_max=self._delayed_entries_max)
        assert mode == SubscriptionMode.KEY_SHARED, mode
        return KeySharedDispatcher(self, self._entries_max, self._bytes_max, self._unacked_per_consumer_max,
                                   delayed_entries_max=self._delayed_entries_max)

    @property
    def consumers(self) -> list[ConsumerPort]:
        return self.dispatcher.consumers

    @property
    def type_name(self) -> str:
        return self.mode.pulsar_name

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer: ConsumerPort, mode: SubscriptionMode) -> None:
        """Attaches a consumer that asked for ``mode``; NotAllowed if the subscription
        has consumers in another mode, ConsumerBusy if it is exclusive and taken."""
        if self.consumers and mode != self.mode:
            raise NotAllowed(f"subscription {self.name} is {self.type_name}, not {mode.pulsar_name}")
        if not self.consumers and mode != self.mode:
            # The first consumer after all left may change the mode (as Pulsar allows).
            self.mode = mode
            retired = self.dispatcher.retire()      # its loop must not go on beside the new one
            if retired is not None:
                self._retired_loops.add(retired)
                retired.add_done_callback(self._retired_loops.discard)
            self.dispatcher = self._make_dispatcher(mode)
            # What the old dispatcher held back (replays, delayed entries) is not
            # carried over: the new one reads again after the mark-delete position.
            self.cursor.rewind()
        if self.mode == SubscriptionMode.EXCLUSIVE and self.consumers:
            raise ConsumerBusy(f"exclusive subscription {self.name} already has a consumer")
        self.dispatcher.add_consumer(consumer)

    def remove_consumer(self, consumer: ConsumerPort) -> None:
        self.dispatcher.remove_consumer(consumer)

    def disconnect_consumers(self) -> int:
        """Disconnects every consumer (clients subscribe again, dropping what they had
        queued): for seeks, cursor resets and forced deletes."""
        consumers = list(self.consumers)
        for consumer in consumers:
            consumer.disconnect()
            self.remove_consumer(consumer)
        return len(consumers)

    # --- acknowledgements --------------------------------------------------------------------

    def acknowledge(self, consumer: ConsumerPort, acks: Sequence[AckedMessage], *, cumulative: bool) -> None:
        """Applies one ACK of ``consumer``. Cumulative: everything up to the last id (not
        allowed on shared modes: NotAllowed)."""
        cursor = self.cursor
        if cumulative:
            if self.mode.shares_messages:
                raise NotAllowed("cumulative acknowledgement is not allowed on shared subscriptions")
            for acked in acks[-1:]:
                ack_set = list(acked.ack_set) if acked.ack_set else None
                if cursor.ack_cumulative(acked.position, ack_set):
                    self.messages_acked += 1
            return
        done: list[Position] = []
        for acked in acks:
            position = acked.position
            ack_set = list(acked.ack_set) if acked.ack_set else None
            if cursor.ack(position, ack_set, acked.batch_size):
                self.messages_acked += 1
            if cursor.is_acked(position):
                done.append(position)
                self._redelivery_counts.pop(position, None)
        on_acked = getattr(self.dispatcher, "on_acked", None)
        if on_acked is not None and done:
            on_acked(done)

    def hold(self, positions: Sequence[Position]) -> None:
        """``positions`` were acknowledged in an open transaction (``held_acks`` holds
        them now): no longer unacknowledged at their consumer (its unacknowledged
        count drops, as Pulsar's does), and not to be redelivered."""
        on_acked = getattr(self.dispatcher, "on_acked", None)
        if on_acked is not None and positions:
            on_acked(list(positions))

    def release_held(self, positions: Sequence[Position], *, through: Position | None = None,
                     leave_sent: bool = False) -> None:
        """The transaction that held ``positions`` (and, for a cumulative
        acknowledgement, every entry up to ``through``) aborted: what is not
        acknowledged otherwise is delivered again, its redelivery count raised.
        ``leave_sent``: a position still unacknowledged at a consumer stays there (the
        hold was taken back before it took effect)."""
        self.dispatcher.release(list(positions), through=through, leave_sent=leave_sent)

    def redeliver(self, consumer: ConsumerPort, positions: Sequence[Position], *, counted: bool = True) -> None:
        """The client asks for ``positions`` again (negative ack, ack timeout); none:
        everything it holds unacknowledged. ``counted=False``: it never used them (read
        ahead), so their redelivery counts stay as they are."""
        self.dispatcher.redeliver(consumer, list(positions) or None, counted=counted)

    # --- redelivery counts --------------------------------------------------------------------

    def redelivery_count(self, position: Position) -> int:
        return self._redelivery_counts.get(position, 0)

    def count_redelivery(self, position: Position) -> None:
        counts = self._redelivery_counts
        counts[position] = counts.get(position, 0) + 1
        counts.move_to_end(position)
        while len(counts) > self._redelivery_counts_max:
            counts.popitem(last=False)

    def count_redelivery_range(self, start: Position, end_exclusive: Position) -> None:
        """Counts a redelivery for every unacknowledged entry in [start, end)."""
        position = start
        steps = 0
        while position < end_exclusive and position <= self.ledger.last_confirmed and \
                steps < self._redelivery_counts_max:
            if not self.cursor.is_acked(position):
                self.count_redelivery(position)
            position = self.ledger.next_position(position)
            steps += 1

    # --- cursor moves -------------------------------------------------------------------------

    def skip_before(self, first_kept: Position, entries_between) -> int:
        """Acknowledges every entry before ``first_kept`` (message expiry, backlog
        eviction); returns how many entries that moved the mark-delete position over."""
        cursor = self.cursor
        before = cursor.mark_delete_position
        if first_kept.entry_id > 0:
            target = Position(first_kept.ledger_id, first_kept.entry_id - 1)
        else:
            target = Position(first_kept.ledger_id, -1)
        if target <= before or not cursor.ack_cumulative(target):
            return 0
        after = cursor.mark_delete_position
        on_acked = getattr(self.dispatcher, "on_acked", None)
        pending = getattr(self.dispatcher, "pending", None)
        if on_acked is not None and pending:
            done = [position for position in pending if position <= after]
            if done:
                on_acked(done)
        for position in [p for p in self._redelivery_counts if p <= after]:
            del self._redelivery_counts[position]
        return entries_between(before, after)

    def reset_cursor(self, position: Position) -> None:
        self.cursor.reset(position)
        self._redelivery_counts.clear()
        self.dispatcher.on_cursor_reset()
        self.dispatcher.wake()

    async def close(self) -> None:
        await self.dispatcher.close()
        await cancel_and_wait(*self._retired_loops)
        try:
            await self.cursor.close()
        except MagnetarError as error:
            log.warning("cursor close failed: subscription=%s error=%s", self.full_name, error)
