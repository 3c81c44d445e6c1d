"""The gateway's broker consumers and the pulls they serve.

Theory of operation:
- A ``GatewayConsumer`` is one broker consumer (client/consumer.py) plus its lease table
  (gateway/leases.py). Which one serves a pull is decided by ``ConsumerKey``: in shared
  mode one per (topic, subscription) per gateway instance, shared by every HTTP worker;
  in key-shared, exclusive and failover one per named consumer, since the broker keeps
  keys and turns per consumer; in broadcast one per member (the broker gives each
  member its own cursor; consumers of one member share it).
- Flow control, not prefetch: a pull that finds too few READY messages registers as a
  waiter and the consumer grants the broker just enough permits for what waiters still
  want (``_grant``). Arriving entries fill waiters oldest first. A waiter that times out
  leaves its permits behind (the protocol cannot take them back); what they bring waits
  READY, without a lease, for the next pull, at most ``ready_hold_ms``, then goes back
  to the subscription. A pull over a partitioned topic waits on every partition's
  consumer at once and splits its permits between them.
- Leases start when the response is written (``written``), or the messages go back to
  READY (``unwritten``). A tick task (``LeaseClock``) ends leases when due and gives
  their entries back to the broker with REDELIVER (gateway/leases.py says why whole
  entries, and why never from here again).
- When the broker connection goes, the broker redelivers what this consumer held, so the
  lease table is cleared: receipts issued before cannot be extended or nacked here any
  more (acks still reach the broker, which is the authority). A gateway that dies
  (kill -9) drops its connections, and the broker redelivers the same way: that is why
  a crash loses nothing.
- Dead letters: a pull may say ``max_deliveries`` (and a topic): an entry arriving for
  delivery number max_deliveries + 1 is published to the dead-letter topic, then
  acknowledged, instead of being handed out.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from client.consumer import Consumer
from client.messages import MessageId, ReceivedEntry
from client.pool import BrokerPool
from common.errors import MagnetarError, ServiceNotReady, ShuttingDown, TooManyRequests
from runtime.tasks import cancel_and_wait
from gateway.config import GatewayConfig
from gateway.leases import LeaseTable, Slot
from gateway.receipts import ReceiptContext

log = logging.getLogger(__name__)

BROADCAST_PROPERTY = "magnetar.subscription.mode"
# A pull that asked not to wait still waits this long for the broker's answer to its
# permits: without a prefetch queue there is nothing to answer from before that.
SHORT_POLL_S = 0.1
# Once a pull has something, it waits this much longer for the rest of the same
# dispatch round (entries of one round arrive within a few ms of each other).
GATHER_S = 0.005
# Dead-letter publications in flight per consumer; past it, arrivals wait in the table.
DEAD_LETTERS_IN_FLIGHT_MAX = 64

# The broker subscription type behind each gateway mode (broadcast members share their
# member cursor like a shared subscription).
READ_AHEAD_MODES = ("shared", "key_shared", "broadcast")
SUB_TYPES = {"shared": "shared", "key_shared": "key_shared", "exclusive": "exclusive", "failover": "failover",
             "broadcast": "shared"}


@dataclass(frozen=True, slots=True)
class ConsumerKey:
    topic: str              # a topic or one partition of it
    subscription: str
    mode: str
    name: str               # the consumer or member name; "" for the shared pool


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    max_deliveries: int
    topic: str


# (dead-letter topic, topic the entry came from, the entry)
DeadLetterSink = Callable[[str, str, ReceivedEntry], Awaitable[None]]


@dataclass(eq=False, repr=False)
class Waiter:
    """One pull waiting for messages, possibly on several consumers (partitions)."""

    want: int
    consumers: list["GatewayConsumer"]
    ordered: bool = False
    taken: list[tuple["GatewayConsumer", Slot]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failure: MagnetarError | None = None

    @property
    def remaining(self) -> int:
        return self.want - len(self.taken)

    def share(self) -> int:
        """Permits this waiter asks of each of its consumers."""
        return math.ceil(self.remaining / len(self.consumers)) if self.remaining > 0 else 0


class GatewayConsumer:
    def __init__(self, key: ConsumerKey, pool: BrokerPool, config: GatewayConfig, instance_name: str,
                 dead_letter_sink: DeadLetterSink) -> None:
        self.key = key
        self.config = config
        self.table = LeaseTable(config.leases_per_subscription_max, config.ready_hold_ms / 1000,
                                config.deferral_ms_max / 1000)
        sub_type = SUB_TYPES[key.mode]
        properties = {BROADCAST_PROPERTY: "broadcast"} if key.mode == "broadcast" else {}
        consumer_name = key.name or instance_name
        self._pool = pool
        self._consumer_options = dict(sub_type=sub_type, consumer_name=consumer_name, properties=properties)
        self.consumer: Consumer | None = None
        self.waiters: collections.deque[Waiter] = collections.deque()
        self.dead_letter_policy: DeadLetterPolicy | None = None
        self._dead_letter_sink = dead_letter_sink
        self._dead_letter_tasks: set[asyncio.Task[None]] = set()
        self.last_used_s = time.monotonic()
        # Laid out on the first receipt this consumer's messages get (gateway/service.py).
        self.receipt_context: ReceiptContext | None = None
        self.failure: MagnetarError | None = None
        self.closed = False
        self.messages_delivered = 0
        self.messages_returned = 0
        self.entries_returned_unused = 0
        # Told (key, messages) when leases end without an ack (counted per subscription).
        self.on_leases_ended: Callable[[ConsumerKey, int], None] | None = None
        # Messages pulls took in the current and the previous half of ready_hold_ms:
        # what pulls take meanwhile is all that is worth reading ahead.
        self._taken_windows = [0, 0]
        self._window_started_s = time.monotonic()
        # Exclusive and failover give back by rewinding their cursor, which sends every
        # message in flight again: no read-ahead there.
        self.read_ahead_modes = key.mode in READ_AHEAD_MODES

    async def start(self, initial_position: str) -> None:
        self.consumer = Consumer(self._pool, self.key.topic, self.key.subscription, listener=self,
                                 initial_position=initial_position, **self._consumer_options)
        await self.consumer.start()
        log.info("gateway consumer started: topic=%s subscription=%s mode=%s name=%s", self.key.topic,
                 self.key.subscription, self.key.mode, self.key.name)

    @property
    def idle(self) -> bool:
        return not self.waiters and self.table.entries == 0 and not self._dead_letter_tasks

    # --- pulls ----------------------------------------------------------------------------------

    def register(self, waiter: Waiter) -> None:
        if self.failure is not None:
            raise self.failure
        self.last_used_s = time.monotonic()
        self.waiters.append(waiter)
        self._feed()
        self._grant(pulled=True)

    def unregister(self, waiter: Waiter) -> None:
        # Checked first: a failed deque.remove formats the repr of what it looked for.
        if waiter in self.waiters:
            self.waiters.remove(waiter)

    def _grant(self, pulled: bool = False) -> None:
        """Asks the broker for what waiters still want beyond the permits outstanding."""
        consumer = self.consumer
        if consumer is None or not consumer.ready:
            return
        demand = sum(waiter.share() for waiter in self.waiters)
        if (demand or pulled) and self.read_ahead_modes:
            # Read-ahead, topped up by each pull: not leased, given back unused (not a
            # delivery) under the ready_hold_ms rule when no pull takes it.
            demand += max(0, self.read_ahead_target() - self.table.ready)
        demand = min(demand, self.table.room - self.table.ready)
        if demand > consumer.permits_outstanding:
            consumer.flow(demand - consumer.permits_outstanding)

    def read_ahead_target(self) -> int:
        """How much to hold READY beyond what waiters want: what pulls took over the
        last half hold (at least one window), at most config.read_ahead_messages - so
        a read-ahead is taken before ready_hold_ms sends it back, and occasional pulls
        read ahead nothing."""
        now_s = time.monotonic()
        window_s = self.config.ready_hold_ms / 2000
        elapsed = now_s - self._window_started_s
        if elapsed >= window_s:
            self._taken_windows = [0, self._taken_windows[0]] if elapsed < 2 * window_s else [0, 0]
            self._window_started_s = now_s
        return min(self.config.read_ahead_messages, max(self._taken_windows))

    def _feed(self) -> None:
        """Hands READY messages to waiters, oldest waiter first."""
        while self.waiters and self.table.ready and self.table.room > 0:
            waiter = self.waiters[0]
            slots = self.table.take(waiter.remaining, waiter.ordered)
            if not slots:
                break
            waiter.taken.extend((self, slot) for slot in slots)
            self._taken_windows[0] += len(slots)
            waiter.wake.set()
            if waiter.remaining <= 0:
                self.waiters.popleft()
                for other in waiter.consumers:
                    if other is not self:
                        other.unregister(waiter)

    def written(self, slots: list[Slot], lease_s: float) -> None:
        self.table.written(slots, lease_s, time.monotonic())
        self.messages_delivered += len(slots)

    def unwritten(self, slots: list[Slot]) -> None:
        self.table.unwritten(slots, time.monotonic())
        self._feed()

    # --- the broker's side (client.consumer.ConsumerListener) ------------------------------------

    def on_entry(self, entry: ReceivedEntry) -> None:
        policy = self.dead_letter_policy
        if policy is not None and entry.redelivery_count + 1 > policy.max_deliveries and entry.messages:
            if len(self._dead_letter_tasks) < DEAD_LETTERS_IN_FLIGHT_MAX:
                task = asyncio.get_running_loop().create_task(self._dead_letter(policy, entry))
                self._dead_letter_tasks.add(task)
                task.add_done_callback(self._dead_letter_tasks.discard)
                return
        self.table.add(entry, time.monotonic(), int(time.time() * 1000))
        self._feed()
        self._grant()

    async def _dead_letter(self, policy: DeadLetterPolicy, entry: ReceivedEntry) -> None:
        try:
            await self._dead_letter_sink(policy.topic, self.key.topic, entry)
            assert self.consumer is not None
            await self.consumer.ack([m.message_id for m in entry.messages])
            log.info("dead-lettered: topic=%s subscription=%s position=%s deliveries=%d dead_letter_topic=%s",
                     self.key.topic, self.key.subscription, entry.position, entry.redelivery_count, policy.topic)
        except MagnetarError as error:
            # Not acknowledged: the broker still holds it for this consumer; give it back
            # so it comes round again (and is dead-lettered then).
            log.warning("dead-lettering failed, giving the entry back: topic=%s position=%s error=%s",
                        self.key.topic, entry.position, error)
            if self.consumer is not None:
                self.consumer.redeliver([entry.position])

    def on_disconnected(self) -> None:
        held = self.table.clear()
        if held:
            log.info("gateway consumer lost its broker, leases void (the broker redelivers): topic=%s "
                     "subscription=%s messages=%d", self.key.topic, self.key.subscription, held)

    def on_reconnected(self) -> None:
        self._grant()

    def on_failed(self, error: MagnetarError) -> None:
        self.failure = error
        for waiter in list(self.waiters):
            waiter.failure = error
            waiter.wake.set()
        self.waiters.clear()

    # --- leases --------------------------------------------------------------------------------------

    def tick(self, now_s: float) -> None:
        ended_before = self.table.leases_ended
        positions, unused = self.table.expire_split(now_s)
        ended = self.table.leases_ended - ended_before
        if ended and self.on_leases_ended is not None:
            self.on_leases_ended(self.key, ended)
        if positions:
            self.messages_returned += len(positions)
            if self.consumer is not None:
                self.consumer.redeliver(positions)
            log.debug("leases ended, entries given back: topic=%s subscription=%s entries=%d", self.key.topic,
                      self.key.subscription, len(positions))
        if unused and self.consumer is not None:
            # Never handed out (read ahead, or left by a pull that gave up): not a
            # delivery attempt, so the broker keeps their redelivery counts.
            self.consumer.redeliver(unused, unused=True)
            self.entries_returned_unused += len(unused)
        if self.waiters:
            self._feed()
            self._grant()

    async def ack(self, message_ids: list[MessageId]) -> None:
        """Acknowledges through this consumer's broker connection (any consumer of the
        subscription may acknowledge any of its messages)."""
        for message_id in message_ids:
            self.table.ack(message_id.position, message_id.batch_index)
        if self.consumer is None:
            raise ServiceNotReady("consumer is not started")
        self.last_used_s = time.monotonic()
        await self.consumer.ack(message_ids)

    async def close(self) -> None:
        self.closed = True
        self.on_failed(ShuttingDown(f"consumer of {self.key.topic} closed"))
        await cancel_and_wait(*self._dead_letter_tasks)
        if self.consumer is not None:
            await self.consumer.close()
        self.table.clear()


class ConsumerPool:
    """The gateway's consumers by key: made on first use (at most ``consumers_max``),
    closed when idle for ``consumer_idle_ms`` or when their broker consumer failed for
    good. Its tick task ends leases; it belongs to the pool's ``run``."""

    def __init__(self, pool: BrokerPool, config: GatewayConfig, instance_name: str,
                 dead_letter_sink: DeadLetterSink) -> None:
        self._pool = pool
        self.config = config
        self.instance_name = instance_name
        self._dead_letter_sink = dead_letter_sink
        self.consumers: dict[ConsumerKey, GatewayConsumer] = {}
        self._starting: dict[ConsumerKey, asyncio.Task[GatewayConsumer]] = {}
        self.closed = False
        self.on_leases_ended: Callable[[ConsumerKey, int], None] | None = None
        # Entries given back unused by consumers closed since (the metric adds the open ones').
        self.entries_returned_unused_closed = 0

    @property
    def entries_returned_unused(self) -> int:
        return self.entries_returned_unused_closed + sum(consumer.entries_returned_unused
                                                         for consumer in self.consumers.values())

    async def get(self, key: ConsumerKey, initial_position: str = "latest") -> GatewayConsumer:
        if self.closed:
            raise ShuttingDown("the gateway is stopping")
        consumer = self.consumers.get(key)
        if consumer is not None and consumer.failure is None:
            return consumer
        if consumer is not None:
            await self._close(key)
        starting = self._starting.get(key)
        if starting is None:
            if len(self.consumers) + len(self._starting) >= self.config.consumers_max:
                raise TooManyRequests(f"this gateway holds {self.config.consumers_max} consumers already")
            starting = asyncio.get_running_loop().create_task(self._start(key, initial_position))
            starting.add_done_callback(lambda task: task.cancelled() or task.exception())
            self._starting[key] = starting
        return await asyncio.shield(starting)

    async def _start(self, key: ConsumerKey, initial_position: str) -> GatewayConsumer:
        try:
            consumer = GatewayConsumer(key, self._pool, self.config, self.instance_name, self._dead_letter_sink)
            consumer.on_leases_ended = self.on_leases_ended
            await consumer.start(initial_position)
            self.consumers[key] = consumer
            return consumer
        finally:
            self._starting.pop(key, None)

    def find(self, key: ConsumerKey) -> GatewayConsumer | None:
        return self.consumers.get(key)

    async def close_subscription(self, subscription: str, member: str | None = None) -> None:
        """Closes this gateway's consumers of ``subscription`` (of one member's cursor
        when ``member`` is given), before the subscription is deleted."""
        for key in [key for key in self.consumers if key.subscription == subscription
                    and (member is None or key.name == member)]:
            await self._close(key)

    async def _close(self, key: ConsumerKey) -> None:
        consumer = self.consumers.pop(key, None)
        if consumer is not None:
            self.entries_returned_unused_closed += consumer.entries_returned_unused
            await consumer.close()

    async def run(self) -> None:
        """Ends leases every ``lease_tick_ms`` and closes idle or failed consumers. The
        closes run beside the ticks (a close waits on the broker, up to the operation
        timeout, and leases must not wait for it)."""
        tick_s = self.config.lease_tick_ms / 1000
        idle_s = self.config.consumer_idle_ms / 1000
        closing: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(tick_s)
                now_s = time.monotonic()
                for key, consumer in list(self.consumers.items()):
                    consumer.tick(now_s)
                    if consumer.failure is not None or (consumer.idle and now_s - consumer.last_used_s > idle_s):
                        log.info("gateway consumer closed: topic=%s subscription=%s reason=%s", key.topic,
                                 key.subscription, "failed" if consumer.failure else "idle")
                        del self.consumers[key]
                        self.entries_returned_unused_closed += consumer.entries_returned_unused
                        task = asyncio.get_running_loop().create_task(consumer.close())
                        closing.add(task)
                        task.add_done_callback(closing.discard)
        finally:
            await cancel_and_wait(*closing)

    async def close(self) -> None:
        self.closed = True
        await cancel_and_wait(*self._starting.values())
        for key in list(self.consumers):
            await self._close(key)

    @property
    def leases(self) -> int:
        return sum(consumer.table.active for consumer in self.consumers.values())
