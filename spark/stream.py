"""Streaming reads (``spark.readStream.format("magnetar")``): offsets are per topic
partition positions, ``{"<partition's topic name>": "LEDGER:ENTRY"}``, the last entry a
micro-batch included ("-1:-1": nothing yet). A micro-batch reads, for each partition,
the entries after its start offset up to and including its end offset, through a broker
as a non-durable reader (spark/tail.py); the broker serves archived ledgers from the
archive and the rest from the bookies, so history and tail come through one path.

Replayable: the same (start, end) offsets always give the same rows (a position range
of a topic never changes), so Spark's checkpoint (offsets written before a batch runs,
commits after its sink committed) gives exactly-once with an idempotent sink (the file
sink): a query killed mid-batch reruns that batch from the same offsets.

Options (besides the batch ones that apply): ``startingOffsets`` ``earliest`` (default)
or ``latest``; ``maxMessagesPerTrigger`` (Spark's ReadLimit: a micro-batch ends at the
last whole entry within the limit, counted by reading the range on the driver; at least
one entry, so a batch of more messages than the limit still moves on).

``failOnDataLoss`` (default true, as Spark's Kafka source): before a micro-batch is
planned and before it is read, each partition's start offset is checked against what
the partition still stores (its archive manifest and its ledgers; spark/data_loss.py).
When retention deleted messages after it, the query fails with MessagesDeleted naming
the topic and the range; with false the reader logs the range and goes on from the
oldest stored message.
"""

from __future__ import annotations

import logging
from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from common.errors import ConfigError, MessagesDeleted
from spark import manifest
from spark.data_loss import LedgerHistory, find_loss
from spark.options import _boolean, _get, _integer, parse_read_options
from spark.reader import TailPartition
from spark.tail import TailReader

NOTHING = "-1:-1"

log = logging.getLogger(__name__)


def _position(text: str) -> tuple[int, int] | None:
    ledger, entry = (int(part) for part in text.split(":"))
    return None if ledger < 0 else (ledger, entry)


def _text(position: tuple[int, int] | None) -> str:
    return NOTHING if position is None else f"{position[0]}:{position[1]}"


class MagnetarStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        # startingOffsets means earliest/latest here, not a batch read's position.
        batch_options = {name: value for name, value in options.items() if name.lower() != "startingoffsets"}
        self.options = parse_read_options(batch_options)
        if self.options.service_url is None:
            raise ConfigError("option serviceUrl is required for streaming reads")
        starting = _get(options, "startingOffsets") or "earliest"
        if starting not in ("earliest", "latest"):
            raise ConfigError("option startingOffsets of a stream must be earliest or latest")
        self.starting = starting
        self.max_messages = _integer(options, "maxMessagesPerTrigger", None, 1)
        self.fail_on_data_loss = _boolean(options, "failOnDataLoss", True)
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

    def initialOffset(self) -> dict:
        names = self._partition_names()
        if self.starting == "earliest":
            return {name: NOTHING for name in names}
        return {name: _text(manifest.last_message_position(self.options.admin_url, name)) for name in names}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_messages is None else ReadMaxRows(self.max_messages)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = dict(start)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        for name in self._partition_names():
            begin = _position(start.get(name, NOTHING))
            self._check_data_loss(name, begin)
            end = manifest.last_message_position(self.options.admin_url, name)
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
        return latest

    def _position_within(self, name: str, begin, end, budget: int) -> tuple[tuple[int, int], int]:
        """The last whole entry after ``begin`` within ``budget`` messages (at least
        one entry), and the messages up to it."""
        reader = TailReader(self.options.service_url, name, begin, end, self.options.tail_timeout_ms)
        chosen, used = None, 0
        counted = 0
        current, current_rows = None, 0
        batches = reader.batches()
        try:
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
        finally:
            batches.close()
        return (chosen if chosen is not None else end), used

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        planned = []
        for name, end_text in end.items():
            end_position = _position(end_text)
            begin = _position(start.get(name, NOTHING))
            if end_position is None or (begin is not None and end_position <= begin):
                continue
            self._check_data_loss(name, begin)
            planned.append(TailPartition(name, begin, end_position, None))
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TailPartition), type(partition)
        self._check_data_loss(partition.topic, partition.start_after)
        reader = TailReader(self.options.service_url, partition.topic, partition.start_after, partition.end,
                            self.options.tail_timeout_ms)
        yield from reader.batches()

    def commit(self, end: dict) -> None:
        pass
