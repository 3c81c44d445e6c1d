"""CPU per durable ack of two Magnetar trees and the path skeleton, interleaved (issue 40):
for a before/after of a change to the publish path that is a few percent of its CPU.

Theory of operation: one ``magnetar standalone --bookies 1 --copies 1`` per tree (this
tree, and ``--baseline-tree`` for the before; a second copy of one tree is the A/A
control of the noise) and the path skeleton's relay and store (bench/path_skeleton.py)
are all up at once. A producer of the raw protocol client (bench/rawclient.py) per
standalone sends one 1 KiB entry at a time, the next after the previous one's receipt
(a durable ack: the receipt follows the journal's fdatasync); the skeleton gets one
request at a time likewise, with the same 1 ms rest floor.py gives it. The sides take
turns in blocks of ``--block`` entries, in an order rotated each round, so the machine's
other load falls on all of them; one side's broker + bookie CPU (utime + stime from
/proc, every thread) is read around each of its blocks only. Run one standalone after
another instead and the same tree's CPU per ack varies 0.65-1.25 ms between runs minutes
apart on this shared machine, which hides a 5-10 % change.

    python bench/ack_cpu.py --baseline-tree /tmp/before --rounds 20 --block 300
    python bench/ack_cpu.py --baseline-tree /tmp/before --control    # + a copy of the before

The trees need their generated protobuf modules (``make proto`` or a copy of
protocol/proto/*_pb2*.py). Prints one JSON document (and writes it with ``--out``):
per side CPU ms per entry, latency p50, entries; the new tree over the baseline; each
over the skeleton; the load average's range over the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, REPO_DIR)
sys.path.insert(0, BENCH_DIR)

import latency  # noqa: E402
import path_skeleton  # noqa: E402
import rawclient  # noqa: E402

SKELETON = "skeleton"
WARMUP_ENTRIES = 300
ENTRY_BYTES = 1024
SKELETON_REST_S = 0.001      # as floor.py's skeleton_baseline
RECEIPT_TIMEOUT_S = 30.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


# --- the figures (pure) ------------------------------------------------------------------------

def summarize(sides: dict[str, dict], *, new: str, baseline: str | None) -> dict:
    """Per side ``{"ticks", "entries", "latencies_us"}`` → CPU ms per entry, p50 ms and
    the ratios: the new tree over the baseline, each side over the skeleton. A side with
    no entries has no figures, and no ratio is made from a missing figure."""
    figures: dict[str, dict] = {}
    for name, side in sides.items():
        entries = side.get("entries") or 0
        latencies = side.get("latencies_us") or []
        figures[name] = {
            "entries": entries,
            "cpu_ms_per_entry": round(side["ticks"] * 1000 / CLOCK_TICKS_PER_S / entries, 4) if entries else None,
            "p50_ms": round(statistics.median(latencies) / 1000, 3) if latencies else None,
        }

    def ratio(top: str | None, bottom: str | None) -> float | None:
        if top not in figures or bottom not in figures:
            return None
        a, b = figures[top]["cpu_ms_per_entry"], figures[bottom]["cpu_ms_per_entry"]
        return round(a / b, 3) if a is not None and b else None

    return {"sides": figures,
            "new_over_baseline": ratio(new, baseline),
            "over_skeleton": {name: ratio(name, SKELETON) for name in figures if name != SKELETON}}


# --- running (shell) ---------------------------------------------------------------------------

def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


class _MagnetarSide:
    def __init__(self, tree: str) -> None:
        self.tree = tree
        self.base_dir = tempfile.mkdtemp(prefix="magnetar-ack-cpu-")
        self.standalone = latency.Standalone(tree, self.base_dir, 1, 1)
        self.connection: rawclient.RawConnection | None = None
        self.pids: list[int] = []
        self.producer_name = ""
        self.sequence_id = 0
        self.receipt = asyncio.Event()

    async def start(self) -> None:
        await asyncio.to_thread(self.standalone.start)
        children = latency.children_of(self.standalone.process.pid)
        self.pids = [pid for name, pid in children.items() if name == "broker" or name.startswith("bookie")]
        self.connection = await rawclient.RawConnection.open(self.standalone.ready["service_url"])
        request_id = self.connection.request_id()
        answer = await self.connection.request(
            rawclient.producer_command("persistent://public/default/ack-cpu", 1, request_id), request_id, "PRODUCER")
        self.producer_name = answer.command.producer_success.producer_name
        self.connection.on_receipt = lambda _receipt: self.receipt.set()

    async def block(self, count: int, batch: rawclient.BatchTemplate) -> tuple[int, list[int]]:
        assert self.connection is not None
        before = sum(_ticks(pid) for pid in self.pids)
        latencies = []
        for _ in range(count):
            self.receipt.clear()
            started = time.perf_counter_ns()
            self.connection.write(rawclient.send_frame(1, self.producer_name, self.sequence_id, batch,
                                                       int(time.time() * 1000)))
            await rawclient._wait_event(self.receipt, self.connection, timeout_s=RECEIPT_TIMEOUT_S)
            latencies.append((time.perf_counter_ns() - started) // 1000)
            self.sequence_id += 1
        return sum(_ticks(pid) for pid in self.pids) - before, latencies

    async def stop(self) -> None:
        if self.connection is not None:
            self.connection.close()
        await asyncio.to_thread(self.standalone.stop)
        shutil.rmtree(self.base_dir, ignore_errors=True)


class _SkeletonSide:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="magnetar-ack-cpu-skeleton-")
        self.store = path_skeleton._Child("--role", "store", "--dir", self.directory)
        self.relay = path_skeleton._Child("--role", "relay", "--store-port", str(self.store.port))

    async def block(self, count: int, _batch: object) -> tuple[int, list[int]]:
        before = sum(_ticks(child.process.pid) for child in (self.store, self.relay))
        latencies = await path_skeleton._timed_requests(self.relay.port, count, SKELETON_REST_S)
        return sum(_ticks(child.process.pid) for child in (self.store, self.relay)) - before, latencies

    async def stop(self) -> None:
        self.relay.stop()
        self.store.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


async def run(args: argparse.Namespace) -> dict:
    trees = {"new": REPO_DIR}
    if args.baseline_tree:
        trees["baseline"] = args.baseline_tree
        if args.control:
            trees["baseline_copy"] = args.baseline_tree
    sides: dict[str, object] = {}
    try:
        for name, tree in trees.items():
            side = _MagnetarSide(tree)
            sides[name] = side
            await side.start()
        sides[SKELETON] = _SkeletonSide()
        batch = rawclient.build_batch(1, ENTRY_BYTES)
        for side in sides.values():
            await side.block(WARMUP_ENTRIES, batch)
        totals = {name: {"ticks": 0, "entries": 0, "latencies_us": []} for name in sides}
        loads = []
        names = list(sides)
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                ticks, latencies = await sides[name].block(args.block, batch)
                totals[name]["ticks"] += ticks
                totals[name]["entries"] += args.block
                totals[name]["latencies_us"] += latencies
            loads.append(os.getloadavg()[0])
    finally:
        for side in sides.values():
            await side.stop()
    result = summarize(totals, new="new", baseline="baseline" if args.baseline_tree else None)
    result.update({"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "trees": trees, "rounds": args.rounds,
                   "block": args.block, "load_average": [round(min(loads), 2), round(max(loads), 2)]})
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", default=None, help="the tree before the change")
    parser.add_argument("--control", action="store_true", help="also a second standalone of the baseline tree")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=300, help="entries per side per round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
