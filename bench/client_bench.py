"""The public asyncio client (magnetar.client) against the official client's asyncio
API (``pulsar.asyncio``, pulsar-client) in one run, against two brokers: Magnetar (etcd,
one bookie, one broker, one copy) and pulsar-lite (a Pulsar-protocol broker compiled
from Rust). ``make bench-client`` writes bench/results/client_bench.json.

Workloads, each in a client process of its own (the client is what is measured: one
process, one event loop, as an asyncio service would run it):

- produce: MESSAGES messages of MESSAGE_BYTES to a fresh topic, WINDOW sends in flight
  (``await producer.send`` gathered in windows: the only send the official asyncio API
  has; ours the same, so the call pattern is equal), batching on with each client's
  defaults; the rate counts until the last receipt.
- drain: a backlog of MESSAGES messages (written beforehand, batched) read from the
  earliest position by one exclusive consumer, ``await receive()`` then
  ``await acknowledge(message)`` per message; the rate counts from subscribing to the
  last message.

Reported per broker and workload: each client's msgs/s and the client process's CPU
seconds per 100,000 messages, and ours / official as ratios of rates and of CPU per
message (the issue's aims: drain >= 5x, publish >= 2x). A client process that crashes
or hangs is recorded as a failed run (with its stderr's end), not fatal. Both clients run the same case back to back, alternating which
goes first over the repeats, and the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MESSAGES = 50_000
MESSAGE_BYTES = 256
WINDOW = 1_000
CASE_TIMEOUT_S = 300


# --- the client processes --------------------------------------------------------------------

async def _produce_ours(url: str, topic: str, count: int, size: int, window: int) -> tuple[float, float]:
    from magnetar.client import Client

    payload = b"x" * size
    async with Client(url) as client:
        producer = await client.create_producer(topic, max_pending_messages=max(window, 1_000))
        start, cpu_start = time.perf_counter(), time.process_time()
        for base in range(0, count, window):
            await asyncio.gather(*(producer.send(payload) for _ in range(min(window, count - base))))
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        await producer.close()
    return elapsed, cpu_s


async def _produce_official(url: str, topic: str, count: int, size: int, window: int) -> tuple[float, float]:
    import pulsar.asyncio

    payload = b"x" * size
    client = pulsar.asyncio.Client(url)
    try:
        producer = await client.create_producer(topic, max_pending_messages=max(window, 1_000))
        start, cpu_start = time.perf_counter(), time.process_time()
        for base in range(0, count, window):
            await asyncio.gather(*(producer.send(payload) for _ in range(min(window, count - base))))
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        await producer.close()
    finally:
        await client.close()
    return elapsed, cpu_s


async def _drain_ours(url: str, topic: str, count: int) -> tuple[float, float]:
    from magnetar.client import Client, InitialPosition

    async with Client(url) as client:
        start, cpu_start = time.perf_counter(), time.process_time()
        consumer = await client.subscribe(topic, "drain", initial_position=InitialPosition.Earliest)
        for _ in range(count):
            message = await consumer.receive()
            await consumer.acknowledge(message)
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        await consumer.close()
    return elapsed, cpu_s


async def _drain_official(url: str, topic: str, count: int) -> tuple[float, float]:
    import pulsar
    import pulsar.asyncio

    client = pulsar.asyncio.Client(url)
    try:
        start, cpu_start = time.perf_counter(), time.process_time()
        consumer = await client.subscribe(topic, "drain", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(count):
            message = await consumer.receive()
            await consumer.acknowledge(message)
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        await consumer.close()
    finally:
        await client.close()
    return elapsed, cpu_s


async def _fill(url: str, topic: str, count: int, size: int) -> None:
    """A backlog for a drain, written by our client (batched, fast)."""
    from magnetar.client import Client

    payload = b"y" * size
    async with Client(url) as client:
        producer = await client.create_producer(topic, max_pending_messages=10_000, batching_max_messages=1_000)
        for base in range(0, count, 5_000):
            await asyncio.gather(*(producer.send(payload) for _ in range(min(5_000, count - base))))
        await producer.close()


def worker(args: argparse.Namespace) -> None:
    """One case; CPU is the whole process's (the official client's C++ threads too)
    over the timed section only, not the imports and connection before it."""
    if args.workload == "produce":
        run = _produce_ours if args.client == "ours" else _produce_official
        elapsed, cpu_s = asyncio.run(run(args.url, args.topic, args.messages, args.message_bytes, args.window))
    elif args.workload == "drain":
        run = _drain_ours if args.client == "ours" else _drain_official
        elapsed, cpu_s = asyncio.run(run(args.url, args.topic, args.messages))
    else:
        asyncio.run(_fill(args.url, args.topic, args.messages, args.message_bytes))
        elapsed, cpu_s = 0.0, 0.0
    print(json.dumps({"elapsed_s": elapsed, "cpu_s": cpu_s}), flush=True)


def run_worker(client: str, workload: str, url: str, topic: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--client", client, "--workload", workload,
               "--url", url, "--topic", topic, "--messages", str(args.messages),
               "--message-bytes", str(args.message_bytes), "--window", str(args.window)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"failed": f"no result within {CASE_TIMEOUT_S} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        # Recorded, not raised: one crashed client process (the official client once
        # died of SIGSEGV against pulsar-lite) must not lose the rest of the run.
        return {"failed": f"exit status {done.returncode}", "stderr_tail": done.stderr[-1500:]}
    result = json.loads(lines[-1])
    if workload != "fill":
        result["msgs_per_s"] = args.messages / result["elapsed_s"]
        result["cpu_s_per_100k"] = result["cpu_s"] * 100_000 / args.messages
    return result


# --- the run ---------------------------------------------------------------------------------

def measure(broker: str, url: str, args: argparse.Namespace) -> dict:
    results: dict = {}
    for workload in ("produce", "drain"):
        runs: dict[str, list[dict]] = {"ours": [], "official": []}
        for repeat in range(args.repeat):
            order = ("ours", "official") if repeat % 2 == 0 else ("official", "ours")
            for client in order:
                topic = f"persistent://public/default/bench-{workload}-{client}-{uuid.uuid4().hex[:8]}"
                if workload == "drain":
                    filled = run_worker("ours", "fill", url, topic, args)
                    if "failed" in filled:
                        raise RuntimeError(f"filling {topic} failed: {filled}")
                result = run_worker(client, workload, url, topic, args)
                runs[client].append(result)
                if "failed" in result:
                    print(f"{broker} {workload} {client}: FAILED {result}", file=sys.stderr, flush=True)
                    continue
                print(f"{broker} {workload} {client}: {result['msgs_per_s']:,.0f} msgs/s, "
                      f"{result['cpu_s_per_100k']:.1f} CPU-s per 100k", file=sys.stderr, flush=True)
        summary: dict = {}
        for client, client_runs in runs.items():
            good = [r for r in client_runs if "failed" not in r]
            summary[client] = {
                "msgs_per_s_median": statistics.median(r["msgs_per_s"] for r in good) if good else None,
                "cpu_s_per_100k_median": statistics.median(r["cpu_s_per_100k"] for r in good) if good else None,
                "failed_runs": len(client_runs) - len(good), "runs": client_runs}
        ours, official = summary["ours"], summary["official"]
        summary["ratio_ours_to_official"] = (ours["msgs_per_s_median"] / official["msgs_per_s_median"]
                                             if ours["msgs_per_s_median"] and official["msgs_per_s_median"] else None)
        summary["cpu_ratio_official_to_ours"] = (
            official["cpu_s_per_100k_median"] / ours["cpu_s_per_100k_median"]
            if ours["cpu_s_per_100k_median"] and official["cpu_s_per_100k_median"] else None)
        results[workload] = summary
    return results


async def with_magnetar(args: argparse.Namespace) -> dict:
    from bench.harness import bench_cluster

    async with bench_cluster("client-bench-", directory=None, keep_data=False) as cluster:
        await cluster.start_bookies(1)
        await cluster.start_brokers(1, extra_args=["--ensemble-size", "1", "--write-quorum", "1",
                                                   "--ack-quorum", "1"])
        return await asyncio.to_thread(measure, "magnetar", cluster.brokers[0].service_url, args)


async def with_pulsar_lite(args: argparse.Namespace) -> dict:
    from tests.pulsar_lite import PulsarLiteProcess

    base = tempfile.mkdtemp(prefix="client-bench-lite-")
    lite = PulsarLiteProcess(base)
    try:
        await lite.start()
        return await asyncio.to_thread(measure, "pulsar-lite", lite.service_url, args)
    finally:
        lite.kill9()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/client_bench.json")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--message-bytes", type=int, default=MESSAGE_BYTES)
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--brokers", default="magnetar,pulsar-lite")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=["ours", "official"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=["produce", "drain", "fill"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    report: dict = {"what": "magnetar.client against pulsar.asyncio (pulsar-client), same run",
                    "messages": args.messages, "message_bytes": args.message_bytes, "window": args.window,
                    "repeat": args.repeat, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "load_average_at_start": os.getloadavg(), "brokers": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for broker in args.brokers.split(","):
        run = {"magnetar": with_magnetar, "pulsar-lite": with_pulsar_lite}[broker]
        report["brokers"][broker] = asyncio.run(run(args))
        report["load_average_at_end"] = os.getloadavg()
        with open(args.out, "w") as handle:       # after each broker: a later failure keeps these
            json.dump(report, handle, indent=2)

    def rate(value) -> str:
        return f"{value:>9,.0f}" if value else "   failed"

    failed = 0
    for broker, results in report["brokers"].items():
        for workload, summary in results.items():
            ratio = summary["ratio_ours_to_official"]
            failed += summary["ours"]["failed_runs"] + summary["official"]["failed_runs"]
            print(f"{broker:12} {workload:8} ours {rate(summary['ours']['msgs_per_s_median'])} msgs/s  "
                  f"official {rate(summary['official']['msgs_per_s_median'])} msgs/s  "
                  f"ratio {f'{ratio:.2f}x' if ratio else '-'}  CPU per message official/ours "
                  f"{summary['cpu_ratio_official_to_ours'] or 0:.2f}x")
    if failed:
        print(f"{failed} client runs failed (bench/results: 'failed' in their runs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
