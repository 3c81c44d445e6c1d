"""The bookie's /metrics gauges (bookie/metrics.py) and the entry log count behind one.

What it proves:
- one scrape takes the storage statistics once (they sum over every ledger directory
  and used to be taken once per gauge, ~10 times per scrape), and every gauge shows the
  value of its field, journal and disk gauges included (zeros before the journal and
  the first disk check exist);
- the entry log count that feeds magnetar_bookie_entry_logs follows creations and
  deletions without listing the directory at scrape time.
- adds that came on the add socket are counted apart from, and also in, all adds.

How: BookieMetrics over a stand-in node whose storage counts stats() calls; the text
exposition of the registry is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bookie.disk_monitor import DiskUsage
from bookie.entry_log import EntryLogger
from bookie.journal import JournalStats
from bookie.ledger_storage import StorageStats
from bookie.metrics import BookieMetrics

STATS = StorageStats(write_cache_bytes=11, read_cache_bytes=12, read_cache_hits=13, read_cache_misses=14,
                     ledger_count=15, entry_log_count=16, flushes=17, flushed_bytes=18, compacted_logs=19,
                     compacted_bytes=20)


class _Storage:
    def __init__(self) -> None:
        self.calls = 0

    def stats(self) -> StorageStats:
        self.calls += 1
        return STATS


@dataclass
class _Journal:
    stats: JournalStats
    on_group_written: object = None
    queued_records: int = 0
    queued_bytes: int = 0


class _Node:
    def __init__(self) -> None:
        self.storage = _Storage()
        self.journal: _Journal | None = None
        self.read_only = False
        self.disk_usage: DiskUsage | None = None


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values


def test_one_scrape_takes_the_storage_stats_once():
    """Each scrape calls storage.stats() exactly once and shows every field."""
    node = _Node()
    registry = CollectorRegistry()
    BookieMetrics(node, registry)      # type: ignore[arg-type]
    values = _scrape(registry)
    assert node.storage.calls == 1
    expected = {
        "magnetar_bookie_write_cache_bytes": 11, "magnetar_bookie_read_cache_bytes": 12,
        "magnetar_bookie_read_cache_hits": 13, "magnetar_bookie_read_cache_misses": 14,
        "magnetar_bookie_ledgers": 15, "magnetar_bookie_entry_logs": 16, "magnetar_bookie_flushes": 17,
        "magnetar_bookie_flushed_bytes": 18, "magnetar_bookie_compacted_logs": 19,
        "magnetar_bookie_compacted_bytes": 20,
        "magnetar_bookie_read_only": 0, "magnetar_bookie_journal_fsyncs": 0, "magnetar_bookie_journal_records": 0,
        "magnetar_bookie_journal_bytes": 0, "magnetar_bookie_journal_fsync_seconds": 0,
        "magnetar_bookie_disk_usage_ratio": 0, "magnetar_bookie_disk_free_bytes": 0,
    }
    assert {name: values[name] for name in expected} == expected
    _scrape(registry)
    assert node.storage.calls == 2


def test_journal_and_disk_gauges_follow_the_node():
    """With a journal and a disk check, their numbers are what the scrape shows."""
    node = _Node()
    node.journal = _Journal(JournalStats(groups_written=3, records_written=30, bytes_written=300,
                                         fsync_seconds_total=0.5))
    node.read_only = True
    node.disk_usage = DiskUsage(total_bytes=5000, free_bytes=1234, ratio=0.25, worst_directory="/data")
    registry = CollectorRegistry()
    BookieMetrics(node, registry)      # type: ignore[arg-type]
    values = _scrape(registry)
    assert values["magnetar_bookie_journal_fsyncs"] == 3
    assert values["magnetar_bookie_journal_records"] == 30
    assert values["magnetar_bookie_journal_bytes"] == 300
    assert values["magnetar_bookie_journal_fsync_seconds"] == 0.5
    assert values["magnetar_bookie_read_only"] == 1
    assert values["magnetar_bookie_disk_usage_ratio"] == 0.25
    assert values["magnetar_bookie_disk_free_bytes"] == 1234
    assert node.storage.calls == 1


def test_the_entry_log_count_follows_creations_and_deletions(tmp_path, monkeypatch):
    """log_count matches the files on disk after start-up (with logs of an earlier
    run), rotations and deletions, and reading it lists no directory."""
    directory = tmp_path / "entrylogs"
    earlier = EntryLogger(str(directory), log_bytes_max=4096, fsync_enabled=False)
    earlier.open_new_log()
    earlier.append_batch([b"x" * 1000] * 6)
    earlier.close()
    logger = EntryLogger(str(directory), log_bytes_max=4096, fsync_enabled=False)
    try:
        assert logger.log_count == len(os.listdir(directory)) == 2
        logger.open_new_log()
        logger.append_batch([b"y" * 1000] * 9)
        assert logger.log_count == len(os.listdir(directory)) == 5
        logger.delete_log(1)
        assert logger.log_count == len(os.listdir(directory)) == 4

        def no_listing(path):
            raise AssertionError("log_count listed the directory")

        monkeypatch.setattr(os, "listdir", no_listing)
        assert logger.log_count == 4
    finally:
        monkeypatch.undo()
        logger.close()


def test_adds_on_the_add_socket_are_counted_apart():
    """magnetar_bookie_add_socket_adds counts the acknowledged entries that came on the
    add socket; magnetar_bookie_adds counts those and gRPC's (refused ones in neither)."""
    registry = CollectorRegistry()
    metrics = BookieMetrics(_Node(), registry)      # type: ignore[arg-type]
    metrics.on_adds(5, 1, 600)                       # gRPC
    metrics.on_adds(7, 2, 900, on_add_socket=True)
    values = _scrape(registry)
    assert values["magnetar_bookie_adds_total"] == 12
    assert values["magnetar_bookie_add_socket_adds_total"] == 7
    assert values["magnetar_bookie_add_errors_total"] == 3
