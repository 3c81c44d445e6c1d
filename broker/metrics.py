"""The broker's Prometheus metrics, read from the service when /metrics is scraped
(so the hot paths only bump plain integer counters). The publish-latency histogram is
made by the wiring and handed to the service (broker/main.py)."""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from broker.service import BrokerService
from broker.topic_metrics import ScrapeResult, TopicMetricsLimits, TopicSeries
from broker.transaction_coordinator import EXECUTION_BUCKETS_MS
from common.histograms import LatencyStages
from ledger.bookie_client import LEDGER_STAGES

# The stages of a publish (and of its dispatch) the broker times, each exported as the
# histogram magnetar_broker_<stage>_seconds (docs/performance.md "Where the time goes"):
# send_decode: a SEND's bytes read until appended to the managed ledger; managed_ledger_queue:
# appended until submitted to a ledger (waits only during a rollover); ledger_add:
# submitted until the ack quorum confirmed it, in order; bookie_add_send_wait and
# bookie_add_round_trip: ledger/bookie_client.py; dispatch: the newest entry confirmed
# until written to a tailing consumer.
BROKER_STAGES = (*LEDGER_STAGES, "send_decode", "managed_ledger_queue", "ledger_add", "dispatch")
_STAGE_HELP = {
    "send_decode": "A SEND's bytes read until its entry is appended to the managed ledger",
    "managed_ledger_queue": "An append waiting for a ledger (rollover) before it is submitted",
    "ledger_add": "An entry submitted to its ledger until the ack quorum confirmed it (in order)",
    "bookie_add_send_wait": "An add queued for a bookie until its add-stream message is written",
    "bookie_add_round_trip": "An add-stream message written until the bookie's reply is read (per entry)",
    "dispatch": "The newest confirmed entry, from confirmed until written to a tailing consumer",
}
assert set(_STAGE_HELP) == set(BROKER_STAGES)


def register_broker_metrics(service: BrokerService, registry: CollectorRegistry) -> "TopicSeriesText":
    """Registers the service's gauges and counters (read when scraped) in ``registry``;
    returns the writer of the per-topic series, for /metrics (build_admin_app)."""
    gauges = [
        ("magnetar_broker_connections", "Client connections", lambda: len(service.connections)),
        # The dispatcher invariant (subscriptions/dispatch_watch.py): a consumer with
        # permits and a subscription with backlog get a read within the bound.
        ("magnetar_dispatcher_wait_seconds_max",
         "Longest a dispatcher waited with backlog and a consumer with permits, without a read",
         lambda: service.upkeep.dispatch_wait_s_max),
        # Metadata outages (bundles/ownership.py): 1 while etcd has not confirmed this
        # broker's lease for a while and only loaded topics are served.
        ("magnetar_broker_metadata_degraded", "1 while etcd is away and only loaded topics are served",
         lambda: int(service.ownership is not None and service.ownership.metadata_degraded)),
        # 1 while this broker holds a confirmed ownership lease (always 1 without the
        # bundles layer): 0 means its bundles are about to move or it cannot take any.
        ("magnetar_broker_lease_held", "1 while this broker's ownership lease is held and confirmed by etcd",
         lambda: lease_held(service)),
        ("magnetar_broker_metadata_outages", "Metadata outages this broker rode through or fenced in (since start)",
         lambda: service.ownership.outages if service.ownership is not None else 0),
        ("magnetar_broker_entry_cache_bytes", "Bytes in the entry cache", lambda: service.cache.size_bytes),
        ("magnetar_broker_entry_cache_hits", "Entry cache hits", lambda: service.cache.hits),
        ("magnetar_broker_entry_cache_misses", "Entry cache misses", lambda: service.cache.misses),
        ("magnetar_broker_topics_preloaded",
         "Topics loaded ahead of their clients when a bundle was handed to this broker (since start)",
         lambda: service.topic_loader.topics_preloaded),
        # Publish back-pressure (broker/publish_limits.py).
        ("magnetar_broker_pending_sends", "Sends accepted and not yet answered (whole broker)",
         lambda: service.publish_limits.broker.sends),
        ("magnetar_broker_pending_send_bytes", "Payload bytes of sends accepted and not yet answered",
         lambda: service.publish_limits.broker.size_bytes),
        ("magnetar_broker_publish_paused_connections", "Connections not read now because of pending sends",
         lambda: sum(1 for c in list(service.connections) if c.reading_paused)),
        # The console's history (broker/stats_history.py) and what its bounds left out.
        ("magnetar_broker_stats_history_topics", "Topics with a history for the console",
         lambda: len(service.stats_history)),
        ("magnetar_broker_stats_history_topics_untracked",
         "Loaded topics without a history because of stats_history_topics_max (at the last sample)",
         lambda: service.stats_history.counts.topics_untracked),
        ("magnetar_broker_stats_history_subscriptions_untracked",
         "Subscriptions of tracked topics without a history because of stats_history_subscriptions_max",
         lambda: service.stats_history.counts.subscriptions_untracked),
        ("magnetar_broker_stats_history_sample_seconds",
         "How long the last console-history sample worked in all (a pass over the loaded topics)",
         lambda: service.upkeep.stats_history_sample_s),
        ("magnetar_broker_stats_history_hold_seconds",
         "The longest the last console-history sample held the event loop at once",
         lambda: service.upkeep.stats_history_hold_s),
    ]
    for name, help_text, function in gauges:
        Gauge(name, help_text, registry=registry).set_function(function)
    registry.register(_PublishLimitsCollector(service))
    stages = getattr(service.ledger_client, "stages", None)
    if stages is not None:
        registry.register(StagesCollector(stages, "magnetar_broker", _STAGE_HELP))
    registry.register(_PolicyCollector(service))
    registry.register(_TransactionCoordinatorCollector(service))
    registry.register(_PartitionCallsCollector(service))
    registry.register(_TopicTotalsCollector(service))
    topic_series = TopicSeriesText(service)
    registry.register(_TopicSeriesStats(topic_series))
    return topic_series


def lease_held(service: BrokerService) -> int:
    ownership = service.ownership
    if ownership is None:
        return 1
    lease = ownership.lease
    return int(lease is not None and not lease.is_lost and not ownership.fenced and not ownership.metadata_degraded)


class TopicSeriesText:
    """Pulsar's per-topic and per-subscription series (broker/topic_metrics.py), written
    as text into /metrics (runtime/ops_http.py ``extra_metrics``), with the limits of the
    broker's config; remembers what the last scrape held back and how long it took."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service
        config = service.config
        self._series = TopicSeries(config.cluster, TopicMetricsLimits(
            topic_level=config.metrics_topic_level, topics_max=config.metrics_topics_max,
            subscriptions_max=config.metrics_subscriptions_max, transactions=config.transactions_enabled))
        self.last: ScrapeResult | None = None
        self.last_seconds = 0.0

    def __call__(self) -> bytes:
        started = time.perf_counter()
        self.last = self._series.scrape(self._service.loaded_topics(), time.monotonic())
        text = self.last.text.encode()
        self.last_seconds = time.perf_counter() - started
        return text


# The loaded topics' totals, summed in one pass per scrape (each gauge walking the
# topics on its own took half of a 10,000-topic scrape): (name, help) in the order of
# _TopicTotalsCollector's sums.
_TOPIC_TOTALS = (
    ("magnetar_broker_topics", "Topics loaded on this broker"),
    ("magnetar_broker_producers", "Producers attached"),
    ("magnetar_broker_consumers", "Consumers attached"),
    ("magnetar_broker_subscriptions", "Subscriptions of loaded topics"),
    ("magnetar_broker_messages_in", "Messages published to loaded topics (since load)"),
    ("magnetar_broker_bytes_in", "Bytes published to loaded topics (since load)"),
    ("magnetar_broker_messages_out", "Messages dispatched by loaded topics (since load)"),
    ("magnetar_broker_read_ahead_entries",
     "Entries read from the bookies ahead of catching-up readers by loaded topics (since load)"),
)


class _TopicTotalsCollector(Collector):
    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        topics = self._service.loaded_topics()
        producers = consumers = subscriptions = messages_in = bytes_in = messages_out = read_ahead = 0
        for topic in topics:
            producers += len(topic.producers)
            subscriptions += len(topic.subscriptions)
            messages_in += topic.messages_in
            bytes_in += topic.bytes_in
            read_ahead += topic.ledger.read_ahead_entries
            for subscription in topic.subscriptions.values():
                dispatcher = subscription.dispatcher
                consumers += len(dispatcher.consumers)
                messages_out += dispatcher.messages_dispatched
        values = (len(topics), producers, consumers, subscriptions, messages_in, bytes_in, messages_out, read_ahead)
        for (name, help_text), value in zip(_TOPIC_TOTALS, values):
            yield GaugeMetricFamily(name, help_text, value=value)


class _TopicSeriesStats(Collector):
    def __init__(self, text: TopicSeriesText) -> None:
        self._text = text

    def collect(self) -> Iterator[GaugeMetricFamily]:
        last = self._text.last
        yield GaugeMetricFamily("magnetar_broker_metrics_topics_folded",
                                "Topics without series of their own because of metrics_topics_max "
                                "(folded into their namespace's series), at the last scrape",
                                value=last.topics_folded if last is not None else 0)
        yield GaugeMetricFamily("magnetar_broker_metrics_subscriptions_omitted",
                                "Subscriptions without series because of the metrics limits, at the last scrape",
                                value=last.subscriptions_omitted if last is not None else 0)
        yield GaugeMetricFamily("magnetar_broker_metrics_topic_samples",
                                "Per-topic and per-subscription samples written at the last scrape",
                                value=last.samples if last is not None else 0)
        yield GaugeMetricFamily("magnetar_broker_metrics_topics_seconds",
                                "Time the last scrape spent writing the per-topic series",
                                value=self._text.last_seconds)


class _PolicyCollector(Collector):
    """What message TTL and backlog quotas did (broker/policy_enforcement.py)."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[CounterMetricFamily]:
        counters = self._service.policy_counters
        yield CounterMetricFamily("magnetar_broker_messages_expired",
                                  "Entries acknowledged for subscriptions by message TTL",
                                  value=counters.messages_expired)
        yield CounterMetricFamily("magnetar_broker_backlog_quota_evicted_entries",
                                  "Entries skipped by consumer_backlog_eviction quotas",
                                  value=counters.entries_evicted)
        yield CounterMetricFamily("magnetar_broker_backlog_quota_producers_refused",
                                  "Producer creations refused by a backlog quota",
                                  value=counters.producers_refused)
        yield CounterMetricFamily("magnetar_broker_backlog_quota_producers_disconnected",
                                  "Attached producers closed by a backlog quota",
                                  value=counters.producers_disconnected)
        yield CounterMetricFamily("magnetar_broker_backlog_quota_sends_refused",
                                  "SENDs not stored because a producer-blocking size quota was passed",
                                  value=counters.sends_refused)
        inactivity = self._service.inactivity.counters
        yield CounterMetricFamily("magnetar_broker_subscriptions_expired",
                                  "Subscriptions deleted after going without a consumer for their expiration time",
                                  value=inactivity.subscriptions_expired)
        yield CounterMetricFamily("magnetar_broker_inactive_topics_deleted",
                                  "Topics deleted by the inactive topic policies", value=inactivity.topics_deleted)
        yield CounterMetricFamily("magnetar_broker_inactive_partitioned_topics_deleted",
                                  "Partitioned topics deleted once the inactive topic policies deleted their last "
                                  "partition", value=inactivity.partitioned_topics_deleted)
        yield CounterMetricFamily("magnetar_broker_compactions_started_by_threshold",
                                  "Compactions started because a namespace's compactionThreshold was passed",
                                  value=counters.compactions_started)


class _TransactionCoordinatorCollector(Collector):
    """Pulsar's transaction coordinator series (its TransactionAggregator, names as in
    Pulsar 3.x), one per coordinator this broker serves, labels ``cluster`` and
    ``coordinator_id``: counted since this broker loaded it (a coordinator that moves
    starts again at 0 on its new broker, as in Pulsar). ``append_log`` counts writes of
    the coordinator's records to etcd (its log here). The lifetime of ended
    transactions (open to ended, commit or abort) as Pulsar exports it,
    ``pulsar_txn_execution_latency_le_<ms>`` (the transactions in each bucket, not
    cumulative; ``_le_overflow`` past the last), and as a Prometheus histogram,
    ``magnetar_broker_transaction_execution_seconds``, of the same buckets."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        coordinators = self._service.transactions
        if coordinators is None:
            return
        labels = ["cluster", "coordinator_id"]
        active = GaugeMetricFamily("pulsar_txn_active_count", "Transactions open or ending on the coordinator",
                                   labels=labels)
        counters = {
            "created": CounterMetricFamily("pulsar_txn_created", "Transactions created", labels=labels),
            "committed": CounterMetricFamily("pulsar_txn_committed", "Transactions committed", labels=labels),
            "aborted": CounterMetricFamily("pulsar_txn_aborted", "Transactions aborted (timeouts included)",
                                           labels=labels),
            "timed_out": CounterMetricFamily("pulsar_txn_timeout", "Transactions aborted by their timeout",
                                             labels=labels),
            "record_writes": CounterMetricFamily("pulsar_txn_append_log",
                                                 "Writes of the coordinator's transaction records (etcd)",
                                                 labels=labels),
        }
        bounds = [*map(str, EXECUTION_BUCKETS_MS), "overflow"]
        latency = {bound: GaugeMetricFamily(f"pulsar_txn_execution_latency_le_{bound}",
                                            f"Ended transactions that lived (open to ended) "
                                            + (f"at most {bound} ms (and more than the bucket before)"
                                               if bound != "overflow" else f"more than {EXECUTION_BUCKETS_MS[-1]} ms"),
                                            labels=labels) for bound in bounds}
        histogram = HistogramMetricFamily("magnetar_broker_transaction_execution_seconds",
                                          "Ended transactions' lifetime, open to ended", labels=labels)
        cluster = self._service.config.cluster
        for coordinator in coordinators.served():
            values = [cluster, str(coordinator.coordinator_id)]
            active.add_metric(values, len(coordinator.records))
            for attribute, family in counters.items():
                family.add_metric(values, getattr(coordinator, attribute))
            execution = coordinator.execution_ms
            for bound, count in zip(bounds, execution.counts):
                latency[bound].add_metric(values, count)
            cumulative = [count for _bound, count in execution.cumulative()]
            histogram.add_metric(values, [*((str(ms / 1000), n) for ms, n in zip(EXECUTION_BUCKETS_MS, cumulative)),
                                          ("+Inf", cumulative[-1])], sum_value=execution.sum / 1000)
        yield active
        yield from counters.values()
        yield from latency.values()
        yield histogram


class _PartitionCallsCollector(Collector):
    """The admin calls this broker made on partitions other brokers serve
    (broker/admin/fanout.py), by outcome: a broker that cannot reach another's admin
    port (a network policy, a wrong advertised address) shows as ``unreachable``."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[CounterMetricFamily]:
        calls = CounterMetricFamily("magnetar_broker_partition_calls",
                                    "Admin calls made on partitions other brokers serve, by outcome (ok; absent: "
                                    "404; refused: the owner's error; unreachable: no answer)", labels=["outcome"])
        for outcome, count in self._service.partition_calls.items():
            calls.add_metric([outcome], count)
        yield calls


class _PublishLimitsCollector(Collector):
    """How often publish back-pressure stopped reading connections, in all and by the
    kind of bound that did it (a pause may be for several bounds at once)."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self._service.publish_limits.stats
        yield CounterMetricFamily("magnetar_dispatcher_stalls",
                                  "Dispatchers found waiting past the bound with backlog and permits (then woken)",
                                  value=self._service.upkeep.dispatch_stalls)
        yield CounterMetricFamily("magnetar_broker_publish_reading_pauses",
                                  "Times a connection stopped being read because of pending sends",
                                  value=stats.reading_pauses)
        yield CounterMetricFamily("magnetar_broker_publish_reading_resumes",
                                  "Times a paused connection was read again", value=stats.reading_resumes)
        blocks = CounterMetricFamily("magnetar_broker_publish_blocks",
                                     "Times a connection was blocked by a full bound, by the bound's kind",
                                     labels=["kind"])
        for kind, count in (stats.blocks_by_kind or {}).items():
            blocks.add_metric([kind], count)
        yield blocks


class StagesCollector(Collector):
    """A process's stage histograms (common/histograms.LatencyStages), as Prometheus
    histograms ``<prefix>_<stage>_seconds``, read at scrape time."""

    def __init__(self, stages: LatencyStages, prefix: str, help_by_stage: dict[str, str]) -> None:
        self._stages = stages
        self._prefix = prefix
        self._help = help_by_stage

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for name, histogram in self._stages.histograms.items():
            yield HistogramMetricFamily(f"{self._prefix}_{name}_seconds", self._help.get(name, name),
                                        buckets=histogram.cumulative(), sum_value=histogram.sum)
