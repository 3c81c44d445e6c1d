"""bench/thread_hop_bench.py on a tiny scale: every hand-off mode (executor, plain
thread, inline) does its writes, with and without a rest, in a temporary directory that
is left empty; the summary has one line per mode and rest."""

from __future__ import annotations

import argparse
import os
import threading

from bench import thread_hop_bench


async def test_a_tiny_run_times_every_mode_and_leaves_nothing_behind(tmp_path):
    threads_before = threading.active_count()
    args = argparse.Namespace(count=5, repeat=2, rest_ms=0.2, fsync=True, dir=str(tmp_path))
    result = await thread_hop_bench.run(args)
    assert len(result["rows"]) == 2 * 2 * len(thread_hop_bench.MODES)
    assert all(0 < row["p50_us"] <= row["p99_us"] for row in result["rows"])
    assert set(result["summary"]) == {f"{mode} rest {rest} ms" for mode in ("executor", "thread", "inline")
                                      for rest in ("0", "0.2")}
    assert os.listdir(tmp_path) == []
    assert threading.active_count() == threads_before    # the workers were joined
