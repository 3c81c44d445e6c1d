"""Batch reads: one Spark partition per archive file (a file of more than
``rowsPerPartition`` rows is split by record batches), each task reading verified
record batches (archive/reader.py) and yielding them as ``pyarrow.RecordBatch`` of the
schema in spark/schema.py.

Planning (``partitions``, on Spark's planning worker) reads the manifests through a
broker's admin REST and drops the files the options exclude. A task opens its file with
the manifest's size (a truncated file fails before any read), skips the record batches
the options' bounds exclude by their footer metadata, and trims rows at the edges. A
corrupt file fails the task with ArchiveCorrupt naming the file: Spark retries the
task, then fails the job with that message; no row of a batch that fails its checksum
is ever returned.

Only the options prune; filters Spark could push down do not (the reader does not
implement ``pushFilters``, so Spark evaluates every filter on the rows read). pyspark
4.1-4.3 keeps one planned read per DataFrame source, replaced by each filter pushdown
and run by every scan of that source planned after it: by another query's scan, by the
other branch of a union, by a query running at the same time. A task cannot tell which
scan it serves, so a read planned with one query's filters could prune rows another
query needs. A plan that only the options shape is right for every scan of the
DataFrame, whichever runs it (docs/spark.md, "Filters and pruning").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from archive.reader import ArchiveFile
from common.errors import ConfigError
from spark import manifest, metrics
from spark.bounds import Bounds, option_bounds
from spark.options import ReadOptions
from spark.schema import to_spark_batch


@dataclass
class ArchivePartition(InputPartition):
    topic: str
    ledger_id: int
    url: str
    size_bytes: int
    batch_start: int | None          # None: every batch of the file
    batch_stop: int | None

    def __post_init__(self) -> None:
        InputPartition.__init__(self, self.url)


@dataclass
class TailPartition(InputPartition):
    """The entries of one topic partition after its last archived one, up to its last
    message at planning time (inclusive): read through a broker (spark/tail.py)."""

    topic: str
    start_after: tuple[int, int] | None
    end: tuple[int, int]
    # The broker URL the tail is read through: the serviceUrl option, or the one the
    # admin URL's lookup named when the option was not given (found once, at planning).
    service_url: str = ""

    def __post_init__(self) -> None:
        InputPartition.__init__(self, self.topic)


def plan_tail(options: ReadOptions, base: Bounds, topic: str, partitions: int,
              ledgers: list[dict], last_position, service_url_for=None) -> list[TailPartition]:
    """The tail partitions of a topic: for each of its partitions (or itself), from
    after the last archived entry to ``last_position(name)``, read through the
    serviceUrl option's broker or, without it, ``service_url_for(name)``'s."""
    names = [f"{topic}-partition-{index}" for index in range(partitions)] if partitions > 0 else [topic]
    planned = []
    for name in names:
        archived = [(ledger["ledger_id"], ledger["entry_count"] - 1) for ledger in ledgers if ledger["topic"] == name]
        start_after = max(archived) if archived else None
        end = last_position(name)
        if end is None or (start_after is not None and end <= start_after):
            continue
        if base.position_end is not None and start_after is not None and start_after >= base.position_end:
            continue
        service_url = options.service_url or (service_url_for(name) if service_url_for is not None else None)
        if not service_url:
            raise ConfigError("reading the topic's tail needs option serviceUrl (a broker's pulsar:// URL), "
                              "or includeUnarchived=false for the archive only")
        planned.append(TailPartition(name, start_after, end, service_url))
    return planned


def plan_archive(options: ReadOptions, base: Bounds, ledgers_by_topic: dict[str, list[dict]],
                 footer_batch_count) -> tuple[list[ArchivePartition], dict]:
    """Partitions of the archive files (pure but for ``footer_batch_count(url, size)``,
    asked only for files to split). Returns (partitions, counters)."""
    partitions: list[ArchivePartition] = []
    counters = {"files_listed": 0, "files_planned": 0, "files_pruned_by_options": 0}
    for topic, ledgers in ledgers_by_topic.items():
        for ledger in ledgers:
            ledger_id = ledger["ledger_id"]
            for record in ledger["files"]:
                counters["files_listed"] += 1
                if not base.file_may_match(ledger_id, record):
                    counters["files_pruned_by_options"] += 1
                    continue
                counters["files_planned"] += 1
                ranges: list[tuple[int | None, int | None]] = [(None, None)]
                if record["row_count"] > options.rows_per_partition:
                    batch_count = footer_batch_count(record["url"], record["size_bytes"])
                    pieces = -(-record["row_count"] // options.rows_per_partition)
                    step = max(1, -(-batch_count // pieces))
                    ranges = [(start, min(start + step, batch_count)) for start in range(0, batch_count, step)]
                for start, stop in ranges:
                    partitions.append(ArchivePartition(ledger["topic"], ledger_id, record["url"],
                                                       record["size_bytes"], start, stop))
    return partitions, counters


def _footer_batch_count(url: str, size_bytes: int) -> int:
    with ArchiveFile.open(url, size_bytes=size_bytes) as archive_file:
        return archive_file.batch_count


class MagnetarBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.base = option_bounds(options.starting_position, options.ending_position,
                                  options.starting_timestamp_ms, options.ending_timestamp_ms)

    def partitions(self) -> Sequence[InputPartition]:
        self.options.use_archive_endpoint()
        topics = manifest.resolve_topics(self.options.admin_url, self.options.topics, self.options.pattern,
                                         self.options.namespace)
        ledgers_by_topic = {topic: manifest.ledgers(self.options.admin_url, topic) for topic in topics}
        partitions, counters = plan_archive(self.options, self.base, ledgers_by_topic, _footer_batch_count)
        if self.options.include_unarchived:
            admin_url = self.options.admin_url
            found: list[str] = []

            def service_url_for(name: str) -> str:
                # Asked once per read, and only when there is a tail to read: any
                # broker's URL will do (the tail reader looks its topic up itself).
                if not found:
                    found.append(manifest.service_url_of(admin_url, name))
                return found[0]

            for topic in topics:
                tails = plan_tail(self.options, self.base, topic, manifest.partition_count(admin_url, topic),
                                  ledgers_by_topic[topic],
                                  lambda name: manifest.last_message_position(admin_url, name), service_url_for)
                partitions.extend(tails)
                counters["tail_partitions"] = counters.get("tail_partitions", 0) + len(tails)
        metrics.record(self.options.metrics_dir, "plan", topics=topics, **counters)
        if not partitions:
            # Spark needs at least one partition; an empty one reads nothing.
            partitions = [ArchivePartition("", -1, "", 0, 0, 0)]
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self.options.use_archive_endpoint()
        if isinstance(partition, TailPartition):
            yield from self._read_tail(partition)
            return
        assert isinstance(partition, ArchivePartition), type(partition)
        if not partition.url:
            return
        yield from self._read_file(partition, self.base)

    def _read_tail(self, partition: TailPartition) -> Iterator[pa.RecordBatch]:
        from spark.tail import TailReader

        assert partition.service_url, partition
        admin_url, topic = self.options.admin_url, partition.topic
        reader = TailReader(partition.service_url, topic, partition.start_after, partition.end,
                            self.options.tail_timeout_ms,
                            ledgers_now=lambda: (manifest.topic_ledgers(admin_url, topic),
                                                 manifest.ledgers(admin_url, topic)))
        rows = 0
        for batch in reader.batches():
            batch = self.base.keep(batch)
            if batch.num_rows:
                rows += batch.num_rows
                yield batch
        metrics.record(self.options.metrics_dir, "tail", topic=partition.topic,
                       start_after=partition.start_after, end=partition.end, entries=reader.entries_read, rows=rows)

    def _read_file(self, partition: ArchivePartition, bounds: Bounds) -> Iterator[pa.RecordBatch]:
        read = skipped = rows = 0
        with ArchiveFile.open(partition.url, size_bytes=partition.size_bytes) as archive_file:
            count = archive_file.batch_count
            start = 0 if partition.batch_start is None else partition.batch_start
            stop = count if partition.batch_stop is None else min(partition.batch_stop, count)
            for index in range(start, stop):
                if not bounds.batch_may_match(partition.ledger_id, archive_file.metadata.batches[index]):
                    skipped += 1
                    continue
                batch = to_spark_batch(archive_file.read_batch(index))
                read += 1
                batch = bounds.keep(batch)
                if batch.num_rows:
                    rows += batch.num_rows
                    yield batch
        metrics.record(self.options.metrics_dir, "task", url=partition.url, batches_read=read,
                       batches_skipped=skipped, rows=rows)
