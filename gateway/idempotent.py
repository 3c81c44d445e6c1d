"""Idempotent produce over HTTP: a request names a producer and numbers its messages, so
sending it again (after a timeout, a dropped connection, a gateway dying) stores nothing
twice.

Theory of operation:
- The broker keeps, per topic partition and producer name, the highest sequence id it
  stored (broker/deduplication.py, the namespace policy ``deduplication``). A message at
  or below it is answered with message id (-1, -1) and not stored; the gateway reports
  it as ``duplicate``. The gateway only names and routes; the broker decides.
- The policy must be on, or a resend would be stored again: the gateway reads the
  namespace's ``deduplication`` from a broker's admin API and refuses an idempotent
  produce with 412 when it is off. Only "on" is cached (``POLICY_TTL_S``): "off" is
  asked again on every idempotent request, so turning the policy on takes effect at
  the next request (the owner broker applies it at once too: broker/policy_watch.py).
  The refusals are what is not cached, and each costs one small admin call.
- One entry per message: the broker counts a batch entry by its lowest sequence id, so
  a resent batch that overlaps messages already stored would be dropped whole, new
  messages with it.
- A producer of the request's name on each partition it writes, registered for the
  request and closed after it: the broker lets one connection at a time hold a name on
  a topic, so a name kept open here would refuse a retry that reaches another gateway.
  A name another gateway holds (its earlier request still writing) is answered 409
  ``ProducerNameInUse``, retriable; requests of one name through this gateway take turns
  (at most ``WAITERS_PER_NAME_MAX`` waiting, each at most the produce timeout).
- Routing: a keyed message goes to its key's partition, as always; keyless ones to the
  partition of the producer name's hash (not round-robin), so a resend lands where the
  first copy is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from client.messages import MessageId, OutgoingMessage
from client.pool import BrokerPool
from client.producer import Producer
from common.errors import (
    MagnetarError,
    OperationTimeout,
    PreconditionFailed,
    ProducerBusy,
    ProducerNameInUse,
    TooManyRequests,
)
from common.topic_name import TopicName
from gateway.json_codec import Sequenced
from gateway.producers import partition_for_key, partition_topic

log = logging.getLogger(__name__)

# How long a namespace's deduplication policy, once seen on, is trusted (turning it
# off applies to this gateway's requests after this; the broker stops deduplicating at
# once, so a resend in that window may be stored twice: at-least-once, as without it).
POLICY_TTL_S = 10.0
# Namespaces whose policy is remembered (a cache, not a registry: cleared when full).
POLICIES_MAX = 10_000
# Requests of one producer name waiting for their turn on this gateway.
WAITERS_PER_NAME_MAX = 64
# A message the broker already had: its receipt names no entry.
_NO_ENTRY = 2**64 - 1


class Duplicate:
    """The outcome of a message the broker had stored already."""

    def __repr__(self) -> str:
        return "DUPLICATE"


DUPLICATE = Duplicate()


@dataclass
class _Turns:
    """Requests of one (partition, producer name) on this gateway, one at a time."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


PolicyReader = Callable[[str], Awaitable[bool]]


class IdempotentProducers:
    def __init__(self, pool: BrokerPool, partitions: Callable[[str], Awaitable[int]], read_policy: PolicyReader, *,
                 producers_max: int, timeout_s: float) -> None:
        self._pool = pool
        self._partitions = partitions
        self._read_policy = read_policy
        self._producers_max = producers_max
        self._timeout_s = timeout_s
        self._turns: dict[tuple[str, str], _Turns] = {}
        self._policies: dict[str, tuple[bool, float]] = {}
        self.open_producers = 0
        self.duplicates = 0

    async def send(self, topic: str, messages: Sequence[OutgoingMessage], sequenced: Sequenced,
                   ) -> list[MessageId | Duplicate | MagnetarError]:
        """Stores each message at most once for its (producer, sequence id); per message
        of the request, its id, DUPLICATE, or the error that kept it from being stored."""
        await self.check_policy(topic)
        partitions = await self._partitions(topic)
        groups: dict[str, list[int]] = {}
        keyless = partition_for_key(sequenced.producer, partitions) if partitions else 0
        for index, message in enumerate(messages):
            target = (partition_for_key(message.key, partitions) if message.key else keyless) if partitions else 0
            groups.setdefault(partition_topic(topic, target, partitions), []).append(index)
        outcomes: list[MessageId | Duplicate | MagnetarError | None] = [None] * len(messages)
        results = await asyncio.gather(*(self._send_to(name, [messages[i] for i in indexes],
                                                       [sequenced.sequence_ids[i] for i in indexes], sequenced.producer)
                                         for name, indexes in groups.items()), return_exceptions=True)
        for (name, indexes), result in zip(groups.items(), results):
            for position, index in enumerate(indexes):
                if isinstance(result, MagnetarError):
                    outcomes[index] = result
                elif isinstance(result, BaseException):
                    raise result
                else:
                    outcomes[index] = result[position]
        return outcomes  # type: ignore[return-value]

    async def check_policy(self, topic: str) -> None:
        """PreconditionFailed unless the topic's namespace deduplicates."""
        namespace = TopicName.parse(topic).namespace_name
        key = str(namespace)
        cached = self._policies.get(key)
        now_s = time.monotonic()
        if cached is None or not cached[0] or now_s - cached[1] >= POLICY_TTL_S:
            if len(self._policies) >= POLICIES_MAX:
                self._policies.clear()
            cached = (await self._read_policy(key), now_s)
            self._policies[key] = cached
        if not cached[0]:
            raise PreconditionFailed(f"idempotent produce needs deduplication on namespace {key}; it is off "
                                     f"(turn it on: POST /admin/v2/namespaces/{key}/deduplication with true)")

    async def _send_to(self, topic: str, messages: list[OutgoingMessage], sequence_ids: list[int], name: str,
                       ) -> list[MessageId | Duplicate | MagnetarError]:
        key = (topic, name)
        turns = self._turns.get(key)
        if turns is None:
            turns = self._turns[key] = _Turns()
        if turns.users > WAITERS_PER_NAME_MAX:
            raise TooManyRequests(f"{turns.users} requests of producer {name!r} are waiting on this gateway")
        turns.users += 1
        try:
            async with asyncio.timeout(self._timeout_s):
                async with turns.lock:
                    return await self._send_as(topic, messages, sequence_ids, name)
        except TimeoutError:
            raise OperationTimeout(f"producer {name!r} on {topic}: no outcome within {self._timeout_s:g} s; the "
                                   "messages may or may not be stored, and sending them again stores each "
                                   "at most once") from None
        finally:
            turns.users -= 1
            if turns.users == 0:
                self._turns.pop(key, None)

    async def _send_as(self, topic: str, messages: list[OutgoingMessage], sequence_ids: list[int], name: str,
                       ) -> list[MessageId | Duplicate | MagnetarError]:
        if self.open_producers >= self._producers_max:
            raise TooManyRequests(f"this gateway holds {self._producers_max} idempotent producers already")
        producer = Producer(self._pool, topic, producer_name=name)
        self.open_producers += 1
        try:
            try:
                await producer.start()
            except ProducerBusy as busy:
                raise ProducerNameInUse(f"producer {name!r} is registered on {topic} by another connection (an "
                                        f"earlier request still being written?): {busy.message}") from None
            futures = []
            for message, sequence_id in zip(messages, sequence_ids):
                producer.set_next_sequence_id(sequence_id)
                futures.append(producer.send(message))
            await producer.drain()
            await asyncio.wait(futures)
            outcomes: list[MessageId | Duplicate | MagnetarError] = []
            for future in futures:
                error = future.exception()
                if error is not None:
                    outcomes.append(error if isinstance(error, MagnetarError) else OperationTimeout(str(error)))
                elif future.result().ledger_id == _NO_ENTRY:
                    self.duplicates += 1
                    outcomes.append(DUPLICATE)
                else:
                    outcomes.append(future.result())
            return outcomes
        finally:
            self.open_producers -= 1
            await producer.close()
