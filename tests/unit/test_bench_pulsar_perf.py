"""The pure parts of the end-to-end benchmark (bench/pulsar_perf.py), with no sockets and
no processes.

Proves that: a run is judged incorrect (exit 1) when a drain missed messages or any run
reported errors or duplicates, and correct only when none did; throughputs are taken to
the one-copy and copies-adjusted disk ceilings of the run's baseline (raw / 2 and
raw / (2 x copies)), and a case with no measurable span gets no ratio instead of a
crash; the producers' publish latency keeps the worst process's percentiles.

How: hand-built summaries in the shape ``magnetar perf`` prints.
"""

from __future__ import annotations

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import pulsar_perf  # noqa: E402


def _latency_run(rate: int, *, errors: int = 0, duplicates: int = 0) -> dict:
    return {"rate_target": rate, "producer": {"errors": 0, "msgs_per_s": rate},
            "consumer": {"errors": errors, "duplicates": duplicates}}


def _block(copies: int = 1) -> dict:
    return {
        "copies": copies,
        "publish": {"messages": 1000, "errors": 0, "MB_per_s": 10.0},
        "drain": {"messages": 1000, "expected_messages": 1000, "complete": True, "errors": 0, "duplicates": 0,
                  "MB_per_s": 20.0},
        "latency": [_latency_run(1000), _latency_run(10000)],
    }


def test_a_clean_run_has_no_problems():
    assert pulsar_perf.problems({"blocks": [_block(1), _block(2)]}) == []


@pytest.mark.parametrize("case, changes, expected", [
    ("drain", {"messages": 990, "complete": False}, "copies 2: drain received 990 of 1000 messages"),
    ("drain", {"duplicates": 3}, "copies 2: drain received 3 duplicates"),
    ("drain", {"errors": 1}, "copies 2: drain had 1 errors"),
    ("publish", {"errors": 4}, "copies 2: publish had 4 errors"),
])
def test_each_fault_is_reported(case, changes, expected):
    block = _block(2)
    block[case].update(changes)
    assert pulsar_perf.problems({"blocks": [_block(1), block]}) == [expected]


def test_latency_runs_are_checked_too():
    block = _block(1)
    block["latency"][1] = _latency_run(10000, errors=2, duplicates=5)
    block["latency"][0]["producer"]["errors"] = 1
    assert pulsar_perf.problems({"blocks": [block]}) == [
        "copies 1: latency @1000/s producer had 1 errors",
        "copies 1: latency @10000/s consumer had 2 errors",
        "copies 1: latency @10000/s consumer received 5 duplicates",
    ]


def test_an_unfinished_block_is_a_problem():
    block = _block(1)
    del block["latency"]
    assert pulsar_perf.problems({"blocks": [block]}) == ["copies 1: the block did not finish"]


def test_ratios_to_the_ceilings():
    block = _block(2)
    pulsar_perf.add_ratios(block, 400.0)
    assert block["ceiling"] == {"one_copy_MB_per_s": 200.0, "one_copy_msgs_per_s": round(200e6 / 1024),
                                "copies_adjusted_MB_per_s": 100.0}
    assert block["publish"]["ratio_to_one_copy_ceiling"] == 0.05
    assert block["publish"]["ratio_to_copies_ceiling"] == 0.1
    assert block["drain"]["ratio_to_one_copy_ceiling"] == 0.1
    assert "ratio_to_copies_ceiling" not in block["drain"]   # a drain reads each entry once


def test_no_span_no_ratio():
    block = _block(1)
    block["drain"]["MB_per_s"] = None
    pulsar_perf.add_ratios(block, 400.0)
    assert block["drain"]["ratio_to_one_copy_ceiling"] is None


def test_publish_aggregate_keeps_the_worst_latency_and_every_process():
    runs = [{"messages": 100, "started_unix_s": 1.0, "ended_unix_s": 2.0, "errors": 0,
             "publish_latency_ms": {"p50": 1.0, "p99": 9.0, "p99.9": 20.0, "max": 30.0}},
            {"messages": 300, "started_unix_s": 1.5, "ended_unix_s": 3.0, "errors": 0,
             "publish_latency_ms": {"p50": 2.0, "p99": 5.0, "p99.9": 25.0, "max": 28.0}}]
    before = copy.deepcopy(runs)
    result = pulsar_perf.aggregate(runs, "started_unix_s", "ended_unix_s", latency_key="publish_latency_ms")
    assert (result["messages"], result["seconds"], result["msgs_per_s"]) == (400, 2.0, 200.0)
    assert result["MB_per_s"] == round(400 * pulsar_perf.MESSAGE_BYTES / 2.0 / 1e6, 3)
    assert result["publish_latency_ms_worst_process"] == {"p50": 2.0, "p99": 9.0, "p99.9": 25.0, "max": 30.0}
    assert result["processes"] == before
