"""A topic's producer access modes (Pulsar's PIP-68), kept for ``PersistentTopic``.

Shared producers coexist; an Exclusive one is refused (ProducerFenced) while any
producer is attached; WaitForExclusive queues (bounded) until the topic is free, and is
told so with a PRODUCER_SUCCESS that is not ready yet; ExclusiveWithFencing closes every
other producer and fails the queued ones. Each grant of exclusive access moves the topic
epoch, kept in the managed ledger's properties so it survives restarts and moves: an
exclusive producer that reconnects with an older epoch was superseded meanwhile and is
fenced.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from typing import TYPE_CHECKING, Callable, Protocol

from common.errors import MagnetarError, NotAllowed, ProducerBusy, ProducerFenced, TopicFenced
from protocol import commands
from runtime.tasks import log_failure

if TYPE_CHECKING:
    from broker.producer import Producer
    from managed_ledger.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)

# ProducerAccessMode (PulsarApi.proto).
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
# WaitForExclusive producers queued per topic; more are refused with ProducerBusy (a
# queue is for a handful of standby writers, not a crowd).
WAITING_EXCLUSIVE_PRODUCERS_MAX = 100
# The managed-ledger property holding the topic epoch.
TOPIC_EPOCH_PROPERTY = "magnetar.topic.epoch"


class AccessTopic(Protocol):
    """What producer access needs of its topic (``PersistentTopic``)."""

    full_name: str
    ledger: ManagedLedger
    producers: dict[int, Producer]
    closing: bool

    def _check_open(self) -> None: ...

    def remove_producer(self, producer: Producer) -> None: ...


class ProducerAccess:
    """The producer holding exclusive access (granted, maybe not registered yet), the
    WaitForExclusive producers queued, and the topic epoch."""

    def __init__(self, topic: AccessTopic) -> None:
        self._topic = topic
        self.exclusive_producer: Producer | None = None
        self._waiting_exclusive: collections.deque[tuple[Producer, asyncio.Future[int]]] = collections.deque()
        epoch = topic.ledger.properties.get(TOPIC_EPOCH_PROPERTY)
        self.topic_epoch: int | None = int(epoch) if epoch is not None else None
        self._promotions: set[asyncio.Task[None]] = set()

    async def acquire_access(self, producer: Producer, epoch: int | None, on_queued: Callable[[], None]
                             ) -> int | None:
        """Grants ``producer`` its access mode; returns the topic epoch it holds (None:
        the topic never had an exclusive producer). ``epoch``: the one the client held
        before (a reconnect). ``on_queued`` is called when a WaitForExclusive producer
        starts to wait. A cancelled caller leaves nothing granted or queued."""
        self._topic._check_open()
        mode = producer.access_mode
        holder = self.exclusive_producer
        if mode != ACCESS_SHARED and epoch is not None and self.topic_epoch is not None and epoch < self.topic_epoch:
            # A reconnect of an exclusive producer that another superseded meanwhile.
            # (Pulsar would queue a WaitForExclusive one here, and its sends would time
            # out; failing it at once says what happened.)
            raise ProducerFenced(f"topic {self._topic.full_name} epoch moved to {self.topic_epoch}; "
                                 f"the producer held {epoch}")
        if mode == ACCESS_SHARED:
            if holder is not None or self._waiting_exclusive:
                raise ProducerBusy(f"topic {self._topic.full_name} has an exclusive producer: "
                                   f"{holder.name if holder else 'queued'}")
            return self.topic_epoch
        if mode == ACCESS_EXCLUSIVE:
            if holder is not None or self._waiting_exclusive:
                raise ProducerFenced(f"topic {self._topic.full_name} has an exclusive producer: "
                                     f"{holder.name if holder else 'queued'}")
            if self._topic.producers:
                raise ProducerFenced(f"topic {self._topic.full_name} has shared producers")
            return await self._become_exclusive(producer, epoch)
        if mode == ACCESS_EXCLUSIVE_WITH_FENCING:
            if holder is not None or self._topic.producers:
                self._fence_producers()
            return await self._become_exclusive(producer, epoch)
        if mode == ACCESS_WAIT_FOR_EXCLUSIVE:
            if holder is None and not self._topic.producers:
                return await self._become_exclusive(producer, epoch)
            if len(self._waiting_exclusive) >= WAITING_EXCLUSIVE_PRODUCERS_MAX:
                raise ProducerBusy(f"topic {self._topic.full_name} has {WAITING_EXCLUSIVE_PRODUCERS_MAX} producers "
                                   "waiting for exclusive access")
            granted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiting_exclusive.append((producer, granted))
            on_queued()
            log.info("producer waiting for exclusive access: topic=%s producer=%s", self._topic.full_name,
                     producer.name)
            try:
                return await granted
            except asyncio.CancelledError:
                self._waiting_exclusive = collections.deque(
                    item for item in self._waiting_exclusive if item[0] is not producer)
                self.release_access(producer)
                raise
        raise NotAllowed(f"unknown producer access mode {mode}")

    def _fence_producers(self) -> None:
        """ExclusiveWithFencing: every other producer is closed (its client reconnects
        and is refused: ProducerFenced) and every queued one fails."""
        waiting, self._waiting_exclusive = self._waiting_exclusive, collections.deque()
        for producer, granted in waiting:
            if not granted.done():
                granted.set_exception(ProducerFenced(f"fenced out of {self._topic.full_name}"))
        for producer in list(self._topic.producers.values()):
            log.info("producer fenced out: topic=%s producer=%s", self._topic.full_name, producer.name)
            if not producer.closed:
                producer.connection.write_command(commands.close_producer(producer.producer_id))
                producer.connection.forget_producer(producer)
            producer.closed = True
            self._topic.remove_producer(producer)
        self.exclusive_producer = None

    async def _become_exclusive(self, producer: Producer, epoch: int | None) -> int:
        current = self.topic_epoch
        if epoch is not None and current is not None and epoch < current:
            raise ProducerFenced(f"topic {self._topic.full_name} epoch moved to {current}; the producer held {epoch}")
        # Taken before the await below, so that a concurrent request sees it.
        self.exclusive_producer = producer
        if epoch is not None and epoch == current:
            new_epoch = epoch                     # a reconnect of the holder
        else:
            # A new grant. An epoch the client claims beyond the topic's was never
            # granted here (a deleted topic's, or forged): it is not adopted, so
            # epochs only ever move by one (a forged 2**64 - 1 made every later grant
            # overflow the wire field, and no exclusive producer could be created).
            new_epoch = (current if current is not None else -1) + 1
        try:
            if new_epoch != current:
                await self._topic.ledger.set_properties({TOPIC_EPOCH_PROPERTY: str(new_epoch)})
        except BaseException:
            if self.exclusive_producer is producer:
                self.exclusive_producer = None
            raise
        self.topic_epoch = new_epoch
        log.info("exclusive producer: topic=%s producer=%s epoch=%d", self._topic.full_name, producer.name, new_epoch)
        return new_epoch

    def release_access(self, producer: Producer) -> None:
        """The producer left: if it held exclusive access, the next queued one gets it."""
        if self.exclusive_producer is not producer:
            return
        self.exclusive_producer = None
        while self._waiting_exclusive and not self._topic.closing:
            successor, granted = self._waiting_exclusive.popleft()
            if granted.done():
                continue
            self.exclusive_producer = successor    # reserved until its epoch is stored
            task = asyncio.get_running_loop().create_task(self._promote(successor, granted))
            self._promotions.add(task)
            task.add_done_callback(self._promotions.discard)
            task.add_done_callback(functools.partial(log_failure, owner=f"topic {self._topic.full_name}"))
            return

    async def _promote(self, producer: Producer, granted: asyncio.Future[int]) -> None:
        self.exclusive_producer = None
        try:
            epoch = await self._become_exclusive(producer, None)
        except MagnetarError as error:
            if not granted.done():
                granted.set_exception(error)
            return
        if granted.done():            # the waiting client went away meanwhile
            self.release_access(producer)
        else:
            granted.set_result(epoch)

    def close(self) -> None:
        """The topic is closing: the queued producers fail, promotions under way stop."""
        waiting, self._waiting_exclusive = self._waiting_exclusive, collections.deque()
        for _producer, granted in waiting:
            if not granted.done():
                granted.set_exception(TopicFenced(f"topic {self._topic.full_name} is being closed"))
        for task in list(self._promotions):
            task.cancel()
