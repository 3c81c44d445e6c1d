"""What the benchmarks share: a cluster on this machine for the length of one run, the
disk baseline they are compared with, and reading the client processes they start.

Theory of operation:
- ``bench_cluster`` makes a fresh directory, starts etcd in it and yields a
  ``tests.cluster.Cluster`` (the benchmark starts the bookies and brokers it needs).
  Whatever happens, every process it started is stopped when the block ends, and the
  directory is removed unless the run asked to keep it (``--keep-data``), so a failed
  run leaves neither processes nor gigabytes behind.
- The disk baseline is raw sequential write + fdatasync bandwidth on the disk the
  bookies write to, measured in the same run, because on a shared machine absolute
  numbers drift and ratios to a baseline of the same run much less. One long probe
  proved unstable (1285 MB/s before a case, 332 after, in one run): the baseline is the
  median of several short probes, and the spread between them is recorded, with a flag
  when it is too wide for the ratios to mean much.
- Client processes print their summary as the last JSON line of stdout (anything
  before it is noise: progress, the client's own log), and consumers announce on stderr
  that they subscribed (``magnetar.tools.perf_stats.READY_EVENT``) before a runner
  starts producing or lets them go.
- Several client processes count as one: their messages over the span from the
  earliest start to the latest end each reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import AsyncIterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from magnetar.tools.perf_stats import is_ready_line  # noqa: E402
from tests.cluster import Cluster, EtcdProcess  # noqa: E402

MIB = 1024 * 1024
# A full journal group: the bookie's journal writes groups of about this size.
PROBE_BLOCK_BYTES = 4 * MIB
# The probe file is truncated past this, so a fast disk does not fill up.
PROBE_FILE_BYTES_MAX = 2 * 1024 * MIB
# Probes per measurement: the median of five survives two outliers (a neighbour's
# burst, the writeback of the files of the case just run).
DISK_PROBES = 5
# Probes further apart than this (max / min) make the baseline, and every ratio to it,
# doubtful: the results say so rather than hide it.
DISK_SPREAD_UNSTABLE = 1.5


# --- the cluster ------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def bench_cluster(prefix: str, *, directory: str | None, keep_data: bool) -> AsyncIterator[Cluster]:
    """etcd in a fresh directory under ``directory`` (default: the temp dir), as a
    Cluster to start bookies and brokers in; all stopped, and the directory removed
    unless ``keep_data``, when the block ends whatever happened."""
    base_dir = tempfile.mkdtemp(prefix=prefix, dir=directory)
    etcd = EtcdProcess(base_dir)
    try:
        etcd.start()
        cluster = Cluster(etcd, base_dir)
        try:
            yield cluster
        finally:
            await cluster.stop()
    finally:
        etcd.kill9()
        if keep_data:
            print(f"data and logs kept in {base_dir}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(base_dir, ignore_errors=True)


# --- the disk baseline ---------------------------------------------------------------------------

def raw_disk_bandwidth(directory: str, seconds: float, block_bytes: int = PROBE_BLOCK_BYTES) -> float:
    """MB/s of sequential write + fdatasync in blocks the size of a full journal group."""
    path = os.path.join(directory, "raw-disk-probe")
    block = os.urandom(block_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    file_bytes = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            os.write(fd, block)
            os.fdatasync(fd)
            written += block_bytes
            file_bytes += block_bytes
            if file_bytes >= PROBE_FILE_BYTES_MAX:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                file_bytes = 0
    finally:
        os.close(fd)
        os.unlink(path)
    return written / (time.perf_counter() - started) / 1e6


def disk_probes(directory: str, seconds: float, probes: int = DISK_PROBES) -> list[float]:
    """``probes`` short measurements (MB/s) sharing ``seconds``. Blocking: run it in a thread."""
    assert probes >= 1, probes
    return [raw_disk_bandwidth(directory, seconds / probes) for _ in range(probes)]


async def measure_disk(directory: str, seconds: float) -> list[float]:
    return await asyncio.to_thread(disk_probes, directory, seconds)


def disk_baseline(before: list[float], after: list[float]) -> dict:
    """The baseline of a stretch of a run from the probes taken before and after it:
    the median of them all (what ratios are taken to), and how far apart they were."""
    probes = [*before, *after]
    assert probes, "no disk probes"
    low, high = min(probes), max(probes)
    return {
        "median": round(statistics.median(probes), 1),
        "before": round(statistics.median(before), 1) if before else None,
        "after": round(statistics.median(after), 1) if after else None,
        "min": round(low, 1), "max": round(high, 1), "probes_count": len(probes),
        "baseline_unstable": low <= 0 or high / low > DISK_SPREAD_UNSTABLE,
    }


def disk_ceiling_MB_per_s(raw_MB_per_s: float, copies: int) -> float:
    """What the disk allows for stored entries: every byte is written twice per bookie
    (journal, then entry log), and once more per extra copy when the bookies share the
    disk, so raw / (2 x copies)."""
    assert copies >= 1, copies
    return raw_MB_per_s / (2 * copies)


def unstable_note(baseline: dict) -> str:
    return (f" UNSTABLE (probes {baseline['min']}-{baseline['max']} MB/s: ratios doubtful)"
            if baseline["baseline_unstable"] else "")


# --- client processes ----------------------------------------------------------------------------

def last_json_line(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object (a tool's summary), else None."""
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


async def wait_ready(stderr: asyncio.StreamReader, name: str, timeout_s: float) -> bytes:
    """Reads a consumer's stderr up to the line saying it subscribed; returns what came
    before. Raises if the process closes stderr (exits) first or takes too long."""
    lines = []
    async with asyncio.timeout(timeout_s):
        while True:
            line = await stderr.readline()
            if not line:
                raise RuntimeError(f"{name} exited before subscribing: "
                                   f"{b''.join(lines).decode(errors='replace')[-2000:]}")
            if is_ready_line(line):
                return b"".join(lines)
            lines.append(line)


def aggregate_runs(runs: list[dict], start_key: str, end_key: str, message_bytes: int) -> dict:
    """Several client processes as one: their messages over the wall-clock span from the
    earliest start to the latest end (each process reports its own bounds). No span (no
    message, or one instant) means no rate rather than an infinite one."""
    starts = [run[start_key] for run in runs if run.get(start_key)]
    ends = [run[end_key] for run in runs if run.get(end_key)]
    messages = sum(run["messages"] for run in runs)
    if starts and ends and max(ends) > min(starts):
        start_s, end_s = min(starts), max(ends)
        span_s = end_s - start_s
    else:
        start_s = end_s = span_s = None
    return {
        "processes_count": len(runs), "messages": messages,
        "messages_per_process": [run["messages"] for run in runs],
        "window_start_unix_s": start_s, "window_end_unix_s": end_s,
        "seconds": round(span_s, 3) if span_s else None,
        "msgs_per_s": round(messages / span_s, 1) if span_s else None,
        "MB_per_s": round(messages * message_bytes / span_s / 1e6, 3) if span_s else None,
        "errors": sum(run["errors"] for run in runs),
    }
