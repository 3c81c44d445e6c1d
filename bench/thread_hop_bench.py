"""What a hand-off to another thread and back costs an asyncio loop on this machine, back
to back and after a rest (docs/performance.md, "Not done"): the bookie's journal hands
every group to its IO thread and waits for the loop to hear back, and a durable ack made
one at a time arrives about once a millisecond, after the CPUs went idle.

Three ways to do the same 1 KiB ``write`` (and, with ``--fsync``, ``fdatasync``) of a
file on the data disk, each awaited by a coroutine, timed from the request to the
coroutine resuming:

- ``executor``: a one-worker ``ThreadPoolExecutor`` (what bookie/journal.py uses), its
  future's done-callback handing back with ``call_soon_threadsafe``;
- ``thread``: a plain thread fed by a ``queue.SimpleQueue``, handing back the same way;
- ``inline``: the write on the loop's own thread, then one ``asyncio.sleep(0)``: no
  hand-off at all (the floor; blocking the loop, which the bookie does not do).

Rest before each operation: none (back to back) and ``--rest-ms`` (1 ms by default),
slept on the loop's thread. The modes are interleaved in every repeat.

    python bench/thread_hop_bench.py --out bench/results/thread_hop.json
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from typing import Awaitable, Callable

PAYLOAD = b"\x5a" * 1024


class Target:
    """The file the operations write (and fdatasync), and the operation itself."""

    def __init__(self, directory: str, fsync: bool) -> None:
        fd, self.path = tempfile.mkstemp(prefix="thread-hop-", dir=directory)
        self.fd = fd
        self.fsync = fsync

    def operate(self) -> None:
        os.write(self.fd, PAYLOAD)
        if self.fsync:
            os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


Mode = Callable[[Target, int, float], Awaitable[list[float]]]


async def via_executor(target: Target, count: int, rest_s: float) -> list[float]:
    loop = asyncio.get_running_loop()
    samples = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hop") as executor:
        for _ in range(count):
            if rest_s:
                time.sleep(rest_s)
            started = time.perf_counter()
            done = loop.create_future()
            work = executor.submit(target.operate)
            work.add_done_callback(lambda _work, done=done: loop.call_soon_threadsafe(done.set_result, None))
            await done
            samples.append(time.perf_counter() - started)
    return samples


async def via_thread(target: Target, count: int, rest_s: float) -> list[float]:
    loop = asyncio.get_running_loop()
    requests: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()

    def worker() -> None:
        while True:
            done = requests.get()
            if done is None:
                return
            target.operate()
            loop.call_soon_threadsafe(done.set_result, None)

    thread = threading.Thread(target=worker, name="hop", daemon=True)
    thread.start()
    samples = []
    try:
        for _ in range(count):
            if rest_s:
                time.sleep(rest_s)
            started = time.perf_counter()
            done = loop.create_future()
            requests.put(done)
            await done
            samples.append(time.perf_counter() - started)
    finally:
        requests.put(None)
        thread.join(10)
    return samples


async def inline(target: Target, count: int, rest_s: float) -> list[float]:
    samples = []
    for _ in range(count):
        if rest_s:
            time.sleep(rest_s)
        started = time.perf_counter()
        target.operate()
        await asyncio.sleep(0)
        samples.append(time.perf_counter() - started)
    return samples


MODES: dict[str, Mode] = {"executor": via_executor, "thread": via_thread, "inline": inline}


def percentile_us(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, int(fraction * len(ordered)))
    return round(ordered[index] * 1e6, 1)


async def run(args: argparse.Namespace) -> dict:
    target = Target(args.dir, args.fsync)
    rows = []
    try:
        for repeat in range(args.repeat):
            for rest_ms in (0.0, args.rest_ms):
                for name, mode in MODES.items():
                    samples = await mode(target, args.count, rest_ms / 1000)
                    rows.append({"repeat": repeat, "rest_ms": rest_ms, "mode": name,
                                 "p50_us": percentile_us(samples, 0.5), "p99_us": percentile_us(samples, 0.99)})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        target.close()
    summary = {}
    for rest_ms in (0.0, args.rest_ms):
        for name in MODES:
            mine = [row for row in rows if row["rest_ms"] == rest_ms and row["mode"] == name]
            summary[f"{name} rest {rest_ms:g} ms"] = {
                "p50_us_median": round(statistics.median(row["p50_us"] for row in mine), 1),
                "p99_us_median": round(statistics.median(row["p99_us"] for row in mine), 1)}
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
            "settings": {"count": args.count, "repeat": args.repeat, "rest_ms": args.rest_ms, "fsync": args.fsync,
                         "dir": args.dir},
            "rows": rows, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1500, help="operations per mode and repeat")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rest-ms", type=float, default=1.0)
    parser.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        "bench", "results"),
                        help="where the scratch file goes (the data disk)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    for key, value in results["summary"].items():
        print(f"{key}: p50 {value['p50_us_median']} us, p99 {value['p99_us_median']} us")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)
        print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
