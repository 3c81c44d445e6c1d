"""The perf tools' latency histogram (magnetar/tools/latency_histogram.py), pure.

Proves that: bucket indexes are contiguous and monotonic, every value lands in a bucket
whose highest value is not below it and within 1/128 of it; percentiles follow the
rank rule (ceil(p/100 * n), at least 1), are never below the exact value nor more than
the precision above it, and are clamped to the maximum recorded; an empty histogram
reports zeros; negative values (clocks of two hosts) count as 0; merging two histograms
equals recording everything in one; the summary is in milliseconds.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from magnetar.tools.latency_histogram import LatencyHistogram, bucket_highest, bucket_index

PRECISION = 1 / 128


def test_small_values_get_a_bucket_each():
    assert [bucket_index(v) for v in range(256)] == list(range(256))
    assert [bucket_highest(i) for i in range(256)] == list(range(256))


@pytest.mark.parametrize("value", [256, 257, 300, 511, 512, 513, 1000, 4095, 4096, 10**6, 2**40 + 12345])
def test_bucket_holds_its_value_within_precision(value):
    index = bucket_index(value)
    highest = bucket_highest(index)
    assert highest >= value
    assert (highest - value) / value < PRECISION
    assert bucket_index(highest) == index
    assert bucket_index(highest + 1) == index + 1


def test_bucket_indexes_are_contiguous_and_monotonic():
    previous = bucket_index(0)
    for value in range(1, 70_000):
        index = bucket_index(value)
        assert index in (previous, previous + 1), value
        previous = index


def test_percentiles_follow_the_rank_rule_exactly_for_small_values():
    histogram = LatencyHistogram()
    for value in range(1, 101):          # 1..100 µs, exact buckets
        histogram.record(value)
    assert histogram.percentile_us(50) == 50
    assert histogram.percentile_us(99) == 99
    assert histogram.percentile_us(99.9) == 100
    assert histogram.percentile_us(100) == 100
    assert histogram.percentile_us(0) == 1


def test_percentiles_within_precision_of_the_exact_values():
    rng = random.Random(7)
    values = [int(rng.lognormvariate(8, 1.5)) for _ in range(5000)]
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    ordered = sorted(values)
    for percentile in (50, 90, 99, 99.9):
        # The rank in exact arithmetic: ceil(p/100 * n), at least 1.
        exact = ordered[max(1, math.ceil(Fraction(str(percentile)) * len(values) / 100)) - 1]
        reported = histogram.percentile_us(percentile)
        assert exact <= reported <= max(exact, exact + exact * PRECISION), (percentile, exact, reported)
    assert histogram.percentile_us(100) == max(values)


def test_percentile_is_clamped_to_the_maximum():
    histogram = LatencyHistogram()
    histogram.record(1000)               # bucket bound is above 1000
    assert bucket_highest(bucket_index(1000)) > 1000
    assert histogram.percentile_us(50) == 1000


def test_empty_histogram_reports_zeros():
    histogram = LatencyHistogram()
    assert histogram.percentile_us(99) == 0
    summary = histogram.summary_ms()
    assert summary["count"] == 0 and summary["mean"] == 0.0 and summary["max"] == 0.0


def test_negative_values_count_as_zero():
    histogram = LatencyHistogram()
    histogram.record(-50)
    assert (histogram.count, histogram.min_us, histogram.max_us) == (1, 0, 0)


def test_percentile_out_of_range_is_a_programmer_error():
    with pytest.raises(AssertionError):
        LatencyHistogram().percentile_us(101)


def test_merge_equals_recording_all():
    rng = random.Random(3)
    first, second, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for index in range(2000):
        value = rng.randrange(0, 10**6 if index % 2 else 500)
        (first if index % 3 else second).record(value)
        both.record(value)
    first.merge(second)
    assert first.counts == both.counts
    assert (first.count, first.total_us, first.min_us, first.max_us) == \
        (both.count, both.total_us, both.min_us, both.max_us)


def test_recording_a_value_several_times_at_once_equals_recording_it_each_time():
    once, each = LatencyHistogram(), LatencyHistogram()
    once.record(1234, 50)
    once.record(7)
    for _ in range(50):
        each.record(1234)
    each.record(7)
    assert once.counts == each.counts
    assert (once.count, once.total_us, once.min_us, once.max_us) == (51, 1234 * 50 + 7, 7, 1234)
    assert once.summary_ms() == each.summary_ms()


def test_merge_into_empty_and_of_empty():
    filled = LatencyHistogram()
    filled.record(5)
    empty = LatencyHistogram()
    empty.merge(filled)
    assert (empty.count, empty.min_us, empty.max_us) == (1, 5, 5)
    filled.merge(LatencyHistogram())
    assert (filled.count, filled.min_us) == (1, 5)


def test_summary_is_in_milliseconds():
    histogram = LatencyHistogram()
    for value in (1000, 2000, 3000):
        histogram.record(value)
    summary = histogram.summary_ms()
    assert summary["count"] == 3
    assert summary["mean"] == 2.0
    assert summary["min"] == 1.0
    assert summary["max"] == 3.0
    assert 2.0 <= summary["p50"] <= 2.0 * (1 + PRECISION)
    assert set(summary) == {"count", "mean", "min", "p50", "p95", "p99", "p99.9", "max"}
