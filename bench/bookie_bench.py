"""Storage-tier benchmark: sustained adds to real bookie processes, fsync on, compared
with the raw write+fdatasync bandwidth of the same disk measured in the same run.

Cases: 1 KiB and 64 KiB entries, to one bookie (E=Qw=Qa=1) and to two bookies
(E=Qw=Qa=2), both bookies' journal and ledger directories on the benchmark's disk.

The ceiling a disk allows: every byte of an entry is written twice per bookie (journal
and entry log), and once more per extra replica on the same disk, so
    ceiling_MBps = raw_write_fdatasync_MBps / (2 * replicas).
The ratio reported is achieved MB/s over that ceiling (the machine is shared and noisy:
absolute numbers drift, ratios to a baseline taken in the same run much less). The raw
bandwidth is the median of short probes right before and right after each case
(bench/harness.py); a case whose probes spread too far is flagged ``baseline_unstable``.

    python bench/bookie_bench.py --out bench/results/bookie.json [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
import urllib.request

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

from harness import bench_cluster, disk_baseline, disk_ceiling_MB_per_s, measure_disk, unstable_note  # noqa: E402
from ledger.client import LedgerClient  # noqa: E402
from ledger.config import LedgerClientConfig  # noqa: E402
from metadata import open_store  # noqa: E402
from tests.cluster import Cluster  # noqa: E402


def scrape(http_address: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def run_case(cluster: Cluster, bookies, replicas: int, entry_bytes: int, seconds: float,
                   writers: int, window: int) -> dict:
    store = open_store(cluster.metadata_url)
    client = LedgerClient(store, LedgerClientConfig(), rng=random.Random(1))
    await client.start()
    try:
        payload = os.urandom(entry_bytes)
        handles = [await client.create_ledger(replicas, replicas, replicas) for _ in range(writers)]
        # Warm-up: connections, first journal files, allocator.
        for handle in handles:
            await asyncio.gather(*[await handle.submit(payload) for _ in range(50)])
        fsyncs_before = sum(scrape(b.http_address, "magnetar_bookie_journal_fsyncs") for b in bookies)
        acked = 0
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()

        async def writer(handle):
            nonlocal acked
            in_flight: list[asyncio.Future[int]] = []
            while time.perf_counter() < deadline:
                in_flight.append(await handle.submit(payload))
                if len(in_flight) >= window:
                    await in_flight[0]
                    done = [f for f in in_flight if f.done()]
                    acked += len(done)
                    in_flight = [f for f in in_flight if not f.done()]
            await asyncio.gather(*in_flight)
            acked += len(in_flight)

        await asyncio.gather(*(writer(h) for h in handles))
        elapsed = time.perf_counter() - started
        fsyncs = sum(scrape(b.http_address, "magnetar_bookie_journal_fsyncs") for b in bookies) - fsyncs_before
        for handle in handles:
            await handle.close()
            await client.delete_ledger(handle.ledger_id)
    finally:
        await client.close()
        await store.close()
    megabytes = acked * entry_bytes / 1e6
    return {
        "entry_bytes": entry_bytes, "replicas": replicas, "writers": writers, "window": window,
        "seconds": round(elapsed, 2), "adds": acked, "adds_per_s": round(acked / elapsed, 1),
        "MB_per_s": round(megabytes / elapsed, 2), "journal_fsyncs_per_s": round(fsyncs / elapsed, 1),
        "entries_per_fsync": round(acked * replicas / fsyncs, 1) if fsyncs else None,
    }


async def main_async(args: argparse.Namespace) -> dict:
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds_per_case": args.seconds, "cases": []}
    async with bench_cluster("magnetar-bench-", directory=args.dir, keep_data=args.keep_data) as cluster:
        bookies = await cluster.start_bookies(2, extra_args=["--gc-interval-s", "5"])
        for replicas in (1, 2):
            for entry_bytes, writers, window in ((1024, 4, 2000), (64 * 1024, 2, 64)):
                # The disk's speed drifts (shared machine): probe it right before and
                # after each case and compare the case with the median of the probes.
                before = await measure_disk(cluster.base_dir, args.raw_seconds)
                case = await run_case(cluster, bookies, replicas, entry_bytes, args.seconds, writers, window)
                after = await measure_disk(cluster.base_dir, args.raw_seconds)
                baseline = disk_baseline(before, after)
                ceiling = disk_ceiling_MB_per_s(baseline["median"], replicas)
                case["raw_write_fdatasync_MB_per_s"] = baseline
                case["ceiling_MB_per_s"] = round(ceiling, 1)
                case["ratio_to_ceiling"] = round(case["MB_per_s"] / ceiling, 3)
                results["cases"].append(case)
                print(json.dumps(case), flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/bookie.json")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--raw-seconds", type=float, default=4.0,
                        help="disk probing before and after each case (several short probes), each time")
    parser.add_argument("--dir", default=None, help="where the bookies' data goes (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true", help="keep the cluster's data and logs afterwards")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    print(f"{'entry':>7} {'copies':>6} {'adds/s':>10} {'MB/s':>8} {'fsyncs/s':>9} {'raw MB/s':>9} "
          f"{'(min-max)':>15} {'ceiling':>8} {'ratio':>6}")
    for case in results["cases"]:
        raw = case["raw_write_fdatasync_MB_per_s"]
        spread = f"({raw['min']}-{raw['max']})"
        print(f"{case['entry_bytes']:>7} {case['replicas']:>6} {case['adds_per_s']:>10} {case['MB_per_s']:>8} "
              f"{case['journal_fsyncs_per_s']:>9} {raw['median']:>9} {spread:>15} "
              f"{case['ceiling_MB_per_s']:>8} {case['ratio_to_ceiling']:>6}{unstable_note(raw)}")
    print("(raw MB/s: median of the disk probes before and after the case; ceiling: raw / (2 x copies))")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
