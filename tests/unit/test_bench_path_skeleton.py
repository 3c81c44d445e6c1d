"""bench/path_skeleton.py on a tiny scale: both skeletons (three processes with an IO
thread, one process) answer every request after writing it, with real child processes
on loopback; the children are gone afterwards and the file they wrote is unlinked."""

from __future__ import annotations

import os

from bench import path_skeleton


def test_a_tiny_run_times_both_shapes_and_leaves_nothing_behind(tmp_path):
    result = path_skeleton.skeleton_baseline(str(tmp_path), requests=20, rest_ms=0.2)
    for shape in ("three_process", "one_process"):
        assert result[shape]["count"] == 20
        assert 0 < result[shape]["p50"] <= result[shape]["p90"] <= result[shape]["p99"]
    assert set(result["cpu_ms_per_request"]) == {"relay", "store", "one_process_store"}
    assert os.listdir(tmp_path) == []
