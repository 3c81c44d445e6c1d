"""Writes: ``df.write.format("magnetar")`` and ``df.writeStream.format("magnetar")``
produce a DataFrame's rows to a topic through a broker (client/), each task with its
own producers.

Columns: ``payload`` (binary or string, required); ``key`` (string), ``ordering_key``
(binary), ``properties`` (map<string,string>), ``event_time`` (timestamp) and
``partition`` (int) when the DataFrame has them. On a partitioned topic a row goes to
its ``partition`` (when set and >= 0), else to the partition of its key as the official
client routes keys (client/routing.py), else round-robin by batch entry. Rows are sent
as batch entries of at most ``batchMessages`` rows (default 100) and 1 MiB, each entry
holding rows bound for one partition in row order, with at most
``PENDING_MESSAGES_MAX`` messages awaiting their receipts per task (backpressure).

The commit protocol: a task returns what the broker stored (a message count, the first
and last message ids, and the messages deduplication dropped) only after every receipt
arrived; ``commit`` on the driver sums them (and writes them to ``metricsDir``).
Delivery is at-least-once: a task that fails after some receipts is retried by Spark
and sends its rows again, and a streaming query restarted after a micro-batch's rows
were stored but before Spark recorded its commit runs that micro-batch again. With
``idempotent=true`` every attempt of a task uses the same producer names and sequence
ids for the same rows (batch writes: per job; streams: per query, micro-batch and
Spark partition), so on a namespace with deduplication on the broker stores each row
once: exactly-once, provided the task sees its rows in the same order on every
attempt (true of a query over a replayable source without a shuffle, or after
``sortWithinPartitions``; a different order would drop the wrong rows as duplicates).
Without deduplication on the namespace the option changes nothing. A job that fails
leaves what its tasks stored; ``abort`` cannot take messages back and says how many
were stored.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from client.client import PulsarClient
from client.messages import MessageId, OutgoingMessage
from client.producer import Producer
from client.routing import key_partition
from common.errors import ConfigError
from spark import metrics
from spark.options import _boolean, _get, _integer, topic_name

log = logging.getLogger(__name__)

# Messages a task may have sent without receipts: well under the client's own limit
# (producer_pending_messages_max, 10,000) so a send never fails for it.
PENDING_MESSAGES_MAX = 5_000
BATCH_BYTES_MAX = 1024 * 1024
BATCH_MESSAGES_DEFAULT = 100
DUPLICATE_LEDGER_ID = 2**64 - 1


@dataclass(frozen=True)
class WriteOptions:
    topic: str
    service_url: str
    batch_messages: int
    metrics_dir: str | None
    idempotent: bool


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    topic = _get(options, "topic")
    if topic is None:
        raise ConfigError("option topic is required to write")
    service_url = _get(options, "serviceUrl")
    if service_url is None or not service_url.startswith(("pulsar://", "pulsar+ssl://")):
        raise ConfigError("option serviceUrl (a broker's pulsar:// URL) is required to write")
    batch_messages = _integer(options, "batchMessages", BATCH_MESSAGES_DEFAULT, 1)
    assert batch_messages is not None
    if batch_messages > 1000:
        raise ConfigError("option batchMessages must be <= 1000 (the client's batch limit)")
    return WriteOptions(topic_name(topic, "topic"), service_url, batch_messages, _get(options, "metricsDir"),
                        _boolean(options, "idempotent", False))


@dataclass
class WriteReceipt(WriterCommitMessage):
    messages: int                    # stored by this task
    first_message_id: str | None
    last_message_id: str | None
    duplicates: int = 0              # dropped by the broker's deduplication (stored before)


def _messages(batch: pa.RecordBatch) -> tuple[list[OutgoingMessage], list[int | None] | None]:
    """The rows as messages, and the ``partition`` column's values when there is one."""
    names = batch.schema.names
    if "payload" not in names:
        raise ConfigError("a DataFrame written to a topic needs a payload column (binary or string)")
    payloads = batch.column("payload").to_pylist()
    keys = batch.column("key").to_pylist() if "key" in names else None
    ordering = batch.column("ordering_key").to_pylist() if "ordering_key" in names else None
    properties = batch.column("properties").to_pylist() if "properties" in names else None
    partitions = batch.column("partition").to_pylist() if "partition" in names else None
    event_times = None
    if "event_time" in names:
        column = batch.column("event_time").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
        event_times = column.to_pylist()
    messages = []
    for index, payload in enumerate(payloads):
        if payload is None:
            raise ConfigError(f"row {index} of a written batch has a null payload")
        messages.append(OutgoingMessage(
            payload=payload.encode() if isinstance(payload, str) else bytes(payload),
            key=None if keys is None else keys[index],
            ordering_key=None if ordering is None or ordering[index] is None else bytes(ordering[index]),
            properties=dict(properties[index] or []) if properties is not None else {},
            event_time_ms=(event_times[index] or 0) if event_times is not None else 0))
    return messages, partitions


def _task_partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class _TaskWrite:
    """One task's rows sent to the topic's partitions: a producer per partition it
    writes to, batch entries of rows bound for the same partition (in row order),
    receipts awaited with a bound on what is in flight."""

    def __init__(self, options: WriteOptions, producer_prefix: str, first_sequence_id: int) -> None:
        self.options = options
        self.producer_prefix = producer_prefix
        self.first_sequence_id = first_sequence_id
        self.task_index = _task_partition_id()
        self.client = PulsarClient(options.service_url)
        self.targets: list[str] = []
        self.partitioned = False
        self.producers: dict[str, Producer] = {}
        self.buffers: dict[str, list[OutgoingMessage]] = {}
        self.buffer_bytes: dict[str, int] = {}
        self.pending: list[asyncio.Future] = []
        self.pending_messages = 0
        self.count = self.duplicates = 0
        self.first: MessageId | None = None
        self.last: MessageId | None = None
        self.round_robin = self.task_index

    async def run(self, iterator: Iterator[pa.RecordBatch]) -> WriteReceipt:
        try:
            partitions = await self.client.partitions(self.options.topic)
            self.partitioned = partitions > 0
            self.targets = ([f"{self.options.topic}-partition-{index}" for index in range(partitions)]
                            if partitions > 0 else [self.options.topic])
            for batch in iterator:
                messages, partition_column = _messages(batch)
                for index, message in enumerate(messages):
                    target = self._target(message, None if partition_column is None else partition_column[index])
                    await self._add(target, message)
            for target in list(self.buffers):
                await self._flush(target)
            await self._settle(0)
            return WriteReceipt(self.count, None if self.first is None else str(self.first),
                                None if self.last is None else str(self.last), self.duplicates)
        finally:
            await self.client.close()

    def _target(self, message: OutgoingMessage, partition: int | None) -> str:
        count = len(self.targets)
        if partition is not None and partition >= 0:
            if not self.partitioned:
                raise ConfigError(f"a row names partition {partition} but topic {self.options.topic} "
                                  f"is not partitioned")
            if partition >= count:
                raise ConfigError(f"a row names partition {partition}; topic {self.options.topic} has {count}")
            return self.targets[partition]
        if count == 1:
            return self.targets[0]
        if message.key is not None:
            return self.targets[key_partition(message.key, count)]
        return self.targets[self.round_robin % count]

    async def _add(self, target: str, message: OutgoingMessage) -> None:
        buffer = self.buffers.setdefault(target, [])
        size = self.buffer_bytes.get(target, 0)
        if buffer and (len(buffer) >= self.options.batch_messages or size + message.size_bytes > BATCH_BYTES_MAX):
            await self._flush(target)
            buffer = self.buffers.setdefault(target, [])
            size = 0
        buffer.append(message)
        self.buffer_bytes[target] = size + message.size_bytes

    async def _producer(self, target: str) -> Producer:
        producer = self.producers.get(target)
        if producer is None:
            if self.options.idempotent:
                # The same name and sequence ids for the same rows on every attempt.
                name = f"{self.producer_prefix}-{self.task_index}-{self.targets.index(target)}"
                producer = await self.client.create_producer(target, producer_name=name)
                producer.set_next_sequence_id(self.first_sequence_id)
            else:
                producer = await self.client.create_producer(target, producer_name=f"spark-{uuid.uuid4().hex[:12]}")
            self.producers[target] = producer
        return producer

    async def _flush(self, target: str) -> None:
        group = self.buffers.pop(target, [])
        self.buffer_bytes.pop(target, None)
        if not group:
            return
        producer = await self._producer(target)
        await self._settle(PENDING_MESSAGES_MAX - len(group))
        self.pending.append(producer.send_batch(group))
        self.pending_messages += len(group)
        self.round_robin += 1                 # rows without key: the next batch to the next partition
        await producer.drain()

    async def _settle(self, until_messages: int) -> None:
        while self.pending and self.pending_messages > until_messages:
            ids = await self.pending.pop(0)
            self.pending_messages -= len(ids)
            # Deduplicated (stored by an earlier attempt): the receipt's id is -1:-1,
            # which the wire's uint64 fields carry as 2^64 - 1.
            if ids[0].ledger_id < 0 or ids[0].ledger_id >= DUPLICATE_LEDGER_ID:
                self.duplicates += len(ids)
                continue
            self.count += len(ids)
            self.first = self.first or ids[0]
            self.last = ids[-1]


class MagnetarWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        # One name for the whole job (pickled to every task and every retry of it).
        self.producer_prefix = f"spark-{uuid.uuid4().hex[:12]}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReceipt:
        return asyncio.run(_TaskWrite(self.options, self.producer_prefix, 0).run(iterator))

    def commit(self, messages: list[WriteReceipt | None]) -> None:
        stored = sum(m.messages for m in messages if m is not None)
        duplicates = sum(m.duplicates for m in messages if m is not None)
        log.info("spark write committed: topic=%s tasks=%d messages=%d duplicates_dropped=%d", self.options.topic,
                 len(messages), stored, duplicates)
        metrics.record(self.options.metrics_dir, "write", topic=self.options.topic, tasks=len(messages),
                       messages=stored, duplicates=duplicates, committed=True)

    def abort(self, messages: list[WriteReceipt | None]) -> None:
        stored = sum(m.messages for m in messages if m is not None)
        log.warning("spark write aborted: topic=%s messages_already_stored=%d (at-least-once: they stay)",
                    self.options.topic, stored)
        metrics.record(self.options.metrics_dir, "write", topic=self.options.topic, tasks=len(messages),
                       messages=stored, committed=False)


class MagnetarStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("magnetar")``: each micro-batch's rows are produced as a
    batch write's are; ``commit`` records what each micro-batch stored. With
    ``idempotent`` the producers are named after the query (its id survives restarts
    from the checkpoint), the Spark partition and the topic partition, and a
    micro-batch's messages are numbered from ``batch_id << 32``: a micro-batch run again
    (a task retried, or a query restarted before the batch's commit) sends the same
    names and sequence ids, and a topic with deduplication on stores none twice."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.fallback_prefix = f"spark-{uuid.uuid4().hex[:12]}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReceipt:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty("sql.streaming.queryId") if context is not None else None
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        if self.options.idempotent and (query_id is None or batch_id is None):
            raise ConfigError("option idempotent needs Spark's query id and batch id in the task, and found none")
        prefix = f"spark-{query_id}" if query_id is not None else self.fallback_prefix
        first_sequence_id = int(batch_id) << 32 if batch_id is not None else 0
        return asyncio.run(_TaskWrite(self.options, prefix, first_sequence_id).run(iterator))

    def commit(self, messages: list[WriteReceipt | None], batchId: int) -> None:
        stored = sum(m.messages for m in messages if m is not None)
        duplicates = sum(m.duplicates for m in messages if m is not None)
        log.info("spark stream write committed: topic=%s batch_id=%d messages=%d duplicates_dropped=%d",
                 self.options.topic, batchId, stored, duplicates)
        metrics.record(self.options.metrics_dir, "stream-write", topic=self.options.topic, batch_id=batchId,
                       messages=stored, duplicates=duplicates, committed=True)

    def abort(self, messages: list[WriteReceipt | None], batchId: int) -> None:
        stored = sum(m.messages for m in messages if m is not None)
        log.warning("spark stream write aborted: topic=%s batch_id=%d messages_already_stored=%d",
                    self.options.topic, batchId, stored)
        metrics.record(self.options.metrics_dir, "stream-write", topic=self.options.topic, batch_id=batchId,
                       messages=stored, committed=False)
