"""Per-test wall and CPU time, for finding where `make test` spends its time.

Loaded with ``-p tests.timings`` and a path in ``MAGNETAR_TEST_TIMES`` (a directory):
each pytest process (each xdist worker) writes ``<dir>/<worker>.json`` with one row per
test: its module, wall seconds (set-up + call + teardown, so a module fixture's start
and stop count to the test that paid for them), the CPU-s of the pytest process itself
and of the processes it started and reaped meanwhile (bookies, brokers, CLI runs, Spark's
JVM: they count once waited for, normally in the same test's or module's teardown; a
process reaped later, as pyspark's JVM is, counts to whichever test reaps it), and the
test's start offset on its worker, and the processes the test process started, by kind
(``magnetar broker`` is "broker"; a standalone's own children are not seen). `python -m
tests.timings DIR` prints per-module sums, longest
first, and each worker's timeline."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

import pytest

_rows: list[dict] = []
_started = time.monotonic()
_spawned: collections.Counter = collections.Counter()     # this test's processes, by kind


def _kind(argv) -> str:
    """``magnetar broker`` -> "broker"; ``python -m tests.x`` -> "tests.x"; else the program."""
    args = [str(a) for a in (argv if isinstance(argv, (list, tuple)) else [argv])]
    for flag in ("-m",):
        if flag in args and args.index(flag) + 1 < len(args):
            module = args[args.index(flag) + 1]
            if module == "magnetar":
                from magnetar.cli import COMMANDS

                return next((a for a in args[args.index(flag) + 2:] if a in COMMANDS), "magnetar")
            return module
    return os.path.basename(args[0]) if args else "?"


_popen_init = subprocess.Popen.__init__


def _counting_init(self, args, *rest, **kwargs):
    _spawned[_kind(args)] += 1
    return _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _counting_init


def _cpu() -> tuple[float, float]:
    times = os.times()
    return times.user + times.system, times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.monotonic()
    own, children = _cpu()
    _spawned.clear()
    yield
    own_after, children_after = _cpu()
    path = str(item.fspath).replace(os.sep, "/")
    _rows.append({
        "module": "/".join(path.rsplit("/", 2)[-2:]), "test": item.nodeid,
        "start": round(start - _started, 3), "wall": round(time.monotonic() - start, 3),
        "cpu": round(own_after - own, 3), "children_cpu": round(children_after - children, 3),
        "spawned": dict(_spawned),
    })


def pytest_sessionfinish(session):
    directory = os.environ.get("MAGNETAR_TEST_TIMES")
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    own, children = _cpu()
    with open(os.path.join(directory, f"{worker}.json"), "w") as handle:
        json.dump({"worker": worker, "session_wall": round(time.monotonic() - _started, 3),
                   "session_cpu": round(own, 3), "session_children_cpu": round(children, 3),
                   "tests": _rows}, handle, indent=0)


def _report(directory: str, top: int) -> None:
    modules: dict[str, dict] = {}
    workers = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name)) as handle:
            data = json.load(handle)
        workers.append(data)
        for row in data["tests"]:
            entry = modules.setdefault(row["module"], {"wall": 0.0, "cpu": 0.0, "tests": 0, "worker": data["worker"],
                                                      "start": row["start"]})
            entry["wall"] += row["wall"]
            entry["cpu"] += row["cpu"] + row["children_cpu"]
            entry["tests"] += 1
            entry["start"] = min(entry["start"], row["start"])
            for kind, count in row.get("spawned", {}).items():
                entry.setdefault("spawned", collections.Counter())[kind] += count
    total_wall = sum(m["wall"] for m in modules.values())
    total_cpu = sum(m["cpu"] for m in modules.values())
    print(f"{'module':55} {'tests':>5} {'wall s':>8} {'CPU s':>8} {'worker':>6} {'start':>7}")
    for name, entry in sorted(modules.items(), key=lambda kv: -kv[1]["wall"])[:top]:
        spawned = ", ".join(f"{kind} {count}" for kind, count in collections.Counter(entry.get("spawned", {})).most_common(5))
        print(f"{name:55} {entry['tests']:5d} {entry['wall']:8.1f} {entry['cpu']:8.1f} {entry['worker']:>6} "
              f"{entry['start']:7.1f}  {spawned}")
    print(f"{'all ' + str(len(modules)) + ' modules':55} {sum(m['tests'] for m in modules.values()):5d} "
          f"{total_wall:8.1f} {total_cpu:8.1f}")
    spawned = collections.Counter()
    for entry in modules.values():
        spawned.update(entry.get("spawned", {}))
    print("processes started:", ", ".join(f"{kind} {count}" for kind, count in spawned.most_common(12)))
    for data in workers:
        print(f"{data['worker']}: session {data['session_wall']:.1f} s wall, {data['session_cpu']:.1f} CPU-s own, "
              f"{data['session_children_cpu']:.1f} CPU-s of its children")


if __name__ == "__main__":
    _report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
