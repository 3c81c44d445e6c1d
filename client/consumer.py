"""A consumer on one topic (or one partition) with explicit flow control.

Theory of operation:
- Nothing is prefetched: the broker sends only what ``flow`` granted (permits count
  messages, a batch entry takes as many as it holds, so one entry may overshoot).
  ``permits_outstanding`` is what was granted and not yet used.
- Each MESSAGE is decoded (client/messages.py; a batch entry is split once for all the
  subscriptions of its topic read through the connection: client/split_cache.py) and
  handed to the listener's ``on_entry`` synchronously, in arrival order; the listener
  must not block.
- ``ack`` names messages individually (batch messages by index, through Pulsar's ack
  sets) or cumulatively, and waits for the broker's ACK_RESPONSE, so a returned ack was
  applied. ``redeliver`` asks the broker to send entries again (REDELIVER with their
  ids; shared modes send each to any consumer, ordered modes rewind).
- Reconnection: CLOSE_CONSUMER (unload, broker stopping, a seek) or a lost connection
  detach the consumer. The broker then gives every entry it held unacknowledged to
  someone else or again, so the listener's ``on_disconnected`` is told at once (what it
  handed on is no longer held here), and ``on_reconnected`` once subscribed again with
  zero permits. Attempts wait a jittered exponential back-off and go on until the
  consumer is closed, or, with ``reconnect_attempts_max`` set, until that many failed
  in a row; then (or at once on a non-retriable refusal) ``on_failed`` is told and
  the consumer is done for good.
"""

from __future__ import annotations

import asyncio
import random
import logging
import time
from typing import Callable, Mapping, Protocol, Sequence

from common.errors import ConsumerBusy, InvalidArgument, MagnetarError, OperationTimeout, ServiceNotReady
from runtime.tasks import cancel_and_wait
from common.topic_name import TopicName
from protocol.batch import message_count
from protocol.codec import Frame, wrap
from protocol.proto import pulsar_api_pb2 as pb

from client.connection import ClientConnection
from client.config import RECONNECT_LOG_EVERY
from client.pool import BrokerPool
from client.messages import MessageId, ReceivedEntry, ack_set_without, decode_entry


log = logging.getLogger(__name__)

T = pb.BaseCommand

SUB_TYPES: dict[str, int] = {
    "exclusive": pb.CommandSubscribe.Exclusive,
    "shared": pb.CommandSubscribe.Shared,
    "failover": pb.CommandSubscribe.Failover,
    "key_shared": pb.CommandSubscribe.Key_Shared,
}
INITIAL_POSITIONS: dict[str, int] = {
    "latest": pb.CommandSubscribe.Latest,
    "earliest": pb.CommandSubscribe.Earliest,
}
# FLOW's messagePermits is a uint32.
PERMITS_PER_FLOW_MAX = 0xFFFF_FFFF


class ConsumerListener(Protocol):
    def on_entry(self, entry: ReceivedEntry) -> None: ...

    def on_disconnected(self) -> None: ...

    def on_reconnected(self) -> None: ...

    def on_failed(self, error: MagnetarError) -> None: ...


class _NoListener:
    def on_entry(self, entry: ReceivedEntry) -> None:
        pass

    def on_disconnected(self) -> None:
        pass

    def on_reconnected(self) -> None:
        pass

    def on_failed(self, error: MagnetarError) -> None:
        pass


class Consumer:
    def __init__(self, pool: BrokerPool, topic: str, subscription: str, *, sub_type: str = "shared",
                 consumer_name: str = "", initial_position: str = "latest",
                 properties: Mapping[str, str] | None = None, durable: bool = True,
                 start_message_id: MessageId | None = None,
                 schema: pb.Schema | None = None, read_compacted: bool = False,
                 listener: ConsumerListener | None = None,
                 on_closed: Callable[["Consumer"], None] | None = None) -> None:
        if sub_type not in SUB_TYPES:
            raise InvalidArgument(f"unknown subscription type {sub_type!r}")
        if initial_position not in INITIAL_POSITIONS:
            raise InvalidArgument(f"unknown initial position {initial_position!r}")
        if not subscription:
            raise InvalidArgument("subscription name must not be empty")
        self.pool = pool
        self.config = pool.config
        self.topic = topic
        self.partition = TopicName.parse(topic).partition_index
        self.subscription = subscription
        self.sub_type = sub_type
        self.consumer_name = consumer_name
        self.initial_position = initial_position
        self.properties = dict(properties or {})
        self.durable = durable
        # A non-durable subscription (a reader) starts at this entry, inclusive: the
        # broker positions it there and the caller drops what it should not see.
        if start_message_id is not None and durable:
            raise InvalidArgument("start_message_id is for non-durable subscriptions (readers)")
        self.start_message_id = start_message_id
        self.schema = schema
        self.read_compacted = read_compacted
        self.listener: ConsumerListener = listener or _NoListener()
        self._on_closed = on_closed
        self._connection: ClientConnection | None = None
        self._consumer_id = 0
        self.permits_outstanding = 0
        self.active = True               # failover: whether the broker made this one active
        self.end_of_topic = False
        self._reconnect_task: asyncio.Task[None] | None = None
        self.failure: MagnetarError | None = None
        self.closed = False
        self.last_used_s = time.monotonic()
        # Observability, as the producer's: attempts made, when the attempt that led to
        # the current subscription began and when it completed (time.monotonic()).
        self.reconnect_attempts = 0
        self.attempt_due_s = 0.0           # when the latest attempt was to begin (its wait drawn)
        self.attempt_started_s = 0.0
        self.registered_s = 0.0

    # --- subscribing ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._subscribe()

    async def _subscribe(self) -> None:
        connection = await self.pool.connection_for(self.topic)
        consumer_id = connection.register_consumer(self, self.topic, self.subscription)
        request_id = connection.new_request_id()
        body = pb.CommandSubscribe(
            topic=self.topic, subscription=self.subscription, subType=SUB_TYPES[self.sub_type],
            consumer_id=consumer_id, request_id=request_id, durable=self.durable,
            initialPosition=INITIAL_POSITIONS[self.initial_position],
            metadata=[pb.KeyValue(key=k, value=v) for k, v in self.properties.items()])
        if self.consumer_name:
            body.consumer_name = self.consumer_name
        if self.schema is not None:
            body.schema.CopyFrom(self.schema)
        if self.read_compacted:
            body.readCompacted = True
        if self.start_message_id is not None:
            body.start_message_id.CopyFrom(pb.MessageIdData(ledgerId=self.start_message_id.ledger_id,
                                                            entryId=self.start_message_id.entry_id))
        try:
            await connection.request(wrap(body), request_id)
        except BaseException as error:
            connection.unregister_consumer(consumer_id)
            if isinstance(error, (asyncio.CancelledError, OperationTimeout)) and not connection.closed:
                # The broker may have subscribed it without our seeing the answer (a
                # caller's timeout): undo that, or it holds the subscription (exclusive)
                # for as long as the connection lives. The answer is not awaited.
                connection.write_command(wrap(pb.CommandCloseConsumer(consumer_id=consumer_id,
                                                                      request_id=connection.new_request_id())))
            raise
        self._connection, self._consumer_id = connection, consumer_id
        self.permits_outstanding = 0
        self.registered_s = time.monotonic()
        log.debug("consumer subscribed: topic=%s subscription=%s type=%s name=%s", self.topic, self.subscription,
                  self.sub_type, self.consumer_name)

    @property
    def ready(self) -> bool:
        return self._connection is not None and not self._connection.closed

    # --- flow and frames in ---------------------------------------------------------------------

    def flow(self, permits: int) -> bool:
        """Grants ``permits`` more messages; False (nothing granted) while not connected."""
        assert 0 < permits <= PERMITS_PER_FLOW_MAX, permits
        if not self.ready:
            return False
        assert self._connection is not None
        self._connection.write_command(wrap(pb.CommandFlow(consumer_id=self._consumer_id, messagePermits=permits)))
        self.permits_outstanding += permits
        return True

    def on_frame(self, frame: Frame) -> None:
        command = frame.command
        if command.type == T.MESSAGE:
            assert frame.payload is not None
            payload = frame.payload
            self.permits_outstanding -= message_count(payload.metadata)
            connection = self._connection
            splits = connection.splits_for(self.topic) if connection is not None else None
            entry = decode_entry(command.message, payload.metadata, payload.payload, self.partition, splits,
                                 self.topic, payload.stored)
            self.listener.on_entry(entry)
        elif command.type == T.CLOSE_CONSUMER:
            log.info("broker closed consumer, reconnecting: topic=%s subscription=%s", self.topic, self.subscription)
            self._detach()
            self._start_reconnect()
        elif command.type == T.ACTIVE_CONSUMER_CHANGE:
            self.active = command.active_consumer_change.is_active
        elif command.type == T.REACHED_END_OF_TOPIC:
            self.end_of_topic = True

    def on_connection_lost(self) -> None:
        self._detach()
        self._start_reconnect()

    # --- acknowledgements -------------------------------------------------------------------------

    async def ack(self, message_ids: Sequence[MessageId], *, cumulative: bool = False) -> None:
        """Acknowledges ``message_ids`` and waits until the broker applied it. Messages
        of one batch entry are named together in one id with their bits cleared."""
        if not message_ids:
            return
        if cumulative and len(message_ids) != 1:
            raise InvalidArgument("a cumulative acknowledgement names one message")
        connection = self._connected()
        request_id = connection.new_request_id()
        ack_type = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
        body = pb.CommandAck(consumer_id=self._consumer_id, ack_type=ack_type, request_id=request_id,
                             message_id=ack_message_ids(message_ids))
        self.last_used_s = time.monotonic()
        await connection.request(wrap(body), request_id)

    def ack_nowait(self, message_ids: Sequence[MessageId], *, cumulative: bool = False) -> bool:
        """Acknowledges ``message_ids`` without asking for a receipt (the official
        clients' default): one ACK written, nothing awaited. False when not connected
        (the broker then redelivers them: at-least-once)."""
        if not message_ids or not self.ready:
            return False
        if cumulative and len(message_ids) != 1:
            raise InvalidArgument("a cumulative acknowledgement names one message")
        assert self._connection is not None
        ack_type = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
        ids = [message_ids[0].to_proto()] if cumulative else ack_message_ids(message_ids)
        self._connection.write_command(wrap(pb.CommandAck(consumer_id=self._consumer_id, ack_type=ack_type,
                                                          message_id=ids)))
        self.last_used_s = time.monotonic()
        return True

    def redeliver(self, positions: Sequence[tuple[int, int]], *, unused: bool = False) -> bool:
        """Asks the broker to deliver these entries again (to any consumer, in shared
        modes). False when not connected (the broker redelivers everything this consumer
        held anyway when its connection went). ``unused``: they were never handed to an
        application (read ahead), so the broker does not count this as a delivery
        (Magnetar's extension of the command; a broker without it counts them)."""
        if not positions or not self.ready:
            return False
        assert self._connection is not None
        ids = [pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id) for ledger_id, entry_id in positions]
        if self.partition >= 0:
            for message_id in ids:
                message_id.partition = self.partition
        self._connection.write_command(wrap(pb.CommandRedeliverUnacknowledgedMessages(
            consumer_id=self._consumer_id, message_ids=ids, magnetar_unused=unused)))
        return True

    def redeliver_all(self) -> bool:
        """Asks the broker to deliver again everything this consumer holds
        unacknowledged (what exclusive and failover subscriptions do on a negative
        acknowledgement). False when not connected."""
        if not self.ready:
            return False
        assert self._connection is not None
        self._connection.write_command(wrap(pb.CommandRedeliverUnacknowledgedMessages(consumer_id=self._consumer_id)))
        return True

    async def last_message_id(self) -> MessageId:
        """The id of the topic's last stored entry (GET_LAST_MESSAGE_ID)."""
        connection = self._connected()
        request_id = connection.new_request_id()
        frame = await connection.request(wrap(pb.CommandGetLastMessageId(consumer_id=self._consumer_id,
                                                                         request_id=request_id)), request_id)
        last = frame.command.getLastMessageIdResponse.last_message_id
        batch_index = last.batch_index if last.HasField("batch_index") else -1
        return MessageId(last.ledgerId, last.entryId, self.partition, batch_index)

    async def seek(self, *, message_id: MessageId | None = None, publish_time_ms: int | None = None) -> None:
        """Moves the subscription (the broker disconnects its consumers, which subscribe
        again). Exactly one of the two is given."""
        if (message_id is None) == (publish_time_ms is None):
            raise InvalidArgument("seek takes a message id or a publish time")
        connection = self._connected()
        request_id = connection.new_request_id()
        body = pb.CommandSeek(consumer_id=self._consumer_id, request_id=request_id)
        if message_id is not None:
            body.message_id.CopyFrom(pb.MessageIdData(ledgerId=message_id.ledger_id, entryId=message_id.entry_id))
            if not self.durable:
                # A reader's subscription goes with its consumer: subscribing again
                # after the seek's disconnection must start where the seek said.
                self.start_message_id = message_id
        else:
            body.message_publish_time = publish_time_ms
        await connection.request(wrap(body), request_id)

    async def unsubscribe(self) -> None:
        """Deletes the subscription (this must be its only consumer), then closes."""
        connection = self._connected()
        request_id = connection.new_request_id()
        await connection.request(wrap(pb.CommandUnsubscribe(consumer_id=self._consumer_id, request_id=request_id)),
                                 request_id)
        await self.close()

    def _connected(self) -> ClientConnection:
        if self.closed:
            raise ServiceNotReady(f"consumer of {self.topic} is closed")
        if self.failure is not None:
            raise self.failure
        if not self.ready:
            raise ServiceNotReady(f"consumer of {self.topic} is reconnecting")
        assert self._connection is not None
        return self._connection

    # --- reconnecting -------------------------------------------------------------------------

    def _detach(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.unregister_consumer(self._consumer_id)
        self.permits_outstanding = 0
        if not self.closed:
            self.listener.on_disconnected()

    def _start_reconnect(self) -> None:
        if self.closed or self.failure is not None or self._reconnect_task is not None:
            return
        self._reconnect_task = asyncio.get_running_loop().create_task(
            self._reconnect(), name=f"reconnect consumer {self.topic} {self.subscription}")

    async def _reconnect(self) -> None:
        error: MagnetarError = ServiceNotReady(f"consumer of {self.topic} could not reconnect")
        try:
            attempt = 0
            while self.config.reconnect_attempts_left(attempt):
                wait_s = self.config.backoff_jittered_s(attempt, random.random())
                self.attempt_due_s = time.monotonic() + wait_s
                await asyncio.sleep(wait_s)
                self.reconnect_attempts += 1
                self.attempt_started_s = time.monotonic()
                attempt += 1
                try:
                    await self._subscribe()
                except MagnetarError as failure:
                    error = failure
                    log.log(logging.INFO if attempt <= RECONNECT_LOG_EVERY or attempt % RECONNECT_LOG_EVERY == 0
                            else logging.DEBUG, "consumer reconnection failed: topic=%s subscription=%s attempt=%d "
                            "error=%s", self.topic, self.subscription, attempt - 1, failure)
                    # Busy: the broker still holds our previous registration (it has not
                    # yet noticed the old connection close); it goes with that connection.
                    if not failure.retriable and not isinstance(failure, ConsumerBusy):
                        break
                    continue
                self.listener.on_reconnected()
                return
            log.warning("consumer failed for good: topic=%s subscription=%s error=%s", self.topic,
                        self.subscription, error)
            self.failure = error
            self.listener.on_failed(error)
        finally:
            self._reconnect_task = None

    # --- closing ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Detaches from the subscription (the broker redelivers what this consumer held
        unacknowledged)."""
        if self.closed:
            return
        self.closed = True
        if self._on_closed is not None:
            self._on_closed(self)
        await cancel_and_wait(self._reconnect_task)
        connection, self._connection = self._connection, None
        if connection is not None and not connection.closed:
            request_id = connection.new_request_id()
            try:
                await connection.request(wrap(pb.CommandCloseConsumer(consumer_id=self._consumer_id,
                                                                      request_id=request_id)), request_id)
            except MagnetarError as error:
                log.debug("close consumer failed: topic=%s error=%s", self.topic, error)
            connection.unregister_consumer(self._consumer_id)


def ack_message_ids(message_ids: Sequence[MessageId]) -> list[pb.MessageIdData]:
    """The MessageIdData of an individual ACK: one per entry; messages of one batch
    entry share it, with all their bits cleared from the batch's ack set."""
    by_entry: dict[tuple[int, int, int], list[MessageId]] = {}
    for message_id in message_ids:
        by_entry.setdefault((message_id.ledger_id, message_id.entry_id, message_id.partition), []).append(message_id)
    result = []
    for (ledger_id, entry_id, partition), ids in by_entry.items():
        data = pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)
        if partition >= 0:
            data.partition = partition
        batched = [m for m in ids if m.batch_index >= 0]
        if batched and len(batched) == len(ids):
            batch_size = batched[0].batch_size
            assert all(m.batch_size == batch_size for m in batched), ids
            data.batch_size = batch_size
            data.ack_set.extend(ack_set_without(batch_size, sorted({m.batch_index for m in batched})))
        result.append(data)
    return result
