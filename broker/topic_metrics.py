"""Per-topic and per-subscription Prometheus series with Pulsar's names and labels,
computed when /metrics is scraped from what the topics count anyway (no per-message
cost: the publish and dispatch paths only bump the integer counters they already had).

Theory of operation:
- Series and labels are Pulsar's (its NamespaceStatsAggregator): ``cluster``,
  ``namespace`` (``tenant/ns``), ``topic`` (the full name; a partition is its own topic)
  and, for subscription series, ``subscription``. Every value is a gauge, as in Pulsar.
  Rates (``pulsar_rate_in`` msg/s, ``pulsar_throughput_in`` bytes/s ...) are measured
  between successive scrapes by a ``RateMeter`` of their own (broker/stats.py), so the
  admin stats' rates are not disturbed; the first scrape after a topic loads says 0.
- ``pulsar_msg_backlog`` of a topic is the sum of its subscriptions' backlogs (entries,
  as Pulsar counts them); ``pulsar_storage_size`` the bytes its ledgers hold.
- **Topic or namespace level** (Pulsar's ``exposeTopicLevelMetricsInPrometheus``;
  ``metrics_topic_level`` here, on by default as there): off, every topic is folded
  into one series per namespace (labels ``cluster`` and ``namespace`` only) and no
  subscription series are written.
- **Cardinality limit**: at most ``metrics_topics_max`` topics get series of their own,
  chosen in name order (so the same topics keep their series from scrape to scrape
  while the set of loaded topics stays put); the rest are folded into one series per
  namespace, as if topic level were off for them (a namespace may then have both its
  first topics' series and an aggregate of the rest without a ``topic`` label: a
  ``sum by (namespace)`` counts every topic once). Subscription series are written for
  the exposed topics' subscriptions, at most ``metrics_subscriptions_max`` of them; the
  others are left out (their backlog is still in their topic's ``pulsar_msg_backlog``).
  ``magnetar_broker_metrics_topics_folded`` and
  ``magnetar_broker_metrics_subscriptions_omitted`` count what the limits held back, so a
  dashboard can say its per-topic view is partial.
- With transactions on, Pulsar's transaction series too: per topic its buffer's open
  transactions and the transactions committed and aborted on it
  (``pulsar_txn_tb_*_total``), per subscription those ended on its pending
  acknowledgements (``pulsar_txn_tp_*_count_total``); counted since the topic loaded on
  this broker, as Pulsar's (which start again at a load too).
- The text is written directly (``TopicSeries.scrape``), not through prometheus_client's
  generic writer, and the rates keep one sample per loaded topic and consumer: the
  scrape's cost is one pass over the loaded topics (bench/metrics_bench.py).
Pure: it reads loaded topics and the time it is given; no IO, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, Iterable

if TYPE_CHECKING:
    from broker.topic import PersistentTopic
    from subscriptions.subscription import Subscription

# (name, help) of the topic-level gauges, in the order the values are computed.
TOPIC_SERIES: tuple[tuple[str, str], ...] = (
    ("pulsar_subscriptions_count", "Subscriptions of the topic"),
    ("pulsar_producers_count", "Producers attached to the topic"),
    ("pulsar_consumers_count", "Consumers attached to the topic's subscriptions"),
    ("pulsar_rate_in", "Messages published per second"),
    ("pulsar_rate_out", "Messages dispatched per second (all subscriptions)"),
    ("pulsar_throughput_in", "Bytes published per second"),
    ("pulsar_throughput_out", "Bytes dispatched per second (all subscriptions)"),
    ("pulsar_storage_size", "Bytes the topic's ledgers hold"),
    ("pulsar_msg_backlog", "Entries not yet acknowledged, summed over the topic's subscriptions"),
)
# With transactions on (the broker's transactions_enabled), as Pulsar's TopicStats.
TOPIC_TRANSACTION_SERIES: tuple[tuple[str, str], ...] = (
    ("pulsar_txn_tb_active_total", "Transactions open on the topic (its transaction buffer)"),
    ("pulsar_txn_tb_aborted_total", "Transactions aborted on the topic since it loaded on this broker"),
    ("pulsar_txn_tb_committed_total", "Transactions committed on the topic since it loaded on this broker"),
)
SUBSCRIPTION_SERIES: tuple[tuple[str, str], ...] = (
    ("pulsar_subscription_back_log", "Entries the subscription has not acknowledged"),
    ("pulsar_subscription_msg_rate_out", "Messages dispatched to the subscription's consumers per second"),
    ("pulsar_subscription_msg_throughput_out", "Bytes dispatched to the subscription's consumers per second"),
    ("pulsar_subscription_unacked_messages", "Messages dispatched and not yet acknowledged"),
    ("pulsar_subscription_delayed", "Delayed messages waiting for their delivery time"),
    ("pulsar_subscription_consumers_count", "Consumers attached to the subscription"),
)
SUBSCRIPTION_TRANSACTION_SERIES: tuple[tuple[str, str], ...] = (
    ("pulsar_txn_tp_committed_count_total",
     "Transactions committed on the subscription (its pending acknowledgements) since the topic loaded here"),
    ("pulsar_txn_tp_aborted_count_total",
     "Transactions aborted on the subscription (its pending acknowledgements) since the topic loaded here"),
)


@dataclass(frozen=True)
class TopicMetricsLimits:
    topic_level: bool = True
    topics_max: int = 1000
    subscriptions_max: int = 5000
    # The transaction series (TOPIC_/SUBSCRIPTION_TRANSACTION_SERIES) are written.
    transactions: bool = False


# A counter is measured over at least this long (as broker/stats.py RATE_WINDOW_S_MIN):
# a quicker second scrape repeats the last measured rate.
RATE_WINDOW_S_MIN = 1.0


class ScrapeRates:
    """Per-second rates of monotone counters between successive scrapes. Only what the
    last scrape saw is kept (each scrape's samples replace the previous ones), so the
    memory is bounded by the loaded topics and consumers; a counter that went down (an
    object replaced under the same key) restarts its measurement."""

    def __init__(self) -> None:
        self._previous: dict[Hashable, tuple[float, int, int, float, float]] = {}
        self._current: dict[Hashable, tuple[float, int, int, float, float]] = {}

    def rates(self, key: Hashable, first: int, second: int, now_s: float) -> tuple[float, float]:
        before = self._previous.get(key)
        if before is None or now_s < before[0]:
            entry = (now_s, first, second, 0.0, 0.0)
        elif now_s - before[0] < RATE_WINDOW_S_MIN:
            entry = before     # too soon: keep the old sample and its rates
        elif first >= before[1] and second >= before[2]:
            elapsed = now_s - before[0]
            entry = (now_s, first, second, (first - before[1]) / elapsed, (second - before[2]) / elapsed)
        else:
            entry = (now_s, first, second, 0.0, 0.0)
        self._current[key] = entry
        return entry[3], entry[4]

    def end_scrape(self) -> None:
        self._previous, self._current = self._current, {}

    def __len__(self) -> int:
        return len(self._previous)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _subscription_values(topic: "PersistentTopic", subscription: "Subscription", rates: ScrapeRates,
                         now_s: float) -> tuple:
    rate = throughput = 0.0
    unacked = 0
    dispatcher = subscription.dispatcher
    consumers = subscription.consumers
    for consumer in consumers:
        consumer_rate, consumer_throughput = rates.rates(id(consumer), consumer.messages_out, consumer.bytes_out,
                                                         now_s)
        rate += consumer_rate
        throughput += consumer_throughput
        unacked += dispatcher.unacked_messages(consumer)
    delayed_tracker = getattr(dispatcher, "delayed", None)
    delayed = len(delayed_tracker) if delayed_tracker is not None else 0
    overflow = getattr(dispatcher, "delayed_overflow", None)
    if overflow is not None:
        delayed += getattr(overflow, "entries", 0)
    backlog = subscription.cursor.backlog_entries(topic.entries_between)
    return (backlog, rate, throughput, unacked, delayed, len(consumers))


def _topic_transaction_values(topic: "PersistentTopic") -> tuple:
    transactions = topic.transactions
    return (len(transactions.buffer.open), transactions.aborted, transactions.committed)


def _subscription_transaction_values(topic: "PersistentTopic", name: str) -> tuple:
    ended = topic.transactions.ended_on.get(name)
    return (0, 0) if ended is None else (ended[0], ended[1])


@dataclass
class ScrapeResult:
    text: str
    topics_folded: int
    subscriptions_omitted: int
    samples: int


class TopicSeries:
    """Writes the series of one scrape as Prometheus text (exposition format 0.0.4),
    directly: at 10,000 topics prometheus_client's generic writer took 0.6 s for the
    15,000 samples of 1,000 exposed topics, string formatting here a few dozen ms."""

    def __init__(self, cluster: str, limits: TopicMetricsLimits) -> None:
        self.cluster = cluster
        self.limits = limits
        self._rates = ScrapeRates()

    def scrape(self, topics: Iterable["PersistentTopic"], now_s: float) -> ScrapeResult:
        limits = self.limits
        cluster = _escape(self.cluster)
        topic_series = TOPIC_SERIES + TOPIC_TRANSACTION_SERIES if limits.transactions else TOPIC_SERIES
        subscription_series = (SUBSCRIPTION_SERIES + SUBSCRIPTION_TRANSACTION_SERIES if limits.transactions
                               else SUBSCRIPTION_SERIES)
        topic_lines: list[list[str]] = [[] for _ in topic_series]
        subscription_lines: list[list[str]] = [[] for _ in subscription_series]
        topics_count: dict[str, int] = {}
        folded: dict[str, list[float]] = {}        # namespace -> summed topic values
        exposed_topics = exposed_subscriptions = 0
        topics_folded = subscriptions_omitted = 0
        rates = self._rates
        for topic in sorted(topics, key=lambda t: t.full_name):
            namespace = f"{topic.name.tenant}/{topic.name.namespace}"
            topics_count[namespace] = topics_count.get(namespace, 0) + 1
            rate_in, throughput_in = rates.rates((topic.full_name, id(topic)), topic.messages_in, topic.bytes_in,
                                                 now_s)
            subscriptions = topic.subscriptions
            consumers = rate_out = throughput_out = backlog = 0
            values_by_name = []
            for name in sorted(subscriptions):
                values = _subscription_values(topic, subscriptions[name], rates, now_s)
                if limits.transactions:
                    values += _subscription_transaction_values(topic, name)
                values_by_name.append((name, values))
                backlog += values[0]
                rate_out += values[1]
                throughput_out += values[2]
                consumers += values[5]
            values = (len(subscriptions), len(topic.producers), consumers, rate_in, rate_out, throughput_in,
                      throughput_out, topic.ledger.total_size(), backlog)
            if limits.transactions:
                values += _topic_transaction_values(topic)
            if limits.topic_level and exposed_topics < limits.topics_max:
                exposed_topics += 1
                labels = f'cluster="{cluster}",namespace="{_escape(namespace)}",topic="{_escape(topic.full_name)}"'
                suffix = "{" + labels + "} "
                for lines, value in zip(topic_lines, values):
                    lines.append(suffix + _number(value))
                for name, subscription_values in values_by_name:
                    if exposed_subscriptions >= limits.subscriptions_max:
                        subscriptions_omitted += 1
                        continue
                    exposed_subscriptions += 1
                    sub_suffix = "{" + labels + f',subscription="{_escape(name)}"' + "} "
                    for lines, value in zip(subscription_lines, subscription_values):
                        lines.append(sub_suffix + _number(value))
                continue
            if limits.topic_level:
                topics_folded += 1
                subscriptions_omitted += len(values_by_name)
            total = folded.get(namespace)
            if total is None:
                folded[namespace] = list(values)
            else:
                for index, value in enumerate(values):
                    total[index] += value
        rates.end_scrape()
        for namespace, total in sorted(folded.items()):
            suffix = f'{{cluster="{cluster}",namespace="{_escape(namespace)}"}} '
            for lines, value in zip(topic_lines, total):
                lines.append(suffix + _number(value))
        out: list[str] = []
        samples = 0
        for (name, help_text), lines in (*zip(topic_series, topic_lines), *zip(subscription_series,
                                                                              subscription_lines)):
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
            out.extend(f"{name}{line}\n" for line in lines)
            samples += len(lines)
        out.append("# HELP pulsar_topics_count Topics loaded on this broker, by namespace\n"
                   "# TYPE pulsar_topics_count gauge\n")
        for namespace, count in sorted(topics_count.items()):
            out.append(f'pulsar_topics_count{{cluster="{cluster}",namespace="{_escape(namespace)}"}} {count}\n')
        samples += len(topics_count)
        assert exposed_topics <= limits.topics_max
        assert exposed_subscriptions <= limits.subscriptions_max
        return ScrapeResult("".join(out), topics_folded, subscriptions_omitted, samples)
