"""The console's bounded history (broker/stats_history.py), fed readings by hand: rates
from counters, the ring keeps the last window's samples, the bounds on topics and
subscriptions keep the largest backlogs (and drop the rest's history), a topic closed or
replaced starts over, and the "falling behind since" rule: the first sample of the
current run of non-zero, never-decreasing backlog; none while drained."""

from __future__ import annotations

import pytest

from broker.stats_history import (
    HistoryLimits,
    StatsHistory,
    SubscriptionReading,
    TopicReading,
)
from common.errors import ConfigError

T = "persistent://public/default/t"


def topic(name: str = T, *, backlog: int = 0, messages_in: int = 0, out: int = 0, unacked: int = 0,
          identity: int = 1, subscriptions: dict | None = None, storage: int = 100) -> TopicReading:
    if subscriptions is None:
        subscriptions = {"s": SubscriptionReading(10, backlog, out, unacked)}
    return TopicReading(name, identity, messages_in, storage, subscriptions)


def sub(backlog: int, out: int = 0, unacked: int = 0, identity: int = 10) -> SubscriptionReading:
    return SubscriptionReading(identity, backlog, out, unacked)


def feed(history: StatsHistory, readings_by_sample: list[list[TopicReading]], start_ms: float = 1_000_000.0,
         step_s: float = 10.0) -> list[float]:
    times = []
    for index, readings in enumerate(readings_by_sample):
        time_ms = start_ms + index * step_s * 1000
        history.sample(readings, time_ms, 100.0 + index * step_s)
        times.append(time_ms)
    return times


def test_rates_backlog_and_samples_of_a_topic():
    history = StatsHistory(HistoryLimits(interval_s=10, window_s=3600))
    times = feed(history, [[topic(backlog=0, messages_in=0)], [topic(backlog=50, messages_in=100, out=50)],
                           [topic(backlog=150, messages_in=300, out=50, unacked=7)]])
    answer = history.topic_history(T)
    assert answer["tracked"] is True
    assert answer["timestamps"] == times
    assert answer["msgRateIn"] == [None, 10, 20]          # no rate at a series' first sample
    assert answer["msgRateOut"] == [None, 5, 0]
    assert answer["msgBacklog"] == [0, 50, 150]
    assert answer["storageSize"] == [100, 100, 100]
    assert answer["historyStart"] == times[0]
    subscription = answer["subscriptions"]["s"]
    assert subscription["msgBacklog"] == [0, 50, 150]
    assert subscription["unackedMessages"] == [0, 0, 7]
    assert subscription["firstSampleIndex"] == 0
    assert subscription["behindSince"] == times[1]         # 0 -> 50 -> 150: since the 50
    assert answer["behindSince"] == times[1] and answer["behindSubscription"] == "s"
    summary = history.topic_history(T, samples=False)
    assert "timestamps" not in summary and "msgBacklog" not in summary["subscriptions"]["s"]
    assert summary["subscriptions"]["s"]["behindSince"] == times[1]


def test_the_ring_keeps_the_window_and_the_since_outlives_it():
    history = StatsHistory(HistoryLimits(interval_s=10, window_s=50))   # 5 samples
    assert history.limits.samples_max == 5
    times = feed(history, [[topic(backlog=index + 1)] for index in range(12)])
    answer = history.topic_history(T)
    assert answer["timestamps"] == times[-5:]
    assert answer["msgBacklog"] == [8, 9, 10, 11, 12]
    # Growing since the first sample, older than the oldest sample kept.
    assert answer["subscriptions"]["s"]["behindSince"] == times[0]
    assert answer["historyStart"] == times[0]


@pytest.mark.parametrize("backlogs, since_index", [
    ([0, 0, 0], None),                 # never behind
    ([5, 5, 5], 0),                    # nothing drains it: behind since the first sample
    ([0, 3, 9, 9, 12], 1),             # grew from zero at sample 1
    ([4, 8, 6], None),                 # went down at the last sample: being drained
    ([4, 8, 6, 7, 9], 2),              # drained to 6, growing again from there
    ([4, 8, 0, 2], 3),                 # caught up (0), behind again at sample 3
    ([3, 0], None),
])
def test_falling_behind_since(backlogs, since_index):
    history = StatsHistory(HistoryLimits())
    times = feed(history, [[topic(backlog=b)] for b in backlogs])
    since = history.topic_history(T, samples=False)["subscriptions"]["s"]["behindSince"]
    assert since == (times[since_index] if since_index is not None else None)


def test_topics_past_the_bound_keep_the_largest_backlogs():
    history = StatsHistory(HistoryLimits(topics_max=2, subscriptions_max=10))
    names = [f"persistent://public/default/t{index}" for index in range(4)]
    feed(history, [[topic(n, backlog=b, identity=i) for i, (n, b) in enumerate(zip(names, [5, 1, 9, 0]))]])
    assert len(history) == 2
    assert history.counts.topics_untracked == 2
    assert history.topic_history(names[0])["tracked"] and history.topic_history(names[2])["tracked"]
    assert history.topic_history(names[1]) == {**history.topic_history(names[1]), "tracked": False,
                                               "timestamps": [], "subscriptions": {}}
    # t1's backlog overtakes t0's: t0 is pushed out and loses its history; t1 starts one.
    feed(history, [[topic(n, backlog=b, identity=i) for i, (n, b) in enumerate(zip(names, [5, 7, 9, 0]))]],
         start_ms=2_000_000)
    assert not history.topic_history(names[0])["tracked"]
    assert history.topic_history(names[1])["timestamps"] == [2_000_000]
    assert len(history.topic_history(names[2])["timestamps"]) == 2
    # A tie keeps the topic already tracked.
    feed(history, [[topic(n, backlog=b, identity=i) for i, (n, b) in enumerate(zip(names, [7, 7, 9, 0]))]],
         start_ms=3_000_000)
    assert history.topic_history(names[1])["tracked"] and not history.topic_history(names[0])["tracked"]


def test_subscriptions_past_the_bound_keep_the_largest_backlogs():
    history = StatsHistory(HistoryLimits(topics_max=10, subscriptions_max=2))
    subscriptions = {"a": sub(1, identity=1), "b": sub(30, identity=2), "c": sub(20, identity=3)}
    feed(history, [[topic(subscriptions=subscriptions)]])
    tracked = history.topic_history(T)["subscriptions"]
    assert sorted(tracked) == ["b", "c"]
    assert history.counts.subscriptions_untracked == 1
    assert history.subscriptions_tracked() == 2
    subscriptions = {"a": sub(50, identity=1), "b": sub(30, identity=2), "c": sub(20, identity=3)}
    feed(history, [[topic(subscriptions=subscriptions)]], start_ms=2_000_000)
    tracked = history.topic_history(T)["subscriptions"]
    assert sorted(tracked) == ["a", "b"]
    assert tracked["a"]["firstSampleIndex"] == 1          # started at the topic's second sample
    assert tracked["a"]["msgBacklog"] == [50]
    assert tracked["b"]["msgBacklog"] == [30, 30]


def test_dropped_unloaded_or_replaced_topics_start_over():
    history = StatsHistory(HistoryLimits())
    feed(history, [[topic(backlog=3)], [topic(backlog=4)]])
    history.drop(T, identity=999)                     # another object's close: kept
    assert len(history.topic_history(T)["timestamps"]) == 2
    history.drop(T, identity=1)
    assert history.topic_history(T)["tracked"] is False
    feed(history, [[topic(backlog=4)], [topic(backlog=4)]])
    feed(history, [[topic(backlog=4, identity=2)]], start_ms=5_000_000)   # loaded again: a new object
    assert history.topic_history(T)["timestamps"] == [5_000_000]
    feed(history, [[]], start_ms=6_000_000)           # not loaded any more
    assert history.topic_history(T)["tracked"] is False and len(history) == 0
    # A subscription made again under its name starts over too.
    feed(history, [[topic(subscriptions={"s": sub(5, out=100, identity=1)})],
                   [topic(subscriptions={"s": sub(6, out=3, identity=2)})]], start_ms=7_000_000)
    assert history.topic_history(T)["subscriptions"]["s"]["msgBacklog"] == [6]


def test_memory_bound_and_limits_are_checked():
    limits = HistoryLimits()
    assert limits.samples_max == 360
    assert limits.sample_bytes_max() == 8 * 360 * (5 * 500 + 3 * 1000)     # 15.8 MB
    with pytest.raises(ConfigError):
        HistoryLimits(interval_s=10, window_s=5)
    with pytest.raises(ConfigError):
        HistoryLimits(interval_s=0.001)
    with pytest.raises(ConfigError):
        HistoryLimits(interval_s=0.05, window_s=7 * 24 * 3600)           # too many samples
    with pytest.raises(ConfigError):
        HistoryLimits(topics_max=-1)


# --- the sampling pass (broker/topic_upkeep.py) lets the event loop go -------------------------

class _Cursor:
    def __init__(self, backlog: int) -> None:
        self.backlog = backlog

    def backlog_entries(self, _entries_between) -> int:
        return self.backlog


class _LoadedTopic:
    """What read_topics reads of a loaded topic (broker/topic.py PersistentTopic)."""

    def __init__(self, index: int) -> None:
        from types import SimpleNamespace
        dispatcher = SimpleNamespace(messages_dispatched=index, unacked_messages=lambda _consumer: 0)
        self.full_name = f"persistent://public/default/t-{index}"
        self.closing = False
        self.messages_in = index
        self.ledger = SimpleNamespace(total_size=lambda: 100)
        self.entries_between = None
        self.subscriptions = {"s": SimpleNamespace(dispatcher=dispatcher, consumers=[], cursor=_Cursor(index))}


async def test_a_sample_reads_the_topics_a_few_at_a_time_letting_the_loop_go():
    """With the hold bound at zero the pass lets the loop run other tasks after every
    topic; what it records is the same as one pass in one go (the 20 largest backlogs),
    and it reports the time it worked and the longest hold."""
    import asyncio
    from types import SimpleNamespace

    from broker.topic_upkeep import TopicUpkeep

    topics = [_LoadedTopic(index) for index in range(200)]
    history = StatsHistory(HistoryLimits(interval_s=10, window_s=3600, topics_max=20, subscriptions_max=20))
    service = SimpleNamespace(loaded_topics=lambda: topics, stats_history=history)
    upkeep = TopicUpkeep(service)
    upkeep.STATS_HISTORY_HOLD_S = 0.0
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    turns = 0
    await upkeep.sample_stats_history()
    ticker.cancel()
    assert turns >= 199, turns                 # ran between the topics' readings
    assert len(history) == 20 and history.topic_history("persistent://public/default/t-199")["tracked"]
    assert history.topic_history("persistent://public/default/t-0")["tracked"] is False
    assert 0 < upkeep.stats_history_hold_s <= upkeep.stats_history_sample_s
