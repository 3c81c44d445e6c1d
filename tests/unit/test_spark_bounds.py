"""The Spark source's pure parts: options parsed with errors naming the option, and
the options' bounds pruning files, record batches and rows conservatively (a pruned
batch never holds a matching row; rows are kept exactly)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from archive.format import BatchMetadata, KeyFilter
from common.errors import ConfigError
from spark.bounds import Bounds, option_bounds
from spark.options import parse_read_options
from spark.schema import ARROW_SCHEMA

ADMIN = {"adminUrl": "http://127.0.0.1:8080"}


def test_options_parse_and_name_the_bad_one():
    parsed = parse_read_options({**ADMIN, "topic": "clicks", "startingOffsets": "5:10", "endingTimestamp": "99"})
    assert parsed.topics == ("persistent://public/default/clicks",)
    assert parsed.starting_position == (5, 10) and parsed.ending_position is None
    assert parsed.ending_timestamp_ms == 99
    # The whole topic (archive and live tail) unless the reader asks for the archive only.
    assert parsed.include_unarchived is True and parsed.service_url is None
    assert parse_read_options({**ADMIN, "topic": "a", "includeUnarchived": "false"}).include_unarchived is False
    assert parse_read_options({**ADMIN, "topics": "a, b,a"}).topics == (
        "persistent://public/default/a", "persistent://public/default/b")
    for options, named in [({**ADMIN}, "topic"), ({**ADMIN, "topic": "a", "topics": "b"}, "topic"),
                           ({"topic": "a"}, "adminUrl"), ({**ADMIN, "topic": "a", "startingOffsets": "x"},
                                                          "startingOffsets"),
                           ({**ADMIN, "pattern": "a.*"}, "namespace"),
                           ({**ADMIN, "topic": "a", "serviceUrl": "http://x:8080"}, "serviceUrl"),
                           ({**ADMIN, "topic": "a", "rowsPerPartition": "0"}, "rowsPerPartition")]:
        with pytest.raises(ConfigError, match=named):
            parse_read_options(options)


def batch(first: int, last: int, t_min: int, t_max: int, keys: list[str]) -> BatchMetadata:
    return BatchMetadata(row_count=last - first + 1, first_entry_id=first, last_entry_id=last,
                         publish_time_ms_min=t_min, publish_time_ms_max=t_max, key_min=min(keys), key_max=max(keys),
                         key_filter=KeyFilter.of(keys).encode(), crc32c=0)


def test_batches_are_pruned_only_when_no_row_can_match():
    b = batch(10, 19, 1000, 2000, ["k1", "k5"])
    assert Bounds().batch_may_match(3, b)
    assert not Bounds(time_us_min=2_001_000).batch_may_match(3, b)
    assert Bounds(time_us_min=2_000_999).batch_may_match(3, b)          # 2000 ms holds up to 2000.999
    assert not Bounds(time_us_max=999_999).batch_may_match(3, b)
    assert not Bounds(position_end=(3, 10)).batch_may_match(3, b)
    assert Bounds(position_end=(3, 11)).batch_may_match(3, b)
    assert not Bounds(position_min=(3, 20)).batch_may_match(3, b)
    record = {"first_entry_id": 10, "last_entry_id": 19, "publish_time_ms_min": 1000, "publish_time_ms_max": 2000}
    assert option_bounds(None, None, 2000, None).file_may_match(3, record)
    assert not option_bounds(None, None, 2001, None).file_may_match(3, record)
    assert not option_bounds(None, None, None, 1000).file_may_match(3, record)     # end exclusive


def test_row_mask_keeps_exactly_the_rows_in_bounds():
    rows = 6
    columns = {
        "topic": ["t"] * rows, "partition": [-1] * rows, "ledger_id": [1, 1, 1, 2, 2, 2],
        "entry_id": [0, 1, 2, 0, 1, 2], "batch_index": [-1] * rows,
        "publish_time": [1_000_000 * i for i in range(rows)], "event_time": [None] * rows,
        "key": ["a", "b", None, "a", "b", "c"], "ordering_key": [None] * rows, "properties": [[]] * rows,
        "producer_name": ["p"] * rows, "sequence_id": list(range(rows)), "payload": [b"x"] * rows,
    }
    data = pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)
    assert Bounds().row_mask(data) is None

    def kept(bounds: Bounds) -> list[int]:
        return data.filter(bounds.row_mask(data)).column("sequence_id").to_pylist()

    assert kept(Bounds(position_min=(1, 2), position_end=(2, 2))) == [2, 3, 4]
    assert kept(Bounds(time_us_min=2_000_000, time_us_max=4_000_000)) == [2, 3, 4]
    assert kept(Bounds(position_min=(2, 0), time_us_max=4_000_000)) == [3, 4]
