"""What the benchmarks share (bench/harness.py), with no sockets and no processes.

Proves that: the cluster context stops what it started and removes its directory unless
asked to keep it, also when the benchmark fails, and stops etcd even when etcd never
became ready; summaries are found as the last JSON object line of noisy output; a
consumer's "subscribed" line is found on its stderr, with what came before it, and a
consumer that exits or stalls first is an error; several processes add up over their
joint span, and no span means no rate; the disk baseline is the median of every probe
and is flagged unstable when the probes spread by more than 1.5x; the ceiling is
raw / (2 x copies); the probes write and fdatasync for real and clean up.

How: fakes stand in for etcd and the cluster (the context manager's own logic is what is
tested); stderr is an asyncio.StreamReader fed by hand; the probes run on tmp_path.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import harness  # noqa: E402
from magnetar.tools.perf_stats import READY_EVENT  # noqa: E402


class _FakeEtcd:
    def __init__(self, base_dir: str, *, fail_start: bool = False) -> None:
        self.base_dir = base_dir
        self.fail_start = fail_start
        self.started = False
        self.killed = False

    def start(self) -> None:
        self.started = True
        if self.fail_start:
            raise RuntimeError("etcd exited with code 1")

    def kill9(self) -> None:
        self.killed = True


class _FakeCluster:
    def __init__(self, etcd: _FakeEtcd, base_dir: str) -> None:
        self.etcd = etcd
        self.base_dir = base_dir
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def fakes(monkeypatch):
    made: dict = {}

    def etcd(base_dir: str) -> _FakeEtcd:
        made["etcd"] = _FakeEtcd(base_dir, fail_start=made.get("fail_start", False))
        return made["etcd"]

    def cluster(etcd_process: _FakeEtcd, base_dir: str) -> _FakeCluster:
        made["cluster"] = _FakeCluster(etcd_process, base_dir)
        return made["cluster"]

    monkeypatch.setattr(harness, "EtcdProcess", etcd)
    monkeypatch.setattr(harness, "Cluster", cluster)
    return made


async def test_cluster_is_stopped_and_its_directory_removed(fakes, tmp_path):
    async with harness.bench_cluster("bench-", directory=str(tmp_path), keep_data=False) as cluster:
        base_dir = cluster.base_dir
        assert os.path.dirname(base_dir) == str(tmp_path)
        assert os.path.basename(base_dir).startswith("bench-")
        assert fakes["etcd"].started and not cluster.stopped
        with open(os.path.join(base_dir, "data"), "w") as handle:
            handle.write("x")
    assert cluster.stopped and fakes["etcd"].killed
    assert not os.path.exists(base_dir)


async def test_a_failing_benchmark_still_tears_down(fakes, tmp_path):
    with pytest.raises(ValueError):
        async with harness.bench_cluster("bench-", directory=str(tmp_path), keep_data=False) as cluster:
            base_dir = cluster.base_dir
            raise ValueError("a case failed")
    assert cluster.stopped and fakes["etcd"].killed
    assert not os.path.exists(base_dir)


async def test_keep_data_keeps_the_directory(fakes, tmp_path):
    async with harness.bench_cluster("bench-", directory=str(tmp_path), keep_data=True) as cluster:
        base_dir = cluster.base_dir
    assert cluster.stopped and fakes["etcd"].killed
    assert os.path.isdir(base_dir)


async def test_etcd_that_never_starts_is_killed_and_cleaned_up(fakes, tmp_path):
    fakes["fail_start"] = True
    with pytest.raises(RuntimeError, match="etcd exited"):
        async with harness.bench_cluster("bench-", directory=str(tmp_path), keep_data=False):
            raise AssertionError("the body must not run")
    assert fakes["etcd"].killed
    assert "cluster" not in fakes
    assert os.listdir(tmp_path) == []


def test_last_json_line_skips_noise():
    text = 'starting\n{"progress": 1}\n2024-01-01 WARN client\n{"messages": 5}\n\n'
    assert harness.last_json_line(text) == {"messages": 5}
    assert harness.last_json_line("no json here\n[1, 2]\n") is None
    assert harness.last_json_line("") is None


def _reader(*chunks: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    if eof:
        reader.feed_eof()
    return reader


async def test_wait_ready_returns_what_came_before():
    reader = _reader(b"loading client\n", b'{"event": "other"}\n',
                     f'{{"event": "{READY_EVENT}", "topic": "t"}}\n'.encode(), b"after\n", eof=False)
    assert await harness.wait_ready(reader, "consumer-0", timeout_s=5) == b'loading client\n{"event": "other"}\n'
    assert await reader.readline() == b"after\n"   # the rest is left for the caller


async def test_wait_ready_fails_when_the_process_exits_first():
    reader = _reader(b"Traceback: boom\n")
    with pytest.raises(RuntimeError, match="consumer-1 exited before subscribing: Traceback: boom"):
        await harness.wait_ready(reader, "consumer-1", timeout_s=5)


async def test_wait_ready_is_bounded():
    reader = _reader(b"still importing\n", eof=False)
    with pytest.raises(TimeoutError):
        await harness.wait_ready(reader, "consumer-2", timeout_s=0.05)


def test_runs_add_up_over_their_joint_span():
    runs = [{"messages": 100, "started_unix_s": 10.0, "ended_unix_s": 11.0, "errors": 0},
            {"messages": 300, "started_unix_s": 10.5, "ended_unix_s": 12.0, "errors": 2}]
    result = harness.aggregate_runs(runs, "started_unix_s", "ended_unix_s", message_bytes=1000)
    assert result == {"processes_count": 2, "messages": 400, "messages_per_process": [100, 300],
                      "window_start_unix_s": 10.0, "window_end_unix_s": 12.0, "seconds": 2.0,
                      "msgs_per_s": 200.0, "MB_per_s": 0.2, "errors": 2}


@pytest.mark.parametrize("first, last", [(None, None), (10.0, 10.0)])
def test_no_span_means_no_rate(first, last):
    """No message, or a single instant: no rate rather than NaN or a rate over 1e-9 s."""
    result = harness.aggregate_runs([{"messages": 1 if first else 0, "first": first, "last": last, "errors": 0}],
                                    "first", "last", message_bytes=1024)
    assert (result["seconds"], result["msgs_per_s"], result["MB_per_s"]) == (None, None, None)
    assert result["window_start_unix_s"] is None and result["window_end_unix_s"] is None


def test_runs_must_report_errors():
    with pytest.raises(KeyError):
        harness.aggregate_runs([{"messages": 1, "first": 1.0, "last": 2.0}], "first", "last", message_bytes=1)


def test_disk_baseline_is_the_median_of_all_probes():
    baseline = harness.disk_baseline([300.0, 320.0, 310.0], [290.0, 305.0])
    assert baseline == {"median": 305.0, "before": 310.0, "after": 297.5, "min": 290.0, "max": 320.0,
                        "probes_count": 5, "baseline_unstable": False}


def test_one_outlier_moves_the_median_little_and_flags_the_baseline():
    """The run that motivated the median: 1285 before, 332 after. One wild probe among
    several barely moves the median, and the spread is flagged."""
    baseline = harness.disk_baseline([1285.0, 340.0, 335.0], [332.0, 338.0, 336.0])
    assert baseline["median"] == 337.0
    assert (baseline["min"], baseline["max"]) == (332.0, 1285.0)
    assert baseline["baseline_unstable"] is True


@pytest.mark.parametrize("low, high, unstable", [(100.0, 150.0, False), (100.0, 150.1, True)])
def test_unstable_past_one_and_a_half(low, high, unstable):
    assert harness.disk_baseline([low], [high])["baseline_unstable"] is unstable


def test_disk_baseline_needs_probes():
    with pytest.raises(AssertionError):
        harness.disk_baseline([], [])


@pytest.mark.parametrize("copies, ceiling", [(1, 150.0), (2, 75.0), (3, 50.0)])
def test_ceiling_is_raw_over_twice_the_copies(copies, ceiling):
    assert harness.disk_ceiling_MB_per_s(300.0, copies) == ceiling


def test_probes_write_for_real_and_clean_up(tmp_path):
    probes = harness.disk_probes(str(tmp_path), 0.15, probes=3)
    assert len(probes) == 3
    assert all(probe > 0 for probe in probes)
    assert os.listdir(tmp_path) == []
