"""bench/journal_bench.py on a tiny scale: a revision's journal loads beside the current
one, both run sequential fsynced appends in a temporary directory (left empty), and the
summary says per mode which p50 was lower in how many repeats."""

from __future__ import annotations

import argparse
import os

from bench import journal_bench


async def test_a_tiny_run_compares_the_two_journals(tmp_path):
    args = argparse.Namespace(baseline_rev="HEAD", appends=5, repeat=2, rest_ms=0.5, dir=str(tmp_path))
    result = await journal_bench.run(args)
    assert set(result["summary"]) == {"back_to_back", "rest_0.5ms"}
    for mode, by_build in result["runs"].items():
        assert set(by_build) == {"baseline", "current"}
        for runs in by_build.values():
            assert len(runs) == 2 and all(0 < run["p50_ms"] <= run["p99_ms"] for run in runs)
        assert result["summary"][mode]["current_p50_lower_in"].endswith("of 2")
    assert os.listdir(tmp_path) == []
