"""The user's consumer: one subscription over one topic, a partitioned topic's
partitions, a list of topics or the topics a pattern matches, read through a bounded
queue with ``receive``, ``batch_receive`` or ``async for``.

Theory of operation:
- One partition consumer (client/consumer.py) per topic or partition, each a
  ``_Source`` feeding one queue. Each source is granted ``receiver_queue_size``
  permits when it subscribes; messages taken from the queue are granted again in
  halves. So the queue holds at most ``receiver_queue_size`` messages per source (and
  one batch over it): memory is bounded by the permits, as in the official clients.
- Acknowledgements are grouped: ids gathered for ``ack_group_time_ms`` (or 1,000 of
  them) go in one ACK per source, without a receipt, as the official clients do. A
  message of a batch entry is acknowledged when every message of its entry delivered
  here was: the entry is then acknowledged whole (brokers without batch-index
  acknowledgements understand that). ``acknowledge_cumulative`` acknowledges
  everything up to a message at once.
- ``negative_acknowledge`` has the message's entry delivered again after
  ``negative_ack_redelivery_delay_ms``, or, with a ``negative_ack_redelivery_backoff``,
  after a delay growing with the message's redelivery count; with ``unacked_messages_timeout_ms``, entries
  handed out and not acknowledged within it are delivered again. Shared and
  key-shared subscriptions name the entries; exclusive and failover ones ask for all
  unacknowledged (the broker's rule for them), dropping what the queue held of that
  source, which comes again.
- With a ``dead_letter_policy``, an entry delivered ``max_redeliver_count`` times
  already is not handed out: its messages are produced to the dead-letter topic and
  then acknowledged.
- A lost connection or a broker closing the consumer: the source's queued messages
  are dropped (the broker delivers them again) and the partition consumer reconnects
  with jittered back-off, without end until closed. Acknowledgements made meanwhile are
  kept (at most ACKS_HELD_MAX) and sent once subscribed again, before its permits are
  granted again, so the broker does not deliver those messages again.
- Pattern subscriptions look for new matching topics every
  ``pattern_auto_discovery_period`` seconds.
- With a ``message_listener``, one task of the consumer's takes the messages from the
  queue in order and calls ``listener(consumer, message)`` for each, awaiting what it
  returns when that is awaitable (an ``async def``): one message at a time, as the
  official client's listener thread does per consumer. An exception from the listener
  is logged and the message left unacknowledged (the listener acknowledges, or
  negatively acknowledges, itself). ``receive`` and its kin are refused meanwhile.
  ``pause_message_listener`` stops the calls (the queue fills to its bound and the
  broker stops sending); ``close`` cancels the task, a call in progress with it.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import inspect
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from common.errors import InvalidArgument, MagnetarError, OperationTimeout, ShuttingDown
from runtime.tasks import cancel_and_wait, every

from client.consumer import Consumer as PartitionConsumer
from client.messages import MessageId, OutgoingMessage, ReceivedEntry, ReceivedMessage
from client.schema import Schema

log = logging.getLogger(__name__)

# ``listener(consumer, message)``: returns None, or an awaitable the consumer awaits.
MessageListener = Callable[["Consumer", "Message"], Any]

ACK_GROUP_IDS_MAX = 1_000
# Acknowledgements made while a source is disconnected, kept for its reconnection: a
# bound on memory through a long outage (past it the oldest are dropped, and those
# messages are delivered again: at-least-once).
ACKS_HELD_MAX = 10_000
# Dead-letter sends in flight per consumer at most (each holds one entry's messages).
DEAD_LETTER_SENDS_MAX = 100


class ConsumerType(enum.Enum):
    Exclusive = "exclusive"
    Shared = "shared"
    Failover = "failover"
    KeyShared = "key_shared"


class InitialPosition(enum.Enum):
    Latest = "latest"
    Earliest = "earliest"


@dataclass(frozen=True)
class DeadLetterPolicy:
    """After ``max_redeliver_count`` deliveries, a message goes to ``dead_letter_topic``
    (default: ``<topic>-<subscription>-DLQ``, Pulsar's name)."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if self.max_redeliver_count <= 0:
            raise InvalidArgument("max_redeliver_count must be > 0")


@dataclass(frozen=True)
class MultiplierRedeliveryBackoff:
    """Negative-ack back-off (the Java client's MultiplierRedeliveryBackoff): a message
    negatively acknowledged after ``n`` redeliveries comes again after
    ``min(min_delay_ms × multiplier ** n, max_delay_ms)``."""

    min_delay_ms: int = 1_000
    max_delay_ms: int = 60_000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.min_delay_ms <= self.max_delay_ms:
            raise InvalidArgument("need 0 < min_delay_ms <= max_delay_ms")
        if self.multiplier < 1:
            raise InvalidArgument("multiplier must be >= 1")

    def delay_ms(self, redelivery_count: int) -> int:
        exponent = min(max(redelivery_count, 0), 64)     # past 64 doublings it is max_delay_ms anyway
        return int(min(self.min_delay_ms * self.multiplier ** exponent, self.max_delay_ms))


class Message:
    """One message received (the official client's ``pulsar.Message`` methods)."""

    __slots__ = ("_received", "_source", "_schema", "_redelivery_count", "_generation")

    def __init__(self, received: ReceivedMessage, source: "_Source", schema: Schema, redelivery_count: int,
                 generation: int = 0) -> None:
        self._received = received
        self._source = source
        self._schema = schema
        self._redelivery_count = redelivery_count
        self._generation = generation      # the source's connection it came on (void once it is gone)

    def data(self) -> bytes:
        return self._received.payload

    def value(self) -> Any:
        return self._schema.decode(self._received.payload)

    def properties(self) -> dict[str, str]:
        return self._received.properties

    def partition_key(self) -> str:
        return self._received.key or ""

    def ordering_key(self) -> str:
        return (self._received.ordering_key or b"").decode(errors="replace")

    def publish_timestamp(self) -> int:
        return self._received.publish_time_ms

    def event_timestamp(self) -> int:
        return self._received.event_time_ms

    def message_id(self) -> MessageId:
        return self._received.message_id

    def topic_name(self) -> str:
        return self._source.topic

    def redelivery_count(self) -> int:
        return self._redelivery_count

    def producer_name(self) -> str:
        return self._received.producer_name

    def sequence_id(self) -> int:
        return self._received.sequence_id

    def __repr__(self) -> str:
        return f"Message(topic={self._source.topic!r}, id={self._received.message_id})"


class _Source:
    """One partition consumer's listener: its entries into the owner's queue."""

    def __init__(self, owner: "Consumer", topic: str) -> None:
        self.owner = owner
        self.topic = topic
        self.low: PartitionConsumer | None = None
        self.taken = 0                       # messages taken from the queue since the last FLOW
        self.generation = 0                  # bumped at each disconnection: queued messages of older ones are void
        # (ledger_id, entry_id) -> [messages delivered and not acknowledged, handed-out time or 0]
        self.entries: dict[tuple[int, int], list] = {}

    def on_entry(self, entry: ReceivedEntry) -> None:
        self.owner._on_entry(self, entry)

    def on_disconnected(self) -> None:
        self.generation += 1
        self.taken = 0
        self.entries.clear()
        self.owner._drop_queued(self)

    def on_reconnected(self) -> None:
        assert self.low is not None
        # Acknowledgements made while disconnected go first: the broker handles a
        # connection's commands in order, so it has them before the FLOW lets it
        # dispatch, and does not deliver those messages again.
        self.owner._flush_acks(self)
        self.low.flow(self.owner.receiver_queue_size)

    def on_failed(self, error: MagnetarError) -> None:
        self.owner._on_failed(self, error)


class Consumer:
    def __init__(self, client, subscription: str, consumer_type: ConsumerType, schema: Schema, *,
                 receiver_queue_size: int, ack_group_time_ms: int, negative_ack_redelivery_delay_ms: int,
                 unacked_messages_timeout_ms: int | None, dead_letter_policy: DeadLetterPolicy | None,
                 make_source: Callable[["Consumer", str], Awaitable[_Source]], pattern: re.Pattern | None,
                 pattern_namespace: str, pattern_auto_discovery_period: float,
                 message_filter: Callable[[ReceivedMessage], bool] | None = None,
                 message_listener: MessageListener | None = None,
                 negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None = None) -> None:
        if receiver_queue_size <= 0:
            raise InvalidArgument("receiver_queue_size must be > 0")
        if unacked_messages_timeout_ms is not None and unacked_messages_timeout_ms < 1000:
            raise InvalidArgument("unacked_messages_timeout_ms must be >= 1000 (the official client's minimum)")
        self._client = client
        self._subscription = subscription
        self.consumer_type = consumer_type
        self.schema = schema
        self.receiver_queue_size = receiver_queue_size
        self.ack_group_time_s = ack_group_time_ms / 1000
        self.nack_delay_s = negative_ack_redelivery_delay_ms / 1000
        self.nack_backoff = negative_ack_redelivery_backoff
        self.ack_timeout_s = unacked_messages_timeout_ms / 1000 if unacked_messages_timeout_ms else None
        self.dead_letter_policy = dead_letter_policy
        self._make_source = make_source
        self._pattern = pattern
        self._pattern_namespace = pattern_namespace
        self._pattern_period_s = pattern_auto_discovery_period
        self._filter = message_filter
        self._sources: dict[str, _Source] = {}
        self._queue: collections.deque[Message] = collections.deque()
        # A source asks for more messages once this many of its own were taken.
        self._flow_after = max(1, receiver_queue_size // 2)
        self._arrived = asyncio.Event()
        self._acks: dict[_Source, list[MessageId]] = {}
        self._nacks: list[tuple[float, _Source, tuple[int, int]]] = []
        self._dead_letter_sends: set[asyncio.Task] = set()
        self._dead_letter_producer = None
        self._tasks: list[asyncio.Task] = []
        self._failure: MagnetarError | None = None
        self._closed = False
        if message_listener is not None and not callable(message_listener):
            raise InvalidArgument("message_listener must be callable: listener(consumer, message)")
        self._listener = message_listener
        self._listening = asyncio.Event()
        self._listening.set()

    async def _start(self, topics: Sequence[str]) -> None:
        try:
            for topic in topics:
                await self._add_source(topic)
        except BaseException:
            await self.close()
            raise
        loop = asyncio.get_running_loop()
        tick_s = min(0.1, self.ack_group_time_s) if self.ack_group_time_s > 0 else 0.1
        self._tasks.append(loop.create_task(every(tick_s, self._on_tick), name=f"consumer {self._subscription}"))
        if self._pattern is not None:
            self._tasks.append(loop.create_task(every(self._pattern_period_s, self._on_discovery_tick),
                                                name=f"pattern {self._pattern.pattern}"))
        if self._listener is not None:
            self._tasks.append(loop.create_task(self._run_listener(), name=f"listener {self._subscription}"))

    async def _add_source(self, topic: str) -> None:
        source = await self._make_source(self, topic)
        self._sources[topic] = source
        assert source.low is not None
        source.low.flow(self.receiver_queue_size)

    # --- about --------------------------------------------------------------------------------

    def topic(self) -> str:
        return ",".join(self._sources)

    def topics(self) -> list[str]:
        return list(self._sources)

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        first = next(iter(self._sources.values()), None)
        return first.low.consumer_name if first is not None and first.low is not None else ""

    def is_connected(self) -> bool:
        return all(s.low is not None and s.low.ready for s in self._sources.values())

    # --- entries in ---------------------------------------------------------------------------

    def _on_entry(self, source: _Source, entry: ReceivedEntry) -> None:
        messages = entry.messages
        if self._filter is not None:
            kept = tuple(m for m in messages if self._filter(m))
            if len(kept) != len(messages):
                self._taken(source, len(messages) - len(kept))
                if not kept:
                    return
                messages = kept
        policy = self.dead_letter_policy
        if policy is not None and entry.redelivery_count >= policy.max_redeliver_count:
            self._taken(source, len(messages))
            self._dead_letter(source, entry, messages)
            return
        source.entries[entry.position] = [len(messages), 0.0]
        generation = source.generation
        schema = self.schema
        redelivery_count = entry.redelivery_count
        self._queue.extend([Message(m, source, schema, redelivery_count, generation) for m in messages])
        self._arrived.set()

    def _drop_queued(self, source: _Source) -> None:
        # The broker delivers again whatever this source held; its queued messages go.
        if any(message._source is source for message in self._queue):
            self._queue = collections.deque(message for message in self._queue if message._source is not source)

    def _on_failed(self, source: _Source, error: MagnetarError) -> None:
        self._failure = error
        self._arrived.set()

    def _taken(self, source: _Source, count: int) -> None:
        source.taken += count
        if source.taken >= self._flow_after and source.low is not None:
            if source.low.flow(source.taken):
                source.taken = 0

    # --- receiving ----------------------------------------------------------------------------

    def _pop(self) -> Message | None:
        while self._queue:
            message = self._queue.popleft()
            source = message._source
            if message._generation != source.generation:
                continue
            source.taken += 1
            if source.taken >= self._flow_after:
                self._taken(source, 0)
            if self.ack_timeout_s is not None:
                state = source.entries.get(message._received.message_id.position)
                if state is not None and not state[1]:
                    state[1] = time.monotonic()
            return message
        return None

    async def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; OperationTimeout (pulsar's Timeout) after ``timeout_millis``."""
        self._check_no_listener()
        # A message already queued is handed over without a second coroutine (the
        # drain's every call): _receive is for waiting.
        message = self._pop()
        if message is not None:
            return message
        return await self._receive(timeout_millis)

    def _check_no_listener(self) -> None:
        if self._listener is not None:
            raise InvalidArgument("this consumer has a message_listener: it is handed the messages, "
                                  "receive is not allowed")

    async def _receive(self, timeout_millis: int | None) -> Message:
        message = self._pop()
        if message is not None:
            return message
        try:
            async with asyncio.timeout(timeout_millis / 1000 if timeout_millis is not None else None):
                while True:
                    self._check_open()
                    self._arrived.clear()
                    await self._arrived.wait()
                    message = self._pop()
                    if message is not None:
                        return message
        except TimeoutError:
            raise OperationTimeout(f"no message within {timeout_millis} ms") from None

    async def batch_receive(self, max_num_messages: int = 100, timeout_ms: int = 100,
                            max_num_bytes: int = 10 * 1024 * 1024) -> list[Message]:
        """Up to ``max_num_messages`` messages (or ``max_num_bytes``): what came within
        ``timeout_ms``, possibly none."""
        self._check_no_listener()
        if max_num_messages <= 0 or max_num_bytes <= 0:
            raise InvalidArgument("batch_receive limits must be positive")
        batch: list[Message] = []
        size_bytes = 0
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                while len(batch) < max_num_messages and size_bytes < max_num_bytes:
                    message = self._pop()
                    if message is None:
                        self._check_open()
                        self._arrived.clear()
                        await self._arrived.wait()
                        continue
                    batch.append(message)
                    size_bytes += len(message._received.payload)
        except TimeoutError:
            pass
        return batch

    # --- the message listener -------------------------------------------------------------------

    def pause_message_listener(self) -> None:
        """Stops handing messages to the listener (after the call in progress); the queue
        fills to ``receiver_queue_size`` and the broker then stops sending."""
        self._listening.clear()

    def resume_message_listener(self) -> None:
        self._listening.set()

    async def _run_listener(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            await self._listening.wait()
            try:
                message = await self._receive(None)
            except MagnetarError as error:      # closed, or failed for good
                if not self._closed:
                    log.warning("message listener stopped: subscription=%s error=%s", self._subscription, error)
                return
            # Paused while this one was awaited: it waits here (one message held).
            await self._listening.wait()
            try:
                result = listener(self, message)
                if inspect.isawaitable(result):
                    await result
            except Exception:     # the user's code: logged, the message left unacknowledged
                log.exception("message listener failed, message left unacknowledged: subscription=%s "
                              "topic=%s id=%s", self._subscription, message.topic_name(), message.message_id())

    def _check_open(self) -> None:
        if self._closed:
            raise ShuttingDown(f"consumer of {self._subscription} is closed")
        if self._failure is not None:
            raise self._failure

    def __aiter__(self) -> "Consumer":
        return self

    async def __anext__(self) -> Message:
        if self._closed:
            raise StopAsyncIteration
        try:
            return await self.receive()
        except ShuttingDown:
            raise StopAsyncIteration from None

    # --- acknowledging ------------------------------------------------------------------------

    def _source_of(self, message: Message | MessageId) -> tuple[_Source, MessageId]:
        if isinstance(message, Message):
            return message._source, message._received.message_id
        sources = [s for s in self._sources.values() if s.low is not None and s.low.partition == message.partition]
        if len(sources) != 1:
            raise InvalidArgument("acknowledge a Message (not a bare id) on a consumer of several topics")
        return sources[0], message

    async def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledges one message (sent grouped within ``ack_group_time_ms``)."""
        self.acknowledge_nowait(message)

    def acknowledge_nowait(self, message: Message | MessageId) -> None:
        source, message_id = self._source_of(message)
        state = source.entries.get(message_id.position)
        if state is not None and message_id.batch_index >= 0:
            state[0] -= 1
            if state[0] > 0:
                return
            message_id = MessageId(message_id.ledger_id, message_id.entry_id, message_id.partition)
        source.entries.pop(message_id.position, None)
        pending = self._acks.setdefault(source, [])
        pending.append(message_id)
        if len(pending) >= ACK_GROUP_IDS_MAX or self.ack_group_time_s == 0:
            self._flush_acks(source)

    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledges ``message`` and every message before it on its topic or partition."""
        if self.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise InvalidArgument("cumulative acknowledgement is not allowed on shared subscriptions")
        source, message_id = self._source_of(message)
        self._flush_acks(source)
        position = message_id.position
        for done in [p for p in source.entries if p <= position]:
            del source.entries[done]
        assert source.low is not None
        source.low.ack_nowait([message_id], cumulative=True)

    def _flush_acks(self, source: _Source) -> None:
        pending = self._acks.pop(source, None)
        if not pending or source.low is None:
            return
        if not source.low.ack_nowait(pending) and not self._closed:
            # Disconnected: kept for the reconnection (sent before its FLOW, so the
            # broker does not deliver them again), the newest ACKS_HELD_MAX at most.
            if len(pending) > ACKS_HELD_MAX:
                log.info("acknowledgements held while disconnected over their bound, oldest dropped (delivered "
                         "again): topic=%s dropped=%d", source.topic, len(pending) - ACKS_HELD_MAX)
                del pending[:len(pending) - ACKS_HELD_MAX]
            self._acks[source] = pending

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Has the message's entry delivered again after ``negative_ack_redelivery_delay_ms``,
        or with a ``negative_ack_redelivery_backoff`` after its delay for the message's
        redelivery count (a bare id counts as not redelivered)."""
        source, message_id = self._source_of(message)
        source.entries.pop(message_id.position, None)
        delay_s = self.nack_delay_s
        if self.nack_backoff is not None:
            count = message.redelivery_count() if isinstance(message, Message) else 0
            delay_s = self.nack_backoff.delay_ms(count) / 1000
        self._nacks.append((time.monotonic() + delay_s, source, message_id.position))

    async def redeliver_unacknowledged_messages(self) -> None:
        for source in self._sources.values():
            self._redeliver(source, list(source.entries))

    def _redeliver(self, source: _Source, positions: list[tuple[int, int]]) -> None:
        if source.low is None or not positions:
            return
        if self.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            for position in positions:
                source.entries.pop(position, None)
            source.low.redeliver(positions)
            return
        # Exclusive and failover: the broker sends everything unacknowledged again
        # from the start; what the queue holds of this source comes again with it.
        if source.low.redeliver_all():
            queued = sum(1 for message in self._queue if message._source is source)
            source.generation += 1
            source.entries.clear()
            self._drop_queued(source)
            if queued:
                self._taken(source, queued)

    def _on_tick(self, now_s: float) -> bool:
        if self._closed:
            return False
        for source in list(self._acks):
            self._flush_acks(source)
        if self._nacks:
            due = [n for n in self._nacks if n[0] <= now_s]
            if due:
                self._nacks = [n for n in self._nacks if n[0] > now_s]
                by_source: dict[_Source, list[tuple[int, int]]] = {}
                for _, source, position in due:
                    by_source.setdefault(source, []).append(position)
                for source, positions in by_source.items():
                    self._redeliver(source, positions)
        if self.ack_timeout_s is not None:
            for source in self._sources.values():
                late = [p for p, state in source.entries.items() if state[1] and now_s - state[1] > self.ack_timeout_s]
                self._redeliver(source, late)
        return True

    # --- dead letters -------------------------------------------------------------------------

    def _dead_letter(self, source: _Source, entry: ReceivedEntry, messages: Sequence[ReceivedMessage]) -> None:
        if len(self._dead_letter_sends) >= DEAD_LETTER_SENDS_MAX:
            log.warning("dead-letter sends at their bound, entry left for redelivery: topic=%s", source.topic)
            return
        task = asyncio.get_running_loop().create_task(self._send_dead_letter(source, entry, messages))
        self._dead_letter_sends.add(task)
        task.add_done_callback(self._dead_letter_sends.discard)

    async def _send_dead_letter(self, source: _Source, entry: ReceivedEntry,
                                messages: Sequence[ReceivedMessage]) -> None:
        policy = self.dead_letter_policy
        assert policy is not None
        try:
            if self._dead_letter_producer is None:
                topic = policy.dead_letter_topic or f"{source.topic.split('-partition-')[0]}-{self._subscription}-DLQ"
                self._dead_letter_producer = await self._client._partition_producer(topic)
            producer = self._dead_letter_producer
            for message in messages:
                properties = dict(message.properties)
                properties.setdefault("REAL_TOPIC", source.topic)
                properties.setdefault("ORIGIN_MESSAGE_ID", str(message.message_id))
                await producer.send(OutgoingMessage(message.payload, message.key, message.ordering_key, properties,
                                                    message.event_time_ms))
            if source.low is not None:
                source.low.ack_nowait([MessageId(entry.ledger_id, entry.entry_id, entry.partition)])
        except MagnetarError as error:
            log.warning("dead-letter send failed, entry left for redelivery: topic=%s error=%s", source.topic, error)

    # --- patterns -----------------------------------------------------------------------------

    def _on_discovery_tick(self, now_s: float) -> bool:
        if self._closed:
            return False
        task = asyncio.get_running_loop().create_task(self._discover())
        self._tasks.append(task)
        self._tasks = [t for t in self._tasks if not t.done() or t is task]
        return True

    async def _discover(self) -> None:
        assert self._pattern is not None
        try:
            topics = await self._client._pattern_topics(self._pattern_namespace, self._pattern)
            for topic in topics:
                if topic not in self._sources and not self._closed:
                    await self._add_source(topic)
                    log.info("pattern consumer added a topic: pattern=%s topic=%s", self._pattern.pattern, topic)
        except MagnetarError as error:
            log.info("pattern discovery failed, trying again later: error=%s", error)

    # --- moving and closing -------------------------------------------------------------------

    async def seek(self, position: MessageId | int) -> None:
        """Moves the subscription to a message id or to a publish time (epoch ms)."""
        # Acknowledgements grouped or held so far are sent before the SEEK (as the
        # official clients flush theirs), and any that cannot be are dropped: sent
        # after it, they would acknowledge messages the seek is to deliver again.
        for source in list(self._acks):
            self._flush_acks(source)
        self._acks.clear()
        for source in self._sources.values():
            assert source.low is not None
            if isinstance(position, MessageId):
                await source.low.seek(message_id=position)
            else:
                await source.low.seek(publish_time_ms=int(position))
            source.generation += 1
            source.entries.clear()
        self._queue.clear()

    async def get_last_message_id(self) -> MessageId:
        if len(self._sources) != 1:
            raise InvalidArgument("get_last_message_id is for a consumer of one topic or partition")
        source = next(iter(self._sources.values()))
        assert source.low is not None
        return await source.low.last_message_id()

    async def unsubscribe(self) -> None:
        for source in self._sources.values():
            assert source.low is not None
            await source.low.unsubscribe()
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        for source in list(self._acks):
            self._flush_acks(source)
        self._closed = True
        self._arrived.set()
        current = asyncio.current_task()
        for task in [*self._tasks, *self._dead_letter_sends]:
            # Not the listener's own task when the listener closes its consumer: it
            # returns from the listener, finds the consumer closed and ends.
            if task is not current:
                await cancel_and_wait(task)
        for source in self._sources.values():
            if source.low is not None:
                await source.low.close()
        if self._dead_letter_producer is not None:
            await self._dead_letter_producer.close()
        self._client._forget(self)

    async def __aenter__(self) -> "Consumer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
