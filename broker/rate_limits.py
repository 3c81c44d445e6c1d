"""Publish and dispatch rate limits per topic (Pulsar's ``publishRate`` and
``dispatchRate``), as token buckets.

Theory of operation:
- A limit of N messages (or bytes) per ``ratePeriodInSecond`` P is a bucket that fills
  at N/P per second and holds at most N: a topic idle for a while may send one
  period's worth at once (Pulsar resets its counters every period, which allows the
  same burst), then goes at the rate.
- Work already taken is never refused, dropped or failed: a publish that was read is
  stored whatever the bucket says, and takes its tokens even if that leaves the bucket
  below zero. The debt is paid by waiting: **publish** — while a topic's bucket is
  below zero, every connection that sends to it is not read (``PublishRateScope``
  blocks their ``ReadGate``s, the same switch as the pending-send bounds of
  broker/publish_limits.py), until the bucket is back at zero; TCP flow control holds
  the producers meanwhile. **dispatch** — the topic's dispatchers (all its
  subscriptions share the topic's limit, as Pulsar's topic dispatch rate does) read at
  most what the bucket allows, and none while it is empty; the dispatcher sets a timer
  for when it will have tokens again (subscriptions/dispatcher.py).
- Because debt is paid, the long-run rate is the limit however the work arrives; a
  window of T seconds holds at most N + rate * T plus what one socket read (publish) or
  one dispatch read (dispatch) overshoots.
- **per subscription** (Pulsar's ``subscriptionDispatchRate``): each subscription has
  a bucket of its own (``SubscriptionDispatchRates`` makes it), and dispatches only what
  both its own and the topic's shared bucket allow (``BothThrottles``).
- **relative to the publish rate** (Pulsar's ``relativeToPublishRate``, dispatch limits
  only): the limit is the configured rate plus what the topic published in the last
  whole second (``PublishWindow``, counted as publishes come, so a backlog written
  long before a consumer came does not lift it); the buckets' rate and capacity follow
  it at each new second. A topic consumed as fast as it is fed never falls behind, and
  a backlog drains at the configured rate above that.
- The limits come from the topic's effective policies (broker/topic_policies.py): a
  topic's own rate overrides its namespace's.
- A limit of -1 or 0 (Pulsar's "no limit") for messages and bytes alike means no
  bucket and no cost.
The buckets are pure (they take the time); the scopes hold the timers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from broker.publish_limits import PUBLISH_RATE, PublishLimits, ReadGate
# A pause shorter than this is rounded up to it: timers of microseconds would only spin.
WAIT_S_MIN = 0.001
# A throttled dispatcher waits until the bucket holds this long's worth of tokens (at
# most its capacity), so that it reads a batch, not one entry per bookie round trip (a
# read per token measured 26 msg/s against a 300 msg/s limit on a backlog).
DISPATCH_BATCH_S = 0.1


class TokenBucket:
    """Tokens accrue at ``rate_per_s`` up to ``capacity``; ``take`` may go below zero."""

    __slots__ = ("rate_per_s", "capacity", "tokens", "_time_s")

    def __init__(self, rate_per_s: float, capacity: float, now_s: float) -> None:
        assert rate_per_s > 0, rate_per_s
        assert capacity > 0, capacity
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self.tokens = capacity
        self._time_s = now_s

    def refill(self, now_s: float) -> float:
        if now_s > self._time_s:
            self.tokens = min(self.capacity, self.tokens + (now_s - self._time_s) * self.rate_per_s)
            self._time_s = now_s
        return self.tokens

    def take(self, amount: float, now_s: float) -> None:
        assert amount >= 0, amount
        self.refill(now_s)
        self.tokens -= amount

    def seconds_until(self, level: float, now_s: float) -> float:
        """How long until the bucket holds ``level`` tokens (0: it does)."""
        tokens = self.refill(now_s)
        return 0.0 if tokens >= level else (level - tokens) / self.rate_per_s


@dataclass(frozen=True)
class RateLimit:
    """Messages and bytes per period; None where there is no limit."""

    messages: int | None
    size_bytes: int | None
    period_s: float = 1.0
    # Dispatch only: the limit is this plus the topic's publish rate (see the header).
    relative: bool = False

    @property
    def limited(self) -> bool:
        return self.messages is not None or self.size_bytes is not None

    def buckets(self, now_s: float) -> list[TokenBucket]:
        return [TokenBucket(amount / self.period_s, amount, now_s)
                for amount in (self.messages, self.size_bytes) if amount is not None]


def _positive_or_none(value: int) -> int | None:
    return value if value > 0 else None


def publish_limit(doc: dict | None) -> RateLimit | None:
    if not doc:
        return None
    limit = RateLimit(_positive_or_none(int(doc.get("publishThrottlingRateInMsg", -1))),
                      _positive_or_none(int(doc.get("publishThrottlingRateInByte", -1))))
    return limit if limit.limited else None


def dispatch_limit(doc: dict | None) -> RateLimit | None:
    if not doc:
        return None
    limit = RateLimit(_positive_or_none(int(doc.get("dispatchThrottlingRateInMsg", -1))),
                      _positive_or_none(int(doc.get("dispatchThrottlingRateInByte", -1))),
                      float(doc.get("ratePeriodInSecond", 1)), bool(doc.get("relativeToPublishRate", False)))
    return limit if limit.limited else None


@dataclass(frozen=True)
class TopicRateLimits:
    """The limits a topic is served under (None: no limit)."""

    publish: RateLimit | None
    dispatch: RateLimit | None
    per_subscription: RateLimit | None


def topic_rate_limits(policies, cluster: str) -> TopicRateLimits:
    """The limits in ``policies`` (a topic's effective NamespacePolicies: its own rates
    laid over its namespace's) for ``cluster``."""
    return TopicRateLimits(publish_limit((policies.publishMaxMessageRate or {}).get(cluster)),
                           dispatch_limit((policies.topicDispatchRate or {}).get(cluster)),
                           dispatch_limit((policies.subscriptionDispatchRate or {}).get(cluster)))


class PublishRateScope:
    """A topic's publish rate: the gates of connections sending to it are blocked while
    its buckets are in debt. Duck-types broker/publish_limits.PendingSends where a gate
    records what blocks it (``kind``, ``name``, ``blocked``)."""

    def __init__(self, topic_name: str, limit: RateLimit, limits: PublishLimits,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kind = PUBLISH_RATE
        self.name = topic_name
        self.limit = limit
        self.blocked: set[ReadGate] = set()
        self._limits = limits
        self._clock = clock
        self._buckets = limit.buckets(clock())
        self._timer: asyncio.TimerHandle | None = None
        self.pauses = 0

    def on_publish(self, gate: ReadGate, messages: int, size_bytes: int) -> None:
        """Takes a publish's tokens (it is stored regardless); blocks the sender while
        the buckets are in debt."""
        now_s = self._clock()
        for bucket, amount in zip(self._buckets, self._amounts(messages, size_bytes)):
            bucket.take(amount, now_s)
        wait_s = self._wait_s(now_s)
        if wait_s <= 0:
            return
        if gate not in self.blocked:
            self.pauses += 1
            self._limits.block(gate, self)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(max(wait_s, WAIT_S_MIN), self._on_timer)

    def _amounts(self, messages: int, size_bytes: int) -> list[int]:
        return [amount for amount, limit in ((messages, self.limit.messages), (size_bytes, self.limit.size_bytes))
                if limit is not None]

    def _wait_s(self, now_s: float) -> float:
        return max(bucket.seconds_until(0.0, now_s) for bucket in self._buckets)

    def _on_timer(self) -> None:
        self._timer = None
        wait_s = self._wait_s(self._clock())
        if wait_s > 0:
            self._timer = asyncio.get_running_loop().call_later(max(wait_s, WAIT_S_MIN), self._on_timer)
            return
        self._limits.unblock(self)

    def close(self) -> None:
        """The topic is closing or its limit changed: nothing stays blocked on this."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.blocked:
            self._limits.unblock(self)


class PublishWindow:
    """What a topic published in the last whole second of the clock (messages, bytes),
    for relative dispatch limits: the topic counts each publish here while such a limit
    is set (PersistentTopic.publish); pure (it takes the time)."""

    __slots__ = ("_second", "_messages", "_bytes", "_last")

    def __init__(self) -> None:
        self._second = 0
        self._messages = 0
        self._bytes = 0
        self._last = (0, 0)

    def add(self, messages: int, size_bytes: int, now_s: float) -> None:
        second = int(now_s)
        if second != self._second:
            self._last = (self._messages, self._bytes) if second == self._second + 1 else (0, 0)
            self._second, self._messages, self._bytes = second, 0, 0
        self._messages += messages
        self._bytes += size_bytes

    def last_second(self, now_s: float) -> tuple[int, int]:
        """(messages, bytes) published in the whole second before ``now_s``'s."""
        second = int(now_s)
        if second == self._second:
            return self._last
        if second == self._second + 1:
            return self._messages, self._bytes
        return 0, 0


class DispatchRateThrottle:
    """A topic's dispatch rate, shared by its subscriptions' dispatchers
    (subscriptions/ports.py ``DispatchThrottle``). ``published``: the topic's publish
    window, which a relative limit needs (without one it stays at the configured rate)."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic,
                 published: PublishWindow | None = None) -> None:
        self.limit = limit
        self._clock = clock
        now_s = clock()
        self._messages = TokenBucket(limit.messages / limit.period_s, limit.messages, now_s) \
            if limit.messages is not None else None
        self._bytes = TokenBucket(limit.size_bytes / limit.period_s, limit.size_bytes, now_s) \
            if limit.size_bytes is not None else None
        # Mean bytes per message dispatched, to turn byte tokens into messages.
        self._message_bytes = 1024.0
        self._published = published if limit.relative else None
        self._second = int(now_s)
        # The publish rates (messages/s, bytes/s) the buckets follow now.
        self.publish_rates = (0.0, 0.0)

    def _follow_publish_rate(self, now_s: float) -> None:
        """A relative limit: at each new second, the buckets' rate becomes the configured
        one plus what the topic published in the second before."""
        assert self._published is not None
        second = int(now_s)
        if second == self._second:
            return
        self._second = second
        messages, size_bytes = self._published.last_second(now_s)
        self.publish_rates = (float(messages), float(size_bytes))
        limit = self.limit
        for bucket, configured, published_per_s in ((self._messages, limit.messages, self.publish_rates[0]),
                                                    (self._bytes, limit.size_bytes, self.publish_rates[1])):
            if bucket is None or configured is None:
                continue
            bucket.refill(now_s)          # tokens accrued so far at the old rate
            bucket.rate_per_s = configured / limit.period_s + published_per_s
            bucket.capacity = configured + published_per_s * limit.period_s
            bucket.tokens = min(bucket.tokens, bucket.capacity)

    def allowance(self) -> int:
        """Messages that may be dispatched now (0: none until ``retry_after_s``)."""
        now_s = self._clock()
        if self._published is not None:
            self._follow_publish_rate(now_s)
        allowed = 2**31 - 1
        if self._messages is not None:
            allowed = min(allowed, int(self._messages.refill(now_s)))
        if self._bytes is not None:
            tokens = self._bytes.refill(now_s)
            allowed = min(allowed, 0 if tokens <= 0 else max(1, int(tokens / self._message_bytes)))
        return max(0, allowed)

    def consume(self, messages: int, size_bytes: int) -> None:
        now_s = self._clock()
        if self._messages is not None:
            self._messages.take(messages, now_s)
        if self._bytes is not None:
            self._bytes.take(size_bytes, now_s)
        if messages > 0:
            self._message_bytes += 0.1 * (size_bytes / messages - self._message_bytes)

    def retry_after_s(self) -> float:
        now_s = self._clock()
        waits = [0.0]
        for bucket in (self._messages, self._bytes):
            if bucket is not None:
                level = min(bucket.capacity, max(1.0, bucket.rate_per_s * DISPATCH_BATCH_S))
                waits.append(bucket.seconds_until(level, now_s))
        return max(max(waits), WAIT_S_MIN)


class BothThrottles:
    """A subscription's own dispatch throttle and its topic's shared one: it dispatches
    what both allow, and both pay for what it sent."""

    def __init__(self, shared: DispatchRateThrottle, own: DispatchRateThrottle) -> None:
        self.shared = shared
        self.own = own

    def allowance(self) -> int:
        return min(self.shared.allowance(), self.own.allowance())

    def consume(self, messages: int, size_bytes: int) -> None:
        self.shared.consume(messages, size_bytes)
        self.own.consume(messages, size_bytes)

    def retry_after_s(self) -> float:
        return max(throttle.retry_after_s() for throttle in (self.shared, self.own)
                   if throttle.allowance() <= 0) if self.allowance() <= 0 else WAIT_S_MIN


class SubscriptionDispatchRates:
    """Makes each subscription of a topic its own throttle of ``limit`` (joined with the
    topic's shared ``topic_throttle`` when there is one)."""

    def __init__(self, limit: RateLimit, topic_throttle: DispatchRateThrottle | None,
                 clock: Callable[[], float] = time.monotonic, published: PublishWindow | None = None) -> None:
        self.limit = limit
        self.topic_throttle = topic_throttle
        self._clock = clock
        self._published = published

    def throttle(self) -> DispatchRateThrottle | BothThrottles:
        own = DispatchRateThrottle(self.limit, self._clock, self._published)
        return own if self.topic_throttle is None else BothThrottles(self.topic_throttle, own)
