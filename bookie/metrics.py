"""The bookie's Prometheus metrics. Counters move per batch, not per entry; the add
path's counters and histograms are plain numbers exposed by a collector at scrape time
(no ``*_created`` samples); gauges are read from the node when /metrics is scraped, by
one collector that takes the storage statistics once per scrape (they sum over every
ledger directory)."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from bookie.config import KIB, MIB
from bookie.journal import JournalStats
from common.histograms import LATENCY_BUCKETS_S, STAGE_BUCKETS_S, WeightedHistogram
from bookie.ledger_storage import StorageStats
from bookie.node import BookieNode

# The add path's histograms and counters: plain numbers on the event loop, exposed at
# scrape time by _AddPathCollector with the names, help and buckets they had as
# prometheus_client metrics. prometheus_client takes a lock per observation (~1.6 us
# per Histogram.observe against ~0.5 us for a WeightedHistogram, ~1 us per Counter.inc)
# and the bookie makes nine observations and three increments per add
# (docs/performance.md, step 13). Only the event loop writes them and /metrics reads
# them on the loop, so no lock is needed.
_HISTOGRAMS: list[tuple[str, str, str, tuple[float, ...]]] = [
    ("add_latency", "magnetar_bookie_add_batch_latency_seconds",
     "From an add batch's arrival to its acknowledgement (journal fsync included)", LATENCY_BUCKETS_S),
    ("fsync_latency", "magnetar_bookie_journal_fsync_latency_seconds", "Journal write + fdatasync of one group",
     LATENCY_BUCKETS_S),
    ("group_records", "magnetar_bookie_journal_group_records", "Records per journal group",
     (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)),
    ("group_bytes", "magnetar_bookie_journal_group_bytes",
     "Bytes per journal group (one write + fdatasync; at most group_bytes_max)",
     (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 64 * MIB)),
    # The stages of an add inside the bookie (docs/performance.md), finer buckets.
    ("journal_write", "magnetar_bookie_journal_write_latency_seconds", "A journal group's write(2)",
     STAGE_BUCKETS_S),
    ("journal_fdatasync", "magnetar_bookie_journal_fdatasync_latency_seconds", "A journal group's fdatasync(2)",
     STAGE_BUCKETS_S),
    ("journal_round", "magnetar_bookie_journal_round_latency_seconds",
     "A journal group handed to the IO thread until the event loop has the result "
     "(write, fdatasync and both thread hops)", STAGE_BUCKETS_S),
    ("add_reply", "magnetar_bookie_add_reply_latency_seconds",
     "An add batch's journal fdatasync done until its reply is handed to gRPC and written", STAGE_BUCKETS_S),
    ("add_replies_merged", "magnetar_bookie_add_batches_per_reply",
     "Add batches one reply of an add stream answers (durable by the same time, from a writer that lets "
     "replies merge)", (1, 2, 4, 8, 16, 32, 64)),
]
_COUNTERS: list[tuple[str, str, str]] = [
    ("adds", "magnetar_bookie_adds", "Entries acknowledged"),
    ("add_errors", "magnetar_bookie_add_errors", "Entries refused"),
    ("add_bytes", "magnetar_bookie_add_bytes", "Bytes of entries received"),
    # Of magnetar_bookie_adds, those that came on the add socket (bookie/add_socket.py),
    # not gRPC: equal to it when every writer uses the socket.
    ("add_socket_adds", "magnetar_bookie_add_socket_adds",
     "Entries acknowledged that came on the add socket (also in magnetar_bookie_adds)"),
    ("reads", "magnetar_bookie_read_entries", "Entries read (including errors)"),
    ("read_bytes", "magnetar_bookie_read_bytes", "Bytes of entries read"),
]


class BookieMetrics:
    def __init__(self, node: BookieNode, registry: CollectorRegistry) -> None:
        self.registry = registry
        for attribute, _name, _help, buckets in _HISTOGRAMS:
            setattr(self, attribute, WeightedHistogram(buckets))
        # The counters' values, by attribute name of _COUNTERS.
        self.counts: dict[str, float] = {attribute: 0 for attribute, _name, _help in _COUNTERS}
        self._node = node
        if node.journal is not None:
            node.journal.on_group_written = self.on_group_written

        registry.register(_NodeCollector(node))
        registry.register(_AddPathCollector(self))

    def on_adds(self, accepted: int, refused: int, size_bytes: int, *, on_add_socket: bool = False) -> None:
        counts = self.counts
        counts["adds"] += accepted
        if on_add_socket:
            counts["add_socket_adds"] += accepted
        if refused:
            counts["add_errors"] += refused
        counts["add_bytes"] += size_bytes

    def on_group_written(self, fsync_seconds: float, records: int, group_bytes: int) -> None:
        self.fsync_latency.observe(fsync_seconds)
        self.journal_fdatasync.observe(fsync_seconds)
        journal = self._node.journal
        if journal is not None and hasattr(journal, "last_round_s"):
            self.journal_write.observe(journal.last_write_s)
            self.journal_round.observe(journal.last_round_s)
        self.group_records.observe(records)
        self.group_bytes.observe(group_bytes)

    def on_reads(self, count: int, size_bytes: int) -> None:
        self.counts["reads"] += count
        self.counts["read_bytes"] += size_bytes


class _AddPathCollector(Collector):
    """Exposes BookieMetrics' histograms and counters at scrape time."""

    def __init__(self, metrics: BookieMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        metrics = self._metrics
        for attribute, name, help_text in _COUNTERS:
            yield CounterMetricFamily(name, help_text, value=metrics.counts[attribute])
        for attribute, name, help_text, _buckets in _HISTOGRAMS:
            histogram: WeightedHistogram = getattr(metrics, attribute)
            yield HistogramMetricFamily(name, help_text, sum_value=histogram.sum,
                                        buckets=[(floatToGoString(float(bound)) if bound != "+Inf" else bound, count)
                                                 for bound, count in histogram.cumulative()])


# The gauges read at each scrape: (name, help, value from the node, journal and storage
# statistics). The journal's statistics are zeros before the journal exists.
_GAUGES: list[tuple[str, str, Callable[[BookieNode, JournalStats, StorageStats], float]]] = [
    ("magnetar_bookie_read_only", "1 when the bookie is read-only", lambda n, j, s: 1 if n.read_only else 0),
    ("magnetar_bookie_journal_fsyncs", "Journal groups written and fsynced", lambda n, j, s: j.groups_written),
    ("magnetar_bookie_journal_records", "Journal records written", lambda n, j, s: j.records_written),
    ("magnetar_bookie_journal_bytes", "Journal bytes written", lambda n, j, s: j.bytes_written),
    ("magnetar_bookie_journal_fsync_seconds", "Time spent in journal fdatasync",
     lambda n, j, s: j.fsync_seconds_total),
    ("magnetar_bookie_journal_group_bytes_largest", "The largest journal group written since start",
     lambda n, j, s: j.group_bytes_largest),
    ("magnetar_bookie_journal_queue_wait_seconds_max", "The longest an add waited in the journal queue",
     lambda n, j, s: j.queue_wait.max),
    ("magnetar_bookie_journal_preallocation_failures",
     "Journal space allocations that failed (that file then grows with its writes)",
     lambda n, j, s: j.preallocation_failures),
    ("magnetar_bookie_write_cache_bytes", "Bytes in write caches", lambda n, j, s: s.write_cache_bytes),
    ("magnetar_bookie_read_cache_bytes", "Bytes in read caches", lambda n, j, s: s.read_cache_bytes),
    ("magnetar_bookie_read_cache_hits", "Read cache hits", lambda n, j, s: s.read_cache_hits),
    ("magnetar_bookie_read_cache_misses", "Read cache misses", lambda n, j, s: s.read_cache_misses),
    ("magnetar_bookie_ledgers", "Ledgers stored", lambda n, j, s: s.ledger_count),
    ("magnetar_bookie_entry_logs", "Entry log files", lambda n, j, s: s.entry_log_count),
    ("magnetar_bookie_flushes", "Ledger storage flushes", lambda n, j, s: s.flushes),
    ("magnetar_bookie_flushed_bytes", "Bytes flushed to entry logs", lambda n, j, s: s.flushed_bytes),
    ("magnetar_bookie_compacted_logs", "Entry logs compacted", lambda n, j, s: s.compacted_logs),
    ("magnetar_bookie_compacted_bytes", "Bytes reclaimed by compaction", lambda n, j, s: s.compacted_bytes),
    ("magnetar_bookie_disk_usage_ratio", "Highest used share of a bookie disk",
     lambda n, j, s: n.disk_usage.ratio if n.disk_usage else 0.0),
    ("magnetar_bookie_disk_free_bytes", "Free bytes on the bookie's disks",
     lambda n, j, s: n.disk_usage.free_bytes if n.disk_usage else 0),
]


class _NodeCollector(Collector):
    """Reads the node's gauges at scrape time, with one ``storage.stats()`` call."""

    def __init__(self, node: BookieNode) -> None:
        self._node = node

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        node = self._node
        journal_stats = node.journal.stats if node.journal is not None else JournalStats()
        storage_stats = node.storage.stats()
        for name, help_text, value in _GAUGES:
            yield GaugeMetricFamily(name, help_text, value=value(node, journal_stats, storage_stats))
        # Kept by the journal per record (one bisect per append, not one observe per
        # add) and exposed here as a histogram.
        journal = node.journal
        yield GaugeMetricFamily("magnetar_bookie_journal_queue_records",
                                "Adds (and fences) waiting in the journal queue for a group",
                                value=journal.queued_records if journal is not None else 0)
        yield GaugeMetricFamily("magnetar_bookie_journal_queue_bytes",
                                "Bytes appended to the journal and not yet written",
                                value=journal.queued_bytes if journal is not None else 0)
        usage = node.disk_usage
        ratio = GaugeMetricFamily("magnetar_bookie_directory_usage_ratio",
                                  "Used share of the filesystem holding each journal or ledger directory",
                                  labels=["directory"])
        free = GaugeMetricFamily("magnetar_bookie_directory_free_bytes",
                                 "Free bytes of the filesystem holding each journal or ledger directory",
                                 labels=["directory"])
        for directory, used_share, free_bytes in (usage.directories if usage is not None else ()):
            ratio.add_metric([directory], used_share)
            free.add_metric([directory], free_bytes)
        yield ratio
        yield free
        queue_wait = journal_stats.queue_wait
        yield HistogramMetricFamily(
            "magnetar_bookie_journal_queue_wait_seconds",
            "Per add (or fence): from its append to the journal until its group's write began",
            buckets=queue_wait.cumulative(), sum_value=queue_wait.sum)
