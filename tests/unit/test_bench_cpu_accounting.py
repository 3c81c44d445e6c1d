"""CPU accounting of the benchmarks (bench/cpu_accounting.py), with no sockets.

Proves that: /proc/<pid>/stat is parsed right even when the command name holds spaces
and parentheses, and /proc/stat's busy time leaves out idle and iowait; tick counts are
interpolated linearly between samples and clamped outside them; a window's report
gives each process alive in it its share of one core, leaves out processes that lived
entirely outside it, and says how much machine load came from elsewhere; the verdict
names saturated processes and a saturated machine, and the busiest process otherwise;
role groups add up their members; a restarted process keeps one monotonic series.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import cpu_accounting  # noqa: E402
from cpu_accounting import (  # noqa: E402
    MACHINE,
    MACHINE_STEAL,
    CpuSampler,
    cpu_seconds_in,
    group_report,
    parse_machine_steal_ticks,
    parse_machine_ticks,
    parse_process_ticks,
    ticks_at,
    verdict,
    window_report,
)


def stat_line(comm: str, utime: int, stime: int) -> str:
    # Fields 3..13, then utime (14), stime (15), then the rest.
    before = ["S", "1", "1", "1", "0", "-1", "4194560", "100", "0", "0", "0"]
    after = ["5", "6", "20", "0", "4", "0", "12345"]
    return f"4242 ({comm}) " + " ".join(before + [str(utime), str(stime)] + after) + "\n"


@pytest.mark.parametrize("comm", ["python", "a b", "weird) (name", "))"])
def test_process_ticks_are_utime_plus_stime(comm):
    assert parse_process_ticks(stat_line(comm, 123, 45)) == 168


def test_machine_ticks_leave_out_idle_and_iowait():
    text = "cpu  100 10 50 9000 300 5 7 3 0 0\ncpu0 50 5 25 4500 150 2 3 1 0 0\n"
    assert parse_machine_ticks(text) == 100 + 10 + 50 + 5 + 7 + 3


def test_machine_ticks_accept_old_kernels_with_fewer_fields():
    assert parse_machine_ticks("cpu 1 2 3 4\n") == 6


SAMPLES = [(10.0, 0), (11.0, 100), (12.0, 100), (13.0, 400)]


@pytest.mark.parametrize("at, expected", [
    (9.0, 0), (10.0, 0), (10.5, 50), (11.0, 100), (11.5, 100), (12.5, 250), (13.0, 400), (20.0, 400),
])
def test_ticks_are_interpolated_and_clamped(at, expected):
    assert ticks_at(SAMPLES, at) == pytest.approx(expected)


def test_cpu_seconds_in_a_window():
    assert cpu_seconds_in(SAMPLES, 10.5, 12.5, ticks_per_s=100) == pytest.approx(2.0)
    assert cpu_seconds_in([], 0, 1) == 0.0


def test_window_report_shares_of_one_core_and_other_load():
    samples = {
        "broker": [(0.0, 0), (10.0, 900)],          # 9 s of CPU in 10 s: 90 %
        "consumer": [(4.0, 0), (6.0, 100)],         # alive 2 s of the window, 1 s CPU: 10 %
        "gone": [(-5.0, 0), (-1.0, 300)],           # exited before the window
        MACHINE: [(0.0, 0), (10.0, 1500)],          # 15 s busy over 2 cores: 150 %
    }
    report = window_report(samples, 0.0, 10.0, cpus=2, ticks_per_s=100)
    assert set(report["processes"]) == {"broker", "consumer"}
    assert report["processes"]["broker"]["cpu_pct"] == pytest.approx(90.0)
    assert report["processes"]["consumer"]["cpu_pct"] == pytest.approx(10.0)
    assert report["watched_cpu_pct"] == pytest.approx(100.0)
    assert report["machine_busy_pct"] == pytest.approx(150.0)
    assert report["other_load_pct"] == pytest.approx(50.0)
    assert report["verdict"].startswith("saturated: broker 90%")


def test_verdicts():
    assert verdict({"broker": {"cpu_pct": 97.0}, "bookie": {"cpu_pct": 88.0}, "c": {"cpu_pct": 10.0}}, 150.0, 2) == \
        "saturated: broker 97%, bookie 88%"
    assert verdict({"c": {"cpu_pct": 60.0}}, 195.0, 2) == "machine CPU saturated (195% of 200%)"
    assert verdict({"c": {"cpu_pct": 40.0}, "d": {"cpu_pct": 20.0}}, 70.0, 2).startswith(
        "no CPU saturated (busiest: c 40%)")
    assert verdict({}, None, 2) == "no processes watched"


def test_steal_is_parsed_reported_and_named_when_noticeable():
    line = "cpu  100 5 50 1000 7 3 2 40 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
    assert parse_machine_steal_ticks(line) == 40
    assert parse_machine_ticks(line) == 100 + 5 + 50 + 3 + 2 + 40
    assert parse_machine_steal_ticks("cpu  1 2 3 4\n") == 0   # a kernel without the column
    samples = {"broker": [(0.0, 0), (10.0, 300)], MACHINE: [(0.0, 0), (10.0, 1200)],
               MACHINE_STEAL: [(0.0, 0), (10.0, 400)]}       # 4 s of 20 core-seconds stolen
    report = window_report(samples, 0.0, 10.0, cpus=2, ticks_per_s=100)
    assert set(report["processes"]) == {"broker"}
    assert report["steal_pct"] == pytest.approx(40.0)
    assert report["verdict"].endswith("CPU steal 40% of 200% (the host ran other guests)")
    samples[MACHINE_STEAL] = [(0.0, 0), (10.0, 50)]           # 2.5 % of the cores: not named
    assert "steal" not in window_report(samples, 0.0, 10.0, cpus=2, ticks_per_s=100)["verdict"]


def test_group_report_adds_up_roles():
    report = {"processes": {"a": {"cpu_pct": 10.0}, "b": {"cpu_pct": 20.5}, "broker": {"cpu_pct": 50.0}}}
    assert group_report(report, {"clients": ["a", "b", "missing"], "broker": ["broker"], "none": ["x"]}) == \
        {"clients": 30.5, "broker": 50.0}


def test_sampler_keeps_one_series_across_a_restart(monkeypatch):
    ticks = {"/proc/1/stat": 500, "/proc/2/stat": 30}

    def fake_read(path):
        if path == "/proc/stat":
            return "cpu 1 0 0 0\n"
        if path not in ticks:
            raise FileNotFoundError(path)
        return stat_line("broker", ticks[path], 0)

    monkeypatch.setattr(cpu_accounting, "_read", fake_read)
    sampler = CpuSampler()
    sampler.watch("broker", 1)
    del ticks["/proc/1/stat"]           # the old process exits
    sampler.sample()
    sampler.watch("broker", 2)          # and a new one starts, its counter from zero
    values = [value for _, value in sampler.samples["broker"]]
    assert values == [500, 530]
