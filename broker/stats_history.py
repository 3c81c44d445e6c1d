"""What the console draws over time, kept by the broker that serves the topics: per topic
its rates in and out, backlog and storage; per subscription its backlog, rate out and
unacknowledged messages; and since when each subscription has been falling behind.
Served by ``GET .../{topic}/statsHistory`` (broker/admin/stats_history.py).

Theory of operation:
- **Sampling.** Every ``interval_s`` the broker reads its loaded topics
  (``read_topics``: counters and backlogs the topics keep anyway, no IO; a few at a time,
  broker/topic_upkeep.py) and hands the readings to ``StatsHistory.sample``. Rates are the counters' growth since the
  previous sample divided by the time between them; a series' first sample has no rate
  (``None`` in the answer), and a counter that went down (a subscription deleted and
  made again) measures nothing for that sample rather than a negative rate.
- **Bounded.** A series keeps its last ``samples_max = window_s / interval_s`` samples
  in fixed-size rings of 8-byte floats. At most ``topics_max`` topics and
  ``subscriptions_max`` subscriptions (of the tracked topics) are tracked. Past a bound,
  each sample tracks those with the largest backlog (on a tie, those already tracked,
  then by name); one pushed out loses its history, and one let in starts an empty one.
  The memory is therefore at most ``topics_max * 5 * samples_max * 8`` plus
  ``subscriptions_max * 3 * samples_max * 8`` bytes of samples (at the defaults, 500
  topics and 1,000 subscriptions at 360 samples: 7.2 MB + 8.6 MB), plus a few hundred
  bytes of bookkeeping per tracked series.
- **Dropped with the topic.** A topic that is not among the readings (unloaded, moved to
  another broker, deleted) loses its history at the next sample, and at once when the
  broker tells ``drop`` (the topic closed). A topic object replaced under the same name
  (closed and loaded again) starts a new history; so does a subscription. A topic that
  moves to another broker starts a new history there: nothing is handed over.
- **Falling behind since.** For each subscription: the time of the first sample of the
  current run of samples whose backlog is non-zero and never went down from one sample
  to the next. While the backlog is zero, or the last sample saw it go down (a consumer
  is draining it), the subscription is not falling behind (``None``). The run's start
  is state of its own, so it can be older than the oldest sample still kept (a backlog
  growing for two hours with a one-hour window), but no older than the first sample on
  this broker (``historyStart`` says when that was). Why this rule and not the publish
  time of the oldest unacknowledged message (Pulsar's ``earliestMsgPublishTimeInBacklog``):
  that costs a read from the bookies per subscription and sample, and answers another
  question, how old the oldest message is: a subscription a steady hour behind has an
  old oldest message but is not falling further behind, and one whose consumer drains
  part of a growing backlog still has young messages at its head while it loses ground.
Pure: it reads topics and the times it is given; no IO, no clock, no logging.
"""

from __future__ import annotations

import heapq
import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from common.errors import ConfigError


@dataclass(frozen=True)
class HistoryLimits:
    # A sample every 10 s over an hour: fine enough to see when a backlog turned, and
    # 360 samples per series (Pulsar's own stats refresh every 60 s; Grafana dashboards
    # keep the longer curves from Prometheus).
    interval_s: float = 10.0
    window_s: float = 3600.0
    topics_max: int = 500
    subscriptions_max: int = 1000

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 3600:
            raise ConfigError("stats_history_interval_s must be in [0.05, 3600]")
        if not self.interval_s <= self.window_s <= 7 * 24 * 3600:
            raise ConfigError("stats_history_window_s must be in [stats_history_interval_s, 604800]")
        if self.samples_max > 100_000:
            raise ConfigError("stats_history_window_s / stats_history_interval_s must be at most 100000 samples")
        if not 0 <= self.topics_max <= 100_000:
            raise ConfigError("stats_history_topics_max must be in [0, 100000]")
        if not 0 <= self.subscriptions_max <= 1_000_000:
            raise ConfigError("stats_history_subscriptions_max must be in [0, 1000000]")

    @property
    def samples_max(self) -> int:
        return max(1, int(self.window_s / self.interval_s + 1e-9))

    def sample_bytes_max(self) -> int:
        """The most the samples can take (the rings' floats)."""
        return 8 * self.samples_max * (len(TOPIC_FIELDS) * self.topics_max
                                       + len(SUBSCRIPTION_FIELDS) * self.subscriptions_max)


# The series of a topic and of a subscription, by their names in the REST answer
# (Pulsar's stats field names where it has them).
TOPIC_FIELDS = ("timestamps", "msgRateIn", "msgRateOut", "msgBacklog", "storageSize")
SUBSCRIPTION_FIELDS = ("msgBacklog", "msgRateOut", "unackedMessages")


class SubscriptionReading(NamedTuple):      # a tuple: made 10,000s of times per sample
    identity: int               # the subscription object's id: another object restarts the series
    backlog_entries: int
    messages_out: int           # monotone while the subscription lives
    unacked_messages: int


@dataclass(frozen=True)
class TopicReading:
    name: str
    identity: int
    messages_in: int
    storage_bytes: int
    subscriptions: dict[str, SubscriptionReading] = field(default_factory=dict)
    # Summed over the subscriptions once (the ranking past topics_max reads them often).
    backlog_entries: int = field(init=False)
    messages_out: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backlog_entries", sum(s.backlog_entries for s in self.subscriptions.values()))
        object.__setattr__(self, "messages_out", sum(s.messages_out for s in self.subscriptions.values()))


def read_topics(topics: Iterable[Any]) -> list[TopicReading]:
    """What one sample needs of the loaded topics (broker/topic.py PersistentTopic, not
    imported: broker/config.py imports this module, and topic imports config): one
    pass, counters only."""
    readings = []
    for topic in topics:
        if topic.closing:
            continue
        subscriptions = {}
        for name, subscription in list(topic.subscriptions.items()):
            dispatcher = subscription.dispatcher
            subscriptions[name] = SubscriptionReading(
                id(subscription), subscription.cursor.backlog_entries(topic.entries_between),
                dispatcher.messages_dispatched, sum(dispatcher.unacked_messages(c) for c in subscription.consumers))
        readings.append(TopicReading(topic.full_name, id(topic), topic.messages_in, topic.ledger.total_size(),
                                     subscriptions))
    return readings


class _Ring:
    """The last ``capacity`` floats appended, in 8 bytes each."""

    __slots__ = ("values", "count", "capacity")

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1
        self.values = array("d")
        self.count = 0          # appended since the start (the ring keeps the last capacity)
        self.capacity = capacity

    def append(self, value: float) -> None:
        if len(self.values) < self.capacity:
            self.values.append(value)
        else:
            self.values[self.count % self.capacity] = value
        self.count += 1
        assert len(self.values) <= self.capacity

    def ordered(self) -> list[float]:
        if self.count <= self.capacity:
            return self.values.tolist()
        split = self.count % self.capacity
        return self.values[split:].tolist() + self.values[:split].tolist()


def _json_number(value: float) -> float | int | None:
    if math.isnan(value):
        return None
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


class _Behind:
    """The since-when rule's state for one subscription (see the module's docstring)."""

    __slots__ = ("run_start_ms", "previous_backlog", "draining")

    def __init__(self) -> None:
        self.run_start_ms: float | None = None   # first sample of the current run
        self.previous_backlog: int | None = None
        self.draining = False

    def observe(self, backlog: int, time_ms: float) -> None:
        previous = self.previous_backlog
        if backlog == 0:
            self.run_start_ms = None
        elif previous is None or previous == 0 or backlog < previous:
            self.run_start_ms = time_ms          # a run starts here
        self.draining = previous is not None and backlog < previous
        self.previous_backlog = backlog

    @property
    def since_ms(self) -> float | None:
        if self.draining or not self.previous_backlog:
            return None
        return self.run_start_ms


class _SubscriptionSeries:
    __slots__ = ("identity", "rings", "behind", "previous_out", "previous_time_s", "first_ms")

    def __init__(self, identity: int, capacity: int) -> None:
        self.identity = identity
        self.rings = tuple(_Ring(capacity) for _ in SUBSCRIPTION_FIELDS)
        self.behind = _Behind()
        self.previous_out: int | None = None
        self.previous_time_s = 0.0
        self.first_ms: float | None = None

    def add(self, reading: SubscriptionReading, time_ms: float, time_s: float) -> None:
        backlog, rate_out, unacked = self.rings
        backlog.append(reading.backlog_entries)
        rate_out.append(_rate(self.previous_out, reading.messages_out, self.previous_time_s, time_s))
        unacked.append(reading.unacked_messages)
        self.previous_out, self.previous_time_s = reading.messages_out, time_s
        self.behind.observe(reading.backlog_entries, time_ms)
        if self.first_ms is None:
            self.first_ms = time_ms


class _TopicSeries:
    __slots__ = ("identity", "rings", "subscriptions", "previous_in", "previous_out", "previous_time_s", "first_ms")

    def __init__(self, identity: int, capacity: int) -> None:
        self.identity = identity
        self.rings = tuple(_Ring(capacity) for _ in TOPIC_FIELDS)
        self.subscriptions: dict[str, _SubscriptionSeries] = {}
        self.previous_in: int | None = None
        self.previous_out: int | None = None
        self.previous_time_s = 0.0
        self.first_ms: float | None = None

    def add(self, reading: TopicReading, time_ms: float, time_s: float) -> None:
        times, rate_in, rate_out, backlog, storage = self.rings
        times.append(time_ms)
        rate_in.append(_rate(self.previous_in, reading.messages_in, self.previous_time_s, time_s))
        messages_out = reading.messages_out
        rate_out.append(_rate(self.previous_out, messages_out, self.previous_time_s, time_s))
        backlog.append(reading.backlog_entries)
        storage.append(reading.storage_bytes)
        if self.first_ms is None:
            self.first_ms = time_ms
        self.previous_in, self.previous_out, self.previous_time_s = reading.messages_in, messages_out, time_s


def _rate(previous: int | None, current: int, previous_time_s: float, time_s: float) -> float:
    if previous is None or current < previous or time_s <= previous_time_s:
        return math.nan
    return (current - previous) / (time_s - previous_time_s)


@dataclass
class HistoryCounts:
    samples: int = 0                 # sampling passes since start
    topics_untracked: int = 0        # loaded topics past topics_max at the last sample
    subscriptions_untracked: int = 0  # subscriptions of tracked topics past subscriptions_max


class StatsHistory:
    def __init__(self, limits: HistoryLimits) -> None:
        self.limits = limits
        self._topics: dict[str, _TopicSeries] = {}
        self.counts = HistoryCounts()

    def __len__(self) -> int:
        return len(self._topics)

    def subscriptions_tracked(self) -> int:
        return sum(len(t.subscriptions) for t in self._topics.values())

    def drop(self, topic_name: str, identity: int) -> None:
        """The topic object ``identity`` closed here (unloaded, moved, deleted): its
        history goes (not that of another object loaded under the name since)."""
        series = self._topics.get(topic_name)
        if series is not None and series.identity == identity:
            del self._topics[topic_name]

    def sample(self, readings: list[TopicReading], time_ms: float, time_s: float) -> None:
        """One sample of every loaded topic: ``time_ms`` is the wall clock (shown),
        ``time_s`` a monotonic clock (rates)."""
        limits = self.limits
        capacity = limits.samples_max
        self.counts.samples += 1
        current = self._topics
        chosen = _largest(readings, limits.topics_max,
                          lambda r: r.name in current and current[r.name].identity == r.identity)
        self.counts.topics_untracked = len(readings) - len(chosen)
        kept: dict[str, _TopicSeries] = {}
        for reading in chosen:
            series = current.get(reading.name)
            if series is None or series.identity != reading.identity:
                series = _TopicSeries(reading.identity, capacity)
            series.add(reading, time_ms, time_s)
            kept[reading.name] = series
        self._topics = kept
        # The subscriptions of the tracked topics, the largest backlogs first.
        candidates = [(reading, name, sub) for reading in chosen for name, sub in reading.subscriptions.items()]
        candidates.sort(key=lambda c: (-c[2].backlog_entries, not _tracked_subscription(kept[c[0].name], c[1], c[2]),
                                       c[0].name, c[1]))
        self.counts.subscriptions_untracked = max(0, len(candidates) - limits.subscriptions_max)
        subscriptions: dict[str, dict[str, _SubscriptionSeries]] = {name: {} for name in kept}
        for reading, name, sub in candidates[:limits.subscriptions_max]:
            series = kept[reading.name].subscriptions.get(name)
            if series is None or series.identity != sub.identity:
                series = _SubscriptionSeries(sub.identity, capacity)
            series.add(sub, time_ms, time_s)
            subscriptions[reading.name][name] = series
        for name, topic_series in kept.items():
            topic_series.subscriptions = subscriptions[name]
        assert len(self._topics) <= limits.topics_max
        assert self.subscriptions_tracked() <= limits.subscriptions_max

    def topic_history(self, topic_name: str, *, samples: bool = True) -> dict:
        """The REST answer for one topic (docs/console.md describes it)."""
        limits = self.limits
        answer: dict = {"topic": topic_name, "intervalSeconds": limits.interval_s, "windowSeconds": limits.window_s,
                        "topicsMax": limits.topics_max, "subscriptionsMax": limits.subscriptions_max}
        series = self._topics.get(topic_name)
        if series is None:
            answer.update(tracked=False, historyStart=None, behindSince=None, behindSubscription=None,
                          subscriptions={})
            if samples:
                answer.update({name: [] for name in TOPIC_FIELDS})
            return answer
        times = series.rings[0]
        length = min(times.count, times.capacity)
        answer.update(tracked=True, historyStart=_json_number(series.first_ms))
        if samples:
            for name, ring in zip(TOPIC_FIELDS, series.rings):
                answer[name] = [_json_number(v) for v in ring.ordered()]
        subscriptions = {}
        behind: tuple[float, str] | None = None
        for name, sub in sorted(series.subscriptions.items()):
            since = sub.behind.since_ms
            sub_length = min(sub.rings[0].count, sub.rings[0].capacity)
            assert sub_length <= length, (sub_length, length)
            entry: dict = {"tracked": True, "historyStart": _json_number(sub.first_ms),
                           "behindSince": _json_number(since) if since is not None else None,
                           "firstSampleIndex": length - sub_length}
            if samples:
                for field_name, ring in zip(SUBSCRIPTION_FIELDS, sub.rings):
                    entry[field_name] = [_json_number(v) for v in ring.ordered()]
            subscriptions[name] = entry
            if since is not None and (behind is None or since < behind[0]):
                behind = (since, name)
        answer["subscriptions"] = subscriptions
        answer["behindSince"] = _json_number(behind[0]) if behind is not None else None
        answer["behindSubscription"] = behind[1] if behind is not None else None
        return answer


def _tracked_subscription(topic_series: _TopicSeries, name: str, reading: SubscriptionReading) -> bool:
    series = topic_series.subscriptions.get(name)
    return series is not None and series.identity == reading.identity


def _largest(readings: list[TopicReading], count: int, tracked) -> list[TopicReading]:
    """The ``count`` readings with the largest backlog (on a tie, those tracked already,
    then by name), in that order; all of them when they fit."""
    if len(readings) <= count:
        return readings
    return heapq.nsmallest(count, readings, key=lambda r: (-r.backlog_entries, not tracked(r), r.name))
