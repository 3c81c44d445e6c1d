"""The journal alone (bookie/journal.py), against another revision's journal in the same
run: sequential appends, each awaited until durable (fsync on), 1 KiB entries, back to
back and with a rest before each (the durable-ack workload's pace), the two journals
interleaved in every repeat (docs/performance.md, step 10). What it isolates: the
journal's own path (the append, the hand-off to its IO thread, write + fdatasync, the
hand-back to the loop) without sockets, the servicer or other processes.

    python bench/journal_bench.py --baseline-rev main --out bench/results/journal.json

The baseline's ``bookie/journal.py`` is taken from ``git show REV:bookie/journal.py``
and loaded beside the current one (the rest of the tree is the current one's; a
baseline whose journal needs other modules of its own revision cannot be compared this
way). Reported per mode: p50 and p99 of each repeat, their medians, and in how many
repeats the current journal's p50 was lower.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))

import bookie.journal as current_journal  # noqa: E402
from bookie.config import JournalConfig  # noqa: E402
from bookie.format import journal_add_record  # noqa: E402
from common.entry import encode_entry  # noqa: E402

PAYLOAD_BYTES = 1024


def load_baseline(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:bookie/journal.py"], cwd=os.path.dirname(BENCH_DIR),
                            check=True, capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix="_journal_baseline.py", delete=False) as file:
        file.write(source)
    spec = importlib.util.spec_from_file_location("journal_baseline", file.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["journal_baseline"] = module       # dataclasses look their module up
    spec.loader.exec_module(module)
    os.unlink(file.name)
    return module


async def one_run(module, directory: str, appends: int, rest_s: float) -> dict:
    """``appends`` sequential appends to a fresh journal in ``directory``; latency of each
    from append to its future's resolution."""
    run_dir = tempfile.mkdtemp(prefix="journal-bench-", dir=directory)
    journal = module.Journal(JournalConfig(journal_dir=run_dir, fsync_enabled=True),
                             on_durable=lambda _tokens: None, first_journal_id=1)
    journal.open()
    writer = asyncio.get_running_loop().create_task(journal.run())
    entry = encode_entry(1, 0, -1, 10**9, os.urandom(PAYLOAD_BYTES))
    latencies = []
    try:
        for index in range(appends):
            if rest_s:
                await asyncio.sleep(rest_s)
            started = time.perf_counter()
            await asyncio.wait_for(journal.append(journal_add_record(entry), len(entry), [(1, index)]), 10)
            latencies.append(time.perf_counter() - started)
    finally:
        await journal.close()
        await asyncio.wait_for(writer, 10)
        journal.close_file()
        for name in os.listdir(run_dir):
            os.unlink(os.path.join(run_dir, name))
        os.rmdir(run_dir)
    latencies.sort()
    return {"p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3),
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 3)}


async def run(args: argparse.Namespace) -> dict:
    builds = {"baseline": load_baseline(args.baseline_rev), "current": current_journal}
    modes = {"back_to_back": 0.0, f"rest_{args.rest_ms:g}ms": args.rest_ms / 1000}
    results: dict = {mode: {build: [] for build in builds} for mode in modes}
    for repeat in range(args.repeat):
        order = list(builds) if repeat % 2 == 0 else list(reversed(builds))
        for mode, rest_s in modes.items():
            for build in order:
                results[mode][build].append(await one_run(builds[build], args.dir, args.appends, rest_s))
    summary = {}
    for mode, by_build in results.items():
        current_p50 = [r["p50_ms"] for r in by_build["current"]]
        baseline_p50 = [r["p50_ms"] for r in by_build["baseline"]]
        summary[mode] = {
            "baseline_p50_ms_median": round(statistics.median(baseline_p50), 3),
            "current_p50_ms_median": round(statistics.median(current_p50), 3),
            "baseline_p99_ms_median": round(statistics.median(r["p99_ms"] for r in by_build["baseline"]), 3),
            "current_p99_ms_median": round(statistics.median(r["p99_ms"] for r in by_build["current"]), 3),
            "current_p50_lower_in": f"{sum(c < b for c, b in zip(current_p50, baseline_p50))} of {args.repeat}",
        }
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "baseline_rev": args.baseline_rev,
            "appends": args.appends, "repeat": args.repeat, "payload_bytes": PAYLOAD_BYTES,
            "runs": results, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default="main")
    parser.add_argument("--appends", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rest-ms", type=float, default=1.0)
    parser.add_argument("--dir", default=BENCH_DIR, help="where the journals are written (the data disk)")
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "results", "journal.json"))
    args = parser.parse_args()
    result = asyncio.run(run(args))
    with open(args.out, "w") as file:
        json.dump(result, file, indent=1)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
