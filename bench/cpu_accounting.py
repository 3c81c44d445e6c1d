"""CPU time per process over a benchmark's measured window, to say who is the bottleneck.

Theory of operation: a sampler task reads, every ``interval_s``, utime + stime of each
process it watches (``/proc/<pid>/stat``, all threads included) and the machine's busy
time (``/proc/stat``: every CPU, everything but idle and iowait), each with the wall
clock (``time.time``, the clock the clients stamp their first and last message with).
A case's window is known only afterwards (from the clients' summaries), so the CPU
spent in ``[start, end]`` is interpolated linearly between the samples around each
bound. A process that started after ``start`` counts from its first sample; one that
exited before ``end`` counts up to its last sample (at most ``interval_s`` of its CPU
is missed, after its last message in practice).

Reported per process as ``cpu_pct``: CPU seconds over window seconds, in percent of one
core (a single-threaded event loop saturates at 100; the official client and the bookie
have threads and can go above). The machine's busy time is reported the same way (at
most 100 x cpus); what it has beyond the watched processes is other load, which on a
shared machine says how much the run was disturbed.

Parsing, interpolation and the bottleneck verdict are pure; ``CpuSampler`` is the shell.
"""

from __future__ import annotations

import asyncio
import os
import time

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# A process at or above this share of one core is called saturated: a Python event loop
# holding the GIL cannot go higher, and scheduling noise keeps it a little below 100.
SATURATED_PCT = 85.0
# The machine is saturated when its busy time reaches this share of all its cores.
MACHINE_SATURATED_SHARE = 0.9
# Sampling every 100 ms reads a dozen small files ten times a second: negligible, and
# fine enough for windows of a few seconds (the ticks themselves are 10 ms).
SAMPLE_INTERVAL_S = 0.1

MACHINE = "machine"
# The ticks the hypervisor gave this machine's CPUs to other guests (/proc/stat steal):
# time the run wanted a CPU and had none. Named in the verdict from this share of all
# cores on; a shared virtual machine often loses 10-30% while a benchmark runs.
MACHINE_STEAL = "machine-steal"
STEAL_NOTED_PCT = 5.0


# --- parsing (pure) ----------------------------------------------------------------------------

def parse_process_ticks(stat_text: str) -> int:
    """utime + stime (clock ticks) from the text of /proc/<pid>/stat. The command name
    (field 2) is in parentheses and may hold spaces and parentheses, so fields are
    counted after the last ')'."""
    rest = stat_text[stat_text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(rest[11]) + int(rest[12])


def parse_machine_steal_ticks(proc_stat_text: str) -> int:
    """Steal clock ticks of all CPUs from /proc/stat's first line (its 8th value; 0 on
    a kernel that does not count it)."""
    first = proc_stat_text.splitlines()[0].split()
    assert first[0] == "cpu", first[0]
    return int(first[8]) if len(first) > 8 else 0


def parse_machine_ticks(proc_stat_text: str) -> int:
    """Busy clock ticks of all CPUs from /proc/stat's first line: user, nice, system,
    irq, softirq, steal (idle and iowait are not busy; guest time is already in user)."""
    first = proc_stat_text.splitlines()[0].split()
    assert first[0] == "cpu", first[0]
    values = [int(value) for value in first[1:]]
    values += [0] * (8 - len(values))
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return user + nice + system + irq + softirq + steal


# --- windows (pure) ----------------------------------------------------------------------------

def ticks_at(samples: list[tuple[float, int]], at_s: float) -> float:
    """The tick count at ``at_s``, interpolated between samples (clamped to the first
    and last sample outside them)."""
    assert samples, "no samples"
    if at_s <= samples[0][0]:
        return float(samples[0][1])
    if at_s >= samples[-1][0]:
        return float(samples[-1][1])
    low, high = 0, len(samples) - 1
    while high - low > 1:
        middle = (low + high) // 2
        if samples[middle][0] <= at_s:
            low = middle
        else:
            high = middle
    (t0, v0), (t1, v1) = samples[low], samples[high]
    if t1 == t0:
        return float(v1)
    return v0 + (v1 - v0) * (at_s - t0) / (t1 - t0)


def cpu_seconds_in(samples: list[tuple[float, int]], start_s: float, end_s: float,
                   ticks_per_s: int = CLOCK_TICKS_PER_S) -> float:
    assert end_s >= start_s, (start_s, end_s)
    if not samples:
        return 0.0
    return max(0.0, ticks_at(samples, end_s) - ticks_at(samples, start_s)) / ticks_per_s


def window_report(samples: dict[str, list[tuple[float, int]]], start_s: float, end_s: float,
                  cpus: int, ticks_per_s: int = CLOCK_TICKS_PER_S) -> dict:
    """CPU per watched process (and the machine) over the window, and a verdict."""
    seconds = max(end_s - start_s, 1e-9)
    processes = {}
    for name, series in samples.items():
        if name in (MACHINE, MACHINE_STEAL):
            continue
        # Only processes alive during part of the window.
        if not series or series[-1][0] < start_s or series[0][0] > end_s:
            continue
        cpu_s = cpu_seconds_in(series, start_s, end_s, ticks_per_s)
        processes[name] = {"cpu_s": round(cpu_s, 3), "cpu_pct": round(100.0 * cpu_s / seconds, 1)}
    report: dict = {"window_s": round(seconds, 3), "cpus": cpus, "processes": processes}
    watched_pct = sum(p["cpu_pct"] for p in processes.values())
    report["watched_cpu_pct"] = round(watched_pct, 1)
    machine = samples.get(MACHINE)
    if machine:
        machine_pct = 100.0 * cpu_seconds_in(machine, start_s, end_s, ticks_per_s) / seconds
        report["machine_busy_pct"] = round(machine_pct, 1)
        report["other_load_pct"] = round(max(0.0, machine_pct - watched_pct), 1)
    steal = samples.get(MACHINE_STEAL)
    if steal:
        report["steal_pct"] = round(100.0 * cpu_seconds_in(steal, start_s, end_s, ticks_per_s) / seconds, 1)
    report["verdict"] = verdict(processes, report.get("machine_busy_pct"), cpus, report.get("steal_pct"))
    return report


def verdict(processes: dict[str, dict], machine_busy_pct: float | None, cpus: int,
            steal_pct: float | None = None) -> str:
    """One line saying what limited the window: saturated processes (>= SATURATED_PCT of
    a core), a saturated machine, or neither; and CPU steal when it was noticeable (its
    share of all cores, from STEAL_NOTED_PCT on)."""
    saturated = sorted(((p["cpu_pct"], name) for name, p in processes.items() if p["cpu_pct"] >= SATURATED_PCT),
                       reverse=True)
    parts = []
    if saturated:
        parts.append("saturated: " + ", ".join(f"{name} {pct:.0f}%" for pct, name in saturated))
    if machine_busy_pct is not None and machine_busy_pct >= MACHINE_SATURATED_SHARE * 100 * cpus:
        parts.append(f"machine CPU saturated ({machine_busy_pct:.0f}% of {100 * cpus}%)")
    if not parts:
        if processes:
            top_pct, top = max((p["cpu_pct"], name) for name, p in processes.items())
            parts.append(f"no CPU saturated (busiest: {top} {top_pct:.0f}%): latency- or IO-bound")
        else:
            parts.append("no processes watched")
    if steal_pct is not None and steal_pct >= STEAL_NOTED_PCT * cpus:
        parts.append(f"CPU steal {steal_pct:.0f}% of {100 * cpus}% (the host ran other guests)")
    return "; ".join(parts)


def group_report(report: dict, groups: dict[str, list[str]]) -> dict:
    """Per-process shares added up by role (e.g. all consumer processes as one)."""
    totals = {}
    for group, names in groups.items():
        members = [report["processes"][name] for name in names if name in report["processes"]]
        if members:
            totals[group] = round(sum(m["cpu_pct"] for m in members), 1)
    return totals


# --- the sampler (shell) ---------------------------------------------------------------------

def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


class CpuSampler:
    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, int]]] = {}
        self._pids: dict[str, int] = {}          # name -> pid, while alive
        self._series_pid: dict[str, int] = {}    # name -> pid of the newest process
        self._offsets: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    def watch(self, name: str, pid: int) -> None:
        """Starts sampling ``pid`` under ``name``. A restarted process keeps its name:
        its tick counter starts again from zero, so its ticks are offset by what the
        series had reached, keeping one monotonic series per name."""
        if self._series_pid.get(name, pid) != pid and self.samples.get(name):
            self._offsets[name] = self.samples[name][-1][1]
        self._series_pid[name] = pid
        self._pids[name] = pid
        self._sample_one(name, time.time())

    def _sample_one(self, name: str, now_s: float) -> None:
        pid = self._pids.get(name)
        if pid is None:
            return
        try:
            ticks = parse_process_ticks(_read(f"/proc/{pid}/stat"))
        except (OSError, ValueError, IndexError):
            del self._pids[name]     # exited (and reaped)
            return
        self.samples.setdefault(name, []).append((now_s, ticks + self._offsets.get(name, 0)))

    def sample(self) -> None:
        now_s = time.time()
        for name in list(self._pids):
            self._sample_one(name, now_s)
        try:
            proc_stat = _read("/proc/stat")
            self.samples.setdefault(MACHINE, []).append((now_s, parse_machine_ticks(proc_stat)))
            self.samples.setdefault(MACHINE_STEAL, []).append((now_s, parse_machine_steal_ticks(proc_stat)))
        except OSError:
            pass

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def report(self, start_s: float, end_s: float) -> dict:
        self.sample()
        return window_report(self.samples, start_s, end_s, os.cpu_count() or 1)
