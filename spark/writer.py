"""Batch writes: ``df.write.format("magnetar")`` produces the DataFrame's rows to a
topic through a broker (client/), each task with its own producer.

Columns: ``payload`` (binary or string, required); ``key`` (string), ``ordering_key``
(binary), ``properties`` (map<string,string>) and ``event_time`` (timestamp) when the
DataFrame has them. Rows are sent as batch entries of at most ``batchMessages`` rows
(default 100) and 1 MiB, with at most ``PENDING_MESSAGES_MAX`` messages awaiting their
receipts per task (backpressure: the task waits for receipts before sending more).

The commit protocol: a task returns what the broker stored (a message count and the
first and last message ids) only after every receipt arrived; ``commit`` on the driver
sums them (and writes them to ``metricsDir``). Delivery is at-least-once: a task that
fails after some receipts is retried by Spark and sends its rows again, so a retried
task's rows can be stored twice (the broker keeps no producer sequence ids across
producers). A job that fails leaves what its tasks stored; ``abort`` cannot take
messages back and says how many were stored.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from client.client import PulsarClient
from client.messages import OutgoingMessage
from common.errors import ConfigError
from spark import metrics
from spark.options import _get, _integer, topic_name

log = logging.getLogger(__name__)

# Messages a task may have sent without receipts: well under the client's own limit
# (producer_pending_messages_max, 10,000) so a send never fails for it.
PENDING_MESSAGES_MAX = 5_000
BATCH_BYTES_MAX = 1024 * 1024
BATCH_MESSAGES_DEFAULT = 100


@dataclass(frozen=True)
class WriteOptions:
    topic: str
    service_url: str
    batch_messages: int
    metrics_dir: str | None


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
    return WriteOptions(topic_name(topic, "topic"), service_url, batch_messages, _get(options, "metricsDir"))


@dataclass
class WriteReceipt(WriterCommitMessage):
    messages: int
    first_message_id: str | None
    last_message_id: str | None


def _messages(batch: pa.RecordBatch) -> list[OutgoingMessage]:
    names = batch.schema.names
    if "payload" not in names:
        raise ConfigError("a DataFrame written to a topic needs a payload column (binary or string)")
    payloads = batch.column("payload").to_pylist()
    keys = batch.column("key").to_pylist() if "key" in names else None
    ordering = batch.column("ordering_key").to_pylist() if "ordering_key" in names else None
    properties = batch.column("properties").to_pylist() if "properties" in names else None
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
    return messages


class MagnetarWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReceipt:
        return asyncio.run(self._write(iterator))

    async def _write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReceipt:
        client = PulsarClient(self.options.service_url)
        try:
            producer = await client.create_producer(self.options.topic, producer_name=f"spark-{uuid.uuid4().hex[:12]}")
            pending: list[asyncio.Future] = []
            pending_messages = 0
            count = 0
            first = last = None

            async def settle(until_messages: int) -> None:
                nonlocal pending_messages, count, first, last
                while pending and pending_messages > until_messages:
                    ids = await pending.pop(0)
                    pending_messages -= len(ids)
                    count += len(ids)
                    first = first or ids[0]
                    last = ids[-1]

            for batch in iterator:
                messages = _messages(batch)
                start = 0
                while start < len(messages):
                    group, size = [], 0
                    while (start < len(messages) and len(group) < self.options.batch_messages
                           and (not group or size + messages[start].size_bytes <= BATCH_BYTES_MAX)):
                        size += messages[start].size_bytes
                        group.append(messages[start])
                        start += 1
                    await settle(PENDING_MESSAGES_MAX - len(group))
                    pending.append(producer.send_batch(group))
                    pending_messages += len(group)
                    await producer.drain()
            await settle(0)
            return WriteReceipt(count, None if first is None else str(first), None if last is None else str(last))
        finally:
            await client.close()

    def commit(self, messages: list[WriteReceipt | None]) -> None:
        stored = sum(m.messages for m in messages if m is not None)
        log.info("spark write committed: topic=%s tasks=%d messages=%d", self.options.topic, len(messages), stored)
        metrics.record(self.options.metrics_dir, "write", topic=self.options.topic, tasks=len(messages),
                       messages=stored, committed=True)

    def abort(self, messages: list[WriteReceipt | None]) -> None:
        stored = sum(m.messages for m in messages if m is not None)
        log.warning("spark write aborted: topic=%s messages_already_stored=%d (at-least-once: they stay)",
                    self.options.topic, stored)
        metrics.record(self.options.metrics_dir, "write", topic=self.options.topic, tasks=len(messages),
                       messages=stored, committed=False)
