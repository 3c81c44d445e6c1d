"""Producing over a connection: PRODUCER (creation, access modes, deduplication's last
sequence id), SEND (checks, back-pressure accounting, the receipt in the turn the
append settles), duplicates, checksum mismatches, CLOSE_PRODUCER, and closing a
producer from the broker's side after its earlier sends are answered.

Mixed into ``ServerConnection`` (broker/connection.py, the router), whose state
these methods use: ``service``, ``config``, ``peer``, ``role``, the per-connection
maps, ``write_command``, ``_write_error``, ``_start_task``, ``_refuse_if_too_many``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

from protocol import commands
from protocol.batch import message_count
from protocol.codec import Frame, PayloadChecksumMismatch
from broker.connection_transactions import has_txn
from broker import policy_enforcement, schemas, topic_policies
from broker.authorization import PRODUCE
from broker.deduplication import Verdict
from common.position import Position
from broker.producer import Producer
from broker.publish_limits import PendingSends
from protocol.proto import pulsar_api_pb2 as pb
from protocol.server_errors import server_error_for
from common.topic_name import TopicName
from common.errors import (
    ChecksumError,
    EncryptionRequired,
    ProducerBusy,
    MagnetarError,
    MalformedFrame,
)
from runtime.eager_future import call_when_done


if TYPE_CHECKING:
    from broker.topic import PersistentTopic

log = logging.getLogger(__name__)

# Producers closed by the broker whose late SENDs a connection drops silently (a client
# has at most a few producers per connection; older ones get NotAllowed errors again).
CLOSED_PRODUCERS_REMEMBERED = 1000
T = pb.BaseCommand


class ProducingHandlers:
    """Producers and their sends over the protocol (see the module)."""

    def _on_producer(self, frame: Frame) -> None:
        request = frame.command.producer
        if request.producer_id in self.producers:
            # A retry of a request that succeeded: answer it again.
            producer = self.producers[request.producer_id]
            self.write_command(commands.producer_success(request.request_id, producer.name))
            return
        if request.producer_id in self._pending_producers:
            return  # still being created; its answer will come
        if self._refuse_if_too_many(frame):
            return
        task = self._start_task(self._create_producer(request))
        self._pending_producers[request.producer_id] = task
        task.add_done_callback(
            lambda t, pid=request.producer_id: self._forget_pending(self._pending_producers, pid, t))

    async def _create_producer(self, request: pb.CommandProducer) -> None:
        schema_version = None
        try:
            topic_name = TopicName.parse(request.topic)
            await self.service.authorizer.check(self.role, topic_name, PRODUCE)
            topic = await self.service.get_topic(topic_name, create=True)
            policies = await self.service.resources.effective_policies(topic.name)
            if policies.encryption_required and not request.encrypted:
                raise EncryptionRequired(f"encryption is required in {topic.name.namespace_name}: "
                                         "the producer must encrypt its messages")
            producers_max = topic_policies.limit(policies.max_producers_per_topic,
                                                 self.config.producers_per_topic_max)
            if len(topic.producers) >= producers_max:
                raise ProducerBusy(f"topic {topic.full_name} has {len(topic.producers)} producers, the most allowed "
                                   f"({producers_max}: maxProducers, else the namespace's, else "
                                   "producers_per_topic_max)")
            if request.HasField("schema"):
                schema_version = schemas.encode_version(
                    await self._register_schema(topic.name, request.schema, consumer=False))
            name = request.producer_name or topic.generate_producer_name()
            producer = Producer(request.producer_id, name, topic.full_name, self,
                                user_provided_name=bool(request.producer_name),
                                access_mode=request.producer_access_mode,
                                metadata={kv.key: kv.value for kv in request.metadata})

            def on_queued() -> None:
                # WaitForExclusive: the client learns it is queued, and waits.
                self.write_command(commands.producer_success(request.request_id, name, producer_ready=False,
                                                             schema_version=schema_version))

            await topic.set_deduplication(await self.service.deduplication_enabled(topic.name))
            await self.service.check_producer_quota(topic)
            epoch = await topic.acquire_access(
                producer, request.topic_epoch if request.HasField("topic_epoch") else None, on_queued)
            # No await from here to the registration below: CLOSE_PRODUCER cancels
            # this task, and a cancellation must find the producer either not added
            # or registered (then detached), never added alone.
            try:
                topic.add_producer(producer)
            except MagnetarError:
                topic.release_access(producer)
                raise
        except MagnetarError as error:
            log.info("producer refused: peer=%s topic=%s error=%s", self.peer, request.topic, error)
            self._write_error(request.request_id, error)
            return
        if self.closed:
            topic.remove_producer(producer)
            return
        self.producers[request.producer_id] = producer
        self._producer_topics[request.producer_id] = topic
        self._closed_by_broker.pop(request.producer_id, None)
        last_sequence_id = -1
        if topic.dedup is not None:
            last_sequence_id = topic.dedup.last_sequence_id(name)
        self.write_command(commands.producer_success(request.request_id, name, schema_version=schema_version,
                                                     topic_epoch=epoch, last_sequence_id=last_sequence_id))
        log.info("producer created: peer=%s topic=%s producer=%s", self.peer, topic.full_name, name)

    def _on_send(self, frame: Frame) -> None:
        send = frame.command.send
        producer = self.producers.get(send.producer_id)
        topic = self._producer_topics.get(send.producer_id)
        if producer is None or topic is None:
            if send.producer_id in self._closed_by_broker:
                log.debug("send for a producer the broker closed, dropped: peer=%s producer_id=%d", self.peer,
                          send.producer_id)
                return
            self.write_command(commands.send_error(send.producer_id, send.sequence_id, pb.NotAllowedError,
                                                   "no such producer on this connection"))
            return
        assert frame.payload is not None
        if producer.closing:
            return   # the broker is closing it: the client resends this after reconnecting
        try:
            message_count(frame.payload.metadata)
        except MalformedFrame as error:
            # Refused before it is stored: an entry no consumer could be sent.
            log.info("send refused, invalid message metadata: peer=%s producer_id=%d sequence_id=%d error=%s",
                     self.peer, send.producer_id, send.sequence_id, error.message)
            self.write_command(commands.send_error(send.producer_id, send.sequence_id, pb.MetadataError,
                                                   f"invalid message metadata: {error.message}"))
            return
        if topic.backlog_size_quota is not None:
            refusal = policy_enforcement.send_refusal(topic, len(frame.payload.stored))
            if refusal is not None:
                # Before deduplication counts it: the SEND is neither stored nor seen.
                self.service.policy_counters.sends_refused += 1
                policy_enforcement.close_producer(topic, producer, refusal, self.service.policy_counters)
                return
        if topic.dedup is not None:
            verdict = topic.dedup.check(producer.name, send.sequence_id, send.highest_sequence_id)
            if verdict is not Verdict.NEW:
                self._answer_duplicate(producer, topic, send.sequence_id, send.highest_sequence_id)
                return
        # Copy out of the socket buffer once: this bytes object is the entry stored,
        # cached and dispatched from then on.
        payload = bytes(frame.payload.stored)
        if has_txn(send):
            try:
                future = self._publish_in_txn(producer, topic, payload, send)
            except MagnetarError as error:
                if topic.dedup is not None:
                    topic.dedup.on_store_failed(producer.name)
                self.write_command(commands.send_error(send.producer_id, send.sequence_id, server_error_for(error),
                                                       error.message))
                return
        else:
            future = topic.publish(producer, payload, send.num_messages)
        stages = self._stages
        if stages is not None:
            # From the bytes' arrival to the append: decoding, checks, and the frames
            # of the same read handled before this one.
            stages.observe("send_decode", time.perf_counter() - self._received_at)
        producer.last_send = future
        assert self._read_gate is not None, "a SEND before connection_made"
        size_bytes = len(payload)
        # Counted until answered; may stop reading this connection (never refuses it).
        scopes = self.service.publish_limits.on_send(self._read_gate, topic.full_name, size_bytes)
        if topic.publish_rate is not None:
            # The namespace's publish rate: stored all the same; reading waits out the debt.
            topic.publish_rate.on_publish(self._read_gate, max(1, send.num_messages), size_bytes)
        sequence_id = send.sequence_id
        highest = send.highest_sequence_id
        producer_id = send.producer_id
        arrived = time.perf_counter()
        name = producer.name
        # Inside the managed ledger's settling of the append (runtime/eager_future.py):
        # the receipt leaves in the turn the bookie's reply was read.
        call_when_done(future, lambda f: self._on_send_done(producer_id, sequence_id, highest, f, arrived, scopes,
                                                            size_bytes, topic=topic, producer_name=name))

    def _answer_duplicate(self, producer: Producer, topic: "PersistentTopic", sequence_id: int,
                          highest: int) -> None:
        """Deduplication: a SEND already stored gets a receipt with message id (-1, -1)
        and is not stored again. The answer waits for the producer's earlier sends, so
        receipts keep their order; a duplicate of a send whose outcome was unknown
        (still being written when it came) is answered by that outcome."""
        producer_id = producer.producer_id

        def answer(_previous: object = None) -> None:
            if producer_id not in self.producers:
                return
            dedup = topic.dedup
            if dedup is not None and sequence_id <= dedup.last_sequence_id(producer.name):
                self.write_command(commands.send_receipt(producer_id, sequence_id, 2**64 - 1, 2**64 - 1,
                                                         highest_sequence_id=highest))
            else:
                # The original failed: the client reconnects and sends it again.
                self.write_command(commands.send_error(producer_id, sequence_id, pb.PersistenceError,
                                                       "the earlier copy of this message was not stored"))

        previous = producer.last_send
        if isinstance(previous, asyncio.Future) and not previous.done():
            previous.add_done_callback(answer)
        else:
            answer()

    def _on_send_done(self, producer_id: int, sequence_id: int, highest: int, future: asyncio.Future[Position],
                      arrived: float, scopes: tuple[PendingSends, ...], size_bytes: int, *,
                      topic: "PersistentTopic | None" = None, producer_name: str = "") -> None:
        observe = self.service.on_publish_latency
        if observe is not None:
            observe(time.perf_counter() - arrived)
        self.service.publish_limits.on_send_done(scopes, size_bytes)
        if topic is not None and topic.dedup is not None:
            if not future.cancelled() and future.exception() is None:
                topic.on_stored(producer_name, sequence_id, highest, future.result())
            else:
                topic.dedup.on_store_failed(producer_name)
        if producer_id not in self.producers:
            return  # closed meanwhile (the client resends what it did not get receipts for)
        error = future.exception()
        if error is None:
            position = future.result()
            self.write_command(commands.send_receipt(producer_id, sequence_id, position.ledger_id,
                                                     position.entry_id, highest_sequence_id=highest))
        else:
            message = error.message if isinstance(error, MagnetarError) else str(error)
            self.write_command(commands.send_error(producer_id, sequence_id, server_error_for(error), message))

    def _on_checksum_mismatch(self, error: PayloadChecksumMismatch) -> None:
        command = error.command
        if command is None or command.type != T.SEND:
            raise MalformedFrame(str(error))
        send = command.send
        log.info("payload checksum mismatch on send: peer=%s producer_id=%d sequence_id=%d",
                 self.peer, send.producer_id, send.sequence_id)
        self.write_command(commands.send_error(send.producer_id, send.sequence_id, server_error_for(
            ChecksumError("")), "payload checksum mismatch"))

    def _on_close_producer(self, frame: Frame) -> None:
        request = frame.command.close_producer
        pending = self._pending_producers.pop(request.producer_id, None)
        if pending is not None:
            # Still being created: stop that (as Pulsar fails the producer's future);
            # the PRODUCER request is not answered, the client gave up on it.
            pending.cancel()
        self._detach_producer(request.producer_id)
        self.write_command(commands.success(request.request_id))

    def _detach_producer(self, producer_id: int) -> None:
        producer = self.producers.pop(producer_id, None)
        topic = self._producer_topics.pop(producer_id, None)
        if producer is not None and topic is not None:
            producer.closed = True
            topic.remove_producer(producer)

    def close_producer_after_sends(self, producer: Producer, on_closed: Callable[[], None]) -> None:
        """Closes ``producer`` from the broker's side once its earlier SENDs are
        answered, so their receipts reach the client before CLOSE_PRODUCER; SENDs that
        arrive meanwhile are dropped unanswered (the client resends them after it
        reconnects). ``on_closed`` runs when CLOSE_PRODUCER is written."""
        producer.closing = True

        def close(_previous: object = None) -> None:
            if self.producers.get(producer.producer_id) is not producer:
                return   # closed by the client or the connection meanwhile
            self.write_command(commands.close_producer(producer.producer_id))
            self.forget_producer(producer)
            on_closed()

        previous = producer.last_send
        if isinstance(previous, asyncio.Future) and not previous.done():
            previous.add_done_callback(close)   # after _on_send_done, which wrote the receipt
        else:
            close()

    def forget_producer(self, producer: Producer) -> None:
        """The broker closed this producer (CLOSE_PRODUCER was sent)."""
        self.producers.pop(producer.producer_id, None)
        self._producer_topics.pop(producer.producer_id, None)
        self._closed_by_broker[producer.producer_id] = None
        while len(self._closed_by_broker) > CLOSED_PRODUCERS_REMEMBERED:
            self._closed_by_broker.popitem(last=False)
