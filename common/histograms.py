"""Histogram bucket boundaries shared by every server's Prometheus metrics, so that
latencies measured in different processes can be compared bucket for bucket, and a
weighted histogram for hot paths that see many samples of one value at once."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Latency buckets from 0.25 ms to 1 s: a journal fsync on a good disk is well under a
# millisecond, a stalled one hundreds.
LATENCY_BUCKETS_S = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class WeightedHistogram:
    """Counts of samples per bucket (the upper bounds ``buckets``, plus +Inf), where one
    call can record ``weight`` samples of the same value: the journal records a whole
    batch of adds that waited the same time with one bisect, not one call per add (a
    ``prometheus_client.Histogram`` observes one sample per call). Pure: no clock, no IO;
    a metrics collector exposes it at scrape time."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    # counts[i] samples fell in (buckets[i-1], buckets[i]]; the last is (buckets[-1], +Inf).
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0
    max: float = 0.0

    def __post_init__(self) -> None:
        assert list(self.buckets) == sorted(self.buckets), self.buckets
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)
        assert len(self.counts) == len(self.buckets) + 1

    def observe(self, value: float, weight: int = 1) -> None:
        assert weight >= 1, weight
        self.counts[bisect.bisect_left(self.buckets, value)] += weight
        self.count += weight
        self.sum += value * weight
        if value > self.max:
            self.max = value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, samples at or below it) per bucket, ending with "+Inf": the
        shape of a Prometheus histogram's ``_bucket`` series."""
        result = []
        running = 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts):
            running += count
            result.append((bound, running))
        assert running == self.count, (running, self.count)
        return result


# Buckets for the stages of one publish (docs/performance.md): from 50 µs, because
# most stages of a healthy path take well under the 0.25 ms LATENCY_BUCKETS_S start at.
STAGE_BUCKETS_S = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
                   0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class LatencyStages:
    """One process's stage histograms by name (seconds, STAGE_BUCKETS_S), recorded on
    hot paths with one bisect each and exposed by a metrics collector at scrape time.
    Names are fixed at construction: a typo fails at once instead of adding a series."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.histograms = {name: WeightedHistogram(STAGE_BUCKETS_S) for name in names}

    def observe(self, name: str, seconds: float, weight: int = 1) -> None:
        # WeightedHistogram.observe written out: the broker times five stages per entry.
        histogram = self.histograms[name]
        assert weight >= 1, weight
        if seconds < 0.0:
            seconds = 0.0
        histogram.counts[bisect.bisect_left(histogram.buckets, seconds)] += weight
        histogram.count += weight
        histogram.sum += seconds * weight
        if seconds > histogram.max:
            histogram.max = seconds
