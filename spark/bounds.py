"""What a read keeps: publish time, ledger/entry and position ranges and keys, from the
options and from the filters Spark pushes down (``pushFilters``). Pure: no IO.

Bounds prune at three levels, each conservative (it may keep what matches nothing,
never drop what matches): a file by its manifest record (entry range, publish time
range), a record batch by its footer metadata (entry range, publish time range, key
range and key filter), then rows exactly (``row_mask``), so the filters the reader
reports as handled are applied in full and Spark need not evaluate them again.

Times are kept in microseconds (Spark's timestamp precision), inclusive at both ends;
the archive's times are milliseconds.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan,
                                    LessThanOrEqual)

from archive.format import BatchMetadata

Position = tuple[int, int]
_INT_COLUMNS = ("ledger_id", "entry_id")


@dataclass(frozen=True)
class Bounds:
    time_us_min: int | None = None
    time_us_max: int | None = None
    ledger_id_min: int | None = None
    ledger_id_max: int | None = None
    entry_id_min: int | None = None
    entry_id_max: int | None = None
    position_min: Position | None = None          # inclusive
    position_end: Position | None = None          # exclusive
    keys: frozenset[str] | None = None            # None: any key (or none)

    @property
    def empty(self) -> bool:
        return self == Bounds()

    def intersect(self, other: "Bounds") -> "Bounds":
        def low(a, b):
            return b if a is None else a if b is None else max(a, b)

        def high(a, b):
            return b if a is None else a if b is None else min(a, b)
        keys = other.keys if self.keys is None else self.keys if other.keys is None else self.keys & other.keys
        return Bounds(low(self.time_us_min, other.time_us_min), high(self.time_us_max, other.time_us_max),
                      low(self.ledger_id_min, other.ledger_id_min), high(self.ledger_id_max, other.ledger_id_max),
                      low(self.entry_id_min, other.entry_id_min), high(self.entry_id_max, other.entry_id_max),
                      low(self.position_min, other.position_min), high(self.position_end, other.position_end), keys)

    # --- pruning ---------------------------------------------------------------------------

    def _time_overlaps(self, time_ms_min: int, time_ms_max: int) -> bool:
        return ((self.time_us_max is None or time_ms_min * 1000 <= self.time_us_max)
                and (self.time_us_min is None or time_ms_max * 1000 + 999 >= self.time_us_min))

    def _entries_overlap(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> bool:
        if self.ledger_id_min is not None and ledger_id < self.ledger_id_min:
            return False
        if self.ledger_id_max is not None and ledger_id > self.ledger_id_max:
            return False
        if self.entry_id_min is not None and last_entry_id < self.entry_id_min:
            return False
        if self.entry_id_max is not None and first_entry_id > self.entry_id_max:
            return False
        if self.position_min is not None and (ledger_id, last_entry_id) < self.position_min:
            return False
        if self.position_end is not None and (ledger_id, first_entry_id) >= self.position_end:
            return False
        return True

    def file_may_match(self, ledger_id: int, record: dict) -> bool:
        """``record``: a file of the manifest (FileRecord JSON)."""
        return (self._entries_overlap(ledger_id, record["first_entry_id"], record["last_entry_id"])
                and self._time_overlaps(record["publish_time_ms_min"], record["publish_time_ms_max"]))

    def batch_may_match(self, ledger_id: int, batch: BatchMetadata) -> bool:
        if not self._entries_overlap(ledger_id, batch.first_entry_id, batch.last_entry_id):
            return False
        if not self._time_overlaps(batch.publish_time_ms_min, batch.publish_time_ms_max):
            return False
        if self.keys is not None and not any(batch.may_contain_key(key) for key in self.keys):
            return False
        return True

    def keep(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's rows within the bounds (the batch itself when all are)."""
        mask = self.row_mask(batch)
        return batch if mask is None else batch.filter(mask)

    def row_mask(self, batch: pa.RecordBatch) -> pa.Array | None:
        """The rows of a Spark-schema batch within the bounds (None: all of them)."""
        masks = []
        times = batch.column("publish_time")
        if self.time_us_min is not None:
            masks.append(pc.greater_equal(times, pa.scalar(self.time_us_min, times.type)))
        if self.time_us_max is not None:
            masks.append(pc.less_equal(times, pa.scalar(self.time_us_max, times.type)))
        for name in _INT_COLUMNS:
            column = batch.column(name)
            low, high = getattr(self, f"{name}_min"), getattr(self, f"{name}_max")
            if low is not None:
                masks.append(pc.greater_equal(column, low))
            if high is not None:
                masks.append(pc.less_equal(column, high))
        if self.position_min is not None or self.position_end is not None:
            ledgers, entries = batch.column("ledger_id"), batch.column("entry_id")
            if self.position_min is not None:
                ledger, entry = self.position_min
                masks.append(pc.or_(pc.greater(ledgers, ledger),
                                    pc.and_(pc.equal(ledgers, ledger), pc.greater_equal(entries, entry))))
            if self.position_end is not None:
                ledger, entry = self.position_end
                masks.append(pc.or_(pc.less(ledgers, ledger),
                                    pc.and_(pc.equal(ledgers, ledger), pc.less(entries, entry))))
        if self.keys is not None:
            masks.append(pc.fill_null(pc.is_in(batch.column("key"), pa.array(sorted(self.keys), pa.string())), False))
        if not masks:
            return None
        mask = masks[0]
        for other in masks[1:]:
            mask = pc.and_(mask, other)
        return mask


def option_bounds(starting_position: Position | None, ending_position: Position | None,
                  starting_timestamp_ms: int | None, ending_timestamp_ms: int | None) -> Bounds:
    """The bounds the read options set (start inclusive, end exclusive)."""
    return Bounds(time_us_min=None if starting_timestamp_ms is None else starting_timestamp_ms * 1000,
                  time_us_max=None if ending_timestamp_ms is None else ending_timestamp_ms * 1000 - 1,
                  position_min=starting_position, position_end=ending_position)


def _micros(value: object) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            # pyspark hands TimestampType literals over as naive local time.
            value = value.astimezone()
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _one(spark_filter: Filter) -> Bounds | None:
    """The bounds of one filter, or None when it is not one the reader handles."""
    attribute = getattr(spark_filter, "attribute", None)
    if attribute is None or len(attribute) != 1:
        return None
    column = attribute[0]
    if column == "key":
        if isinstance(spark_filter, EqualTo) and isinstance(spark_filter.value, str):
            return Bounds(keys=frozenset([spark_filter.value]))
        if isinstance(spark_filter, In) and all(isinstance(v, str) for v in spark_filter.value):
            return Bounds(keys=frozenset(spark_filter.value))
        return None
    if column == "publish_time":
        convert, field_min, field_max = _micros, "time_us_min", "time_us_max"
    elif column in _INT_COLUMNS:
        convert, field_min, field_max = _integer, f"{column}_min", f"{column}_max"
    else:
        return None
    if isinstance(spark_filter, In):
        return None
    value = convert(getattr(spark_filter, "value", None))
    if value is None:
        return None
    if isinstance(spark_filter, EqualTo):
        return replace(Bounds(), **{field_min: value, field_max: value})
    if isinstance(spark_filter, GreaterThan):
        return replace(Bounds(), **{field_min: value + 1})
    if isinstance(spark_filter, GreaterThanOrEqual):
        return replace(Bounds(), **{field_min: value})
    if isinstance(spark_filter, LessThan):
        return replace(Bounds(), **{field_max: value - 1})
    if isinstance(spark_filter, LessThanOrEqual):
        return replace(Bounds(), **{field_max: value})
    return None


def translate(filters: Sequence[Filter]) -> tuple[Bounds, list[Filter]]:
    """(bounds of the handled filters, the filters not handled, as given)."""
    bounds = Bounds()
    unhandled: list[Filter] = []
    for spark_filter in filters:
        one = _one(spark_filter)
        if one is None:
            unhandled.append(spark_filter)
        else:
            bounds = bounds.intersect(one)
    return bounds, unhandled


def handled(filters: Iterable[Filter]) -> bool:
    return any(_one(f) is not None for f in filters)
