"""Streaming reads (``spark.readStream.format("magnetar")``): offsets are per topic
partition positions, ``{"<partition's topic name>": "LEDGER:ENTRY"}``, the last entry a
micro-batch included ("-1:-1": nothing yet). A micro-batch reads, for each partition,
the entries after its start offset up to and including its end offset: those of
archived ledgers straight from the archive files (a Spark partition per file, record
batches outside the range skipped by their footer metadata, rows trimmed at the edges),
the rest — after the last archived entry — through a broker as a non-durable reader
(spark/tail.py). The archive is the oldest part of a partition, so the two ranges never
overlap and leave no gap; ledgers retention removed from the topic but the archive still
keeps are read too.

Replayable: the same (start, end) offsets always give the same rows (a position range
of a topic never changes), so Spark's checkpoint (offsets written before a batch runs,
commits after its sink committed) gives exactly-once with an idempotent sink (the file
sink): a query killed mid-batch reruns that batch from the same offsets.

Options (besides the batch ones that apply): where a new query starts (a query with a
checkpoint resumes from it) — ``startingOffsets`` ``earliest`` (default) or ``latest``;
``startingTimestamp`` (ms: each partition from its first message published at or after
it); ``startingOffsetsByTimestamp`` (JSON, per topic ``{"<topic>": ms}`` or per
partition ``{"<topic>": {"0": ms, …}}``; topics it does not name start by the other
options); ``maxMessagesPerTrigger`` (Spark's ReadLimit: a micro-batch ends at the
last whole entry within the limit, counted by reading the range on the driver; at least
one entry, so a batch of more messages than the limit still moves on);
``minMessagesPerTrigger`` with ``maxTriggerDelay`` (default 15m; the Kafka source's
``minOffsetsPerTrigger``/``maxTriggerDelay``): a trigger that finds fewer new messages
than the minimum runs no micro-batch, until the minimum is there or the delay since the
last batch passed (spark/admission.py; counted by reading the new range on the driver,
up to the minimum; not applied under Trigger.AvailableNow, which reads what is stored).

``failOnDataLoss`` (default true, as Spark's Kafka source): before a micro-batch is
planned and before it is read, each partition's start offset is checked against what
the partition still stores (its archive manifest and its ledgers; spark/data_loss.py).
When retention deleted messages after it, the query fails with MessagesDeleted naming
the topic and the range; with false the reader logs the range and goes on from the
oldest stored message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from archive.reader import ArchiveFile
from common.errors import ConfigError, MessagesDeleted, TailGap
from common.topic_name import TopicName
from spark import manifest, metrics
from spark.admission import TriggerAdmission, parse_delay_s
from spark.bounds import Bounds
from spark.data_loss import LedgerHistory, find_loss
from spark.options import _boolean, _get, _integer, parse_read_options, topic_name
from spark.reader import TailPartition
from spark.schema import to_spark_batch
from spark.tail import TailReader

NOTHING = "-1:-1"
# A tail read that skipped entries (TailGap) plans the rest again at most this often.
TAIL_GAP_REPLANS = 3


@dataclass
class StreamArchivePartition(InputPartition):
    """The entries of a micro-batch's range (``bounds``) held by one archive file."""

    topic: str
    ledger_id: int
    url: str
    size_bytes: int
    bounds: Bounds

    def __post_init__(self) -> None:
        InputPartition.__init__(self, self.url)

log = logging.getLogger(__name__)


def _timestamps_by_topic(text: str | None) -> dict[str, int | dict[str, int]]:
    """``startingOffsetsByTimestamp``: {full topic name: ms, or {partition index: ms}}."""
    if text is None:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ConfigError(f"option startingOffsetsByTimestamp is not JSON: {text!r}") from None
    if not isinstance(parsed, dict):
        raise ConfigError("option startingOffsetsByTimestamp must be a JSON object of topics")

    def millis(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"option startingOffsetsByTimestamp: {value!r} is not a time in ms")
        return value
    by_topic: dict[str, int | dict[str, int]] = {}
    for topic, value in parsed.items():
        name = topic_name(topic, "startingOffsetsByTimestamp")
        if isinstance(value, dict):
            by_topic[name] = {str(int(index)): millis(ms) for index, ms in value.items()}
        else:
            by_topic[name] = millis(value)
    return by_topic


def _position(text: str) -> tuple[int, int] | None:
    ledger, entry = (int(part) for part in text.split(":"))
    return None if ledger < 0 else (ledger, entry)


def _text(position: tuple[int, int] | None) -> str:
    return NOTHING if position is None else f"{position[0]}:{position[1]}"


class MagnetarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        # startingOffsets means earliest/latest here, not a batch read's position, and
        # the starting times pick initial offsets instead of bounding rows.
        batch_options = {name: value for name, value in options.items()
                         if name.lower() not in ("startingoffsets", "startingtimestamp", "startingoffsetsbytimestamp")}
        self.options = parse_read_options(batch_options)
        if self.options.service_url is None:
            raise ConfigError("option serviceUrl is required for streaming reads")
        self.options.use_archive_endpoint()
        starting = _get(options, "startingOffsets") or "earliest"
        if starting not in ("earliest", "latest"):
            raise ConfigError("option startingOffsets of a stream must be earliest or latest")
        self.starting = starting
        self.starting_timestamp_ms = _integer(options, "startingTimestamp", None, 0)
        self.starting_by_timestamp = _timestamps_by_topic(_get(options, "startingOffsetsByTimestamp"))
        self.max_messages = _integer(options, "maxMessagesPerTrigger", None, 1)
        # minMessagesPerTrigger / maxTriggerDelay (spark/admission.py).
        minimum = _integer(options, "minMessagesPerTrigger", None, 1)
        delay_text = _get(options, "maxTriggerDelay")
        if minimum is None and delay_text is not None:
            raise ConfigError("option maxTriggerDelay needs minMessagesPerTrigger")
        if minimum is not None and self.max_messages is not None and minimum > self.max_messages:
            raise ConfigError(f"option minMessagesPerTrigger ({minimum}) is above maxMessagesPerTrigger "
                              f"({self.max_messages})")
        self.admission = None if minimum is None else TriggerAdmission(minimum, parse_delay_s(delay_text))
        self.fail_on_data_loss = _boolean(options, "failOnDataLoss", True)
        # Trigger.AvailableNow: each partition's last message when the query started;
        # no micro-batch goes past it (None: any trigger but AvailableNow).
        self.available_now_end: dict[str, tuple[int, int] | None] | None = None
        # Each partition's newest message at the last latestOffset (before any read
        # limit): what reportLatestOffset shows in the query's progress, beside the
        # micro-batch's endOffset, so the query's lag can be seen there.
        self.newest: dict[str, str] = {}
        self.history = LedgerHistory()

    def _check_data_loss(self, name: str, begin: tuple[int, int] | None) -> None:
        """Raises MessagesDeleted (or, with failOnDataLoss false, logs) when retention
        deleted messages after ``begin`` of partition ``name``."""
        if begin is None:
            return
        topic_ledgers = manifest.topic_ledgers(self.options.admin_url, name)
        self.history.observe(name, topic_ledgers)
        stored = {ledger["ledger_id"]: ledger["entry_count"]
                  for ledger in manifest.ledgers(self.options.admin_url, name) if ledger["topic"] == name}
        for ledger_id, entries in topic_ledgers:
            stored.setdefault(ledger_id, -1 if entries is None else entries)
        loss = find_loss(name, begin, stored, self.history.ledgers(name))
        if loss is None:
            return
        error = MessagesDeleted(loss.topic, loss.after, loss.upto)
        if self.fail_on_data_loss:
            raise error
        log.warning("spark stream skips deleted messages (failOnDataLoss=false): topic=%s after=%s upto=%s",
                    name, loss.after, loss.upto)

    def _partition_names(self) -> list[str]:
        topics = manifest.resolve_topics(self.options.admin_url, self.options.topics, self.options.pattern,
                                         self.options.namespace)
        names = []
        for topic in topics:
            count = manifest.partition_count(self.options.admin_url, topic)
            names.extend([f"{topic}-partition-{i}" for i in range(count)] if count > 0 else [topic])
        return names

    def _starting_time_ms(self, name: str) -> int | None:
        topic = TopicName.parse(name)
        by_topic = self.starting_by_timestamp.get(str(topic.partitioned_parent))
        if isinstance(by_topic, dict):
            by_topic = by_topic.get(str(topic.partition_index))
        return by_topic if by_topic is not None else self.starting_timestamp_ms

    def initialOffset(self) -> dict:
        initial = {}
        for name in self._partition_names():
            time_ms = self._starting_time_ms(name)
            if time_ms is not None:
                position = self._position_at_time(name, time_ms)
                # The offset is the last entry read: the one before ``position``
                # (entry -1 of its ledger when it is the ledger's first).
                initial[name] = _text((position[0], position[1] - 1))
            elif self.starting == "latest":
                initial[name] = _text(manifest.last_message_position(self.options.admin_url, name))
            else:
                initial[name] = NOTHING
        return initial

    def _position_at_time(self, name: str, time_ms: int) -> tuple[int, int]:
        """The first entry of partition ``name`` published at or after ``time_ms``: in
        its archive files when one holds it (their footers say which batches to read),
        else as the broker finds it in the topic's ledgers (or the position after the
        last entry)."""
        for ledger in manifest.ledgers(self.options.admin_url, name):
            if ledger["topic"] != name:
                continue
            for record in sorted(ledger["files"], key=lambda record: record["first_entry_id"]):
                if record["publish_time_ms_max"] < time_ms:
                    continue
                with ArchiveFile.open(record["url"], size_bytes=record["size_bytes"]) as archive_file:
                    for index, batch_metadata in enumerate(archive_file.metadata.batches):
                        if batch_metadata.publish_time_ms_max < time_ms:
                            continue
                        batch = archive_file.read_batch(index)
                        times = batch.column("publish_time").cast(pa.int64()).to_pylist()
                        entries = batch.column("entry_id").to_pylist()
                        for entry_id, publish_ms in zip(entries, times):
                            if publish_ms >= time_ms:
                                return ledger["ledger_id"], entry_id
        return manifest.position_at_time(self.options.admin_url, name, time_ms)

    def prepareForTriggerAvailableNow(self) -> None:
        """Spark's Trigger.AvailableNow: what is stored now is the query's end (read
        in as many micro-batches as the read limit makes), nothing published later."""
        self.available_now_end = {name: manifest.last_message_position(self.options.admin_url, name)
                                  for name in self._partition_names()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_messages is None else ReadMaxRows(self.max_messages)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = dict(start)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        for name in self._partition_names():
            begin = _position(start.get(name, NOTHING))
            self._check_data_loss(name, begin)
            end = manifest.last_message_position(self.options.admin_url, name)
            self.newest[name] = _text(end) if end is not None else start.get(name, NOTHING)
            if self.available_now_end is not None:
                cap = self.available_now_end.get(name)
                end = None if cap is None or end is None else min(end, cap)
            if end is None or (begin is not None and end <= begin):
                latest.setdefault(name, _text(begin))
                continue
            if budget is not None:
                if budget <= 0:
                    latest.setdefault(name, _text(begin))
                    continue
                end, used = self._position_within(name, begin, end, budget)
                budget -= used
            latest[name] = _text(end)
        if self.admission is not None and self.available_now_end is None and latest != start:
            # The first trigger is let through whatever it finds: not counted.
            available = (self.admission.minimum if self.admission.last_s is None
                         else self._count_new(start, latest, self.admission.minimum))
            if available and not self.admission.admit(time.monotonic(), available):
                log.debug("spark stream puts a micro-batch off: %d new messages, minMessagesPerTrigger %d",
                          available, self.admission.minimum)
                return dict(start)
        return latest

    def _count_new(self, start: dict, latest: dict, needed: int) -> int:
        """The messages between ``start`` and ``latest`` (all partitions), counted by
        reading the ranges on the driver as a task would, up to ``needed`` at most."""
        counted = 0
        for name, end_text in latest.items():
            begin, end = _position(start.get(name, NOTHING)), _position(end_text)
            if end is None or (begin is not None and end <= begin):
                continue
            with contextlib.closing(self._driver_batches(name, begin, end)) as batches:
                for batch in batches:
                    counted += batch.num_rows
                    if counted >= needed:
                        return counted
        return counted

    def _driver_batches(self, name: str, begin, end) -> Iterator[pa.RecordBatch]:
        """The rows of entries (begin, end] of partition ``name``, read on the driver the
        way the tasks read them (archive files, then the tail); each partition's reader is
        closed when it is done or when this generator is."""
        for partition in self._plan(name, begin, end):
            batches = self._read_partition(partition, check=False)
            try:
                yield from batches
            finally:
                batches.close()

    def reportLatestOffset(self) -> dict | None:
        """Spark's latestOffset in the query's progress (``sources[].latestOffset``):
        each partition's newest message as the last latestOffset found it, whatever the
        read limit let the micro-batch take (its ``endOffset``). The two differ while the
        query is behind: the Kafka source's ``avgOffsetsBehindLatest`` has no Python
        data source hook, this is the one there is. None before the first trigger."""
        return dict(self.newest) if self.newest else None

    def _position_within(self, name: str, begin, end, budget: int) -> tuple[tuple[int, int], int]:
        """The last whole entry after ``begin`` within ``budget`` messages (at least
        one entry), and the messages up to it: the range is read on the driver the way
        a task reads it (archive files, then the tail), stopping once past the budget."""
        chosen, used = None, 0
        counted = 0
        current, current_rows = None, 0
        with contextlib.closing(self._driver_batches(name, begin, end)) as batches:
            for batch in batches:
                for position in zip(batch.column("ledger_id").to_pylist(), batch.column("entry_id").to_pylist()):
                    if position != current:
                        if current is not None:
                            if chosen is not None and counted + current_rows > budget:
                                return chosen, used
                            counted += current_rows
                            chosen, used = current, counted
                        current, current_rows = position, 0
                    current_rows += 1
        if current is not None and (chosen is None or counted + current_rows <= budget):
            counted += current_rows
            chosen, used = current, counted
        return (chosen if chosen is not None else end), used

    def _plan(self, name: str, begin: tuple[int, int] | None, end: tuple[int, int]) -> list[InputPartition]:
        """The partitions reading entries (begin, end] of partition ``name``: one per
        archive file holding some of them, in order, then the tail after the last
        archived entry through a broker. The archive is a prefix of the partition (the
        oldest closed ledgers are archived first), so the two never overlap."""
        assert begin is None or begin < end, (begin, end)
        bounds = Bounds(position_min=None if begin is None else (begin[0], begin[1] + 1),
                        position_end=(end[0], end[1] + 1))
        ledgers = [ledger for ledger in manifest.ledgers(self.options.admin_url, name) if ledger["topic"] == name]
        planned: list[InputPartition] = []
        for ledger in ledgers:
            for record in sorted(ledger["files"], key=lambda record: record["first_entry_id"]):
                if bounds.file_may_match(ledger["ledger_id"], record):
                    planned.append(StreamArchivePartition(name, ledger["ledger_id"], record["url"],
                                                          record["size_bytes"], bounds))
        archived_last = max(((ledger["ledger_id"], ledger["entry_count"] - 1) for ledger in ledgers), default=None)
        tail_after = begin if archived_last is None or (begin is not None and begin >= archived_last) else archived_last
        if tail_after is None or tail_after < end:
            planned.append(TailPartition(name, tail_after, end))
        return planned

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        planned = []
        for name, end_text in end.items():
            end_position = _position(end_text)
            begin = _position(start.get(name, NOTHING))
            if end_position is None or (begin is not None and end_position <= begin):
                continue
            self._check_data_loss(name, begin)
            planned.extend(self._plan(name, begin, end_position))
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self._read_partition(partition, check=True)

    def _read_partition(self, partition: InputPartition, *, check: bool) -> Iterator[pa.RecordBatch]:
        self.options.use_archive_endpoint()
        rows = 0
        if isinstance(partition, StreamArchivePartition):
            bounds = partition.bounds
            with ArchiveFile.open(partition.url, size_bytes=partition.size_bytes) as archive_file:
                for index, batch_metadata in enumerate(archive_file.metadata.batches):
                    if not bounds.batch_may_match(partition.ledger_id, batch_metadata):
                        continue
                    batch = bounds.keep(to_spark_batch(archive_file.read_batch(index)))
                    if batch.num_rows:
                        rows += batch.num_rows
                        yield batch
            if check:
                metrics.record(self.options.metrics_dir, "stream-archive", topic=partition.topic,
                               url=partition.url, rows=rows)
            return
        assert isinstance(partition, TailPartition), type(partition)
        if check:
            self._check_data_loss(partition.topic, partition.start_after)
        for batch in self._read_tail_range(partition.topic, partition.start_after, partition.end):
            rows += batch.num_rows
            yield batch
        if check:
            metrics.record(self.options.metrics_dir, "stream-tail", topic=partition.topic,
                           start_after=partition.start_after, end=partition.end, rows=rows)

    def _read_tail_range(self, name: str, start_after: tuple[int, int] | None, end: tuple[int, int],
                         depth: int = 0) -> Iterator[pa.RecordBatch]:
        """Entries (start_after, end] of partition ``name`` through a broker; when the
        broker skips some (retention removed their ledger from the topic once it was
        archived: TailGap), the rest is planned again from the manifest as it is now
        and read from the archive files (and the tail after them), at most
        TAIL_GAP_REPLANS times."""
        admin_url = self.options.admin_url
        reader = TailReader(self.options.service_url, name, start_after, end, self.options.tail_timeout_ms,
                            ledgers_now=lambda: (manifest.topic_ledgers(admin_url, name),
                                                 manifest.ledgers(admin_url, name)))
        try:
            yield from reader.batches()
        except TailGap as gap:
            if depth >= TAIL_GAP_REPLANS:
                raise
            log.warning("spark stream tail skipped entries, reading the rest from the archive: topic=%s "
                        "after=%s end=%s delivered=%s", name, gap.last_seen, end, gap.delivered)
            for part in self._plan(name, gap.last_seen, end):
                if isinstance(part, TailPartition):
                    yield from self._read_tail_range(name, part.start_after, end, depth + 1)
                else:
                    yield from self._read_partition(part, check=False)

    def commit(self, end: dict) -> None:
        pass
