"""How long a broker's /metrics takes, and how big it is, with many topics loaded
(issue 35: 10,000 topics on one broker answer in <= 1 s, and the size is bounded by
the configured limit).

    python bench/metrics_bench.py [--topics 10000] [--limits 1000,20000] [--out FILE]

For each limit in ``--limits`` a broker is started with ``--metrics-topics-max LIMIT``
on a fresh cluster (etcd, 2 bookies), ``--topics`` topics are created and loaded over
the binary protocol by a subscription on each (bench/topics_scale.py's client; so each
has a subscription series too; nothing is published: that would measure the publish
path, not this), then /metrics is scraped ``--scrapes`` times, a second apart.
Written: per limit, the scrape time (median and max, seconds), the broker's CPU seconds
per scrape (all its CPU during the scrape, an upper bound of the scrape's own, and its
resting rate measured for 5 s before: on a machine loaded past its cores the wall time
mostly measures waiting for a core), the
body size (bytes), the samples (lines that are not comments), the pulsar_* samples, the
topics folded into namespace series, the broker's own time writing the per-topic
series, and the cardinality limit checked as documented (``_cardinality``).
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

from bench.harness import bench_cluster  # noqa: E402
from bench.topics_scale import Pool, cpu_seconds, subscribe_once  # noqa: E402


async def _create_topics(service_url: str, count: int) -> float:
    """Creates ``count`` topics with one durable subscription each over the binary
    protocol (a SUBSCRIBE then CLOSE_CONSUMER per topic, many in flight: the topic and
    its cursor stay loaded, idle); returns the seconds it took."""
    pool = await Pool.open(service_url)
    try:
        names = [f"persistent://public/default/metrics-bench-{index:06d}" for index in range(count)]
        return await pool.run(names, lambda connection, topic: subscribe_once(pool, connection, topic, "s"))
    finally:
        pool.close()


async def _scrape(url: str) -> tuple[float, bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        started = time.monotonic()
        async with session.get(f"{url}/metrics") as response:
            body = await response.read()
        return time.monotonic() - started, body


def _value(body: bytes, name: str) -> float | None:
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _cardinality(body: bytes, limit: int, loaded: int) -> dict:
    """What the documented limit promises (broker/topic_metrics.py), checked on one
    scrape: the first ``limit`` topics in name order have series of their own, the
    others are folded into the namespace's series without a topic label and counted in
    ..._topics_folded, subscription series stop at the subscription limit (one per
    topic here), and summing by namespace still counts every topic's subscription once."""
    topics_seen: set[str] = set()
    subscription_series = 0
    subscriptions_summed = 0.0
    for line in body.decode().splitlines():
        if line.startswith("pulsar_rate_in{"):
            labels = line[line.index("{") + 1:line.rindex("}")]
            for part in labels.split('",'):
                if part.startswith("topic="):
                    topics_seen.add(part.split('"', 1)[1].rstrip('"'))
        elif line.startswith("pulsar_subscription_back_log{"):
            subscription_series += 1
        elif line.startswith("pulsar_subscriptions_count{") and 'namespace="public/default"' in line:
            subscriptions_summed += float(line.rsplit(" ", 1)[1])
    names = [f"persistent://public/default/metrics-bench-{index:06d}" for index in range(loaded)]
    exposed_expected = min(limit, loaded)
    folded = _value(body, "magnetar_broker_metrics_topics_folded")
    checks = {
        "topic_series": len(topics_seen), "topic_series_expected": exposed_expected,
        "first_in_name_order": sorted(topics_seen) == names[:exposed_expected],
        "folded": folded, "folded_expected": loaded - exposed_expected,
        "subscription_series": subscription_series, "subscription_series_expected": exposed_expected,
        "subscriptions_summed_by_namespace": subscriptions_summed, "subscriptions_expected": loaded}
    checks["as_documented"] = (len(topics_seen) == exposed_expected and checks["first_in_name_order"]
                               and folded == loaded - exposed_expected
                               and subscription_series == exposed_expected and subscriptions_summed == loaded)
    return checks


async def run_case(args: argparse.Namespace, limit: int) -> dict:
    async with bench_cluster("metrics-bench", directory=args.data_dir, keep_data=False) as cluster:
        await cluster.start_bookies(2)
        (broker,) = await cluster.start_brokers(1, extra_args=["--metrics-topics-max", str(limit),
                                                               "--metrics-subscriptions-max", str(limit)])
        created_s = await _create_topics(broker.service_url, args.topics)
        await _scrape(broker.web_service_url)   # the first scrape starts the rate meters
        # The broker's CPU at rest, then per scrape (less the resting rate): what a scrape
        # costs, which a loaded machine does not change as much as the wall time.
        pid = broker.process.pid
        idle_before, idle_started = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(5.0)
        idle_rate = (cpu_seconds(pid) - idle_before) / (time.monotonic() - idle_started)
        times, sizes, cpu = [], [], []
        body = b""
        for _ in range(args.scrapes):
            await asyncio.sleep(1.0)
            cpu_before = cpu_seconds(pid)
            seconds, body = await _scrape(broker.web_service_url)
            cpu.append(cpu_seconds(pid) - cpu_before)
            times.append(seconds)
            sizes.append(len(body))
        lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
        loaded = _value(body, "magnetar_broker_topics")
        result = {
            "topics_max": limit,
            "topics_loaded": loaded,
            "topics_created_s": round(created_s, 1),
            "scrape_s_median": round(statistics.median(times), 3),
            "scrape_s_max": round(max(times), 3),
            # All the broker's CPU during the scrape, its resting work included (about
            # idle_broker_cpu_s_per_s x scrape_s of it): an upper bound of the scrape's own.
            "scrape_broker_cpu_s_median": round(statistics.median(cpu), 3),
            "idle_broker_cpu_s_per_s": round(idle_rate, 3),
            "load_avg": os.getloadavg(),
            "body_bytes": sizes[-1],
            "samples": len(lines),
            "pulsar_samples": sum(1 for line in lines if line.startswith("pulsar_")),
            "topics_folded": _value(body, "magnetar_broker_metrics_topics_folded"),
            # The broker's own time writing the per-topic series (the rest of a scrape's
            # time is the registry's other series, HTTP, and waiting for the event loop).
            "topic_series_s": _value(body, "magnetar_broker_metrics_topics_seconds"),
            "cardinality": _cardinality(body, limit, int(loaded or 0)),
        }
        print(json.dumps(result), flush=True)
        return result


async def main_async(args: argparse.Namespace) -> int:
    results = [await run_case(args, int(limit)) for limit in args.limits.split(",")]
    document = {"bench": "metrics_bench", "topics": args.topics, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                      time.gmtime()),
                "cases": results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")
    slow = [r for r in results if r["scrape_s_max"] > 1.0]
    wrong = [r for r in results if not r["cardinality"]["as_documented"] or r["topics_loaded"] != args.topics]
    print(f"written {args.out}; scrapes over 1 s: {len(slow)}; limits not as documented: {len(wrong)}")
    return 1 if slow or wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--limits", default="1000,20000",
                        help="comma-separated --metrics-topics-max values, one broker run each")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="bench/results/metrics_bench.json")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
