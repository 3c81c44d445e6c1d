"""Consuming over a connection: SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES,
UNSUBSCRIBE, CLOSE_CONSUMER, SEEK and GET_LAST_MESSAGE_ID, and the consumers a
connection holds (``AttachedConsumer``).

Mixed into ``ServerConnection`` (broker/connection.py, the router), whose state
these methods use: ``service``, ``config``, ``peer``, ``role``, the per-connection
maps, ``write_command``, ``_write_error``, ``_start_task``, ``_refuse_if_too_many``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from protocol import commands
from protocol.codec import Frame
from broker.connection_transactions import has_txn
from broker import topic_policies
from broker.authorization import CONSUME
from broker.consumer import Consumer
from common.position import Position
from protocol.proto import pulsar_api_pb2 as pb
from common.topic_name import TopicName
from common.errors import (
    ConsumerBusy,
    InvalidArgument,
    MagnetarError,
    NotAllowed,
    SubscriptionNotFound,
)

from subscriptions.mode import SubscriptionMode
from subscriptions.ports import AckedMessage

if TYPE_CHECKING:
    from broker.topic import PersistentTopic
    from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)

T = pb.BaseCommand


class AttachedConsumer:
    """A consumer on this connection, with its topic and subscription."""

    __slots__ = ("consumer", "topic", "subscription", "durable")

    def __init__(self, consumer: Consumer, topic: "PersistentTopic", subscription: "Subscription",
                 durable: bool) -> None:
        self.consumer = consumer
        self.topic = topic
        self.subscription = subscription
        self.durable = durable


class ConsumingHandlers:
    """Consumers, their flow, acknowledgements and seeks over the protocol (see the module)."""

    def _on_subscribe(self, frame: Frame) -> None:
        request = frame.command.subscribe
        if request.consumer_id in self.consumers:
            self.write_command(commands.success(request.request_id))
            return
        if request.consumer_id in self._pending_consumers:
            return
        if self._refuse_if_too_many(frame):
            return
        task = self._start_task(self._subscribe(request))
        self._pending_consumers[request.consumer_id] = task
        task.add_done_callback(
            lambda t, cid=request.consumer_id: self._forget_pending(self._pending_consumers, cid, t))

    async def _subscribe(self, request: pb.CommandSubscribe) -> None:
        durable = request.durable
        try:
            if not request.subscription:
                raise InvalidArgument("subscription name must not be empty")
            topic_name = TopicName.parse(request.topic)
            await self.service.authorizer.check(self.role, topic_name, CONSUME)
            topic = await self.service.get_topic(topic_name, create=request.force_topic_creation)
            consumers = sum(len(s.consumers) for s in topic.subscriptions.values())
            consumers_max = topic_policies.limit(
                (await self.service.resources.effective_policies(topic.name)).max_consumers_per_topic,
                self.config.consumers_per_topic_max)
            if consumers >= consumers_max:
                raise ConsumerBusy(f"topic {topic.full_name} has {consumers} consumers, the most allowed "
                                   f"({consumers_max}: maxConsumers, else the namespace's, else "
                                   "consumers_per_topic_max)")
            if request.HasField("schema"):
                await self._register_schema(topic.name, request.schema, consumer=True)
            consumer = Consumer(request.consumer_id, request.consumer_name or f"consumer-{request.consumer_id}",
                                request.subscription, topic.full_name, SubscriptionMode.from_wire(request.subType),
                                self,
                                priority_level=request.priority_level,
                                partition_index=topic.name.partition_index,
                                metadata={kv.key: kv.value for kv in request.metadata})
            start = request.start_message_id if request.HasField("start_message_id") else None
            broadcast = await self.service.is_broadcast(topic.name, request.subscription, consumer.metadata)
            # No await from the consumer's addition (inside subscribe) to the
            # registration below: CLOSE_CONSUMER cancels this task (see _create_producer).
            subscription = await topic.subscribe(
                consumer, durable=durable, initial_position=request.initialPosition,
                start_message_id=start, rollback_duration_s=request.start_message_rollback_duration_sec,
                broadcast=broadcast, read_compacted=request.read_compacted)
        except MagnetarError as error:
            log.info("subscribe refused: peer=%s topic=%s subscription=%s error=%s", self.peer, request.topic,
                     request.subscription, error)
            self._write_error(request.request_id, error)
            return
        if self.closed:
            subscription.remove_consumer(consumer)
            return
        self.consumers[request.consumer_id] = AttachedConsumer(consumer, topic, subscription, durable)
        self.write_command(commands.success(request.request_id))
        log.info("consumer subscribed: peer=%s topic=%s subscription=%s mode=%s consumer=%s", self.peer,
                 topic.full_name, subscription.name, subscription.type_name, consumer.name)

    def _attached(self, consumer_id: int) -> AttachedConsumer | None:
        return self.consumers.get(consumer_id)

    def _on_flow(self, frame: Frame) -> None:
        flow = frame.command.flow
        attached = self._attached(flow.consumer_id)
        if attached is None:
            return
        attached.consumer.permits += flow.messagePermits
        attached.subscription.dispatcher.on_flow(attached.consumer)

    def _on_ack(self, frame: Frame) -> None:
        ack = frame.command.ack
        if has_txn(ack):
            self._on_txn_ack(frame)   # pending until the transaction ends (connection_transactions.py)
            return
        attached = self._attached(ack.consumer_id)
        if attached is None:
            if ack.HasField("request_id"):
                self.write_command(commands.error(ack.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        if any(_out_of_range(m) for m in ack.message_id):
            # No entry has such an id (positions are Java longs): an ack of one is a
            # client's bug or hostile, and the cursor could not persist it.
            if ack.HasField("request_id"):
                self._write_error(ack.request_id, InvalidArgument("acknowledged message id out of range"))
            return
        try:
            attached.subscription.acknowledge(attached.consumer, [_acked_message(m) for m in ack.message_id],
                                              cumulative=ack.ack_type == pb.CommandAck.Cumulative)
        except MagnetarError as error:
            if ack.HasField("request_id"):
                self._write_error(ack.request_id, error)
            return
        if ack.HasField("request_id"):
            self.write_command(commands.ack_response(ack.consumer_id, ack.request_id))

    def _on_redeliver(self, frame: Frame) -> None:
        request = frame.command.redeliverUnacknowledgedMessages
        attached = self._attached(request.consumer_id)
        if attached is not None:
            attached.subscription.redeliver(attached.consumer,
                                            [Position(m.ledgerId, m.entryId) for m in request.message_ids],
                                            counted=not request.magnetar_unused)

    async def _on_unsubscribe(self, frame: Frame) -> None:
        request = frame.command.unsubscribe
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.error(request.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        try:
            await attached.topic.unsubscribe(attached.subscription.name, attached.consumer)
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        self.consumers.pop(request.consumer_id, None)
        attached.consumer.closed = True
        self.write_command(commands.success(request.request_id))

    def _on_close_consumer(self, frame: Frame) -> None:
        request = frame.command.close_consumer
        pending = self._pending_consumers.pop(request.consumer_id, None)
        if pending is not None:
            pending.cancel()   # still subscribing: stop that (see _on_close_producer)
        self._detach_consumer(request.consumer_id)
        self.write_command(commands.success(request.request_id))

    def _detach_consumer(self, consumer_id: int) -> None:
        attached = self.consumers.pop(consumer_id, None)
        if attached is None:
            return
        attached.consumer.closed = True
        attached.subscription.remove_consumer(attached.consumer)
        if not attached.durable and not attached.subscription.consumers:
            # A reader's subscription lives only as long as its consumer.
            self._start_task(self._drop_subscription(attached))

    async def _drop_subscription(self, attached: AttachedConsumer) -> None:
        try:
            await attached.topic.unsubscribe(attached.subscription.name, None)
        except (MagnetarError, SubscriptionNotFound):
            pass

    def forget_consumer(self, consumer: Consumer) -> None:
        """The broker closed this consumer (CLOSE_CONSUMER was sent)."""
        self.consumers.pop(consumer.consumer_id, None)

    async def _on_seek(self, frame: Frame) -> None:
        request = frame.command.seek
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.error(request.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        if request.HasField("message_id") and _out_of_range(request.message_id) and not _is_earliest(
                request.message_id):
            self._write_error(request.request_id, InvalidArgument("seek message id out of range"))
            return
        subscription = attached.subscription
        try:
            if request.HasField("message_id"):
                target = attached.topic.seek_position(request.message_id, read_compacted=subscription.read_compacted)
            elif request.HasField("message_publish_time"):
                target = await attached.topic.find_position_by_time(request.message_publish_time)
            else:
                raise NotAllowed("seek needs a message id or a publish time")
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        # As Pulsar does: disconnect the subscription's consumers (each client drops what
        # it had queued and subscribes again), move the cursor, and only then answer.
        # The order matters to the official clients: a seek answered while the consumer
        # is still connected makes the C++ client skip the sought message itself.
        subscription.disconnect_consumers()
        subscription.reset_cursor(target)
        self.write_command(commands.success(request.request_id))
        log.info("subscription seek: topic=%s subscription=%s position=%s", attached.topic.full_name,
                 subscription.name, target)

    async def _on_get_last_message_id(self, frame: Frame) -> None:
        request = frame.command.getLastMessageId
        attached = self._attached(request.consumer_id)
        if attached is None:
            self.write_command(commands.error(request.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        try:
            position, batch_index = await attached.topic.last_message_id(
                read_compacted=attached.subscription.read_compacted)
        except MagnetarError as error:
            self._write_error(request.request_id, error)
            return
        command = commands.get_last_message_id_response(
            request.request_id, position.ledger_id, position.entry_id,
            mark_delete=tuple(attached.subscription.cursor.mark_delete_position))
        if batch_index >= 0:
            command.getLastMessageIdResponse.last_message_id.batch_index = batch_index
        self.write_command(command)


# The largest ledger or entry id a position can have: ids are Java longs on the wire
# (sent as uint64), and the cursor's records store them as signed 64-bit integers.
_POSITION_ID_MAX = 2**63 - 1


def _out_of_range(message_id: pb.MessageIdData) -> bool:
    return message_id.ledgerId > _POSITION_ID_MAX or message_id.entryId > _POSITION_ID_MAX


def _is_earliest(message_id: pb.MessageIdData) -> bool:
    """The clients' MessageId.earliest: (-1, -1) as uint64s."""
    return message_id.ledgerId == 2**64 - 1 and message_id.entryId == 2**64 - 1


def _acked_message(message_id: pb.MessageIdData) -> AckedMessage:
    return AckedMessage(Position(message_id.ledgerId, message_id.entryId),
                        tuple(message_id.ack_set) or None,
                        message_id.batch_size if message_id.HasField("batch_size") else 0)
