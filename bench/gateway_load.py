"""Load test of the HTTP gateway with locust: a cluster (etcd, 3 bookies, a broker, a
gateway) as processes, then ``locust`` headless (50 users, 60 s by default) running
bench/gateway_locustfile.py against it: produce batches of 10, pull 10 and ack. Writes
requests/s, p50/p99 latency and failures, per request kind and in total, to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gateway_bench import cpu_seconds, tree_pids  # noqa: E402
from harness import bench_cluster  # noqa: E402
from tests.cluster import unique  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summarize(stats: list[dict], seconds: float) -> dict:
    """Locust's --json entries → requests/s, p50/p99 and failures per name and in total."""
    def percentile(times: dict, fraction: float) -> float | None:
        total = sum(times.values())
        if not total:
            return None
        seen = 0
        for bucket in sorted(times, key=float):
            seen += times[bucket]
            if seen >= fraction * total:
                return float(bucket)
        return None

    by_name = {}
    everything: dict = {}
    requests = failures = 0
    for entry in stats:
        times = {str(k): v for k, v in entry["response_times"].items()}
        for bucket, count in times.items():
            everything[bucket] = everything.get(bucket, 0) + count
        requests += entry["num_requests"]
        failures += entry["num_failures"]
        by_name[f"{entry['method']} {entry['name']}"] = {
            "requests": entry["num_requests"], "failures": entry["num_failures"],
            "requests_per_s": round(entry["num_requests"] / seconds, 1),
            "p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)}
    return {"requests": requests, "failures": failures, "requests_per_s": round(requests / seconds, 1),
            "p50_ms": percentile(everything, 0.5), "p99_ms": percentile(everything, 0.99), "by_request": by_name}


async def main_async(args: argparse.Namespace) -> dict:
    async with bench_cluster("magnetar-bench-gateway-load-", directory=args.dir, keep_data=args.keep_data) as cluster:
        bookies = await cluster.start_bookies(3)
        (broker,) = await cluster.start_brokers(1)
        (gateway,) = await cluster.start_gateways(1)
        topic_path = f"persistent/public/default/{unique('locust')}"
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{gateway.url}/v1/topics/{topic_path}/subscriptions/locust",
                                   json={"mode": "shared", "initial_position": "earliest"}) as response:
                assert response.status == 200, await response.text()
        env = {**os.environ, "GATEWAY_TOPIC_PATH": topic_path, "GATEWAY_SUBSCRIPTION": "locust"}
        command = [os.path.join(os.path.dirname(sys.executable), "locust"), "-f",
                   os.path.join(HERE, "gateway_locustfile.py"), "--headless", "-u", str(args.users),
                   "-r", str(args.spawn_rate), "-t", f"{args.seconds}s", "--host", gateway.url, "--json",
                   "--only-summary", "--stop-timeout", "5"]
        gateway_pids = tree_pids(gateway.process.pid)
        gateway_cpu_s, locust_cpu_s = cpu_seconds(gateway_pids), _children_cpu_s()
        others = {"broker": [broker.process.pid], "bookies": [bookie.process.pid for bookie in bookies]}
        others_cpu_s = {name: cpu_seconds(pids) for name, pids in others.items()}
        started = time.monotonic()
        completed = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True,
                                            timeout=args.seconds + 120)
        elapsed = time.monotonic() - started
        # CPU shares over the run, in % of one core: locust's own (the load generator on
        # the same machine; near 100 it, not the gateway, sets the pace) and the gateway's.
        cpu = {"locust_cpu_pct": round((_children_cpu_s() - locust_cpu_s) / elapsed * 100, 1),
               "gateway_cpu_pct": round((cpu_seconds(gateway_pids) - gateway_cpu_s) / elapsed * 100, 1),
               "gateway_processes": len(gateway_pids),
               **{f"{name}_cpu_pct": round((cpu_seconds(pids) - others_cpu_s[name]) / elapsed * 100, 1)
                  for name, pids in others.items()}}
        if completed.returncode not in (0, 1):   # 1: some requests failed (reported below)
            raise RuntimeError(f"locust failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
        stats = json.loads(completed.stdout)
        result = {"users": args.users, "seconds": args.seconds, "wall_seconds": round(elapsed, 1),
                  **summarize(stats, args.seconds), **cpu, "unix_s": int(time.time())}
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/gateway_locust.json")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--spawn-rate", type=int, default=25)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep-data", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps(result, indent=1))
    return 0 if result["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
