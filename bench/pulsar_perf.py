"""End-to-end benchmark through the official Pulsar client: a real cluster (etcd, two
bookies, one broker) on loopback, driven by ``magnetar perf`` in separate processes.

For copies in (1, 2) — every message stored on that many bookies, E = Qw = Qa = copies,
set through the broker's options — it measures:
- publish: max-rate throughput, batching on, 1 KiB messages (``perf produce --rate 0``),
  from ``--publish-processes`` producer processes on one topic at once;
- drain: max-rate consume of the backlog publish left (a subscription created before
  publishing), after a broker restart so that the entries come from the bookies and not
  from the broker's entry cache: a catch-up read, not a tailing one; from
  ``--drain-processes`` consumer processes on one shared subscription;
- latency: end-to-end latency (send → receive, both processes on this machine's clock)
  at fixed rates of 1,000 and 10,000 msgs/s, with a consumer subscribed before the
  producer starts (p50 / p99 / p99.9), plus the producer's publish latency.

Why several client processes: one Python process of the official client tops out near
20,000 msgs/s published (its callbacks and the sending loop share one GIL) and ~110,000
msgs/s received, measured on this machine, below what the cluster takes. One process
would measure the client. Processes run at once and are added up over the wall-clock span
from the first one's start to the last one's end (each reports its bounds).

Baseline, measured in the same run on the disk the bookies write to: the raw sequential
write + fdatasync bandwidth, the median of short probes before and after each copies
block (bench/harness.py; ``baseline_unstable`` when the probes spread too far). What the
disk allows for 1 KiB messages with one copy: every byte is written twice (journal, then
entry log), so
    ceiling_MB_per_s = raw_write_fdatasync_MB_per_s / 2,   ceiling_msgs_per_s = that / 1 KiB.
Throughputs are reported as ratios to that one-copy ceiling; publish also to the
copies-adjusted ceiling raw / (2 * copies), both bookies sharing the one disk. (The drain
reads; its ratio to a write ceiling only puts the two on one scale.) The machine
is shared: absolute numbers drift, ratios to a baseline taken in the same run much less.

    python bench/pulsar_perf.py --out bench/results/pulsar_perf.json

Default total runtime: about 3 minutes. Exit code 1 when a drain missed messages, or a
run reported errors or duplicates (the numbers are then not of a correct run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

from harness import (  # noqa: E402
    aggregate_runs,
    bench_cluster,
    disk_baseline,
    disk_ceiling_MB_per_s,
    last_json_line,
    measure_disk,
    unstable_note,
    wait_ready,
)
from tests.cluster import Cluster, python_command, run_cli  # noqa: E402

MESSAGE_BYTES = 1024
# Subprocess budgets beyond a case's own duration: start-up, lookups, the drain of pending sends.
TOOL_OVERHEAD_S = 60.0
# A drain consumer stops once the backlog has not yielded a message for this long; the
# throughput is counted up to its last message, so the wait does not dilute it.
DRAIN_IDLE_S = 3.0
READY_TIMEOUT_S = 30.0


async def perf(*args: str, timeout_s: float) -> dict:
    """Runs ``magnetar perf …`` and returns its summary; raises with its stderr if it failed."""
    returncode, stdout, stderr = await run_cli("perf", *args, timeout_s=timeout_s)
    summary = last_json_line(stdout)
    if returncode != 0 or summary is None:
        raise RuntimeError(f"magnetar perf {args[0]} exited {returncode}: {stderr.strip()[-2000:]}")
    return summary


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Cluster) -> None:
        self.args = args
        self.cluster = cluster
        self.run_id = uuid.uuid4().hex[:8]

    def topic(self, copies: int, case: str) -> str:
        return f"persistent://public/default/bench-{self.run_id}-copies{copies}-{case}"

    async def publish(self, service_url: str, topic: str) -> dict:
        """``--publish-processes`` producer processes on the topic at once, added up."""
        args = self.args
        runs = await asyncio.gather(*(
            perf("produce", "--service-url", service_url, topic, "--rate", "0", "--size", str(MESSAGE_BYTES),
                 "--seconds", str(args.publish_seconds), "--batching", "--max-pending", str(args.max_pending),
                 "--progress-interval-s", "5", timeout_s=args.publish_seconds + TOOL_OVERHEAD_S)
            for _ in range(args.publish_processes)))
        return aggregate(runs, "started_unix_s", "ended_unix_s", latency_key="publish_latency_ms")

    async def drain(self, service_url: str, topic: str, messages: int) -> dict:
        """``--drain-processes`` consumers of the drain subscription at once (shared when
        more than one), each stopping once the backlog stops coming; added up."""
        args = self.args
        if args.drain_processes == 1:
            stop = ["--messages", str(messages)]
        else:
            stop = ["--idle-timeout-s", str(DRAIN_IDLE_S)]
        runs = await asyncio.gather(*(
            perf("consume", "--service-url", service_url, topic, "--subscription", "drain",
                 "--subscription-type", self.drain_type, "--initial-position", "earliest",
                 "--seconds", str(args.drain_seconds_max), "--progress-interval-s", "5", *stop,
                 timeout_s=args.drain_seconds_max + TOOL_OVERHEAD_S)
            for _ in range(args.drain_processes)))
        result = aggregate(runs, "first_message_unix_s", "last_message_unix_s")
        result["expected_messages"] = messages
        result["complete"] = result["messages"] == messages
        result["duplicates"] = sum(run["duplicates"] for run in runs)
        return result

    @property
    def drain_type(self) -> str:
        return "exclusive" if self.args.drain_processes == 1 else "shared"

    async def latency(self, service_url: str, topic: str, rate: int) -> dict:
        """Consumer first (waits until subscribed), then a producer paced at ``rate``."""
        args = self.args
        messages = int(rate * args.latency_seconds)
        consumer = await asyncio.create_subprocess_exec(
            *python_command("perf", "consume", "--service-url", service_url, topic, "--subscription", "latency",
                            "--messages", str(messages), "--seconds", str(args.latency_seconds + 30),
                            "--progress-interval-s", "0"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            stderr_head = await wait_ready(consumer.stderr, "perf consume", READY_TIMEOUT_S)
            stderr_rest = asyncio.ensure_future(consumer.stderr.read())  # keep the pipe from filling
            produced = await perf("produce", "--service-url", service_url, topic, "--rate", str(rate),
                                  "--size", str(MESSAGE_BYTES), "--messages", str(messages), "--batching",
                                  "--max-pending", str(args.max_pending), "--progress-interval-s", "0",
                                  timeout_s=args.latency_seconds + TOOL_OVERHEAD_S)
            async with asyncio.timeout(TOOL_OVERHEAD_S):
                stdout = await consumer.stdout.read()
                await consumer.wait()
                stderr = stderr_head + await stderr_rest
        finally:
            if consumer.returncode is None:
                consumer.kill()
                await consumer.wait()
        consumed = last_json_line(stdout.decode())
        if consumer.returncode != 0 or consumed is None:
            raise RuntimeError(f"perf consume exited {consumer.returncode}: {stderr.decode().strip()[-2000:]}")
        return {"rate_target": rate, "producer": produced, "consumer": consumed}

    async def copies_block(self, copies: int) -> dict:
        args = self.args
        disk_before = await measure_disk(self.cluster.base_dir, args.raw_seconds)
        quorum = str(copies)
        broker = self.cluster.broker(name=f"broker-copies{copies}", extra_args=[
            "--ensemble-size", quorum, "--write-quorum", quorum, "--ack-quorum", quorum])
        await broker.start()
        block: dict = {"copies": copies}
        try:
            url = broker.service_url
            publish_topic = self.topic(copies, "publish")
            # The drain subscription exists before the backlog is written, so it covers all of it.
            returncode, _, stderr = await run_cli("consume", "--service-url", url, publish_topic, "-s", "drain",
                                                  "-t", self.drain_type, "-n", "0", "--timeout-s", "0.2",
                                                  "--initial-position", "earliest", timeout_s=TOOL_OVERHEAD_S)
            if returncode != 0:
                raise RuntimeError(f"could not create the drain subscription: {stderr.strip()[-2000:]}")
            block["publish"] = await self.publish(url, publish_topic)
            print(json.dumps({"copies": copies, "publish": block["publish"]}), flush=True)
            # Restart: the backlog must come from the bookies, not the broker's entry cache.
            await broker.terminate()
            await broker.start()
            block["drain"] = await self.drain(broker.service_url, publish_topic, block["publish"]["messages"])
            print(json.dumps({"copies": copies, "drain": block["drain"]}), flush=True)
            block["latency"] = []
            for rate in args.rates:
                result = await self.latency(broker.service_url, self.topic(copies, f"latency-{rate}"), rate)
                block["latency"].append(result)
                print(json.dumps({"copies": copies, "latency": result}), flush=True)
        finally:
            await broker.terminate()
        disk_after = await measure_disk(self.cluster.base_dir, args.raw_seconds)
        baseline = disk_baseline(disk_before, disk_after)
        block["raw_write_fdatasync_MB_per_s"] = baseline
        add_ratios(block, baseline["median"])
        return block


def aggregate(runs: list[dict], start_key: str, end_key: str, *, latency_key: str | None = None) -> dict:
    """Several perf processes as one (harness.aggregate_runs). Latency percentiles cannot
    be merged from summaries: the worst process's value of each is kept, and every
    process's summary is kept under ``processes``."""
    result = aggregate_runs(runs, start_key, end_key, MESSAGE_BYTES)
    if latency_key is not None:
        result[f"{latency_key}_worst_process"] = {
            key: max(run[latency_key][key] for run in runs) for key in ("p50", "p99", "p99.9", "max")}
    result["processes"] = runs
    return result


def add_ratios(block: dict, raw_MB_per_s: float) -> None:
    """Ratios of the throughputs to what the disk allows (see the module docstring)."""
    one_copy_MB_per_s = disk_ceiling_MB_per_s(raw_MB_per_s, 1)
    copies_MB_per_s = disk_ceiling_MB_per_s(raw_MB_per_s, block["copies"])
    block["ceiling"] = {
        "one_copy_MB_per_s": round(one_copy_MB_per_s, 1),
        "one_copy_msgs_per_s": round(one_copy_MB_per_s * 1e6 / MESSAGE_BYTES),
        "copies_adjusted_MB_per_s": round(copies_MB_per_s, 1),
    }

    def ratio(MB_per_s: float | None, ceiling_MB_per_s: float) -> float | None:
        return round(MB_per_s / ceiling_MB_per_s, 4) if MB_per_s is not None else None

    for case in ("publish", "drain"):
        if case in block:
            block[case]["ratio_to_one_copy_ceiling"] = ratio(block[case]["MB_per_s"], one_copy_MB_per_s)
    if "publish" in block:
        # Only writes multiply per copy; a drain reads each entry from one bookie.
        block["publish"]["ratio_to_copies_ceiling"] = ratio(block["publish"]["MB_per_s"], copies_MB_per_s)


def problems(results: dict) -> list[str]:
    """What makes a run's numbers not those of a correct run: a drain that missed
    messages, errors or duplicates anywhere. Empty when all is well."""
    found = []
    for block in results["blocks"]:
        copies = block["copies"]
        publish, drain = block.get("publish"), block.get("drain")
        if publish is None or drain is None or "latency" not in block:
            found.append(f"copies {copies}: the block did not finish")
            continue
        if publish["errors"]:
            found.append(f"copies {copies}: publish had {publish['errors']} errors")
        if not drain["complete"]:
            found.append(f"copies {copies}: drain received {drain['messages']} of {drain['expected_messages']} "
                         f"messages")
        if drain["errors"]:
            found.append(f"copies {copies}: drain had {drain['errors']} errors")
        if drain["duplicates"]:
            found.append(f"copies {copies}: drain received {drain['duplicates']} duplicates")
        for result in block["latency"]:
            rate = result["rate_target"]
            for side in ("producer", "consumer"):
                if result[side]["errors"]:
                    found.append(f"copies {copies}: latency @{rate}/s {side} had {result[side]['errors']} errors")
            if result["consumer"]["duplicates"]:
                found.append(f"copies {copies}: latency @{rate}/s consumer received "
                             f"{result['consumer']['duplicates']} duplicates")
    return found


async def main_async(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    results: dict = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(), "message_bytes": MESSAGE_BYTES,
        "settings": {"publish_seconds": args.publish_seconds, "latency_seconds": args.latency_seconds,
                     "rates": args.rates, "max_pending": args.max_pending,
                     "publish_processes": args.publish_processes, "drain_processes": args.drain_processes,
                     "bookies": 2, "brokers": 1, "batching": True, "batch_max_delay_ms": 1},
        "blocks": [],
    }
    async with bench_cluster("magnetar-pulsar-bench-", directory=args.dir, keep_data=args.keep_data) as cluster:
        await cluster.start_bookies(2)
        bench = Bench(args, cluster)
        for copies in args.copies:
            results["blocks"].append(await bench.copies_block(copies))
    results["total_seconds"] = round(time.monotonic() - started, 1)
    return results


def print_table(results: dict) -> None:
    print(f"\n{'copies':>6} {'case':<16} {'msgs/s':>10} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'p99.9 ms':>9} {'ratio 1c':>9} {'ratio kc':>9}")
    for block in results["blocks"]:
        copies = block["copies"]
        for case in ("publish", "drain"):
            row = block[case]
            latency = row.get("publish_latency_ms_worst_process")
            p50, p99, p999 = ((latency["p50"], latency["p99"], latency["p99.9"]) if latency else ("-", "-", "-"))
            print(f"{copies:>6} {case:<16} {row['msgs_per_s'] or '-':>10} {row['MB_per_s'] or '-':>8} {p50:>8} "
                  f"{p99:>8} {p999:>9} {row['ratio_to_one_copy_ceiling'] or '-':>9} "
                  f"{row.get('ratio_to_copies_ceiling') or '-':>9}")
        for result in block["latency"]:
            latency = result["consumer"]["end_to_end_latency_ms"]
            label = f"e2e @{result['rate_target']}/s"
            print(f"{copies:>6} {label:<16} {result['producer']['msgs_per_s']:>10} "
                  f"{result['producer']['MB_per_s']:>8} {latency['p50']:>8} {latency['p99']:>8} "
                  f"{latency['p99.9']:>9} {'-':>9} {'-':>9}")
        raw = block["raw_write_fdatasync_MB_per_s"]
        print(f"{'':>6} baseline: raw write+fdatasync {raw['median']} MB/s (median of {raw['probes_count']} "
              f"probes, {raw['min']}-{raw['max']}) -> one-copy ceiling {block['ceiling']['one_copy_MB_per_s']} MB/s "
              f"= {block['ceiling']['one_copy_msgs_per_s']} msgs/s of 1 KiB{unstable_note(raw)}")
    print("(publish latency: send -> broker ack at max rate, worst of the producer processes, mostly time spent "
          "behind the --max-pending window; e2e: send -> receive; ratio 1c: to the one-copy disk ceiling, "
          "kc: to raw / (2 x copies))")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/pulsar_perf.json")
    parser.add_argument("--copies", type=lambda text: [int(x) for x in text.split(",")], default=[1, 2])
    parser.add_argument("--publish-seconds", type=float, default=15.0)
    parser.add_argument("--drain-seconds-max", type=float, default=60.0)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rates", type=lambda text: [int(x) for x in text.split(",")], default=[1000, 10000])
    parser.add_argument("--raw-seconds", type=float, default=3.0,
                        help="disk probing before and after each copies block (several short probes), each time")
    parser.add_argument("--max-pending", type=int, default=1000)
    parser.add_argument("--publish-processes", type=int, default=3,
                        help="producer processes publishing at once (one Python client tops out near 20k msgs/s)")
    parser.add_argument("--drain-processes", type=int, default=2,
                        help="consumer processes draining at once, on a shared subscription when more than one")
    parser.add_argument("--dir", default=None, help="where the bookies' data goes (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true", help="keep the cluster's data and logs afterwards")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    print_table(results)
    print(f"results written to {args.out} (total {results['total_seconds']} s)")
    found = problems(results)
    if found:
        print("the run was not correct:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
