"""Many topics on one broker (issue 40, "scale in topics"): broker memory per idle topic
and per subscription, lookups/s, etcd operations/s, and how long a bundle of topics
takes to load on a second broker after the first is killed.

    python bench/topics_scale.py [--quick] [--topics 10000] [--subscriptions-per-topic 10]
                                 [--bundle-topics 1000] [--out FILE]

Theory of operation:
- One etcd, one bookie (ledgers of one copy: the bench measures the broker, not
  replication), broker A. Two namespaces: ``public/scale`` (16 bundles) and
  ``public/failover`` (one bundle of ``--bundle-topics`` topics); ``--topics`` counts both.
  Shedding is off, so everything stays on A until A dies.
- The bench is the client, over the binary protocol (bench/rawclient.py's codec, a few
  connections, many requests in flight): a topic is created by a PRODUCER then
  CLOSE_PRODUCER (the topic stays loaded, idle), a subscription by a SUBSCRIBE then
  CLOSE_CONSUMER (a durable cursor stays, with no consumer).
- **Memory is RSS** of the broker process (``VmRSS`` in /proc), read after the broker
  settled (a few seconds with no requests): per idle topic = the RSS gained while the
  topics were created, over their number; per subscription the same for the
  subscriptions. RSS includes the allocator's free lists and fragmentation, so it is the
  operator's number, not Python's object sizes (the note gives a tracemalloc breakdown
  done apart).
- **etcd operations/s**: etcd's own counters (``etcd_mvcc_{range,put,delete,txn}_total``
  from its /metrics) before and after each phase, over the phase's length.
- **Lookups/s**: binary LOOKUPs of every topic against A (its owner), many in flight.
- **Failover**: broker B is started, A is killed with SIGKILL. B's lookups of a failover
  topic wait until its bundle is owned (A's lease has to expire first: ``--lease-ttl-s``);
  from the moment B owns the bundle the bench SUBSCRIBEs once to every topic of that
  bundle (each subscription exists: the topic and all its cursors load), as reconnecting
  consumers would, and times until the last topic answered. Reported apart: the wait for
  the lease (a configuration, ``detect_s``) and the load (``load_s``; aim <= 5 s for
  1,000 topics).
- **Ledgers**: ``--ledgers lazy`` (the default here, and ``make bench-topics-scale``)
  runs the brokers with ``--lazy-ledgers``: a topic makes its first ledger at its first
  publish, so the idle topics of this bench hold none, and a new owner has none to
  recover or replace. ``--ledgers eager`` measures the brokers' default (a ledger made
  at every load; after a crash each topic's open ledger is recovered first).
- **Idle**: the broker's CPU seconds per second and etcd operations/s over
  ``--idle-s`` with every topic and subscription loaded and no client, then three
  /metrics scrapes a second apart (bench/metrics_bench.py measures /metrics alone).
- A request answered with a retriable error (ServiceNotReady, MetadataError) is sent
  again (as clients do), up to 30 times; ``retries`` counts them. On a machine
  loaded far past its cores a broker may lose its lease (``--lease-ttl-s``, 30 s here)
  and close its topics; the retries then reload them.
- ``--quick`` scales everything down for a busy machine (2,000 topics, 5 subscriptions
  each, a bundle of 500); its results say ``quick: true``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import bench_cluster  # noqa: E402
from bench.rawclient import (RawConnection, RequestFailed, close_consumer_command,  # noqa: E402
                             close_producer_command, producer_command, subscribe_command)
from protocol.codec import Frame, wrap  # noqa: E402
from protocol.proto import pulsar_api_pb2 as pb  # noqa: E402

T = pb.BaseCommand.Type
CONNECTIONS = 4
IN_FLIGHT_PER_CONNECTION = 16
ETCD_COUNTERS = ("etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total")
SCALE_BUNDLES = 16


class LookupConnection(RawConnection):
    """A RawConnection that also takes LOOKUP_RESPONSE by its request id."""

    def _handle(self, frame: Frame) -> None:
        if frame.command.type == T.LOOKUP_RESPONSE:
            future = self._requests.pop(frame.command.lookupTopicResponse.request_id, None)
            if future is not None and not future.done():
                future.set_result(frame)
            return
        super()._handle(frame)

    async def lookup(self, topic: str) -> pb.CommandLookupTopicResponse:
        request_id = self.request_id()
        frame = await self.request(wrap(pb.CommandLookupTopic(topic=topic, request_id=request_id)), request_id,
                                   f"lookup {topic}")
        return frame.command.lookupTopicResponse


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_profile(pid: int, path: str | None, gil_only: bool = False) -> subprocess.Popen | None:
    """py-spy sampling ``pid`` into ``path`` (raw collapsed stacks) until stopped.
    ``gil_only``: only the thread holding the GIL is sampled (py-spy --gil), so a
    thread waiting for the GIL or in select() is not counted: closer to Python CPU."""
    if not path:
        return None
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--nonblocking",
                             *(["--gil"] if gil_only else []), "--output", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profile(process: subprocess.Popen | None) -> None:
    if process is not None:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def etcd_counters(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {name: 0.0 for name in ETCD_COUNTERS}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


def etcd_rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    ops = {name.removeprefix("etcd_mvcc_").removesuffix("_total"): after[name] - before[name] for name in before}
    total = sum(ops.values())
    return {"ops": {k: int(v) for k, v in ops.items()}, "ops_total": int(total),
            "ops_per_s": round(total / seconds, 1) if seconds > 0 else None}


def http_json(method: str, url: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read()
    return json.loads(text) if text else None


class Pool:
    """A few connections with many requests in flight; ``run`` applies ``job`` to every
    item and returns the seconds it took."""

    def __init__(self, connections: list[LookupConnection]) -> None:
        self.connections = connections
        self._ids = iter(range(1, 1 << 62))

    @classmethod
    async def open(cls, service_url: str, count: int = CONNECTIONS) -> "Pool":
        return cls([await LookupConnection.open(service_url) for _ in range(count)])

    def close(self) -> None:
        for connection in self.connections:
            connection.close()

    def next_id(self) -> int:
        return next(self._ids)

    async def run(self, items: list, job) -> float:
        started = time.monotonic()
        queue: asyncio.Queue = asyncio.Queue()
        for item in items:
            queue.put_nowait(item)

        async def worker(connection: LookupConnection) -> None:
            while True:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await job(connection, item)

        await asyncio.gather(*(worker(c) for c in self.connections for _ in range(IN_FLIGHT_PER_CONNECTION)))
        return time.monotonic() - started


RETRIES_MAX = 30
# Answers a client retries: the broker is not ready (a topic moving, its lease being
# confirmed again) or etcd did not answer in time (a machine too loaded for its calls).
RETRIABLE = (pb.ServiceNotReady, pb.MetadataError)
retries = {"count": 0}


async def retried(attempt) -> None:
    """Runs ``attempt()`` again (up to RETRIES_MAX times, backing off from 0.1 to 2 s,
    counted in ``retries``) when the broker answers with a retriable error, as a client
    would."""
    for tries in range(RETRIES_MAX + 1):
        try:
            return await attempt()
        except RequestFailed as error:
            if error.server_error not in RETRIABLE or tries == RETRIES_MAX:
                raise
            retries["count"] += 1
            await asyncio.sleep(min(0.1 * (tries + 1), 2.0))


async def create_topic(pool: Pool, connection: LookupConnection, topic: str) -> None:
    await retried(lambda: _create_topic(pool, connection, topic))


async def _create_topic(pool: Pool, connection: LookupConnection, topic: str) -> None:
    producer_id = pool.next_id()
    request_id = connection.request_id()
    await connection.request(producer_command(topic, producer_id, request_id), request_id, f"producer {topic}")
    request_id = connection.request_id()
    await connection.request(close_producer_command(producer_id, request_id), request_id, f"close producer {topic}")


async def subscribe_once(pool: Pool, connection: LookupConnection, topic: str, subscription: str) -> None:
    await retried(lambda: _subscribe_once(pool, connection, topic, subscription))


async def _subscribe_once(pool: Pool, connection: LookupConnection, topic: str, subscription: str) -> None:
    consumer_id = pool.next_id()
    request_id = connection.request_id()
    await connection.request(subscribe_command(topic, subscription, pb.CommandSubscribe.Shared, consumer_id,
                                               request_id), request_id, f"subscribe {topic} {subscription}")
    request_id = connection.request_id()
    await connection.request(close_consumer_command(consumer_id, request_id), request_id, f"close consumer {topic}")


async def settled_rss(pid: int, seconds: float = 4.0) -> int:
    await asyncio.sleep(seconds)
    return rss_bytes(pid)


def topic_names(namespace: str, count: int) -> list[str]:
    return [f"persistent://public/{namespace}/t-{index:06d}" for index in range(count)]


async def run(args: argparse.Namespace) -> dict:
    result: dict = {"bench": "topics_scale", "quick": args.quick, "ledgers": args.ledgers, "topics": args.topics,
                    "subscriptions_per_topic": args.subscriptions_per_topic, "bundle_topics": args.bundle_topics,
                    "memory_measure": "RSS (VmRSS) deltas of the broker process, after 4 s settled",
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": {
                        "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(), "python": platform.python_version()}}
    broker_args = ["--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1", "--no-shedding",
                   "--lease-ttl-s", str(args.lease_ttl_s), "--metrics-topics-max", "1000", *args.broker_arg]
    if args.ledgers == "lazy":
        broker_args.append("--lazy-ledgers")
    async with bench_cluster("topics-scale", directory=args.data_dir, keep_data=args.keep_data) as cluster:
        etcd_port = cluster.etcd.client_port
        await cluster.start_bookies(1)
        (broker_a,) = await cluster.start_brokers(1, extra_args=broker_args)
        admin = broker_a.web_service_url
        http_json("PUT", f"{admin}/admin/v2/namespaces/public/scale", {"bundles": {"numBundles": SCALE_BUNDLES}})
        http_json("PUT", f"{admin}/admin/v2/namespaces/public/failover", {"bundles": {"numBundles": 1}})
        scale_topics = topic_names("scale", args.topics - args.bundle_topics)
        failover_topics = topic_names("failover", args.bundle_topics)
        every_topic = failover_topics + scale_topics
        pool = await Pool.open(broker_a.service_url)
        try:
            # Warm-up: the code paths of a topic and a subscription are imported and
            # their caches made before the baseline.
            warm = [f"persistent://public/default/warm-{index}" for index in range(50)]
            await pool.run(warm, lambda c, t: create_topic(pool, c, t))
            await pool.run(warm, lambda c, t: subscribe_once(pool, c, t, "warm"))
            pid = broker_a.process.pid
            rss_base = await settled_rss(pid)

            before = etcd_counters(etcd_port)
            seconds = await pool.run(every_topic, lambda c, t: create_topic(pool, c, t))
            result["create_topics"] = {"seconds": round(seconds, 1), "per_s": round(len(every_topic) / seconds, 1),
                                       "etcd": etcd_rates(before, etcd_counters(etcd_port), seconds)}
            print(json.dumps({"create_topics": result["create_topics"]}), flush=True)
            rss_topics = await settled_rss(pid)

            subscriptions = [(t, f"sub-{i}") for t in every_topic for i in range(args.subscriptions_per_topic)]
            before = etcd_counters(etcd_port)
            seconds = await pool.run(subscriptions, lambda c, ts: subscribe_once(pool, c, ts[0], ts[1]))
            result["create_subscriptions"] = {
                "count": len(subscriptions), "seconds": round(seconds, 1),
                "per_s": round(len(subscriptions) / seconds, 1),
                "etcd": etcd_rates(before, etcd_counters(etcd_port), seconds)}
            print(json.dumps({"create_subscriptions": result["create_subscriptions"]}), flush=True)
            rss_subscriptions = await settled_rss(pid)
            result["memory"] = {
                "rss_base_MiB": round(rss_base / 2**20, 1), "rss_topics_MiB": round(rss_topics / 2**20, 1),
                "rss_subscriptions_MiB": round(rss_subscriptions / 2**20, 1),
                "idle_topic_KiB": round((rss_topics - rss_base) / len(every_topic) / 1024, 2),
                "subscription_KiB": round((rss_subscriptions - rss_topics) / max(len(subscriptions), 1) / 1024, 2)}
            print(json.dumps({"memory": result["memory"]}), flush=True)

            # Idle broker: its own periodic work over the topics, seen as etcd traffic.
            # Its CPU then is what 10,000 idle topics cost it per second (periodic walks).
            before = etcd_counters(etcd_port)
            cpu_idle = cpu_seconds(pid)
            await asyncio.sleep(args.idle_s)
            result["idle_etcd"] = etcd_rates(before, etcd_counters(etcd_port), args.idle_s)
            result["idle_broker_cpu_s_per_s"] = round((cpu_seconds(pid) - cpu_idle) / args.idle_s, 3)

            scrapes = []
            for _ in range(3):
                started = time.perf_counter()
                scrape = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{admin}/metrics", timeout=60).read())
                scrapes.append(round(time.perf_counter() - started, 3))
                await asyncio.sleep(1.0)
            result["metrics_scrape"] = {"seconds": scrapes, "bytes": len(scrape)}
            # The console history's last sample over every loaded topic (it runs every
            # --stats-history-interval-s, 10 s by default, on the event loop in one go).
            for name in ("sample", "hold"):
                found = re.search(rb"^magnetar_broker_stats_history_" + name.encode() + rb"_seconds (\S+)$",
                                  scrape, re.M)
                result[f"stats_history_{name}_s"] = round(float(found.group(1)), 4) if found else None
            # The broker's full (generation 2) collections so far: a long hold above may
            # be one of them, which any allocation can start.
            gen2 = {kind: re.search(rb'^magnetar_broker_gc_pause_seconds_' + kind.encode()
                                    + rb'\{generation="2"\} (\S+)$', scrape, re.M) for kind in ("count", "sum")}
            result["gc_generation2"] = {kind: float(found.group(1)) if found else None for kind, found in gen2.items()}
            print(json.dumps({"idle_broker_cpu_s_per_s": result["idle_broker_cpu_s_per_s"],
                              "metrics_scrape": result["metrics_scrape"],
                              "stats_history_sample_s": result["stats_history_sample_s"],
                              "stats_history_hold_s": result["stats_history_hold_s"],
                              "gc_generation2": result["gc_generation2"]}), flush=True)

            before = etcd_counters(etcd_port)
            lookups = every_topic * args.lookup_rounds

            async def lookup(connection: LookupConnection, topic: str) -> None:
                answer = await connection.lookup(topic)
                if answer.response != pb.CommandLookupTopicResponse.Connect:
                    raise RuntimeError(f"lookup of {topic} on its owner answered {answer}")

            seconds = await pool.run(lookups, lookup)
            result["lookups"] = {"count": len(lookups), "seconds": round(seconds, 2),
                                 "per_s": round(len(lookups) / seconds, 1),
                                 "etcd": etcd_rates(before, etcd_counters(etcd_port), seconds)}
            print(json.dumps({"lookups": result["lookups"]}), flush=True)
        finally:
            pool.close()

        # Failover: B joins, A dies; B owns A's bundles once A's lease expired.
        (broker_b,) = await cluster.start_brokers(1, extra_args=broker_args)
        pool_b = await Pool.open(broker_b.service_url)
        try:
            before = etcd_counters(etcd_port)
            killed = time.monotonic()
            broker_a.kill9()
            probe = pool_b.connections[0]
            while True:
                try:
                    answer = await probe.lookup(failover_topics[0])
                    if (answer.response == pb.CommandLookupTopicResponse.Connect
                            and answer.brokerServiceUrl == broker_b.service_url):
                        break
                except RequestFailed:
                    pass
                if time.monotonic() - killed > args.lease_ttl_s + 60:
                    raise RuntimeError("broker B never took the failover bundle")
                await asyncio.sleep(0.05)
            owned = time.monotonic()
            pids = {"broker": broker_b.process.pid, "bookie": cluster.bookies[0].process.pid,
                    "etcd": cluster.etcd.process.pid}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            profile = start_profile(broker_b.process.pid, args.profile_failover, args.profile_gil)
            loaded_at: list[float] = []

            async def load(connection: LookupConnection, topic: str) -> None:
                for attempt in range(50):
                    try:
                        await _subscribe_once(pool_b, connection, topic, "sub-0")
                        break
                    except RequestFailed as error:
                        if attempt == 49:
                            raise
                        if error.server_error not in (*RETRIABLE, pb.TopicNotFound):
                            raise
                        await asyncio.sleep(0.1)
                loaded_at.append(time.monotonic())

            load_s = await pool_b.run(failover_topics, load)
            stop_profile(profile)
            cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 2) for name, pid in pids.items()}
            spent = time.monotonic() - killed
            result["failover"] = {
                "lease_ttl_s": args.lease_ttl_s, "bundle_topics": len(failover_topics),
                "detect_s": round(owned - killed, 2), "load_s": round(load_s, 2),
                "load_p50_s": round(sorted(loaded_at)[len(loaded_at) // 2] - owned, 2),
                "topics_per_s": round(len(failover_topics) / load_s, 1),
                "kill_to_all_loaded_s": round(spent, 2), "load_cpu_s": cpu,
                "etcd": etcd_rates(before, etcd_counters(etcd_port), spent)}
            print(json.dumps({"failover": result["failover"]}), flush=True)
        finally:
            pool_b.close()
    result["retries"] = retries["count"]
    result["aims"] = {"idle_topic_KiB_max": 20, "idle_topic_met": result["memory"]["idle_topic_KiB"] <= 20,
                      "bundle_load_s_max": 5, "bundle_load_met": result["failover"]["load_s"] <= 5}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 topics, 5 subscriptions each, a bundle of 500")
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--subscriptions-per-topic", type=int, default=10)
    parser.add_argument("--bundle-topics", type=int, default=1_000)
    parser.add_argument("--lookup-rounds", type=int, default=2)
    parser.add_argument("--lease-ttl-s", type=int, default=30)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--profile-failover", default=None, help="py-spy raw profile of broker B's load here")
    parser.add_argument("--profile-gil", action="store_true",
                        help="profile only the thread holding the GIL (py-spy --gil)")
    parser.add_argument("--ledgers", choices=("lazy", "eager"), default="lazy",
                        help="lazy: brokers with --lazy-ledgers (a topic's first ledger at its first publish); "
                             "eager: the default (a ledger at every load)")
    parser.add_argument("--broker-arg", action="append", default=[], help="an extra broker argument (repeatable)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.topics, args.subscriptions_per_topic, args.bundle_topics = 2_000, 5, 500
    args.out = args.out or f"bench/results/topics_scale{'_quick' if args.quick else ''}.json"
    result = asyncio.run(run(args))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print(f"written {args.out}: {json.dumps(result['aims'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
