"""A subscription of a topic: its cursor, its consumers and the dispatcher that
matches the subscription's mode.

Mode rules (Pulsar's): an exclusive subscription takes one consumer (a second gets
ConsumerBusy); every consumer of a subscription must ask for the same mode as the
first; unsubscribing is allowed only to the last consumer attached.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

from common.position import Position
from protocol.proto import pulsar_api_pb2 as pb
from common.errors import ConsumerBusy, MagnetarError, NotAllowed
from subscriptions.cursor import ManagedCursor
from subscriptions.dispatcher import Dispatcher, SingleActiveDispatcher
from subscriptions.dispatcher_shared import KeySharedDispatcher, SharedDispatcher

if TYPE_CHECKING:
    from broker.consumer import Consumer
    from broker.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)

SUB_TYPE_NAMES = {pb.CommandSubscribe.Exclusive: "Exclusive", pb.CommandSubscribe.Shared: "Shared",
                  pb.CommandSubscribe.Failover: "Failover", pb.CommandSubscribe.Key_Shared: "Key_Shared"}


class Subscription:
    def __init__(self, name: str, topic_name: str, ledger: "ManagedLedger", cursor: ManagedCursor,
                 sub_type: int, *, partition_index: int = -1, entries_max: int = 100,
                 bytes_max: int = 4 * 1024 * 1024, redelivery_counts_max: int = 100_000,
                 unacked_per_consumer_max: int = 50_000) -> None:
        self.name = name
        self.topic_name = topic_name
        self.full_name = f"{topic_name}/{name}"
        self.ledger = ledger
        self.cursor = cursor
        self.sub_type = sub_type
        self.partition_index = partition_index
        self._entries_max = entries_max
        self._bytes_max = bytes_max
        self._redelivery_counts: collections.OrderedDict[Position, int] = collections.OrderedDict()
        self._redelivery_counts_max = redelivery_counts_max
        self._unacked_per_consumer_max = unacked_per_consumer_max
        self.dispatcher: Dispatcher = self._make_dispatcher(sub_type)
        self.messages_acked = 0

    def _make_dispatcher(self, sub_type: int) -> Dispatcher:
        if sub_type in (pb.CommandSubscribe.Exclusive, pb.CommandSubscribe.Failover):
            return SingleActiveDispatcher(self, self._entries_max, self._bytes_max,
                                          failover=sub_type == pb.CommandSubscribe.Failover)
        if sub_type == pb.CommandSubscribe.Shared:
            return SharedDispatcher(self, self._entries_max, self._bytes_max, self._unacked_per_consumer_max)
        if sub_type == pb.CommandSubscribe.Key_Shared:
            return KeySharedDispatcher(self, self._entries_max, self._bytes_max, self._unacked_per_consumer_max)
        raise NotAllowed(f"unknown subscription mode {sub_type}")

    @property
    def consumers(self) -> list["Consumer"]:
        return self.dispatcher.consumers

    @property
    def type_name(self) -> str:
        return SUB_TYPE_NAMES.get(self.sub_type, str(self.sub_type))

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer: "Consumer") -> None:
        if self.consumers and consumer.sub_type != self.sub_type:
            raise NotAllowed(f"subscription {self.name} is {self.type_name}, "
                             f"not {SUB_TYPE_NAMES.get(consumer.sub_type, consumer.sub_type)}")
        if not self.consumers and consumer.sub_type != self.sub_type:
            # The first consumer after all left may change the mode (as Pulsar allows).
            self.sub_type = consumer.sub_type
            self.dispatcher = self._make_dispatcher(consumer.sub_type)
        if self.sub_type == pb.CommandSubscribe.Exclusive and self.consumers:
            raise ConsumerBusy(f"exclusive subscription {self.name} already has a consumer")
        self.dispatcher.add_consumer(consumer)

    def remove_consumer(self, consumer: "Consumer") -> None:
        self.dispatcher.remove_consumer(consumer)

    def disconnect_consumers(self) -> int:
        """Sends CLOSE_CONSUMER to every consumer (clients subscribe again, dropping what
        they had queued): for seeks, cursor resets and forced deletes."""
        from protocol import commands

        consumers = list(self.consumers)
        for consumer in consumers:
            if not consumer.closed:
                consumer.connection.write_command(commands.close_consumer(consumer.consumer_id))
                consumer.connection.forget_consumer(consumer)
            consumer.closed = True
            self.remove_consumer(consumer)
        return len(consumers)

    # --- acknowledgements --------------------------------------------------------------------

    def acknowledge(self, consumer: "Consumer", ack_type: int, message_ids: list[pb.MessageIdData]) -> None:
        cursor = self.cursor
        if ack_type == pb.CommandAck.Cumulative:
            if self.sub_type in (pb.CommandSubscribe.Shared, pb.CommandSubscribe.Key_Shared):
                raise NotAllowed("cumulative acknowledgement is not allowed on shared subscriptions")
            for message_id in message_ids[-1:]:
                position = Position(message_id.ledgerId, message_id.entryId)
                ack_set = list(message_id.ack_set) or None
                if cursor.ack_cumulative(position, ack_set):
                    self.messages_acked += 1
            return
        done: list[Position] = []
        for message_id in message_ids:
            position = Position(message_id.ledgerId, message_id.entryId)
            ack_set = list(message_id.ack_set) or None
            if cursor.ack(position, ack_set, message_id.batch_size if message_id.HasField("batch_size") else 0):
                self.messages_acked += 1
            if cursor.is_acked(position):
                done.append(position)
                self._redelivery_counts.pop(position, None)
        on_acked = getattr(self.dispatcher, "on_acked", None)
        if on_acked is not None and done:
            on_acked(done)

    def redeliver(self, consumer: "Consumer", message_ids: list[pb.MessageIdData]) -> None:
        positions = [Position(m.ledgerId, m.entryId) for m in message_ids] or None
        self.dispatcher.redeliver(consumer, positions)

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

    def reset_cursor(self, position: Position) -> None:
        self.cursor.reset(position)
        self._redelivery_counts.clear()
        self.dispatcher.wake()

    async def close(self) -> None:
        await self.dispatcher.close()
        try:
            await self.cursor.close()
        except MagnetarError as error:
            log.warning("cursor close failed: subscription=%s error=%s", self.full_name, error)
