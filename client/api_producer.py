"""The user's producer: values through a schema, messages batched by count, bytes and
delay, routed over a partitioned topic's partitions, sends bounded by a queue.

Theory of operation:
- One partition producer (client/producer.py) per partition, or one for a topic that
  is not partitioned. Each gathers messages in a ``_Batch``; the batch goes out as one
  entry when it holds ``batching_max_messages`` messages or
  ``batching_max_allowed_size_in_bytes`` bytes, or ``batching_max_publish_delay_ms``
  after its first message (a timer on the loop), or on ``flush``. With batching off,
  every message is its own entry. A delayed message (deliver_at / deliver_after) is
  always sent alone, as the official client does: the broker keeps one delivery time
  per entry.
- ``send`` returns the message id once the broker's receipt says the entry is durable;
  ``send_async`` takes a callback ``(error or None, message_id)`` instead. A message
  without a receipt ``send_timeout_millis`` after it was queued fails with
  OperationTimeout (pulsar's Timeout): one periodic check over the messages in queue
  order, not a timer per message. An entry all of whose messages timed out leaves the
  partition producer's pending ones: it is not sent again after a reconnection (one
  written to a connection before may still be stored). Meanwhile the partition
  producers reconnect without end (client/producer.py) until ``close``. A message
  with an explicit ``sequence_id`` starts a new batch unless it follows the previous
  one's id (the broker deduplicates by producer name and sequence id).
- At most ``max_pending_messages`` messages await receipts across the partitions:
  past it ``send`` waits (``block_if_queue_full``) or fails at once with
  ProducerQueueIsFull (the catalogue's TooManyRequests).
- Routing: a message with a key goes to the partition the official client picks for
  it (client/routing.py); others by ``message_routing_mode``: round robin, one
  partition picked at creation, or the caller's ``message_router(message, partitions)``.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import random
import time
from typing import Any, Callable, Mapping

from common.errors import InvalidArgument, MagnetarError, OperationTimeout, ShuttingDown, TooManyRequests
from protocol.proto import pulsar_api_pb2 as pb
from runtime.tasks import cancel_and_wait, every

from client.messages import MessageId, OutgoingMessage
from client.producer import Producer as PartitionProducer
from client.routing import key_partition
from client.schema import Schema


class CompressionType(enum.IntEnum):
    NONE = pb.NONE
    LZ4 = pb.LZ4
    ZLIB = pb.ZLIB
    ZSTD = pb.ZSTD
    SNAPPY = pb.SNAPPY


class ProducerAccessMode(enum.IntEnum):
    Shared = pb.Shared
    Exclusive = pb.Exclusive
    WaitForExclusive = pb.WaitForExclusive
    ExclusiveWithFencing = pb.ExclusiveWithFencing


class PartitionsRoutingMode(enum.IntEnum):
    # The official client's numbering (pulsar.PartitionsRoutingMode).
    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


SendCallback = Callable[[MagnetarError | None, MessageId | None], None]


class _Entry:
    """One entry's partition-producer future (once sent) and how many of its messages
    have not timed out: at zero the entry is given up (cancelled, not sent again)."""

    __slots__ = ("future", "unsettled")

    def __init__(self, unsettled: int = 0) -> None:
        self.future: asyncio.Future | None = None
        self.unsettled = unsettled


class _Batch:
    """Messages gathered for one partition producer, and the futures of their ids."""

    __slots__ = ("messages", "futures", "size_bytes", "timer", "entry")

    def __init__(self) -> None:
        self.entry = _Entry()
        self.messages: list[OutgoingMessage] = []
        self.futures: list[asyncio.Future] = []
        self.size_bytes = 0
        self.timer: asyncio.TimerHandle | None = None


class Producer:
    def __init__(self, topic: str, partition_producers: list[PartitionProducer], partitioned: bool,
                 schema: Schema, *, batching_enabled: bool, batching_max_messages: int,
                 batching_max_allowed_size_in_bytes: int, batching_max_publish_delay_ms: int,
                 max_pending_messages: int, block_if_queue_full: bool, send_timeout_millis: int,
                 message_routing_mode: PartitionsRoutingMode,
                 message_router: Callable[[OutgoingMessage, int], int] | None,
                 on_closed: Callable[["Producer"], None]) -> None:
        if batching_max_messages <= 0 or batching_max_allowed_size_in_bytes <= 0 or batching_max_publish_delay_ms < 0:
            raise InvalidArgument("batching limits must be positive")
        if max_pending_messages <= 0:
            raise InvalidArgument("max_pending_messages must be > 0")
        if message_routing_mode == PartitionsRoutingMode.CustomPartition and message_router is None:
            raise InvalidArgument("CustomPartition routing needs a message_router")
        self._topic = topic
        self._partitions = partition_producers
        self._partitioned = partitioned
        self.schema = schema
        self.batching_enabled = batching_enabled
        self.batching_max_messages = min(batching_max_messages, partition_producers[0].config.batch_messages_max)
        self.batching_max_allowed_size_in_bytes = batching_max_allowed_size_in_bytes
        self.batching_delay_s = batching_max_publish_delay_ms / 1000
        self.max_pending_messages = max_pending_messages
        self.block_if_queue_full = block_if_queue_full
        self.send_timeout_s = send_timeout_millis / 1000 if send_timeout_millis > 0 else None
        self.routing_mode = message_routing_mode
        self.message_router = message_router
        self._batches = [_Batch() for _ in partition_producers]
        self._round_robin = random.randrange(len(partition_producers))
        self._single = random.randrange(len(partition_producers))
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._on_closed = on_closed
        self._closed = False
        # (deadline, future, its entry) of each message awaiting its receipt, in the
        # order queued.
        self._deadlines: collections.deque[tuple[float, asyncio.Future, _Entry]] = collections.deque()
        self._expiry: asyncio.Task | None = None
        if self.send_timeout_s is not None:
            self._expiry = asyncio.get_running_loop().create_task(
                every(min(0.1, self.send_timeout_s / 4), self._expire), name=f"send timeouts {topic}")

    def _expire(self, now_s: float) -> bool:
        deadlines = self._deadlines
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now_s):
            _, future, entry = deadlines.popleft()
            if not future.done():
                future.set_exception(OperationTimeout(
                    f"no receipt for a message on {self._topic} within {self.send_timeout_s:g} s "
                    "(it may still be stored)"))
            elif not future.cancelled():
                continue
            # Timed out or cancelled by its caller: once all of its entry's are, the
            # entry leaves the partition producer (not sent again after a reconnection).
            entry.unsettled -= 1
            if entry.unsettled == 0 and entry.future is not None and not entry.future.done():
                entry.future.cancel()
        return not self._closed

    # --- about ------------------------------------------------------------------------------

    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self._partitions[0].producer_name

    def last_sequence_id(self) -> int:
        return max(p._next_sequence_id for p in self._partitions) - 1

    def is_connected(self) -> bool:
        return all(p.ready for p in self._partitions)

    @property
    def pending_messages(self) -> int:
        return self._pending

    # --- sending ------------------------------------------------------------------------------

    async def send(self, content: Any, properties: Mapping[str, str] | None = None, partition_key: str | None = None,
                   ordering_key: str | bytes | None = None, sequence_id: int | None = None,
                   event_timestamp: int | None = None, deliver_at: int | None = None,
                   deliver_after: "float | Any | None" = None) -> MessageId:
        """Sends one message and returns its id once stored durably. ``deliver_after``
        is seconds (a number) or a ``datetime.timedelta``; ``deliver_at`` epoch ms."""
        while self._pending >= self.max_pending_messages and self.block_if_queue_full and not self._closed:
            self._room.clear()
            await self._room.wait()
        return await self._submit(content, properties, partition_key, ordering_key, sequence_id, event_timestamp,
                                  deliver_at, deliver_after)

    def send_async(self, content: Any, callback: SendCallback | None = None, **options) -> asyncio.Future:
        """Queues one message without waiting; ``callback(error, message_id)`` is called
        once the receipt (or the failure) came. Returns the id's future as well. Fails
        at once with ProducerQueueIsFull (TooManyRequests) when the queue is full."""
        future = self._submit(content, options.get("properties"), options.get("partition_key"),
                              options.get("ordering_key"), options.get("sequence_id"),
                              options.get("event_timestamp"), options.get("deliver_at"),
                              options.get("deliver_after"))
        if callback is not None:
            future.add_done_callback(lambda done: callback(done.exception(), None) if done.exception()
                                     else callback(None, done.result()))
        return future

    def send_nowait(self, content: Any, **options) -> asyncio.Future:
        """``send_async`` without a callback: queues one message and returns the future
        of its id (awaiting it later gives the id or the failure)."""
        return self.send_async(content, None, **options)

    def _submit(self, content: Any, properties, partition_key, ordering_key, sequence_id, event_timestamp,
                deliver_at, deliver_after) -> asyncio.Future:
        if self._closed:
            raise ShuttingDown(f"producer of {self._topic} is closed")
        if self._pending >= self.max_pending_messages:
            raise TooManyRequests(f"producer of {self._topic} has {self._pending} messages awaiting receipts "
                                  f"(max_pending_messages {self.max_pending_messages})")
        if deliver_after is not None:
            seconds = deliver_after.total_seconds() if hasattr(deliver_after, "total_seconds") else float(deliver_after)
            deliver_at = int(time.time() * 1000 + seconds * 1000)
        if isinstance(ordering_key, str):
            ordering_key = ordering_key.encode()
        message = OutgoingMessage(self.schema.encode(content), partition_key, ordering_key,
                                  dict(properties) if properties else {}, event_timestamp or 0, deliver_at)
        index = self._route(message)
        partition = self._partitions[index]
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(self._on_done)
        self._pending += 1
        if sequence_id is not None:
            expected = partition._next_sequence_id + len(self._batches[index].messages)
            if sequence_id != expected:
                self._flush_batch(index)
                partition.set_next_sequence_id(sequence_id)
        alone = not self.batching_enabled or deliver_at is not None
        if alone:
            self._flush_batch(index)
            entry = _Entry(1)
        else:
            batch = self._batches[index]    # after any flush above: the batch now gathering
            entry = batch.entry
            entry.unsettled += 1
        if self._expiry is not None:
            deadlines = self._deadlines
            if len(deadlines) > 2 * self.max_pending_messages + 1_000:
                # Receipts came out of queue order (partitions): drop the settled ones.
                self._deadlines = deadlines = collections.deque(d for d in deadlines if not d[1].done())
            deadlines.append((time.monotonic() + self.send_timeout_s, future, entry))
        if alone:
            self._send_entry(partition, [message], [future], batched=False, entry=entry)
            return future
        batch.messages.append(message)
        batch.futures.append(future)
        batch.size_bytes += message.size_bytes
        if len(batch.messages) >= self.batching_max_messages or \
                batch.size_bytes >= self.batching_max_allowed_size_in_bytes:
            self._flush_batch(index)
        elif batch.timer is None:
            batch.timer = asyncio.get_running_loop().call_later(self.batching_delay_s, self._flush_batch, index)
        return future

    def _route(self, message: OutgoingMessage) -> int:
        count = len(self._partitions)
        if count == 1:
            return 0
        if self.routing_mode == PartitionsRoutingMode.CustomPartition:
            assert self.message_router is not None
            index = self.message_router(message, count)
            if not 0 <= index < count:
                raise InvalidArgument(f"message_router chose partition {index} of {count}")
            return index
        if message.key is not None:
            return key_partition(message.key, count)
        if self.routing_mode == PartitionsRoutingMode.UseSinglePartition:
            return self._single
        self._round_robin = (self._round_robin + 1) % count
        return self._round_robin

    def _on_done(self, future: asyncio.Future) -> None:
        self._pending -= 1
        if not future.cancelled():
            future.exception()   # retrieved: send_async's callers may not look
        if self._pending < self.max_pending_messages:
            self._room.set()

    def _flush_batch(self, index: int) -> None:
        batch = self._batches[index]
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if not batch.messages:
            return
        messages, futures = batch.messages, batch.futures
        self._batches[index] = _Batch()
        self._send_entry(self._partitions[index], messages, futures, batched=True, entry=batch.entry)

    def _send_entry(self, partition: PartitionProducer, messages: list[OutgoingMessage],
                    futures: list[asyncio.Future], batched: bool, entry: _Entry) -> None:
        try:
            sent = partition.send_batch(messages) if batched else partition.send(messages[0])
        except MagnetarError as error:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return

        def settle(done: asyncio.Future) -> None:
            error = None if done.cancelled() else done.exception()
            if error is not None or done.cancelled():
                failure = error or ShuttingDown("send cancelled")
                for future in futures:
                    if not future.done():
                        future.set_exception(failure)
                return
            ids = done.result() if batched else [done.result()]
            for future, message_id in zip(futures, ids):
                if not future.done():
                    future.set_result(message_id)

        sent.add_done_callback(settle)
        entry.future = sent
        if entry.unsettled == 0 and self._expiry is not None:
            sent.cancel()   # every message of the batch timed out before it went

    async def flush(self) -> None:
        """Sends every gathered batch now and waits for their receipts."""
        waiting = [f for batch in self._batches for f in batch.futures]
        for index in range(len(self._batches)):
            self._flush_batch(index)
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)

    async def close(self) -> None:
        """Flushes, waits for outstanding receipts, then closes every partition producer."""
        if self._closed:
            return
        try:
            await self.flush()
            while self._pending and all(p.failure is None for p in self._partitions):
                self._room.clear()
                try:
                    async with asyncio.timeout(self.send_timeout_s or 30):
                        await self._room.wait()
                except TimeoutError:
                    break
        finally:
            self._closed = True
            self._room.set()
            if self._expiry is not None:
                await cancel_and_wait(self._expiry)
            self._on_closed(self)
            for partition in self._partitions:
                await partition.close()

    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
