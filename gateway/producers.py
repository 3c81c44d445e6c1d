"""The gateway's broker producers: one per topic partition, made on first use, closed
when idle, and the routing of messages to partitions.

Batches: a produce request's messages become one batch entry per partition and per
dispatch key (ordering key, else key; keyless messages share one), since a key-shared
subscription routes whole entries by their key.

Routing (partitioned topics): a message with a key goes to the partition its key hashes
to (CRC32C of the key, modulo the partitions: the same key always lands on the same
partition, so its order holds); messages without a key go round-robin, one produce
request's keyless messages to one partition so they stay one batch entry. The partition
count is looked up once per ``partitions_ttl_s``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Sequence

import crc32c

from client.messages import OutgoingMessage
from client.pool import BrokerPool
from client.producer import Producer
from common.errors import ShuttingDown, TooManyRequests
from runtime.tasks import cancel_and_wait
from gateway.config import GatewayConfig

log = logging.getLogger(__name__)

# How long a topic's partition count is trusted (partitions are added rarely).
PARTITIONS_TTL_S = 30.0
IDLE_CHECK_S = 5.0


def partition_for_key(key: str, partitions: int) -> int:
    assert partitions >= 1, partitions
    return crc32c.crc32c(key.encode()) % partitions


@dataclass(frozen=True, slots=True)
class SentEntry:
    """One entry sent for a produce request: the request's message indexes it holds,
    and the future of its id (one MessageId, or a list for a batch)."""

    indexes: list[int]
    future: asyncio.Future


def dispatch_key(message: OutgoingMessage) -> bytes | str | None:
    """What a key-shared subscription routes the message by: its ordering key, else its key."""
    return message.ordering_key if message.ordering_key is not None else message.key


def partition_topic(topic: str, index: int, partitions: int) -> str:
    return f"{topic}-partition-{index}" if partitions > 0 else topic


class ProducerPool:
    def __init__(self, pool: BrokerPool, config: GatewayConfig) -> None:
        self._pool = pool
        self.config = config
        self.producers: dict[str, Producer] = {}
        self._starting: dict[str, asyncio.Task[Producer]] = {}
        self._partitions: dict[str, tuple[int, float]] = {}
        self._round_robin = itertools.count()
        self.closed = False

    async def partitions(self, topic: str) -> int:
        cached = self._partitions.get(topic)
        now_s = time.monotonic()
        if cached is not None and now_s - cached[1] < PARTITIONS_TTL_S:
            return cached[0]
        count = await self._pool.partitions(topic)
        self._partitions[topic] = (count, now_s)
        if len(self._partitions) > 4 * self.config.producers_max:
            self._partitions.clear()   # bounded: a cache, not a registry
        return count

    async def producer(self, topic: str) -> Producer:
        """The producer of one topic or partition, made if needed."""
        if self.closed:
            raise ShuttingDown("the gateway is stopping")
        producer = self.producers.get(topic)
        if producer is not None and producer.failure is None and not producer.closed:
            return producer
        if producer is not None:
            self.producers.pop(topic, None)
            await producer.close()
        starting = self._starting.get(topic)
        if starting is None:
            if len(self.producers) + len(self._starting) >= self.config.producers_max:
                raise TooManyRequests(f"this gateway holds {self.config.producers_max} producers already")
            starting = asyncio.get_running_loop().create_task(self._start(topic))
            starting.add_done_callback(lambda task: task.cancelled() or task.exception())
            self._starting[topic] = starting
        return await asyncio.shield(starting)

    async def _start(self, topic: str) -> Producer:
        try:
            producer = Producer(self._pool, topic)
            await producer.start()
            self.producers[topic] = producer
            log.info("gateway producer started: topic=%s producer=%s", topic, producer.producer_name)
            return producer
        finally:
            self._starting.pop(topic, None)

    async def send(self, topic: str, messages: Sequence[OutgoingMessage], *, batch: bool) -> list[SentEntry]:
        """Sends ``messages`` (in batch entries when ``batch``, else one entry each);
        returns the entries sent: which messages (by index) each holds, and its future."""
        partitions = await self.partitions(topic)
        if partitions == 0:
            return await self._send_to(topic, list(range(len(messages))), messages, batch)
        keyless_partition = next(self._round_robin) % partitions
        groups: dict[int, list[int]] = {}
        for index, message in enumerate(messages):
            target = partition_for_key(message.key, partitions) if message.key else keyless_partition
            groups.setdefault(target, []).append(index)
        sent: list[SentEntry] = []
        for partition, indexes in groups.items():
            sent += await self._send_to(partition_topic(topic, partition, partitions), indexes,
                                        [messages[i] for i in indexes], batch)
        return sent

    async def _send_to(self, topic: str, indexes: list[int], messages: Sequence[OutgoingMessage],
                       batch: bool) -> list[SentEntry]:
        producer = await self.producer(topic)
        sent: list[SentEntry] = []
        if not batch or len(messages) == 1:
            sent = [SentEntry([index], producer.send(message)) for index, message in zip(indexes, messages)]
        else:
            # Key-based batching (Pulsar's KEY_BASED batcher): one entry per dispatch
            # key, since key-shared subscriptions route whole entries by the entry's
            # key. Keyless messages share one entry.
            by_key: dict[bytes | str | None, list[int]] = {}
            for position, message in enumerate(messages):
                by_key.setdefault(dispatch_key(message), []).append(position)
            for group in by_key.values():
                if len(group) == 1:
                    sent.append(SentEntry([indexes[group[0]]], producer.send(messages[group[0]])))
                else:
                    sent.append(SentEntry([indexes[i] for i in group],
                                          producer.send_batch([messages[i] for i in group])))
        await producer.drain()
        return sent

    async def run(self) -> None:
        """Closes producers unused for ``producer_idle_ms`` with nothing pending."""
        idle_s = self.config.producer_idle_ms / 1000
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            now_s = time.monotonic()
            for topic, producer in list(self.producers.items()):
                stale = producer.failure is not None or producer.closed
                if stale or (producer.pending_messages == 0 and now_s - producer.last_used_s > idle_s):
                    self.producers.pop(topic, None)
                    await producer.close()
                    log.info("gateway producer closed: topic=%s reason=%s", topic, "failed" if stale else "idle")

    async def close(self) -> None:
        self.closed = True
        await cancel_and_wait(*self._starting.values())
        for topic in list(self.producers):
            producer = self.producers.pop(topic)
            await producer.close()
