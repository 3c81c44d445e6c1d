"""Subscriptions benchmark: how fast the broker dispatches and takes acknowledgements,
on a real cluster (etcd, two bookies, one broker) on loopback, with CPU accounted per
process so that the report says who the bottleneck was.

Cases (1 KiB messages; each case gets a fresh topic whose subscriptions exist before
its backlog is written, so each covers all of it):
- shared: one shared subscription, 4 consumers (4 processes), every message
  acknowledged individually. Measured twice: with the official client (``magnetar perf
  consume``: ``acknowledge()`` per message; the client groups acks on the wire) and
  with the raw client (bench/raw_consumer.py: one ACK command per entry). The backlog
  is written in batches of ``--shared-batch-messages`` (10: small, so acknowledgements
  are frequent). Aim: >= 60,000 msgs/s acknowledged.
- fanout: 4 subscriptions on one topic, each with its own consumer process; counted is
  the total delivered (and acknowledged) over the four. Aim: >= 300,000 msgs/s.
- drain: a backlog of ``--drain-messages`` (1,000,000) written, then the broker is
  restarted so its entry cache is empty and every entry comes from the bookies (a
  catch-up read; the bookies' own caches and the OS page cache may still hold them),
  then one consumer drains it (exclusive subscription, individual acks). The broker
  is restarted again before each client's drain. Aim: >= 250,000 msgs/s.

Ledgers are written with E = Qw = Qa = ``--copies`` (default 1: this benchmark is about
subscriptions; bench/pulsar_perf.py covers replication). The shared and fanout backlogs
(400,000 messages, about 410 MB) fit in the broker's entry cache (512 MiB), so those cases
measure dispatch and acknowledgement, not storage reads. Backlogs are written by the raw
producer (bench/raw_producer.py), batching on; its throughput is reported too.

How consumers are started and counted: every consumer process subscribes, says so, and
waits; once all have, they are started at once (stdin), so none drains alone while the
others start. A case's throughput is every consumer's messages over the span from the
earliest first message to the latest last message (each process reports its bounds),
so neither start-up nor an idle tail dilutes it. Checks: no errors, every consumer's
count (fanout, drain: each gets the whole backlog; shared: the consumers together, the
raw ones also exactly once by position) and the broker's backlog of every subscription
is 0 afterwards.

CPU accounting (bench/cpu_accounting.py): utime + stime of every process involved
(etcd, bookies, broker, producer, each consumer) and of the whole machine, over exactly
the measured window, as percent of one core; the verdict names what was saturated. The
machine is shared and these runs are CPU-bound: the client processes and the servers
share its cores, which the accounting makes visible.

Baselines, measured in the same run, before and after the cases (the machine is shared
and noisy: absolute numbers drift, ratios to a baseline taken in the same run much less):
- disk: raw sequential write + fdatasync MB/s on the bookies' disk, the median of short
  probes (bench/harness.py; ``baseline_unstable`` when they spread too far);
  ``ratio_to_disk_ceiling`` is msgs/s over the one-copy ceiling raw / 2 / 1 KiB (every
  byte goes to the journal and the entry log), as in bench/pulsar_perf.py: it puts the
  cases on one scale with the publish benchmarks.
- CPU: frames/s one core decodes with the broker's codec (a MESSAGE frame: framing,
  CRC32C, protobuf), the kind of work the broker does per entry it dispatches;
  ``entries_ratio_to_cpu_baseline`` is the case's entries/s (msgs/s over the messages
  per batch entry) over that: one dispatched entry against one decoded frame. (The
  baseline's frames carry one 1 KiB message, a case's entries a batch of them: the
  ratio counts per-entry work, not the CRC32C over bigger payloads.)

    python bench/subscriptions_bench.py --out bench/results/subscriptions.json
    python bench/subscriptions_bench.py --quick --out /tmp/subscriptions.json   # smoke run

Default total runtime: about 1.5-3 minutes, estimated (a short run of 150k/150k/300k
messages took 37 s on this machine). A phase that stalls is cut off after
--phase-seconds-max (90 s) and its case recorded as failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import rawclient  # noqa: E402
from cpu_accounting import CpuSampler, group_report  # noqa: E402
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
from tests.cluster import Cluster, python_command  # noqa: E402

MESSAGE_BYTES = 1024
AIMS_MSGS_PER_S = {"shared": 60_000, "fanout": 300_000, "drain": 250_000}
CLIENTS = ("official", "raw")
# Budgets beyond a phase's own work: process start-up (the official client's import
# takes about a second of CPU), subscribing, closing.
SUBSCRIBED_TIMEOUT_S = 60.0
PROCESS_OVERHEAD_S = 60.0
# Shared consumers do not know their share: each stops once nothing came for this long.
SHARED_IDLE_S = 2.0
# The broker applies acknowledgements as they arrive; this bounds the wait for its
# stats to show the last of them.
BACKLOG_SETTLE_S = 5.0


# --- pure helpers ---------------------------------------------------------------------------

def round_up(messages: int, batch_messages: int) -> int:
    """Backlogs are whole batches."""
    return -(-messages // batch_messages) * batch_messages


# Messages the raw producer keeps in flight when not told otherwise: with 10-message
# batches a window of 64 SENDs left the producer waiting on receipts (about 60-85k
# msgs/s here, against 90-120k with 640); 100-message batches gain nothing beyond 64.
# Capped below the broker's 1,000 pending sends per connection, where it stops reading.
WINDOW_MESSAGES = 6_400
WINDOW_ENTRIES_MIN, WINDOW_ENTRIES_MAX = 16, 640


def producer_window(batch_messages: int) -> int:
    return max(WINDOW_ENTRIES_MIN, min(WINDOW_ENTRIES_MAX, WINDOW_MESSAGES // batch_messages))


def raw_producer_argv(service_url: str, topic: str, messages: int, batch_messages: int,
                      window_entries: int) -> list[str]:
    return [sys.executable, os.path.join(BENCH_DIR, "raw_producer.py"), topic, "--service-url", service_url,
            "--messages", str(messages), "--batch-messages", str(batch_messages),
            "--message-bytes", str(MESSAGE_BYTES), "--window-entries", str(window_entries)]


def raw_consumer_argv(service_url: str, topic: str, subscription: str, sub_type: str, *,
                      messages: int | None, idle_timeout_s: float | None, seconds_max: float, permits: int,
                      positions_out: str | None) -> list[str]:
    argv = [sys.executable, os.path.join(BENCH_DIR, "raw_consumer.py"), topic, "--service-url", service_url,
            "-s", subscription, "-t", sub_type, "--initial-position", "earliest", "--seconds", str(seconds_max),
            "--permits", str(permits), "--ack", "individual", "--ack-group-entries", "1", "--wait-for-start"]
    if messages is not None:
        argv += ["--messages", str(messages)]
    if idle_timeout_s is not None:
        argv += ["--idle-timeout-s", str(idle_timeout_s)]
    if positions_out is not None:
        argv += ["--positions-out", positions_out]
    return argv


def official_consumer_argv(service_url: str, topic: str, subscription: str, sub_type: str, *,
                           messages: int | None, idle_timeout_s: float | None, seconds_max: float) -> list[str]:
    argv = python_command("perf", "consume", "--service-url", service_url, topic, "--subscription", subscription,
                          "--subscription-type", sub_type, "--initial-position", "earliest",
                          "--seconds", str(seconds_max), "--progress-interval-s", "0", "--wait-for-start")
    if messages is not None:
        argv += ["--messages", str(messages)]
    if idle_timeout_s is not None:
        argv += ["--idle-timeout-s", str(idle_timeout_s)]
    return argv


def aggregate_consumers(runs: list[dict], message_bytes: int = MESSAGE_BYTES) -> dict:
    """Several consumer processes as one: their messages over the span from the earliest
    first message to the latest last message."""
    return aggregate_runs(runs, "first_message_unix_s", "last_message_unix_s", message_bytes)


def position_check(per_consumer: list[list[tuple[int, int]]], entries_expected: int) -> dict:
    """Entries the consumers of one shared subscription received, together: each
    exactly once is what a shared subscription promises when nobody fails."""
    received = sum(len(positions) for positions in per_consumer)
    distinct = len(set().union(*per_consumer)) if per_consumer else 0
    return {"entries_expected": entries_expected, "entries_received": received, "distinct": distinct,
            "duplicates": received - distinct, "missing": max(0, entries_expected - distinct),
            "ok": distinct == entries_expected and received == distinct}


def acks_confirmed(runs: list[dict]) -> bool:
    """Raw consumers end with an ACK that asks for a response: every one got it. (The
    official client does not say; the broker's backlog of 0 speaks for it.)"""
    return all(run.get("ack_confirmed", True) for run in runs)


def ratios(msgs_per_s: float | None, batch_messages: int, baseline: dict) -> dict:
    """msgs/s against the disk's one-copy ceiling (in 1 KiB messages); entries/s against
    the frames/s one core decodes (per-entry work: see the module docstring)."""
    assert batch_messages >= 1, batch_messages
    if not msgs_per_s:
        return {"entries_per_s": None, "ratio_to_disk_ceiling": None, "entries_ratio_to_cpu_baseline": None}
    entries_per_s = msgs_per_s / batch_messages
    return {"entries_per_s": round(entries_per_s, 1),
            "ratio_to_disk_ceiling": round(msgs_per_s / baseline["disk_ceiling_msgs_per_s"], 4),
            "entries_ratio_to_cpu_baseline": round(entries_per_s / baseline["cpu_codec_frames_per_s"]["mean"], 4)}


def cpu_baseline(seconds: float) -> float:
    """MESSAGE frames per second one core decodes with the broker's codec."""
    from protocol.codec import CommandDecoder, encode_payload_command, wrap
    from protocol.proto import pulsar_api_pb2 as pb

    metadata = pb.MessageMetadata(producer_name="baseline", sequence_id=0, publish_time=1)
    frame = encode_payload_command(
        wrap(pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=2))),
        metadata, os.urandom(MESSAGE_BYTES))
    chunk = frame * 64
    decoder = CommandDecoder()
    frames = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        decoder.feed(chunk)
        while decoder.next_command() is not rawclient.NEED_DATA:
            frames += 1
    return frames / (time.perf_counter() - started)


# --- processes ------------------------------------------------------------------------------------

@dataclass
class ClientProcess:
    name: str
    role: str                   # "producer" or "consumer"
    process: asyncio.subprocess.Process
    stdout: bytes = b""
    stderr: bytes = b""

    async def wait_subscribed(self, timeout_s: float) -> None:
        """Reads stderr up to the subscribed line."""
        self.stderr = await wait_ready(self.process.stderr, self.name, timeout_s)

    async def finish(self, timeout_s: float) -> dict:
        try:
            async with asyncio.timeout(timeout_s):
                stdout, stderr = await self.process.communicate()
        except TimeoutError:
            self.kill()
            await self.process.wait()
            raise RuntimeError(f"{self.name} did not finish in {timeout_s:.0f} s") from None
        self.stdout = stdout
        self.stderr += stderr
        summary = last_json_line(stdout.decode(errors="replace"))
        if self.process.returncode != 0 or summary is None:
            raise RuntimeError(f"{self.name} exited {self.process.returncode}: "
                               f"{self.stderr.decode(errors='replace').strip()[-2000:]}")
        return summary

    def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass


class Bench:
    def __init__(self, args: argparse.Namespace, cluster: Cluster, sampler: CpuSampler, base_dir: str) -> None:
        self.args = args
        self.cluster = cluster
        self.sampler = sampler
        self.base_dir = base_dir
        self.run_id = uuid.uuid4().hex[:8]
        self.broker = cluster.brokers[0]
        self._clients: list[ClientProcess] = []

    def topic(self, case: str) -> str:
        return f"persistent://public/default/subs-{self.run_id}-{case}"

    async def spawn(self, name: str, role: str, argv: list[str], *, stdin: bool) -> ClientProcess:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        client = ClientProcess(name, role, process)
        self._clients.append(client)
        self.sampler.watch(name, process.pid)
        return client

    async def kill_clients(self) -> None:
        """Whatever is still running when the run ends or fails (the processes this
        benchmark started, by their own handles)."""
        for client in self._clients:
            if client.process.returncode is None:
                client.kill()
                await client.process.wait()

    def cpu(self, start_s: float, end_s: float, consumer_names: list[str], producer_names: list[str]) -> dict:
        report = self.sampler.report(start_s, end_s)
        report["by_role"] = group_report(report, {
            "broker": ["broker"], "bookies": [b.name for b in self.cluster.bookies], "etcd": ["etcd"],
            "consumers": consumer_names, "producers": producer_names})
        return report

    # --- phases ---------------------------------------------------------------------------

    async def produce(self, case: str, topic: str, messages: int, batch_messages: int) -> dict:
        name = f"{case}-producer"
        window = self.args.window_entries or producer_window(batch_messages)
        client = await self.spawn(name, "producer", raw_producer_argv(
            self.broker.service_url, topic, messages, batch_messages, window), stdin=False)
        summary = await client.finish(self.args.phase_seconds_max + PROCESS_OVERHEAD_S)
        if summary["messages"] != messages:
            raise RuntimeError(f"{name} had {summary['messages']} of {messages} messages acknowledged")
        summary["cpu"] = self.cpu(summary["started_unix_s"], summary["ended_unix_s"], [], [name])
        print(json.dumps({"case": case, "produce": _brief(summary)}), flush=True)
        return summary

    async def consume(self, case: str, client_kind: str, topic: str,
                      specs: list[tuple[str, str, int | None]]) -> tuple[dict, list[dict], list[str]]:
        """Starts one consumer process per (subscription, type, messages) spec, all at
        once; returns the aggregate, the processes' summaries and their positions files."""
        args = self.args
        url = self.broker.service_url
        clients, positions_files = [], []
        for index, (subscription, sub_type, messages) in enumerate(specs):
            idle = SHARED_IDLE_S if messages is None else None
            name = f"{case}-{client_kind}-consumer-{index}"
            if client_kind == "raw":
                positions_out = os.path.join(self.base_dir, f"{name}-{self.run_id}.positions")
                positions_files.append(positions_out)
                argv = raw_consumer_argv(url, topic, subscription, sub_type, messages=messages, idle_timeout_s=idle,
                                         seconds_max=args.phase_seconds_max, permits=args.raw_permits,
                                         positions_out=positions_out)
            else:
                argv = official_consumer_argv(url, topic, subscription, sub_type, messages=messages,
                                              idle_timeout_s=idle, seconds_max=args.phase_seconds_max)
            clients.append(await self.spawn(name, "consumer", argv, stdin=True))
        await asyncio.gather(*(c.wait_subscribed(SUBSCRIBED_TIMEOUT_S) for c in clients))
        for client in clients:
            client.process.stdin.write(b"go\n")
            client.process.stdin.close()
        runs = await asyncio.gather(*(c.finish(args.phase_seconds_max + PROCESS_OVERHEAD_S) for c in clients))
        result = aggregate_consumers(list(runs))
        names = [c.name for c in clients]
        if result["window_start_unix_s"] is not None:
            result["cpu"] = self.cpu(result["window_start_unix_s"], result["window_end_unix_s"], names, [])
        result["processes"] = list(runs)
        return result, list(runs), positions_files

    async def backlogs(self, topic: str) -> dict[str, int]:
        """msgBacklog (entries) of every subscription of ``topic``, from the admin API;
        waits a little for the last acknowledgements to land."""
        path = urllib.parse.quote(topic.removeprefix("persistent://"))
        url = f"{self.broker.web_service_url}/admin/v2/persistent/{path}/stats"
        deadline = time.monotonic() + BACKLOG_SETTLE_S
        while True:
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
            stats = json.loads(text)
            backlogs = {name: sub["msgBacklog"] for name, sub in stats.get("subscriptions", {}).items()}
            if not any(backlogs.values()) or time.monotonic() >= deadline:
                return backlogs
            await asyncio.sleep(0.2)

    async def restart_broker(self) -> None:
        await self.broker.terminate()
        await self.broker.start()
        self.sampler.watch("broker", self.broker.process.pid)

    # --- cases ------------------------------------------------------------------------------

    def _case_result(self, case: str, client_kind: str, topic: str, batch_messages: int, messages: int,
                     consumed: dict, checks: dict) -> dict:
        msgs_per_s = consumed["msgs_per_s"]
        result = {"case": case, "client": client_kind, "topic": topic, "batch_messages": batch_messages,
                  "backlog_messages": messages, "consume": consumed, "checks": checks,
                  "aim_msgs_per_s": AIMS_MSGS_PER_S[case],
                  "meets_aim": bool(msgs_per_s and msgs_per_s >= AIMS_MSGS_PER_S[case])}
        print(json.dumps({"case": case, "client": client_kind, "msgs_per_s": msgs_per_s,
                          "verdict": consumed.get("cpu", {}).get("verdict"), "checks_ok": checks["ok"]}), flush=True)
        return result

    async def shared_case(self, client_kind: str) -> dict:
        args = self.args
        case = "shared"
        topic = self.topic(f"{case}-{client_kind}")
        messages = round_up(args.shared_messages, args.shared_batch_messages)
        await rawclient.create_subscriptions(self.broker.service_url, topic, [("shared", "shared")])
        produced = await self.produce(case, topic, messages, args.shared_batch_messages)
        consumed, runs, positions_files = await self.consume(
            case, client_kind, topic, [("shared", "shared", None)] * args.shared_consumers)
        checks: dict = {"messages_expected": messages, "messages_received": consumed["messages"],
                        "errors": consumed["errors"], "backlog_after": await self.backlogs(topic)}
        ok = (consumed["errors"] == 0 and consumed["messages"] == messages
              and not any(checks["backlog_after"].values()) and acks_confirmed(runs))
        if positions_files:
            per_consumer = [rawclient.decode_positions(open(path, "rb").read()) for path in positions_files]
            checks["positions"] = position_check(per_consumer, messages // args.shared_batch_messages)
            ok = ok and checks["positions"]["ok"]
        checks["ok"] = ok
        result = self._case_result(case, client_kind, topic, args.shared_batch_messages, messages, consumed, checks)
        result["produce"] = produced
        return result

    async def fanout_case(self, client_kind: str) -> dict:
        args = self.args
        case = "fanout"
        topic = self.topic(f"{case}-{client_kind}")
        messages = round_up(args.fanout_messages, args.fanout_batch_messages)
        subscriptions = [f"fanout-{index}" for index in range(args.fanout_subscriptions)]
        await rawclient.create_subscriptions(self.broker.service_url, topic,
                                             [(name, "exclusive") for name in subscriptions])
        produced = await self.produce(case, topic, messages, args.fanout_batch_messages)
        consumed, runs, _ = await self.consume(case, client_kind, topic,
                                               [(name, "exclusive", messages) for name in subscriptions])
        backlog = await self.backlogs(topic)
        checks = {"messages_expected_each": messages, "messages_per_consumer": consumed["messages_per_process"],
                  "duplicates": sum(run.get("duplicates", 0) for run in runs), "errors": consumed["errors"],
                  "backlog_after": backlog}
        checks["ok"] = (consumed["errors"] == 0 and all(n == messages for n in consumed["messages_per_process"])
                        and checks["duplicates"] == 0 and not any(backlog.values()) and acks_confirmed(runs))
        result = self._case_result(case, client_kind, topic, args.fanout_batch_messages, messages, consumed, checks)
        result["produce"] = produced
        return result

    async def drain_cases(self, client_kinds: list[str]) -> list[dict]:
        """One backlog, a subscription per client kind; the broker restarted before each
        drain so that the entries come from the bookies."""
        args = self.args
        case = "drain"
        topic = self.topic(case)
        messages = round_up(args.drain_messages, args.drain_batch_messages)
        subscriptions = {kind: f"drain-{kind}" for kind in client_kinds}
        await rawclient.create_subscriptions(self.broker.service_url, topic,
                                             [(name, "exclusive") for name in subscriptions.values()])
        produced = await self.produce(case, topic, messages, args.drain_batch_messages)
        results = []
        for kind in client_kinds:
            await self.restart_broker()
            consumed, runs, _ = await self.consume(case, kind, topic, [(subscriptions[kind], "exclusive", messages)])
            backlog = await self.backlogs(topic)
            checks = {"messages_expected": messages, "messages_received": consumed["messages"],
                      "duplicates": sum(run.get("duplicates", 0) for run in runs), "errors": consumed["errors"],
                      "backlog_after": backlog[subscriptions[kind]] if subscriptions[kind] in backlog else None}
            checks["ok"] = (consumed["errors"] == 0 and consumed["messages"] == messages
                            and checks["duplicates"] == 0 and checks["backlog_after"] == 0 and acks_confirmed(runs))
            result = self._case_result(case, kind, topic, args.drain_batch_messages, messages, consumed, checks)
            result["entries_from"] = "bookies (broker restarted before the drain: its entry cache was empty)"
            result["produce"] = produced
            results.append(result)
        return results


def _brief(summary: dict) -> dict:
    return {key: summary.get(key) for key in ("messages", "entries", "seconds", "msgs_per_s", "MB_per_s")}


async def guarded(bench: Bench, case: str, client_kinds: list[str], work) -> list[dict]:
    """Runs a case; a failure (a client that exited with an error, a timeout) is
    recorded as the case's result and the run goes on with the next case."""
    try:
        result = await work
    except (RuntimeError, TimeoutError, OSError, rawclient.ProtocolViolation, rawclient.RequestFailed) as error:
        await bench.kill_clients()
        print(json.dumps({"case": case, "clients": client_kinds, "error": f"{type(error).__name__}: {error}"}),
              file=sys.stderr, flush=True)
        return [{"case": case, "client": kind, "error": f"{type(error).__name__}: {error}",
                 "checks": {"ok": False}} for kind in client_kinds]
    return result if isinstance(result, list) else [result]


async def measure_baseline(base_dir: str, args: argparse.Namespace) -> dict:
    disk = await measure_disk(base_dir, args.raw_seconds)
    frames = cpu_baseline(args.cpu_baseline_seconds)
    return {"disk_MB_per_s": disk, "cpu_frames_per_s": frames}


def combine_baselines(before: dict, after: dict) -> dict:
    """The run's baselines from the measurements before and after the cases: the disk
    probes' median (what the ceiling is taken from), the codec's mean."""
    disk = disk_baseline(before["disk_MB_per_s"], after["disk_MB_per_s"])
    frames = (before["cpu_frames_per_s"] + after["cpu_frames_per_s"]) / 2
    one_copy_MB_per_s = disk_ceiling_MB_per_s(disk["median"], 1)
    return {
        "raw_write_fdatasync_MB_per_s": disk,
        "disk_ceiling_msgs_per_s": round(one_copy_MB_per_s * 1e6 / MESSAGE_BYTES),
        "cpu_codec_frames_per_s": {"before": round(before["cpu_frames_per_s"]),
                                   "after": round(after["cpu_frames_per_s"]), "mean": round(frames)},
    }


async def main_async(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    copies = str(args.copies)
    results: dict = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(), "message_bytes": MESSAGE_BYTES,
        "settings": {key: value for key, value in vars(args).items() if key not in ("out", "dir", "keep_data")},
        "cases": [],
    }
    results["settings"].update({"bookies": 2, "brokers": 1, "copies": args.copies})
    sampler = CpuSampler()
    bench = None
    async with bench_cluster("magnetar-subscriptions-bench-", directory=args.dir,
                             keep_data=args.keep_data) as cluster:
        sampler.start()
        try:
            base_dir = cluster.base_dir
            sampler.watch("runner", os.getpid())   # this process: it only waits and reads pipes
            sampler.watch("etcd", cluster.etcd.process.pid)
            await cluster.start_bookies(2)
            for bookie in cluster.bookies:
                sampler.watch(bookie.name, bookie.process.pid)
            [broker] = await cluster.start_brokers(1, extra_args=[
                "--ensemble-size", copies, "--write-quorum", copies, "--ack-quorum", copies,
                *args.broker_args.split()])
            sampler.watch("broker", broker.process.pid)
            before = await measure_baseline(base_dir, args)
            bench = Bench(args, cluster, sampler, base_dir)
            cases = []
            for kind in args.shared_clients:
                cases += await guarded(bench, "shared", [kind], bench.shared_case(kind))
            for kind in args.fanout_clients:
                cases += await guarded(bench, "fanout", [kind], bench.fanout_case(kind))
            if args.drain_clients:
                cases += await guarded(bench, "drain", args.drain_clients, bench.drain_cases(args.drain_clients))
            after = await measure_baseline(base_dir, args)
            baseline = combine_baselines(before, after)
            for case in cases:
                if "error" not in case:
                    case.update(ratios(case["consume"]["msgs_per_s"], case["batch_messages"], baseline))
            results["baseline"] = baseline
            results["cases"] = cases
        finally:
            if bench is not None:
                await bench.kill_clients()
            await sampler.stop()
    results["total_seconds"] = round(time.monotonic() - started, 1)
    return results


def print_table(results: dict) -> None:
    print(f"\n{'case':<7} {'client':<8} {'msgs/s':>10} {'aim':>8} {'met':>4} {'ratio disk':>10} {'ent/cpu':>9} "
          f"{'broker%':>8} {'bookies%':>8} {'clients%':>8} {'producer':>9} {'machine%':>8} {'other%':>7} "
          f"{'checks':>6}")
    for case in results["cases"]:
        if "error" in case:
            print(f"{case['case']:<7} {case['client']:<8} failed: {case['error'][:150]}")
            continue
        consume = case["consume"]
        cpu = consume.get("cpu", {})
        roles = cpu.get("by_role", {})
        print(f"{case['case']:<7} {case['client']:<8} {consume['msgs_per_s'] or '-':>10} "
              f"{case['aim_msgs_per_s']:>8} {'yes' if case['meets_aim'] else 'no':>4} "
              f"{case['ratio_to_disk_ceiling'] or '-':>10} {case['entries_ratio_to_cpu_baseline'] or '-':>9} "
              f"{roles.get('broker', '-'):>8} {roles.get('bookies', '-'):>8} {roles.get('consumers', '-'):>8} "
              f"{case['produce']['msgs_per_s']:>9} {cpu.get('machine_busy_pct', '-'):>8} "
              f"{cpu.get('other_load_pct', '-'):>7} {'ok' if case['checks']['ok'] else 'FAIL':>6}")
    for case in results["cases"]:
        if "error" in case:
            continue
        verdict = case["consume"].get("cpu", {}).get("verdict", "-")
        print(f"  {case['case']}/{case['client']}: {verdict}")
    baseline = results.get("baseline")
    if baseline:
        raw = baseline["raw_write_fdatasync_MB_per_s"]
        cpu = baseline["cpu_codec_frames_per_s"]
        print(f"baseline: raw write+fdatasync {raw['median']} MB/s (median of {raw['probes_count']} probes, "
              f"{raw['min']}-{raw['max']}) -> one-copy ceiling {baseline['disk_ceiling_msgs_per_s']} msgs/s of "
              f"1 KiB; codec {cpu['before']}/{cpu['after']} frames/s on one core{unstable_note(raw)}")
    print("(msgs/s: acknowledged by the consumers, all processes added up over the case's window; CPU in % of "
          "one core over that window, the machine has "
          f"{results['cpus']} cores; producer: msgs/s of the raw producer that wrote the backlog; other%: "
          "machine load outside the watched processes; ent/cpu: entries/s over the codec's frames/s on one core)")


def parse_clients(text: str) -> list[str]:
    kinds = [kind for kind in text.split(",") if kind]
    for kind in kinds:
        if kind not in CLIENTS:
            raise argparse.ArgumentTypeError(f"unknown client {kind!r}; choose from {', '.join(CLIENTS)}")
    return kinds


QUICK = {"shared_messages": 20_000, "fanout_messages": 20_000, "drain_messages": 50_000,
         "raw_seconds": 1.0, "cpu_baseline_seconds": 0.3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/subscriptions.json")
    parser.add_argument("--copies", type=int, default=1, help="E = Qw = Qa for the topics (default 1: this "
                        "benchmark is about subscriptions, not replication)")
    parser.add_argument("--shared-messages", type=int, default=400_000)
    parser.add_argument("--shared-batch-messages", type=int, default=10)
    parser.add_argument("--shared-consumers", type=int, default=4)
    parser.add_argument("--shared-clients", type=parse_clients, default=["official", "raw"])
    parser.add_argument("--fanout-messages", type=int, default=400_000)
    parser.add_argument("--fanout-batch-messages", type=int, default=100)
    parser.add_argument("--fanout-subscriptions", type=int, default=4)
    parser.add_argument("--fanout-clients", type=parse_clients, default=["raw", "official"])
    parser.add_argument("--drain-messages", type=int, default=1_000_000)
    parser.add_argument("--drain-batch-messages", type=int, default=100)
    parser.add_argument("--drain-clients", type=parse_clients, default=["raw", "official"])
    parser.add_argument("--window-entries", type=int, default=None,
                        help="raw producer: SENDs outstanding (default: about 6,400 messages' worth)")
    parser.add_argument("--raw-permits", type=int, default=10_000, help="raw consumers: receiver queue (messages)")
    parser.add_argument("--phase-seconds-max", type=float, default=90.0,
                        help="a produce or consume phase is cut off after this long")
    parser.add_argument("--raw-seconds", type=float, default=3.0,
                        help="disk baseline duration (several short probes), each time")
    parser.add_argument("--cpu-baseline-seconds", type=float, default=1.0, help="CPU baseline duration, each time")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: small backlogs and short baselines (numbers not meaningful)")
    parser.add_argument("--broker-args", default="",
                        help="extra broker options, e.g. '--dispatch-entries-max 500' (recorded in the results)")
    parser.add_argument("--dir", default=None, help="where the cluster's data goes (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true", help="keep the cluster's data and logs afterwards")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    for key in ("shared_messages", "shared_batch_messages", "shared_consumers", "fanout_messages",
                "fanout_batch_messages", "fanout_subscriptions", "drain_messages", "drain_batch_messages",
                "copies"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.window_entries is not None and args.window_entries < 1:
        parser.error("--window-entries must be >= 1")
    if args.raw_permits < 2:
        parser.error("--raw-permits must be >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    print_table(results)
    print(f"results written to {args.out} (total {results['total_seconds']} s)")
    failed = [f"{case['case']}/{case['client']}" for case in results["cases"] if not case["checks"]["ok"]]
    if failed:
        print(f"checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
