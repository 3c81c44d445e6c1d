"""A fixed-precision latency histogram in the manner of HdrHistogram: constant memory,
constant-time recording, percentiles accurate to 1/128 (< 0.8 %) of the value.

Values are whole microseconds. Values below 256 µs get a bucket each. Above, a value
``v`` with ``b = v.bit_length()`` lands in a bucket ``2**(b-8)`` wide: the 128 buckets
of each power of two cover it with equal relative width. Bucket indexes are contiguous:

    v in [0, 256)            index = v
    v in [2**k, 2**(k+1))    shift = k - 7, index = shift * 128 + (v >> shift)   (k >= 8)

A percentile is reported as the highest value its bucket can hold (never below the
truth, as HdrHistogram does), clamped to the exact maximum recorded.

Pure: no clock, no locks; the tools that record from several threads hold their own.
"""

from __future__ import annotations

_SUB_BUCKETS = 128                 # buckets per power of two: the precision, 1/128
_EXACT_LIMIT = 2 * _SUB_BUCKETS    # values below this get their own bucket
_SHIFT_BASE = _SUB_BUCKETS.bit_length()  # 8: bit_length of the first value with shift 1


def bucket_index(value_us: int) -> int:
    if value_us < _EXACT_LIMIT:
        return value_us
    shift = value_us.bit_length() - _SHIFT_BASE
    return shift * _SUB_BUCKETS + (value_us >> shift)


def bucket_highest(index: int) -> int:
    """The highest value that lands in bucket ``index``."""
    if index < _EXACT_LIMIT:
        return index
    shift = index // _SUB_BUCKETS - 1
    mantissa = index % _SUB_BUCKETS + _SUB_BUCKETS
    return ((mantissa + 1) << shift) - 1


class LatencyHistogram:
    def __init__(self) -> None:
        self.counts: list[int] = []
        self.count = 0
        self.total_us = 0
        self.min_us: int | None = None
        self.max_us = 0

    def record(self, value_us: int, times: int = 1) -> None:
        """Records ``value_us`` (``times`` times: messages that completed together)."""
        assert times >= 1, times
        value_us = max(0, int(value_us))  # clocks of two hosts can disagree; never index negatively
        index = bucket_index(value_us)
        if index >= len(self.counts):
            self.counts.extend([0] * (index + 1 - len(self.counts)))
        self.counts[index] += times
        self.count += times
        self.total_us += value_us * times
        if value_us > self.max_us:
            self.max_us = value_us
        if self.min_us is None or value_us < self.min_us:
            self.min_us = value_us

    def merge(self, other: "LatencyHistogram") -> None:
        if len(other.counts) > len(self.counts):
            self.counts.extend([0] * (len(other.counts) - len(self.counts)))
        for index, bucket_count in enumerate(other.counts):
            self.counts[index] += bucket_count
        self.count += other.count
        self.total_us += other.total_us
        self.max_us = max(self.max_us, other.max_us)
        if other.min_us is not None:
            self.min_us = other.min_us if self.min_us is None else min(self.min_us, other.min_us)

    def percentile_us(self, percentile: float) -> int:
        """The smallest bucket bound below which at least ``percentile`` % of the values
        lie (0 when empty)."""
        assert 0.0 <= percentile <= 100.0, percentile
        if self.count == 0:
            return 0
        # The rank of the value asked for, 1-based: ceil(p/100 * n), at least 1.
        rank = max(1, -(-self.count * percentile // 100))
        seen = 0
        for index, bucket_count in enumerate(self.counts):
            seen += bucket_count
            if seen >= rank:
                return min(bucket_highest(index), self.max_us)
        raise AssertionError("counts do not add up to count")

    def summary_ms(self) -> dict:
        """count, mean, min, p50, p95, p99, p99.9, max — in milliseconds, 3 decimals."""
        def ms(value_us: float) -> float:
            return round(value_us / 1000.0, 3)

        return {
            "count": self.count,
            "mean": ms(self.total_us / self.count) if self.count else 0.0,
            "min": ms(self.min_us or 0),
            "p50": ms(self.percentile_us(50)),
            "p95": ms(self.percentile_us(95)),
            "p99": ms(self.percentile_us(99)),
            "p99.9": ms(self.percentile_us(99.9)),
            "max": ms(self.max_us),
        }
