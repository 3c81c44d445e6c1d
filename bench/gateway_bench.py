"""The HTTP gateway against the official client, same cluster, same run.

Workloads (each on its own topic, one after the other, 1 KiB text payloads):
- batched produce: HTTP requests of 100 messages (``--concurrency`` in flight) vs the
  official producer with batching on (100 messages / 10 ms) sending asynchronously;
- pull + ack: a backlog drained by HTTP workers (pull 100, ack them) vs the official
  consumer receiving and acknowledging each message (shared subscription both);
- pull of 10 latency: one worker pulling 10 at a time from a waiting backlog, acking
  each pull's receipts; p50 / p99 of the pulls and of the acks;
- single produce latency: one message per request, one request at a time, vs the
  official producer without batching sending synchronously; p50 / p99.

The cluster (etcd, 3 bookies, a broker, a gateway) runs as processes (bench/harness.py);
the load comes from this process, the HTTP side with aiohttp. Results go to ``--out``
with each gateway number as a ratio to the official client's in the same run, and the
aims of issue 36 checked: batched produce >= 0.8x the client's msgs/s, pull + ack >=
0.3x the client's drain, a pull of 10 waiting messages p50 <= 5 ms; and single produce
p99 <= 2x the client's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cpu_accounting import CLOCK_TICKS_PER_S, parse_process_ticks  # noqa: E402
from harness import bench_cluster  # noqa: E402
from tests.cluster import unique  # noqa: E402

PAYLOAD = "x" * 1024


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (the gateway's --processes workers are its children)."""
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    queue.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` (all threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                total += parse_process_ticks(handle.read())
        except OSError:
            continue
    return total / CLOCK_TICKS_PER_S


class CpuMeter:
    """CPU seconds the gateway's processes (and the broker) spent in a case: the cost
    per message, which a shared machine's load does not change as much as msgs/s."""

    def __init__(self, gateway_pid: int, broker_pid: int) -> None:
        self.gateway_pids = tree_pids(gateway_pid)
        self.broker_pids = [broker_pid]

    def __enter__(self) -> "CpuMeter":
        self._gateway = cpu_seconds(self.gateway_pids)
        self._broker = cpu_seconds(self.broker_pids)
        return self

    def __exit__(self, *_exc) -> None:
        self.gateway_s = cpu_seconds(self.gateway_pids) - self._gateway
        self.broker_s = cpu_seconds(self.broker_pids) - self._broker

    def per_message(self, messages: int) -> dict:
        return {"gateway_cpu_s": round(self.gateway_s, 2), "broker_cpu_s": round(self.broker_s, 2),
                "gateway_cpu_us_per_msg": round(self.gateway_s / max(messages, 1) * 1e6, 1),
                "broker_cpu_us_per_msg": round(self.broker_s / max(messages, 1) * 1e6, 1)}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def http_batched_produce(url: str, path: str, seconds: float, concurrency: int) -> dict:
    body = json.dumps({"messages": [{"payload": PAYLOAD}] * 100}).encode()
    stored = 0
    deadline = time.monotonic() + seconds

    async def sender(session: aiohttp.ClientSession) -> None:
        nonlocal stored
        while time.monotonic() < deadline:
            async with session.post(f"{url}/v1/topics/{path}/messages", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                document = await response.json()
                assert response.status == 200, document
                stored += sum(1 for r in document["results"] if r["status"] == "stored")

    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    return {"messages": stored, "seconds": round(elapsed, 2), "msgs_per_s": round(stored / elapsed, 1)}


def native_batched_produce(service_url: str, topic: str, seconds: float) -> dict:
    import pulsar

    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                      batching_max_publish_delay_ms=10, max_pending_messages=10_000,
                                      block_if_queue_full=True)
    payload = PAYLOAD.encode()
    sent = 0
    started = time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        for _ in range(100):
            producer.send_async(payload, None)
        sent += 100
    producer.flush()
    elapsed = time.monotonic() - started
    producer.close()
    client.close()
    return {"messages": sent, "seconds": round(elapsed, 2), "msgs_per_s": round(sent / elapsed, 1)}


def native_fill(service_url: str, topic: str, count: int) -> None:
    import pulsar

    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                      batching_max_publish_delay_ms=10, block_if_queue_full=True)
    payload = PAYLOAD.encode()
    for _ in range(count):
        producer.send_async(payload, None)
    producer.flush()
    producer.close()
    client.close()


def native_subscribe(service_url: str, topic: str, subscription: str) -> None:
    import pulsar

    client = pulsar.Client(service_url)
    client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                     initial_position=pulsar.InitialPosition.Earliest).close()
    client.close()


def native_drain(service_url: str, topic: str, subscription: str, count: int) -> dict:
    import pulsar

    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    received = 0
    started = time.monotonic()
    while received < count:
        message = consumer.receive(timeout_millis=30_000)
        consumer.acknowledge(message)
        received += 1
    elapsed = time.monotonic() - started
    consumer.close()
    client.close()
    return {"messages": received, "seconds": round(elapsed, 2), "msgs_per_s": round(received / elapsed, 1)}


async def http_drain(url: str, path: str, subscription: str, count: int, workers: int) -> dict:
    received = 0
    done = asyncio.Event()
    pull_ms: list[float] = []
    ack_ms: list[float] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal received
        base = f"{url}/v1/topics/{path}/subscriptions/{subscription}"
        while not done.is_set():
            started = time.perf_counter()
            async with session.post(f"{base}/pull", json={"max_messages": 100, "wait_ms": 1000}) as response:
                messages = (await response.json())["messages"]
            pull_ms.append((time.perf_counter() - started) * 1000)
            if not messages:
                continue
            started = time.perf_counter()
            async with session.post(f"{base}/ack", json={"receipts": [m["receipt"] for m in messages]}) as response:
                results = (await response.json())["results"]
                assert all(r["status"] == "acked" for r in results), results[:3]
            ack_ms.append((time.perf_counter() - started) * 1000)
            received += len(messages)
            if received >= count:
                done.set()

    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        await asyncio.wait_for(asyncio.gather(*(worker(session) for _ in range(workers))), timeout=600)
    elapsed = time.monotonic() - started
    return {"messages": received, "seconds": round(elapsed, 2), "msgs_per_s": round(received / elapsed, 1),
            "pull_p50_ms": round(statistics.median(pull_ms), 1), "ack_p50_ms": round(statistics.median(ack_ms), 1)}


async def http_pull_latency(url: str, path: str, subscription: str, count: int) -> dict:
    """One worker pulling 10 of a waiting backlog at a time, acking each pull's receipts
    after it; the latency of the pulls (the aim: p50 <= 5 ms) and of the acks."""
    base = f"{url}/v1/topics/{path}/subscriptions/{subscription}"
    pull_ms: list[float] = []
    ack_ms: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(f"{base}/pull", json={"max_messages": 10, "wait_ms": 1000}) as response:
                messages = (await response.json())["messages"]
            pull_ms.append((time.perf_counter() - started) * 1000)
            assert messages, "the backlog ran dry"
            started = time.perf_counter()
            async with session.post(f"{base}/ack", json={"receipts": [m["receipt"] for m in messages]}) as response:
                assert response.status == 200
                await response.read()
            ack_ms.append((time.perf_counter() - started) * 1000)
    return {"pulls": len(pull_ms), "pull": _latency(pull_ms), "ack": _latency(ack_ms)}


async def http_single_latency(url: str, path: str, count: int) -> dict:
    body = json.dumps({"payload": PAYLOAD}).encode()
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(f"{url}/v1/topics/{path}/message", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                await response.read()
                assert response.status == 200
            latencies.append((time.perf_counter() - started) * 1000)
    return _latency(latencies)


def native_single_latency(service_url: str, topic: str, count: int) -> dict:
    import pulsar

    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=False)
    payload = PAYLOAD.encode()
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        producer.send(payload)
        latencies.append((time.perf_counter() - started) * 1000)
    producer.close()
    client.close()
    return _latency(latencies)


def _latency(latencies: list[float]) -> dict:
    return {"requests": len(latencies), "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(percentile(latencies, 0.99), 2), "mean_ms": round(statistics.fmean(latencies), 2)}


async def main_async(args: argparse.Namespace) -> dict:
    async with bench_cluster("magnetar-bench-gateway-", directory=args.dir, keep_data=args.keep_data) as cluster:
        await cluster.start_bookies(3)
        (broker,) = await cluster.start_brokers(1)
        (gateway,) = await cluster.start_gateways(1, extra_args=["--processes", str(args.gateway_processes),
                                                                "--read-ahead-messages", str(args.read_ahead)])
        service_url, url = broker.service_url, gateway.url
        print(f"cluster up: broker={service_url} gateway={url} gateway_pid={gateway.process.pid} "
              f"broker_pid={broker.process.pid}",
              file=sys.stderr, flush=True)
        results: dict = {"payload_bytes": len(PAYLOAD), "seconds_per_case": args.seconds,
                         "concurrency": args.concurrency, "gateway_pid": gateway.process.pid,
                         "gateway_processes": args.gateway_processes, "read_ahead_messages": args.read_ahead}

        args.meter = lambda: CpuMeter(gateway.process.pid, broker.process.pid)
        cases = set(args.cases.split(","))
        if "produce" in cases:
            await _produce_case(args, results, service_url, url)
        if "pull_ack" in cases:
            await _pull_ack_case(args, results, service_url, url)
        if "pull10" in cases:
            await _pull10_case(args, results, service_url, url)
        if "single" in cases:
            await _single_case(args, results, service_url, url)
    aims: dict = {}
    if "batched_produce" in results:
        aims.update(batched_produce_ratio_min=0.8, batched_produce_met=results["batched_produce"]["ratio"] >= 0.8)
    if "pull_ack" in results:
        aims.update(pull_ack_ratio_min=0.3, pull_ack_met=results["pull_ack"]["ratio"] >= 0.3)
    if "pull_10_latency" in results:
        aims.update(pull_10_p50_ms_max=5.0, pull_10_p50_met=results["pull_10_latency"]["pull"]["p50_ms"] <= 5.0)
    if "single_produce_latency" in results:
        aims.update(single_p99_ratio_max=2.0,
                    single_p99_met=results["single_produce_latency"]["p99_ratio"] <= 2.0)
    results["aims"] = aims
    results["unix_s"] = int(time.time())
    return results


async def _produce_case(args: argparse.Namespace, results: dict, service_url: str, url: str) -> None:
    topic = unique("bench-native-produce")
    native = await asyncio.to_thread(native_batched_produce, service_url, topic, args.seconds)
    topic = unique("bench-http-produce")
    with args.meter() as meter:
        http = await http_batched_produce(url, f"persistent/public/default/{topic}", args.seconds, args.concurrency)
    http["cpu"] = meter.per_message(http["messages"])
    results["batched_produce"] = {"native": native, "gateway": http,
                                  "ratio": round(http["msgs_per_s"] / native["msgs_per_s"], 3)}
    print(f"batched produce: {results['batched_produce']}", file=sys.stderr, flush=True)


async def _pull_ack_case(args: argparse.Namespace, results: dict, service_url: str, url: str) -> None:
    count = args.drain_messages
    native_topic, http_topic = unique("bench-native-drain"), unique("bench-http-drain")
    for topic in (native_topic, http_topic):
        await asyncio.to_thread(native_subscribe, service_url, topic, "drain")
        await asyncio.to_thread(native_fill, service_url, topic, count)
    native = await asyncio.to_thread(native_drain, service_url, native_topic, "drain", count)
    client_cpu_s = time.process_time()
    with args.meter() as meter:
        http = await http_drain(url, f"persistent/public/default/{http_topic}", "drain", count, args.concurrency)
    http["cpu"] = meter.per_message(http["messages"])
    # The load generator's own CPU (aiohttp and JSON in this process): if it nears one
    # core, the client, not the gateway, set the pace.
    http["cpu"]["client_cpu_s"] = round(time.process_time() - client_cpu_s, 2)
    results["pull_ack"] = {"native": native, "gateway": http,
                           "ratio": round(http["msgs_per_s"] / native["msgs_per_s"], 3)}
    print(f"pull + ack: {results['pull_ack']}", file=sys.stderr, flush=True)


async def _pull10_case(args: argparse.Namespace, results: dict, service_url: str, url: str) -> None:
    # Pull of 10 waiting messages (a backlog larger than what the pulls take).
    pull_topic = unique("bench-http-pull10")
    await asyncio.to_thread(native_subscribe, service_url, pull_topic, "pull10")
    await asyncio.to_thread(native_fill, service_url, pull_topic, 10 * args.pull_requests + 1000)
    with args.meter() as meter:
        pull10 = await http_pull_latency(url, f"persistent/public/default/{pull_topic}", "pull10",
                                         args.pull_requests)
    pull10["cpu"] = meter.per_message(10 * args.pull_requests)
    results["pull_10_latency"] = pull10
    print(f"pull of 10: {pull10}", file=sys.stderr, flush=True)


async def _single_case(args: argparse.Namespace, results: dict, service_url: str, url: str) -> None:
    # Single-message produce latency.
    native = await asyncio.to_thread(native_single_latency, service_url, unique("bench-native-single"),
                                     args.single_requests)
    http = await http_single_latency(url, f"persistent/public/default/{unique('bench-http-single')}",
                                     args.single_requests)
    results["single_produce_latency"] = {"native": native, "gateway": http,
                                         "p50_ratio": round(http["p50_ms"] / native["p50_ms"], 3),
                                         "p99_ratio": round(http["p99_ms"] / native["p99_ms"], 3)}
    print(f"single produce: {results['single_produce_latency']}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/gateway.json")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each throughput case")
    parser.add_argument("--concurrency", type=int, default=4, help="HTTP requests in flight / pull workers")
    parser.add_argument("--drain-messages", type=int, default=50_000)
    parser.add_argument("--single-requests", type=int, default=2_000)
    parser.add_argument("--cases", default="produce,pull_ack,pull10,single",
                        help="which cases to run, comma-separated (produce, pull_ack, pull10, single)")
    parser.add_argument("--pull-requests", type=int, default=500, help="pulls of 10 for the pull latency case")
    parser.add_argument("--gateway-processes", type=int, default=2,
                        help="gateway processes on the one port (--processes; 2 uses both cores of a 2-core machine)")
    parser.add_argument("--read-ahead", type=int, default=500,
                        help="the gateway's --read-ahead-messages (a steady drain is what it is for)")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep-data", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
