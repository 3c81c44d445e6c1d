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
Pure: it reads loaded topics and the time it is given; no IO, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from prometheus_client.metrics_core import Metric

from broker.stats import RateMeter

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
SUBSCRIPTION_SERIES: tuple[tuple[str, str], ...] = (
    ("pulsar_subscription_back_log", "Entries the subscription has not acknowledged"),
    ("pulsar_subscription_msg_rate_out", "Messages dispatched to the subscription's consumers per second"),
    ("pulsar_subscription_msg_throughput_out", "Bytes dispatched to the subscription's consumers per second"),
    ("pulsar_subscription_unacked_messages", "Messages dispatched and not yet acknowledged"),
    ("pulsar_subscription_delayed", "Delayed messages waiting for their delivery time"),
    ("pulsar_subscription_consumers_count", "Consumers attached to the subscription"),
)


@dataclass(frozen=True)
class TopicMetricsLimits:
    topic_level: bool = True
    topics_max: int = 1000
    subscriptions_max: int = 5000


def _subscription_values(topic: "PersistentTopic", subscription: "Subscription", meter: RateMeter,
                         now_s: float) -> tuple[float, ...]:
    rate = throughput = 0.0
    unacked = 0
    dispatcher = subscription.dispatcher
    consumers = subscription.consumers
    for consumer in consumers:
        consumer_rate, consumer_throughput = meter.rates(
            ("consumer", id(consumer)), (consumer.messages_out, consumer.bytes_out), now_s)
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


class _Series:
    """The samples of one scrape, by family name."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}
        for name, help_text in (*TOPIC_SERIES, *SUBSCRIPTION_SERIES,
                                ("pulsar_topics_count", "Topics loaded on this broker, by namespace")):
            self.families[name] = Metric(name, help_text, "gauge")

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self.families[name].add_sample(name, labels, value)


def collect_topic_metrics(topics: Iterable["PersistentTopic"], cluster: str, limits: TopicMetricsLimits,
                          meter: RateMeter, now_s: float) -> tuple[list[Metric], int, int]:
    """(families, topics folded into namespace series by the limit, subscriptions left
    out by the limit) for the loaded ``topics``."""
    series = _Series()
    ordered = sorted(topics, key=lambda t: t.full_name)
    topics_count: dict[str, int] = {}
    folded: dict[str, list[float]] = {}        # namespace -> summed topic values
    exposed_topics = exposed_subscriptions = 0
    topics_folded = subscriptions_omitted = 0
    for topic in ordered:
        namespace = str(topic.name.namespace_name)
        topics_count[namespace] = topics_count.get(namespace, 0) + 1
        rate_in, throughput_in = meter.rates(("topic", topic.full_name, id(topic)),
                                             (topic.messages_in, topic.bytes_in), now_s)
        subscriptions = [(name, _subscription_values(topic, s, meter, now_s))
                         for name, s in sorted(topic.subscriptions.items())]
        values = (
            len(subscriptions),
            len(topic.producers),
            sum(v[5] for _, v in subscriptions),
            rate_in,
            sum(v[1] for _, v in subscriptions),
            throughput_in,
            sum(v[2] for _, v in subscriptions),
            topic.ledger.total_size(),
            sum(v[0] for _, v in subscriptions),
        )
        if limits.topic_level and exposed_topics < limits.topics_max:
            exposed_topics += 1
            labels = {"cluster": cluster, "namespace": namespace, "topic": topic.full_name}
            for (name, _help), value in zip(TOPIC_SERIES, values):
                series.add(name, labels, value)
            for subscription_name, subscription_values in subscriptions:
                if exposed_subscriptions >= limits.subscriptions_max:
                    subscriptions_omitted += 1
                    continue
                exposed_subscriptions += 1
                sub_labels = {**labels, "subscription": subscription_name}
                for (name, _help), value in zip(SUBSCRIPTION_SERIES, subscription_values):
                    series.add(name, sub_labels, value)
            continue
        if limits.topic_level:
            topics_folded += 1
            subscriptions_omitted += len(subscriptions)
        total = folded.setdefault(namespace, [0.0] * len(TOPIC_SERIES))
        for index, value in enumerate(values):
            total[index] += value
    for namespace, total in sorted(folded.items()):
        labels = {"cluster": cluster, "namespace": namespace}
        for (name, _help), value in zip(TOPIC_SERIES, total):
            series.add(name, labels, value)
    for namespace, count in sorted(topics_count.items()):
        series.add("pulsar_topics_count", {"cluster": cluster, "namespace": namespace}, count)
    assert exposed_topics <= limits.topics_max
    assert exposed_subscriptions <= limits.subscriptions_max
    return list(series.families.values()), topics_folded, subscriptions_omitted
