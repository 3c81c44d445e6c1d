"""Stage histograms (common/histograms.LatencyStages) and their export on the broker's
/metrics (broker/metrics.StagesCollector), with no sockets.

Proves that: a stage records seconds (negative clock differences as 0) with a weight;
an unknown stage name fails at once rather than adding a series; every broker stage
has a help text; the collector exports each stage as a Prometheus histogram
``magnetar_broker_<stage>_seconds`` whose buckets and sum are the recorded ones.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from broker.metrics import BROKER_STAGES, StagesCollector
from common.histograms import STAGE_BUCKETS_S, LatencyStages, WeightedHistogram


def test_stages_record_weighted_seconds_and_refuse_unknown_names() -> None:
    stages = LatencyStages(("send_decode", "dispatch"))
    stages.observe("send_decode", 0.0004, weight=3)
    stages.observe("send_decode", -0.001)
    histogram = stages.histograms["send_decode"]
    assert histogram.count == 4
    assert histogram.buckets == STAGE_BUCKETS_S
    assert histogram.counts[0] == 1          # the negative difference, as 0
    assert histogram.sum == pytest.approx(0.0012)
    with pytest.raises(KeyError):
        stages.observe("no_such_stage", 0.1)


def test_a_stage_records_what_a_weighted_histogram_records() -> None:
    """LatencyStages.observe (written out for the hot path) counts exactly as
    WeightedHistogram.observe of the value clamped at 0: buckets, count, sum and max,
    bucket bounds and negative clock differences included."""
    stages = LatencyStages(("a",))
    reference = WeightedHistogram(STAGE_BUCKETS_S)
    values = [-0.001, 0.0, 0.00005, 0.000051, 0.0003, 0.0025, 1.0, 3.5, 0.0001]
    for index, value in enumerate(values):
        weight = 1 + index % 3
        stages.observe("a", value, weight)
        reference.observe(max(0.0, value), weight)
    recorded = stages.histograms["a"]
    assert (recorded.counts, recorded.count, recorded.sum, recorded.max) == \
        (reference.counts, reference.count, reference.sum, reference.max)
    with pytest.raises(KeyError):
        stages.observe("b", 0.1)


def test_broker_stages_are_exported_as_histograms() -> None:
    stages = LatencyStages(BROKER_STAGES)
    stages.observe("ledger_add", 0.0015, weight=2)
    registry = CollectorRegistry()
    registry.register(StagesCollector(stages, "magnetar_broker", {}))
    text = generate_latest(registry).decode()
    for name in BROKER_STAGES:
        assert f"# TYPE magnetar_broker_{name}_seconds histogram" in text
    assert 'magnetar_broker_ledger_add_seconds_bucket{le="0.0015"} 2.0' in text
    assert 'magnetar_broker_ledger_add_seconds_bucket{le="0.001"} 0.0' in text
    assert "magnetar_broker_ledger_add_seconds_sum 0.003" in text
