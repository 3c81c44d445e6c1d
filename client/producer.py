"""A producer on one topic (or one partition of a partitioned topic).

Theory of operation:
- ``send`` stores one message as one entry; ``send_batch`` stores many messages as one
  batch entry (one SEND, one bookie write, one receipt: the way to throughput). Each
  returns one future, resolved with the message id (a batch: the list of ids) once the
  broker's receipt says the entry is durable, or failed with a catalogue error.
- Sequence ids increase by one per message; a batch carries its first and highest.
  Sends wait for their receipts in ``_pending`` (by first sequence id, in send order),
  at most ``producer_pending_messages_max`` messages: past it a send fails at once with
  TooManyRequests, so a caller that outpaces the broker is told to back off instead of
  growing memory.
- Reconnection: CLOSE_PRODUCER (topic unloaded, broker stopping), a lost connection or
  a retriable SEND_ERROR make the producer look the topic up again and register anew
  under the same name, then send every pending entry again, in order. Attempts wait a
  jittered exponential back-off (``backoff_jittered_s``) and go on until the producer
  is closed, or, with ``reconnect_attempts_max`` set, until that many failed in a row:
  then every pending send fails with ServiceNotReady and the producer is failed for
  good (its owner makes another). A non-retriable refusal (fenced, not authorized...)
  fails it at once. The one task doing it belongs to the producer; ``close`` stops it.
- A caller that stops waiting for an entry cancels its future: the entry is dropped
  from the pending ones before they are sent again and whenever they are full, so it
  is never sent again (one written before may still be stored). So pending state
  stays bounded through an outage of any length once callers time out. (Dropped
  lazily: a callback per entry would cost every send.)
- At-least-once: an entry stored whose receipt was lost with the connection is sent
  again and stored twice (the broker keeps no de-duplication state).
"""

from __future__ import annotations

import asyncio
import random
import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from common.errors import InvalidArgument, MagnetarError, OperationTimeout, ProducerBusy, ServiceNotReady, ShuttingDown, TooManyRequests
from runtime.tasks import cancel_and_wait
from common.topic_name import TopicName
from protocol.codec import Frame, encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import error_for_server_error

from client.compression import CODECS, compress
from client.config import RECONNECT_LOG_EVERY
from client.connection import ClientConnection
from client.pool import BrokerPool
from client.messages import MessageId, OutgoingMessage, batch_payload, single_metadata


log = logging.getLogger(__name__)

T = pb.BaseCommand


@dataclass(slots=True)
class _PendingSend:
    sequence_id: int
    count: int
    batched: bool
    metadata: pb.MessageMetadata
    payload: bytes
    # One future per entry: a MessageId, or for a batch the list of its messages' ids
    # (one future per message costs a callback each; a batch of 100 is one entry).
    future: asyncio.Future


class Producer:
    def __init__(self, pool: BrokerPool, topic: str, *, producer_name: str = "",
                 access_mode: int = pb.Shared, schema: pb.Schema | None = None, compression: int = pb.NONE,
                 resume_sequence_ids: bool = False,
                 on_closed: Callable[["Producer"], None] | None = None) -> None:
        if compression != pb.NONE and compression not in CODECS:
            raise InvalidArgument(f"unknown compression type {compression}")
        self.pool = pool
        self.config = pool.config
        self.topic = topic
        self.partition = TopicName.parse(topic).partition_index
        self.producer_name = producer_name
        # How this producer shares the topic (Shared, Exclusive, WaitForExclusive,
        # ExclusiveWithFencing), the schema it registers, and the codec of its entries.
        self.access_mode = access_mode
        self.schema = schema
        self.compression = compression
        # Whether a producer that has sent nothing yet numbers its messages on from the
        # last sequence id the broker stored under its name (deduplication on).
        self.resume_sequence_ids = resume_sequence_ids
        self._on_closed = on_closed
        self._connection: ClientConnection | None = None
        self._producer_id = 0
        self._next_sequence_id = 0
        # The version the broker gave this producer's schema (PRODUCER_SUCCESS), written
        # into every message's metadata as Pulsar's clients do: a consumer reads a
        # message with the writer's schema of that version.
        self.schema_version = b""
        self._pending: collections.OrderedDict[int, _PendingSend] = collections.OrderedDict()
        self._pending_messages = 0
        self._reconnect_task: asyncio.Task[None] | None = None
        self.failure: MagnetarError | None = None
        self.closed = False
        self.last_used_s = time.monotonic()
        # Observability: reconnection attempts made (all time), when the attempt that
        # led to the current registration began, and when that registration completed
        # (time.monotonic(); 0.0 before the first reconnection).
        self.reconnect_attempts = 0
        self.attempt_due_s = 0.0           # when the latest attempt was to begin (its wait drawn)
        self.attempt_started_s = 0.0
        self.registered_s = 0.0

    # --- connecting ------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._register()

    async def _register(self) -> None:
        connection = await self.pool.connection_for(self.topic)
        producer_id = connection.register_producer(self)
        request_id = connection.new_request_id()
        body = pb.CommandProducer(topic=self.topic, producer_id=producer_id, request_id=request_id)
        if self.producer_name:
            body.producer_name = self.producer_name
        if self.access_mode != pb.Shared:
            body.producer_access_mode = self.access_mode
        if self.schema is not None:
            body.schema.CopyFrom(self.schema)
        try:
            frame = await connection.request(wrap(body), request_id)
        except BaseException as error:
            connection.unregister_producer(producer_id)
            if isinstance(error, (asyncio.CancelledError, OperationTimeout)) and not connection.closed:
                # The broker may have registered it without our seeing the answer:
                # undo that (an exclusive producer would hold the topic). Not awaited.
                connection.write_command(wrap(pb.CommandCloseProducer(producer_id=producer_id,
                                                                      request_id=connection.new_request_id())))
            raise
        success = frame.command.producer_success
        self.producer_name = success.producer_name
        self.schema_version = success.schema_version if success.HasField("schema_version") else b""
        if self.resume_sequence_ids and success.last_sequence_id >= 0 and self._next_sequence_id == 0 \
                and not self._pending:
            self._next_sequence_id = success.last_sequence_id + 1
        self._connection, self._producer_id = connection, producer_id
        self.registered_s = time.monotonic()
        self._drop_abandoned()
        for pending in self._pending.values():
            connection.write_frame(self._frame(pending))
        log.debug("producer ready: topic=%s producer=%s resent=%d", self.topic, self.producer_name, len(self._pending))

    @property
    def ready(self) -> bool:
        return self._connection is not None and not self._connection.closed

    @property
    def pending_messages(self) -> int:
        return self._pending_messages

    # --- sending ---------------------------------------------------------------------------------

    def set_next_sequence_id(self, sequence_id: int) -> None:
        """Numbers the following messages from ``sequence_id`` on (ids only grow): for a
        writer that names each message itself, so that a retry sends the same ids and
        the broker's deduplication drops what it already stored."""
        if sequence_id < self._next_sequence_id:
            raise InvalidArgument(f"sequence id {sequence_id} is below the next one, {self._next_sequence_id}")
        self._next_sequence_id = sequence_id

    def send(self, message: OutgoingMessage) -> asyncio.Future[MessageId]:
        """Stores ``message`` alone in one entry; the future gives its id."""
        self._check_can_send(1)
        sequence_id = self._next_sequence_id
        metadata = single_metadata(self.producer_name, sequence_id, _now_ms(), message)
        return self._enqueue(sequence_id, 1, False, metadata, self._compressed(metadata, message.payload))

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> asyncio.Future[list[MessageId]]:
        """Stores ``messages`` as one batch entry; the future gives their ids, which
        share the entry and differ by batch index."""
        if not messages:
            raise InvalidArgument("a batch holds at least one message")
        if len(messages) > self.config.batch_messages_max:
            raise InvalidArgument(f"a batch holds at most {self.config.batch_messages_max} messages")
        self._check_can_send(len(messages))
        sequence_id = self._next_sequence_id
        metadata, payload = batch_payload(self.producer_name, sequence_id, _now_ms(), messages)
        if len(payload) > self.config.batch_bytes_max:
            raise InvalidArgument(f"a batch of {len(payload)} bytes exceeds {self.config.batch_bytes_max}")
        return self._enqueue(sequence_id, len(messages), True, metadata, self._compressed(metadata, payload))

    def _compressed(self, metadata: pb.MessageMetadata, payload: bytes) -> bytes:
        if self.compression == pb.NONE:
            return payload
        metadata.compression = self.compression
        metadata.uncompressed_size = len(payload)
        return compress(self.compression, payload)

    def _check_can_send(self, count: int) -> None:
        if self.closed:
            raise ShuttingDown(f"producer of {self.topic} is closed")
        if self.failure is not None:
            raise self.failure
        if self._pending_messages + count > self.config.producer_pending_messages_max:
            self._drop_abandoned()
        if self._pending_messages + count > self.config.producer_pending_messages_max:
            raise TooManyRequests(f"producer of {self.topic} has {self._pending_messages} messages awaiting "
                                  f"receipts (limit {self.config.producer_pending_messages_max})")

    def _enqueue(self, sequence_id: int, count: int, batched: bool, metadata: pb.MessageMetadata,
                 payload: bytes) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        pending = _PendingSend(sequence_id, count, batched, metadata, payload, future)
        self._pending[sequence_id] = pending
        self._pending_messages += count
        self._next_sequence_id += count
        self.last_used_s = time.monotonic()
        if self.ready:
            assert self._connection is not None
            self._connection.write_frame(self._frame(pending))
        return future

    def _drop_abandoned(self) -> None:
        """Drops the pending entries whose callers gave up on them (cancelled their
        futures): before sending the pending ones again, and when they would refuse a
        send. Receipts, errors and closing pop their entries before settling them, so
        a done future here is a cancelled one."""
        if any(pending.future.done() for pending in self._pending.values()):
            self._pending = collections.OrderedDict(
                (key, pending) for key, pending in self._pending.items() if not pending.future.done())
            self._pending_messages = sum(pending.count for pending in self._pending.values())

    def _frame(self, pending: _PendingSend) -> bytes:
        # The producer name in stored metadata must be the broker's, which a producer
        # created without one learns only from PRODUCER_SUCCESS.
        if pending.metadata.producer_name != self.producer_name:
            pending.metadata.producer_name = self.producer_name
        if self.schema_version and pending.metadata.schema_version != self.schema_version:
            pending.metadata.schema_version = self.schema_version
        send = pb.CommandSend(producer_id=self._producer_id, sequence_id=pending.sequence_id,
                              num_messages=pending.count)
        if pending.batched:
            send.highest_sequence_id = pending.sequence_id + pending.count - 1
        return encode_payload_command(wrap(send), pending.metadata, pending.payload)

    async def drain(self) -> None:
        """Waits while the connection's write buffer is full (backpressure)."""
        if self._connection is not None:
            await self._connection.drain()

    # --- frames in -----------------------------------------------------------------------------

    def on_frame(self, frame: Frame) -> None:
        command = frame.command
        if command.type == T.SEND_RECEIPT:
            self._on_receipt(command.send_receipt)
        elif command.type == T.SEND_ERROR:
            self._on_send_error(command.send_error)
        elif command.type == T.CLOSE_PRODUCER:
            log.info("broker closed producer, reconnecting: topic=%s producer=%s", self.topic, self.producer_name)
            self._detach()
            self._start_reconnect()

    def _on_receipt(self, receipt: pb.CommandSendReceipt) -> None:
        pending = self._pending.pop(receipt.sequence_id, None)
        if pending is None:
            return   # a receipt for a send resent after a reconnection: already answered
        self._pending_messages -= pending.count
        ledger_id, entry_id = receipt.message_id.ledgerId, receipt.message_id.entryId
        if pending.future.done():
            return
        if pending.batched:
            # tuple.__new__ straight: a NamedTuple's own __new__ is a Python-level
            # wrapper, a third of this per-message cost.
            make, partition, count = tuple.__new__, self.partition, pending.count
            pending.future.set_result([make(MessageId, (ledger_id, entry_id, partition, index, count))
                                       for index in range(count)])
        else:
            pending.future.set_result(MessageId(ledger_id, entry_id, self.partition))

    def _on_send_error(self, send_error: pb.CommandSendError) -> None:
        error = error_for_server_error(send_error.error, send_error.message)
        if error.retriable:
            log.info("send failed, reconnecting to send again: topic=%s sequence_id=%d error=%s", self.topic,
                     send_error.sequence_id, error)
            connection = self._connection
            if connection is not None:
                # The broker still has this producer (and its name) on the connection:
                # close it first. Commands on one connection are handled in order, so
                # the new PRODUCER comes after this close.
                connection.unregister_producer(self._producer_id)
                connection.write_command(wrap(pb.CommandCloseProducer(producer_id=self._producer_id,
                                                                      request_id=connection.new_request_id())))
            self._detach()
            self._start_reconnect()
            return
        pending = self._pending.pop(send_error.sequence_id, None)
        if pending is None:
            return
        self._pending_messages -= pending.count
        _fail(pending.future, error)

    def on_connection_lost(self) -> None:
        self._detach()
        self._start_reconnect()

    # --- reconnecting --------------------------------------------------------------------------

    def _detach(self) -> None:
        self._connection = None

    def _start_reconnect(self) -> None:
        if self.closed or self.failure is not None or self._reconnect_task is not None:
            return
        self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect(),
                                                                      name=f"reconnect producer {self.topic}")

    async def _reconnect(self) -> None:
        error: MagnetarError = ServiceNotReady(f"producer of {self.topic} could not reconnect")
        try:
            attempt = 0
            while self.config.reconnect_attempts_left(attempt):
                wait_s = self.config.backoff_jittered_s(attempt, random.random())
                self.attempt_due_s = time.monotonic() + wait_s
                await asyncio.sleep(wait_s)
                self.reconnect_attempts += 1
                self.attempt_started_s = time.monotonic()
                try:
                    await self._register()
                    return
                except MagnetarError as failure:
                    error = failure
                    log.log(logging.INFO if attempt < RECONNECT_LOG_EVERY or attempt % RECONNECT_LOG_EVERY == 0
                            else logging.DEBUG, "producer reconnection failed: topic=%s attempt=%d error=%s",
                            self.topic, attempt, failure)
                    # Busy: the broker still holds our previous registration (it has not
                    # yet noticed the old connection close); it goes with that connection.
                    if not failure.retriable and not isinstance(failure, ProducerBusy):
                        break
                attempt += 1
            self._give_up(error)
        finally:
            self._reconnect_task = None

    def _give_up(self, error: MagnetarError) -> None:
        log.warning("producer failed for good: topic=%s producer=%s pending=%d error=%s", self.topic,
                    self.producer_name, self._pending_messages, error)
        self.failure = error if error.retriable else ServiceNotReady(str(error))
        self._fail_pending(self.failure)

    def _fail_pending(self, error: MagnetarError) -> None:
        pending, self._pending = self._pending, collections.OrderedDict()
        self._pending_messages = 0
        for send in pending.values():
            _fail(send.future, error)

    # --- closing -----------------------------------------------------------------------------------

    async def close(self) -> None:
        """Unregisters from the broker; sends still awaiting receipts fail with
        ShuttingDown (call after their futures are done for a clean close)."""
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
                await connection.request(wrap(pb.CommandCloseProducer(producer_id=self._producer_id,
                                                                      request_id=request_id)), request_id)
            except MagnetarError as error:
                log.debug("close producer failed: topic=%s error=%s", self.topic, error)
            connection.unregister_producer(self._producer_id)
        self._fail_pending(ShuttingDown(f"producer of {self.topic} closed"))


def _fail(future: asyncio.Future, error: MagnetarError) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()   # marked retrieved: a caller that gave up must not cause a warning


def _now_ms() -> int:
    return int(time.time() * 1000)
