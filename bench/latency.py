"""Latency first (issue 16): the workloads of the issue's table against a real
``magnetar standalone``, through the official ``pulsar-client`` from one Python
process (bench/latency_client.py), with CPU per process and the servers' own per-stage
histograms, against baselines measured in the same run.

Systems measured, each a fresh ``magnetar standalone`` on free loopback ports:
- ``1x1``: ``--bookies 1 --copies 1`` (the issue's table);
- ``3x2``: the default standalone (3 bookies, 2 copies: what ``make run`` gives).
With ``--baseline-rev REV`` the same configurations are also run from a copy of that
revision (``git archive``, protos generated), interleaved with the current tree in the
same run (before/after on the same machine minutes apart, not days); which of the two
runs first alternates between repeats.

Workloads (bench/latency_client.py): durable ack one message at a time; end-to-end at
a fixed 1,000 msgs/s, scheduled by intended send time (no coordinated omission);
publish with at most 1,000 awaiting their receipt; drain (1 consumer), work queue (4
shared consumers, per-message ack), fan-out (4 subscriptions) of the published backlog
(drain and fan-out with ``batch_receive`` and a cumulative ack per batch unless
``--consume per-message``).

Baselines, measured in each repeat before the systems run:
- ``fdatasync``: a 1 KiB write + fdatasync round on the data directory's disk, the
  floor of any durable acknowledgement (p50 / p99 over ``FSYNC_ROUNDS``);
- ``tcp_echo``: a 1 KiB request / reply round trip over loopback between two threads
  of one process (p50 / p99 over ``ECHO_ROUNDS``), the floor of any networked call.
Ratios: durable-ack p50 over fdatasync p50 + TCP echo p50 (one round trip and one
fsync: what a perfect single-copy path costs), end-to-end p50 likewise.

CPU per process (bench/cpu_accounting.py) over each workload's window: etcd, each
bookie, the broker, the gateway, the client.

With ``--repeat N`` everything runs N times; the report shows medians.

    python bench/latency.py --out bench/results/latency.json --report bench/results/latency.md
    python bench/latency.py --baseline-rev main --repeat 3   # before/after in one run

Default total runtime: about 2-3 minutes (one repeat, both configurations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, REPO_DIR)
sys.path.insert(0, BENCH_DIR)

from cpu_accounting import CpuSampler  # noqa: E402
from harness import last_json_line  # noqa: E402
from tests.cluster import contiguous_free_ports  # noqa: E402

from magnetar.tools.latency_histogram import LatencyHistogram  # noqa: E402

CONFIGS = {"1x1": (1, 1), "3x2": (3, 2)}
FSYNC_ROUNDS = 500
# The rest before each sync of the second fdatasync baseline (the durable ack's pace).
FSYNC_IDLE_S = 0.001
ECHO_ROUNDS = 2000
MESSAGE_BYTES = 1024
READY_TIMEOUT_S = 90.0
CLIENT_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
WORKLOADS = ("durable_ack", "raw_durable_ack", "e2e", "raw_e2e", "publish", "drain", "work_queue", "fanout",
             "raw_publish", "raw_drain", "raw_work_queue", "raw_fanout", "publish_each")


# --- baselines ---------------------------------------------------------------------------------

def fdatasync_baseline(directory: str, rounds: int = FSYNC_ROUNDS, *, idle_s: float = 0.0) -> dict:
    """Appends and fdatasyncs 1 KiB, ``rounds`` times, back to back, or each after
    ``idle_s`` of rest: on this machine a sync after a rest is slower (~0.08 ms back to
    back, ~0.15 ms after 1 ms, ~0.23 ms after 5 ms), and one-at-a-time workloads (the
    durable ack) sync after rests."""
    path = os.path.join(directory, "fdatasync-probe")
    block = os.urandom(MESSAGE_BYTES)
    histogram = LatencyHistogram()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(rounds):
            if idle_s:
                time.sleep(idle_s)
            started = time.perf_counter_ns()
            os.write(fd, block)
            os.fdatasync(fd)
            histogram.record((time.perf_counter_ns() - started) // 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    return histogram.summary_ms()


def tcp_echo_baseline(rounds: int = ECHO_ROUNDS) -> dict:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def echo() -> None:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with connection:
            while True:
                data = connection.recv(65536)
                if not data:
                    return
                connection.sendall(data)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    block = os.urandom(MESSAGE_BYTES)
    histogram = LatencyHistogram()
    try:
        for _ in range(rounds):
            started = time.perf_counter_ns()
            client.sendall(block)
            received = 0
            while received < len(block):
                received += len(client.recv(65536))
            histogram.record((time.perf_counter_ns() - started) // 1000)
    finally:
        client.close()
        thread.join(5)
        listener.close()
    return histogram.summary_ms()


# --- a standalone --------------------------------------------------------------------------------

def children_of(pid: int) -> dict[str, int]:
    """The standalone's children by role (etcd, bookie-n, broker, gateway)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except (OSError, ValueError):
            continue
        words = [word.decode(errors="replace") for word in argv]
        if "bookie" in words:
            port = words[words.index("--port") + 1]
            found[f"bookie@{port}"] = int(entry)
        elif "broker" in words:
            found["broker"] = int(entry)
        elif "gateway" in words:
            found["gateway"] = int(entry)
        elif "autorecovery" in words:
            found["autorecovery"] = int(entry)
        elif any("etcd" in os.path.basename(word) for word in words[:1]):
            found["etcd"] = int(entry)
    # Bookies by port order: bookie-0, bookie-1, ...
    bookies = sorted((name for name in found if name.startswith("bookie@")), key=lambda n: int(n.split("@")[1]))
    for index, name in enumerate(bookies):
        found[f"bookie-{index}"] = found.pop(name)
    return found


class Standalone:
    def __init__(self, tree: str, base_dir: str, bookies: int, copies: int, env: dict[str, str] | None = None) -> None:
        self.tree = tree
        self.extra_env = env or {}
        self.data_dir = os.path.join(base_dir, "data")
        self.bookies = bookies
        self.copies = copies
        self.process: subprocess.Popen | None = None
        self.ready: dict = {}
        # Below the kernel's ephemeral range (tests/cluster.py): a port picked there cannot
        # be taken, between the pick and the standalone's bind, as an outgoing connection's.
        block = contiguous_free_ports(8 + 2 * bookies)
        self.ports = {"etcd": block, "etcd_peer": block + 1, "broker": block + 2, "broker_http": block + 3,
                      "gateway": block + 4, "autorecovery": block + 5, "bookie": block + 8, "bookie_http": block + 8 + bookies}
        self.log_path = os.path.join(base_dir, "standalone.log")

    def start(self) -> None:
        ports = self.ports
        argv = [sys.executable, "-m", "magnetar", "standalone", "--data-dir", self.data_dir,
                "--bookies", str(self.bookies), "--copies", str(self.copies),
                "--etcd-port", str(ports["etcd"]), "--etcd-peer-port", str(ports["etcd_peer"]),
                "--broker-port", str(ports["broker"]), "--broker-http-port", str(ports["broker_http"]),
                "--gateway-port", str(ports["gateway"]), "--bookie-port-base", str(ports["bookie"]),
                "--bookie-http-port-base", str(ports["bookie_http"])]
        # Trees older than the standalone's auto-recovery child (--baseline-rev) lack the flag.
        with open(os.path.join(self.tree, "magnetar", "standalone.py"), encoding="utf-8") as source:
            if "--autorecovery-http-port" in source.read():
                argv += ["--autorecovery-http-port", str(ports["autorecovery"])]
        env = {**os.environ, "PYTHONPATH": self.tree, **self.extra_env}
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(argv, cwd=self.tree, stdout=subprocess.PIPE, stderr=log_file, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                # The data directory (and the log with it) is removed after a failed run.
                with open(self.log_path, encoding="utf-8", errors="replace") as log_file:
                    tail = log_file.read()[-2000:]
                raise RuntimeError(f"standalone exited ({self.process.poll()}); its log ends:\n{tail}")
            try:
                document = json.loads(line)
            except ValueError:
                continue
            if isinstance(document, dict) and document.get("event") == "standalone ready":
                self.ready = document
                # Keep reading its stdout so the pipe never fills.
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return
        raise RuntimeError(f"standalone not ready in {READY_TIMEOUT_S}s; see {self.log_path}")

    @property
    def metrics_urls(self) -> list[str]:
        urls = [f"{self.ready['admin_url']}/metrics"]
        urls += [f"http://127.0.0.1:{self.ports['bookie_http'] + n}/metrics" for n in range(self.bookies)]
        return urls

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)   # its children die with it (PDEATHSIG)
            process.wait(10)


# --- one system -----------------------------------------------------------------------------------

async def run_system(args: argparse.Namespace, tree: str, build: str, config: str,
                     env: dict[str, str] | None = None) -> dict:
    bookies, copies = CONFIGS[config]
    base_dir = tempfile.mkdtemp(prefix=f"magnetar-latency-{build}-{config}-", dir=args.dir)
    standalone = Standalone(tree, base_dir, bookies, copies, env)
    sampler = CpuSampler()
    result: dict = {"build": build, "config": config, "bookies": bookies, "copies": copies}
    try:
        await asyncio.to_thread(standalone.start)
        for name, pid in children_of(standalone.process.pid).items():
            sampler.watch(name, pid)
        sampler.start()
        argv = [sys.executable, os.path.join(BENCH_DIR, "latency_client.py"),
                "--service-url", standalone.ready["service_url"],
                "--ack-messages", str(args.ack_messages), "--e2e-seconds", str(args.e2e_seconds),
                "--publish-seconds", str(args.publish_seconds), "--rate", str(args.rate),
                "--consume", getattr(args, "consume", "batch")]
        for url in standalone.metrics_urls:
            argv += ["--metrics-url", url]
        client = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                      stderr=asyncio.subprocess.PIPE)
        sampler.watch("client", client.pid)
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                stdout, stderr = await client.communicate()
        except TimeoutError:
            client.kill()
            await client.wait()
            raise RuntimeError(f"{build} {config}: the client did not finish in {CLIENT_TIMEOUT_S}s") from None
        summary = last_json_line(stdout.decode())
        if client.returncode != 0 or summary is None:
            raise RuntimeError(f"{build} {config}: client exited {client.returncode}: "
                               f"{stderr.decode(errors='replace')[-3000:]}")
        for workload in WORKLOADS:
            measured = summary[workload]
            start, end = measured.get("started_unix_s"), measured.get("ended_unix_s")
            if start and end and end > start:
                measured["cpu"] = sampler.report(start, end)
            result[workload] = measured
    finally:
        await sampler.stop()
        await asyncio.to_thread(standalone.stop)
        if args.keep_data:
            print(f"kept {base_dir}", file=sys.stderr)
        else:
            shutil.rmtree(base_dir, ignore_errors=True)
    return result


def prepare_baseline_tree(rev: str, directory: str) -> str:
    """A copy of revision ``rev`` of this repository, with its protos generated."""
    tree = tempfile.mkdtemp(prefix="magnetar-baseline-", dir=directory)
    archive = subprocess.run(["git", "-C", REPO_DIR, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    for name in os.listdir(os.path.join(tree, "protocol", "proto")):
        if name.endswith(".proto"):
            subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
                            "--grpc_python_out=.", f"protocol/proto/{name}"], cwd=tree, check=True)
    return tree


# --- the whole run --------------------------------------------------------------------------------

def headline(system: dict) -> dict:
    """The numbers of the issue's table, from one system's run."""
    def get(workload: str, *path):
        value = system.get(workload)
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return {
        "publish_msgs_per_s": get("publish", "msgs_per_s"),
        "e2e_p50_ms": get("e2e", "latency_ms", "p50"), "e2e_p99_ms": get("e2e", "latency_ms", "p99"),
        "e2e_p999_ms": get("e2e", "latency_ms", "p99.9"),
        "ack_p50_ms": get("durable_ack", "latency_ms", "p50"), "ack_p99_ms": get("durable_ack", "latency_ms", "p99"),
        "ack_p999_ms": get("durable_ack", "latency_ms", "p99.9"),
        "raw_ack_p50_ms": get("raw_durable_ack", "latency_ms", "p50"),
        "raw_ack_p99_ms": get("raw_durable_ack", "latency_ms", "p99"),
        "drain_msgs_per_s": get("drain", "msgs_per_s"), "work_queue_msgs_per_s": get("work_queue", "msgs_per_s"),
        "fanout_msgs_per_s": get("fanout", "msgs_per_s"),
        "publish_each_msgs_per_s": get("publish_each", "msgs_per_s"),
        "raw_e2e_p50_ms": get("raw_e2e", "latency_ms", "p50"), "raw_e2e_p99_ms": get("raw_e2e", "latency_ms", "p99"),
        "raw_publish_msgs_per_s": get("raw_publish", "msgs_per_s"),
        "raw_drain_msgs_per_s": get("raw_drain", "msgs_per_s"),
        "raw_work_queue_msgs_per_s": get("raw_work_queue", "msgs_per_s"),
        "raw_fanout_msgs_per_s": get("raw_fanout", "msgs_per_s"),
    }


def medians(rows: list[dict]) -> dict:
    keys = rows[0].keys()
    out = {}
    for key in keys:
        values = [row[key] for row in rows if row.get(key) is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    return out


def problems(system: dict) -> list[str]:
    found = []
    tag = f"{system['build']} {system['config']}"
    for workload in WORKLOADS:
        measured = system.get(workload, {})
        if measured.get("errors"):
            found.append(f"{tag} {workload}: {measured['errors']} errors")
        if measured.get("complete") is False:
            found.append(f"{tag} {workload}: incomplete ({measured.get('messages')} of "
                         f"{measured.get('expected', measured.get('received'))})")
    return found


async def main_async(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    common_env = dict(item.split("=", 1) for item in args.env)
    trees = [("current", REPO_DIR, dict(common_env))]
    scratch = tempfile.mkdtemp(prefix="magnetar-latency-trees-", dir=args.dir)
    try:
        if args.baseline_rev or args.baseline_env:
            baseline_env = {**common_env, **dict(item.split("=", 1) for item in args.baseline_env)}
            tree = (prepare_baseline_tree(args.baseline_rev, scratch) if args.baseline_rev not in (None, "current")
                    else REPO_DIR)
            trees.insert(0, ("baseline", tree, baseline_env))
        runs = []
        for repeat in range(args.repeat):
            probe_dir = tempfile.mkdtemp(prefix="magnetar-latency-probe-", dir=args.dir)
            try:
                baselines = {"fdatasync_ms": await asyncio.to_thread(fdatasync_baseline, probe_dir),
                             "fdatasync_after_1ms_idle_ms": await asyncio.to_thread(
                                 fdatasync_baseline, probe_dir, idle_s=FSYNC_IDLE_S),
                             "tcp_echo_ms": await asyncio.to_thread(tcp_echo_baseline)}
            finally:
                shutil.rmtree(probe_dir, ignore_errors=True)
            systems = []
            # The order alternates between repeats: a build always run first (right after
            # the probes, on a cooler page cache and disk) would carry that as a bias.
            ordered = trees if repeat % 2 == 0 else trees[::-1]
            for config in args.configs:
                for build, tree, env in ordered:
                    system = await run_system(args, tree, build, config, env)
                    system["headline"] = headline(system)
                    systems.append(system)
                    print(json.dumps({"repeat": repeat, "build": build, "config": config,
                                      **system["headline"]}), flush=True)
            runs.append({"repeat": repeat, "baselines": baselines, "systems": systems})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
               "settings": {"message_bytes": MESSAGE_BYTES, "batching": True, "batch_max_delay_ms": 1,
                            "max_pending": 1000, "rate": args.rate, "e2e_seconds": args.e2e_seconds,
                            "publish_seconds": args.publish_seconds, "ack_messages": args.ack_messages,
                            "repeat": args.repeat, "configs": args.configs,
                            "baseline_rev": args.baseline_rev, "baseline_env": args.baseline_env,
                            "env": args.env},
               "runs": runs}
    results["summary"] = summarize(results, [build for build, _, _ in trees])
    results["total_seconds"] = round(time.monotonic() - started, 1)
    return results


def summarize(results: dict, builds: list[str]) -> dict:
    """Medians over the repeats per (build, config), with ratios to the baselines of the
    same run and, with a baseline build, current over baseline."""
    runs = results["runs"]
    fsync_p50 = statistics.median(run["baselines"]["fdatasync_ms"]["p50"] for run in runs)
    echo_p50 = statistics.median(run["baselines"]["tcp_echo_ms"]["p50"] for run in runs)
    floor_ms = fsync_p50 + echo_p50
    idle_rows = [run["baselines"]["fdatasync_after_1ms_idle_ms"]["p50"] for run in runs
                 if "fdatasync_after_1ms_idle_ms" in run["baselines"]]
    summary: dict = {"baselines": {"fdatasync_p50_ms": fsync_p50, "tcp_echo_p50_ms": echo_p50,
                                   "fdatasync_after_1ms_idle_p50_ms": statistics.median(idle_rows) if idle_rows else None,
                                   "floor_p50_ms": round(floor_ms, 3)}, "systems": {}}
    for config in results["settings"]["configs"]:
        for build in builds:
            rows = [system["headline"] for run in runs for system in run["systems"]
                    if system["build"] == build and system["config"] == config]
            if not rows:
                continue
            median = medians(rows)
            median["ack_p50_over_floor"] = (round(median["ack_p50_ms"] / floor_ms, 2)
                                            if median["ack_p50_ms"] and floor_ms else None)
            median["e2e_p50_over_floor"] = (round(median["e2e_p50_ms"] / floor_ms, 2)
                                            if median["e2e_p50_ms"] and floor_ms else None)
            # The stage breakdown and CPU of the last repeat's run, for the report.
            last = [system for system in runs[-1]["systems"] if system["build"] == build
                    and system["config"] == config][0]
            median["stages"] = {workload: last[workload].get("stages", {}) for workload in WORKLOADS}
            median["cpu"] = {workload: last[workload].get("cpu", {}).get("processes", {}) for workload in WORKLOADS}
            median["verdict"] = {workload: last[workload].get("cpu", {}).get("verdict") for workload in WORKLOADS}
            summary["systems"][f"{build} {config}"] = median
    if "baseline" in builds:
        ratios = {}
        for config in results["settings"]["configs"]:
            now, before = summary["systems"].get(f"current {config}"), summary["systems"].get(f"baseline {config}")
            if not now or not before:
                continue
            ratios[config] = {key: round(now[key] / before[key], 3) for key in headline({}).keys()
                              if now.get(key) and before.get(key)}
        summary["current_over_baseline"] = ratios
    return summary


HEADLINE_ROWS = [("publish msgs/s", "publish_msgs_per_s"), ("e2e @rate p50 ms", "e2e_p50_ms"),
                 ("e2e @rate p99 ms", "e2e_p99_ms"), ("e2e @rate p99.9 ms", "e2e_p999_ms"),
                 ("durable ack p50 ms", "ack_p50_ms"), ("durable ack p99 ms", "ack_p99_ms"),
                 ("durable ack p99.9 ms", "ack_p999_ms"), ("raw-client durable ack p50 ms", "raw_ack_p50_ms"),
                 ("raw-client durable ack p99 ms", "raw_ack_p99_ms"), ("drain msgs/s", "drain_msgs_per_s"),
                 ("work queue msgs/s", "work_queue_msgs_per_s"), ("fan-out msgs/s", "fanout_msgs_per_s"),
                 ("publish msgs/s, a receipt callback per message", "publish_each_msgs_per_s"),
                 ("raw-client e2e @rate p50 ms", "raw_e2e_p50_ms"), ("raw-client e2e @rate p99 ms", "raw_e2e_p99_ms"),
                 ("raw-client publish msgs/s", "raw_publish_msgs_per_s"),
                 ("raw-client drain msgs/s", "raw_drain_msgs_per_s"),
                 ("raw-client work queue msgs/s", "raw_work_queue_msgs_per_s"),
                 ("raw-client fan-out msgs/s", "raw_fanout_msgs_per_s"),
                 ("ack p50 / floor", "ack_p50_over_floor"), ("e2e p50 / floor", "e2e_p50_over_floor")]


def report_markdown(results: dict) -> str:
    summary = results["summary"]
    names = list(summary["systems"])
    base = summary["baselines"]
    lines = [f"# Latency benchmark ({results['date']}, {results['settings']['repeat']} repeat(s), medians)", "",
             f"Baselines of the same run: 1 KiB write + fdatasync p50 {base['fdatasync_p50_ms']} ms, "
             f"1 KiB loopback TCP echo p50 {base['tcp_echo_p50_ms']} ms; floor = their sum "
             f"{base['floor_p50_ms']} ms. The same fdatasync after 1 ms of rest (the durable ack's "
             f"pace): p50 {base.get('fdatasync_after_1ms_idle_p50_ms')} ms.", "",
             *([f"Environment of every build: {' '.join(settings_env)}; of the baseline also: "
                f"{' '.join(results['settings'].get('baseline_env') or []) or '-'} "
                f"(baseline revision: {results['settings'].get('baseline_rev') or 'this tree'}).", ""]
               if (settings_env := results["settings"].get("env")) else []),
             "| workload | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key in HEADLINE_ROWS:
        lines.append(f"| {label} | " + " | ".join(str(summary["systems"][n].get(key)) for n in names) + " |")
    if "current_over_baseline" in summary:
        lines += ["", "Current over baseline (same run):", ""]
        for config, ratios in summary["current_over_baseline"].items():
            lines.append(f"- {config}: " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
    for name in names:
        system = summary["systems"][name]
        lines += ["", f"## {name}: stages (mean / p50 / p99 ms, from the servers' histograms) and CPU", ""]
        for workload in ("durable_ack", "raw_durable_ack", "e2e", "publish", "fanout"):
            stages = system["stages"].get(workload) or {}
            cells = ", ".join(f"{key} {_pause_count(key, s)}{s['mean_ms']}/{s.get('p50_ms', '-')}/{s.get('p99_ms', '-')}"
                              for key, s in stages.items())
            lines.append(f"- {workload}: {cells or '-'}")
        lines.append("")
        for workload in WORKLOADS:
            cpu = system["cpu"].get(workload) or {}
            cells = ", ".join(f"{proc} {value['cpu_pct']}%" for proc, value in sorted(cpu.items()))
            lines.append(f"- CPU {workload}: {cells or '-'} ({system['verdict'].get(workload)})")
    return "\n".join(lines) + "\n"


def _pause_count(key: str, stage: dict) -> str:
    """GC pauses are shown with how many there were ("12x 0.3/0.25/0.9")."""
    return f"{stage['samples']}x " if key.endswith("_gc_pause") and "samples" in stage else ""


def compact(results: dict) -> dict:
    """What a stage measures is said once (``stage_meanings``), not in every workload's
    breakdown: the results file stays a few hundred kilobytes smaller."""
    meanings = {}
    for run in results["runs"]:
        for system in run["systems"]:
            for workload in WORKLOADS:
                for key, stage in (system.get(workload, {}).get("stages") or {}).items():
                    if "what" in stage:
                        meanings[key] = stage.pop("what")
    for system in results.get("summary", {}).get("systems", {}).values():
        for stages in system.get("stages", {}).values():
            for key, stage in stages.items():
                if "what" in stage:
                    meanings[key] = stage.pop("what")
    results["stage_meanings"] = meanings
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/latency.json")
    parser.add_argument("--report", default="bench/results/latency.md")
    parser.add_argument("--configs", type=lambda text: text.split(","), default=["1x1", "3x2"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline-rev", default=None,
                        help="also run this git revision of the repository, interleaved (before/after)")
    parser.add_argument("--baseline-env", action="append", default=[],
                        help="KEY=VALUE for the baseline's processes (repeat); with no --baseline-rev (or "
                             "'current') the baseline is this tree, e.g. MAGNETAR_EVENT_LOOP=asyncio")
    parser.add_argument("--env", action="append", default=[],
                        help="KEY=VALUE for every build's processes (repeat), e.g. MAGNETAR_ENTRY_CACHE_MIB=16 "
                             "for a broker whose backlog reads go to the bookies")
    parser.add_argument("--ack-messages", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--publish-seconds", type=float, default=4.0)
    parser.add_argument("--consume", choices=["batch", "per-message"], default="batch",
                        help="drain and fan-out consumption (bench/latency_client.py)")
    parser.add_argument("--dir", default=None, help="where data goes (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true")
    args = parser.parse_args()
    for config in args.configs:
        if config not in CONFIGS:
            parser.error(f"--configs: {config} is not one of {sorted(CONFIGS)}")
    results = asyncio.run(main_async(args))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    report = report_markdown(results)
    with open(args.out, "w") as handle:
        json.dump(compact(results), handle, indent=1)
    with open(args.report, "w") as handle:
        handle.write(report)
    print(report)
    print(f"results written to {args.out} and {args.report} (total {results['total_seconds']} s)")
    found = [problem for run in results["runs"] for system in run["systems"] for problem in problems(system)]
    if found:
        print("the run was not correct:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
