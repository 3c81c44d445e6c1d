"""What a read keeps: a publish time range and a position range, from the read options
(a batch read's start/end offsets and timestamps, a micro-batch's offsets). Pure: no IO.

Bounds prune at three levels, each conservative (it may keep what matches nothing,
never drop what matches): a file by its manifest record (entry range, publish time
range), a record batch by its footer metadata (the same ranges), then rows exactly
(``row_mask``). Filters Spark could push down are not turned into bounds: a planned read
may be run by a scan other than the one that pushed them (spark/reader.py).

Times are kept in microseconds (Spark's timestamp precision), inclusive at both ends;
the archive's times are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from archive.format import BatchMetadata

Position = tuple[int, int]


@dataclass(frozen=True)
class Bounds:
    time_us_min: int | None = None
    time_us_max: int | None = None
    position_min: Position | None = None          # inclusive
    position_end: Position | None = None          # exclusive

    # --- pruning ---------------------------------------------------------------------------

    def _time_overlaps(self, time_ms_min: int, time_ms_max: int) -> bool:
        return ((self.time_us_max is None or time_ms_min * 1000 <= self.time_us_max)
                and (self.time_us_min is None or time_ms_max * 1000 + 999 >= self.time_us_min))

    def _entries_overlap(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> bool:
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
        return self._time_overlaps(batch.publish_time_ms_min, batch.publish_time_ms_max)

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
