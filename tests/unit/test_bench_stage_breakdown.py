"""The per-stage latency breakdown of bench/latency.py (bench/stage_breakdown.py), with
no sockets.

Proves that: histograms are parsed from Prometheus text (labels added up, non-histograms
ignored); histograms of one name from several servers merge bucket by bucket; the
difference of two scrapes covers only the samples between them; quantiles interpolate
inside a bucket and stop at the last finite bound; a stage no server exports, or one
without samples in the span, is left out of the breakdown.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from stage_breakdown import breakdown, difference, merge, parse_histograms, quantile  # noqa: E402


def scrape(count_low: int, count_high: int, name: str = "magnetar_bookie_journal_fdatasync_latency_seconds") -> str:
    total = count_low + count_high
    return (f"# HELP {name} x\n# TYPE {name} histogram\n"
            f'{name}_bucket{{le="0.001"}} {count_low}\n{name}_bucket{{le="0.002"}} {total}\n'
            f'{name}_bucket{{le="+Inf"}} {total}\n{name}_count {total}\n'
            f"{name}_sum {count_low * 0.0005 + count_high * 0.0015}\n"
            "# HELP other_total y\n# TYPE other_total counter\nother_total 3\n")


def test_parse_keeps_histograms_only() -> None:
    histograms = parse_histograms(scrape(2, 2))
    assert list(histograms) == ["magnetar_bookie_journal_fdatasync_latency_seconds"]
    histogram = histograms["magnetar_bookie_journal_fdatasync_latency_seconds"]
    assert histogram["count"] == 4
    assert histogram["buckets"] == [(0.001, 2), (0.002, 4), (float("inf"), 4)]


def test_merge_adds_servers_and_difference_subtracts_scrapes() -> None:
    first, second = parse_histograms(scrape(1, 0)), parse_histograms(scrape(0, 3))
    merged = merge([first, second])["magnetar_bookie_journal_fdatasync_latency_seconds"]
    assert merged["count"] == 4
    assert merged["buckets"] == [(0.001, 1), (0.002, 4), (float("inf"), 4)]
    later = parse_histograms(scrape(5, 7))["magnetar_bookie_journal_fdatasync_latency_seconds"]
    delta = difference(later, merged)
    assert delta["count"] == 8
    assert delta["buckets"] == [(0.001, 4), (0.002, 8), (float("inf"), 8)]


@pytest.mark.parametrize("q, expected", [(0.25, 0.0005), (0.5, 0.001), (0.75, 0.0015), (1.0, 0.002)])
def test_quantile_interpolates_inside_a_bucket(q: float, expected: float) -> None:
    assert quantile(q, [(0.001, 2), (0.002, 4), (float("inf"), 4)]) == pytest.approx(expected)


def test_quantile_in_the_infinite_bucket_is_the_last_bound_and_empty_is_none() -> None:
    assert quantile(0.99, [(0.001, 1), (float("inf"), 10)]) == 0.001
    assert quantile(0.5, [(0.001, 0), (float("inf"), 0)]) is None


def test_breakdown_reports_only_stages_with_samples() -> None:
    before = parse_histograms(scrape(1, 1))
    after = parse_histograms(scrape(3, 1))
    stages = breakdown(before, after)
    assert list(stages) == ["bookie_journal_fdatasync"]
    assert stages["bookie_journal_fdatasync"]["samples"] == 2
    assert stages["bookie_journal_fdatasync"]["mean_ms"] == pytest.approx(0.5)
    assert breakdown(after, after) == {}


def test_gc_pauses_come_after_the_stages_with_their_count() -> None:
    """A server's GC pause histogram (labelled by generation, added up) is reported after
    the path's stages and the derived ones, with how many collections the span had."""
    def both(low: int, high: int, gc_low: int) -> dict:
        return parse_histograms(scrape(low, high) + scrape(gc_low, 1, "magnetar_broker_gc_pause_seconds"))
    stages = breakdown(both(1, 1, 0), both(3, 1, 4))
    assert list(stages) == ["bookie_journal_fdatasync", "broker_gc_pause"]
    assert stages["broker_gc_pause"]["samples"] == 4
    assert stages["broker_gc_pause"]["mean_ms"] == pytest.approx(0.5)
