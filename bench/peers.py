"""Magnetar against its peers in one run (issue 16): the workloads of bench/latency.py
against Redis (Streams, AOF ``appendfsync always``), NATS JetStream (file storage, the
default sync interval and, where the server knows it, ``sync_interval: always``),
RabbitMQ (quorum queues, publisher confirms) and ``magnetar standalone`` 1x1 and 3x2,
each from one Python process with its usual client (bench/peer_clients.py; Magnetar
through bench/latency.py's harness and the official ``pulsar-client``).

Theory of operation:
- Every repeat measures the baselines (1 KiB write + fdatasync on the data disk, 1 KiB
  loopback echo), then runs every system once, in an order rotated by one each repeat
  (interleaved: a burst of the machine's other load does not land on one system
  only). Each system gets a fresh server (bench/peer_servers.py: free loopback ports,
  its own temporary data directory, the whole process tree stopped afterwards) and a
  fresh client process; CPU per process is accounted over each workload's window
  (bench/cpu_accounting.py).
- The report (``summary``, ``report_markdown``; pure) shows medians over the repeats
  per system, the best peer per workload (highest rate, lowest latency), Magnetar 1x1
  and 3x2 over it, and the issue's aims, each read from the medians and counted per
  repeat ("met in k of N").
- A peer that does not start (or whose client fails) is skipped, and the report says
  so in a line of its own with the reason; a peer whose server binary is missing
  stops the run before anything starts (``make bench-peers-setup`` installs them).

    python bench/peers.py --repeat 3 --out bench/results/peers.json --report bench/results/peers.md
    python bench/peers.py --merge a.json b.json --out peers.json --report peers.md   # pool runs
    python bench/peers.py --from-json peers.json --report peers.md                   # report again

About 4-5 minutes a repeat here (RabbitMQ's boot and its slow Python client are half of it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, REPO_DIR)
sys.path.insert(0, BENCH_DIR)

import latency  # noqa: E402
import path_skeleton  # noqa: E402
from cpu_accounting import CpuSampler  # noqa: E402
from harness import last_json_line  # noqa: E402
from peer_servers import PeerServer, missing_binaries, server_versions, stop_all  # noqa: E402

CLIENT_TIMEOUT_S = 300.0
MAGNETAR = ("magnetar-1x1", "magnetar-3x2")
PEERS = ("redis", "nats", "nats-sync-always", "rabbitmq")
SYSTEMS = MAGNETAR + PEERS
LABELS = {
    "magnetar-1x1": "Magnetar 1x1", "magnetar-3x2": "Magnetar 3x2 (default)",
    "redis": "Redis AOF always", "nats": "NATS JetStream (default sync: no fsync per ack)",
    "nats-sync-always": "NATS JetStream (sync_interval always)", "rabbitmq": "RabbitMQ quorum",
}
CLIENT_OF = {"redis": "redis", "nats": "nats", "nats-sync-always": "nats", "rabbitmq": "rabbitmq"}
PYTHON_CLIENTS = {"redis": "redis", "nats": "nats", "rabbitmq": "aio_pika"}
WORKLOADS = ("durable_ack", "e2e", "publish", "drain", "work_queue", "fanout")
# Magnetar's alone (bench/latency_client.py): its publish with a receipt callback per
# message, the official client's own per-message cost, and the workloads through the raw
# protocol client (bench/latency_raw.py), the servers' capacity; no peer runs them.
MAGNETAR_ONLY_WORKLOADS = ("publish_each", "raw_e2e", "raw_publish", "raw_drain", "raw_work_queue", "raw_fanout")

# (row label, headline key, higher is better)
ROWS = [
    ("publish msgs/s", "publish_msgs_per_s", True),
    ("e2e @1,000/s p50 ms", "e2e_p50_ms", False),
    ("e2e @1,000/s p99 ms", "e2e_p99_ms", False),
    ("e2e @1,000/s p99.9 ms", "e2e_p999_ms", False),
    ("durable ack p50 ms", "ack_p50_ms", False),
    ("durable ack p99 ms", "ack_p99_ms", False),
    ("drain msgs/s (1 consumer)", "drain_msgs_per_s", True),
    ("work queue msgs/s (4 consumers, per-message ack)", "work_queue_msgs_per_s", True),
    ("fan-out delivered msgs/s (4 subscriptions)", "fanout_msgs_per_s", True),
    ("publish msgs/s, a receipt callback per message (Magnetar only)", "publish_each_msgs_per_s", True),
    ("raw-client e2e @1,000/s p99 ms (Magnetar only)", "raw_e2e_p99_ms", False),
    ("raw-client publish msgs/s (Magnetar only)", "raw_publish_msgs_per_s", True),
    ("raw-client drain msgs/s (Magnetar only)", "raw_drain_msgs_per_s", True),
    ("raw-client work queue msgs/s (Magnetar only)", "raw_work_queue_msgs_per_s", True),
    ("raw-client fan-out msgs/s (Magnetar only)", "raw_fanout_msgs_per_s", True),
]


# --- the report (pure) -----------------------------------------------------------------------------


def _median_or_none(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


# The end-to-end skeleton (bench/path_skeleton.py) per repeat: seconds per hold, and the
# hold that stands for the official client's batch timer (bench/latency_client.py's
# --batch-delay-ms default, which the Magnetar runs use).
SKELETON_E2E_SECONDS = 3.0
CLIENT_BATCH_DELAY_MS = 1
SKELETON_HOLD_KEY = f"hold_{CLIENT_BATCH_DELAY_MS:g}ms"


def best_peer(values: dict[str, float | None], higher_is_better: bool) -> tuple[str, float] | None:
    """The best of the peers' values (Magnetar's are not among them)."""
    candidates = [(value, name) for name, value in values.items() if name not in MAGNETAR and value is not None]
    if not candidates:
        return None
    value, name = (max if higher_is_better else min)(candidates, key=lambda pair: pair[0])
    return name, value


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return round(value / reference, 3)


def aims(headlines: dict[str, dict]) -> list[dict]:
    """The issue's aims, read from one set of headlines (medians, or one repeat's)."""
    one = headlines.get("magnetar-1x1") or {}
    three = headlines.get("magnetar-3x2") or {}

    def best(key: str, higher: bool):
        found = best_peer({name: row.get(key) for name, row in headlines.items()}, higher)
        return found[1] if found else None

    def check(name: str, value, reference, met) -> dict:
        ok = None if value is None or reference is None else met(value, reference)
        return {"aim": name, "value": value, "reference": reference, "met": ok}

    out = [check("durable ack p50 <= 1.0 ms (1x1)", one.get("ack_p50_ms"), 1.0, lambda v, r: v <= r),
           check("e2e p99 at 1,000/s <= best peer's p99 (1x1)", one.get("e2e_p99_ms"), best("e2e_p99_ms", False),
                 lambda v, r: v <= r)]
    for label, key in (("publish", "publish_msgs_per_s"), ("drain", "drain_msgs_per_s"),
                       ("fan-out", "fanout_msgs_per_s")):
        out.append(check(f"{label} >= best peer (1x1)", one.get(key), best(key, True), lambda v, r: v >= r))
    out.append(check("work queue ahead of the best peer (1x1)", one.get("work_queue_msgs_per_s"),
                     best("work_queue_msgs_per_s", True), lambda v, r: v > r))
    out.append(check("3x2 e2e p99 <= 2x the 1x1's", three.get("e2e_p99_ms"),
                     None if one.get("e2e_p99_ms") is None else 2 * one["e2e_p99_ms"], lambda v, r: v <= r))
    out.append(check("3x2 publish >= 50% of the 1x1's", three.get("publish_msgs_per_s"),
                     None if one.get("publish_msgs_per_s") is None else 0.5 * one["publish_msgs_per_s"],
                     lambda v, r: v >= r))
    return out


def summarize(runs: list[dict]) -> dict:
    """Medians per system over the repeats it ran in, the best peer and Magnetar's
    ratios per row, and the aims from the medians with a per-repeat count."""
    names = [name for name in SYSTEMS if any(name in run["systems"] for run in runs)]
    medians = {name: latency.medians([{**valid_headline(run["systems"][name]),
                                       "other_load_pct": other_load_pct(run["systems"][name])}
                                      for run in runs if name in run["systems"]])
               for name in names}
    rows = []
    for label, key, higher in ROWS:
        values = {name: medians[name].get(key) for name in names}
        best = best_peer(values, higher)
        rows.append({"row": label, "key": key, "higher_is_better": higher, "values": values,
                     "best_peer": best[0] if best else None, "best_peer_value": best[1] if best else None,
                     "magnetar_1x1_over_best": ratio(values.get("magnetar-1x1"), best[1] if best else None),
                     "magnetar_3x2_over_best": ratio(values.get("magnetar-3x2"), best[1] if best else None)})
    from_medians = aims(medians)
    per_repeat = [aims({name: valid_headline(system) for name, system in run["systems"].items()}) for run in runs]
    for index, aim in enumerate(from_medians):
        verdicts = [repeat[index]["met"] for repeat in per_repeat if repeat[index]["met"] is not None]
        aim["met_in_repeats"] = f"{sum(verdicts)} of {len(verdicts)}"
    baselines = {"fdatasync_p50_ms": statistics.median(run["baselines"]["fdatasync_ms"]["p50"] for run in runs),
                 "fdatasync_p99_ms": statistics.median(run["baselines"]["fdatasync_ms"]["p99"] for run in runs),
                 "tcp_echo_p50_ms": statistics.median(run["baselines"]["tcp_echo_ms"]["p50"] for run in runs),
                 "fdatasync_after_1ms_idle_p50_ms": _median_or_none(
                     run["baselines"]["fdatasync_after_1ms_idle_ms"]["p50"] for run in runs
                     if "fdatasync_after_1ms_idle_ms" in run["baselines"]),
                 **{f"path_skeleton_{shape}_p50_ms": _median_or_none(
                     run["baselines"]["path_skeleton_ms"][shape]["p50"] for run in runs
                     if "path_skeleton_ms" in run["baselines"]) for shape in ("three_process", "one_process")},
                 **{f"path_skeleton_e2e_{hold}_{quantile}_ms": _median_or_none(
                     run["baselines"]["path_skeleton_e2e_ms"][hold][quantile] for run in runs
                     if "path_skeleton_e2e_ms" in run["baselines"])
                    for hold in (SKELETON_HOLD_KEY, "hold_0ms") for quantile in ("p50", "p99")}}
    skipped = [f"repeat {run['repeat']}: {name}: {reason}" for run in runs for name, reason in run["skipped"].items()]
    invalid = [f"repeat {run['repeat']}: {problem}" for run in runs for system in run["systems"].values()
               for problem in system.get("problems", [])]
    return {"systems": names, "medians": medians, "rows": rows, "aims": from_medians, "baselines": baselines,
            "e2e_floor": e2e_floor(runs), "skipped": skipped, "invalid": invalid}


def e2e_floor(runs: list[dict]) -> list[dict]:
    """Per repeat, the e2e aim's reference (the best peer's e2e p99) against the
    floor of Magnetar's path in the same repeat: the end-to-end skeleton's p99 with the
    official client's batch hold (what the harness's Magnetar producer does) and
    without it."""
    floors = []
    for run in runs:
        skeleton = run["baselines"].get("path_skeleton_e2e_ms")
        if not skeleton:
            continue
        best = best_peer({name: valid_headline(system).get("e2e_p99_ms") for name, system in run["systems"].items()},
                         False)
        floors.append({"repeat": run["repeat"], "best_peer": best[0] if best else None,
                       "best_peer_e2e_p99_ms": best[1] if best else None,
                       "skeleton_hold_p50_ms": skeleton[SKELETON_HOLD_KEY]["p50"],
                       "skeleton_hold_p99_ms": skeleton[SKELETON_HOLD_KEY]["p99"],
                       "skeleton_no_hold_p99_ms": skeleton["hold_0ms"]["p99"],
                       "magnetar_1x1_e2e_p99_ms": valid_headline(run["systems"]["magnetar-1x1"]).get("e2e_p99_ms")
                       if "magnetar-1x1" in run["systems"] else None})
    return floors


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def report_markdown(results: dict) -> str:
    summary = results["summary"]
    names = summary["systems"]
    base = summary["baselines"]
    settings = results["settings"]
    lines = [f"# Magnetar and its peers in one run ({results['date']}, {settings['repeat']} repeat(s), medians)", "",
             f"1 KiB messages, at most {settings['max_pending']} publishes awaiting their ack, e2e at "
             f"{settings['rate']:,} msgs/s for {settings['e2e_seconds']} s, publish for {settings['publish_seconds']} s; "
             f"one Python asyncio process per peer with its usual client, Magnetar through the official "
             f"pulsar-client (drain and fan-out: "
             f"{'batch_receive + a cumulative ack per batch' if settings.get('magnetar_consume') == 'batch' else 'one message at a time'}"
             f"). Machine: {results['cpus']} cores, shared with other work (see the CPU lines).", "",
             *([f"Pooled: the repeats of {len(results['merged_from'])} runs of the same settings, "
                f"started at {', '.join(results['merged_from'])} (every repeat kept).", ""]
               if results.get("merged_from") else []),
             f"Baselines of the run: 1 KiB write + fdatasync p50 {base['fdatasync_p50_ms']} ms, p99 "
             f"{base['fdatasync_p99_ms']} ms (after 1 ms of rest, the durable ack's pace: p50 "
             f"{base.get('fdatasync_after_1ms_idle_p50_ms')} ms); loopback TCP echo p50 {base['tcp_echo_p50_ms']} ms.", "",
             *([f"The durable ack's path with no work in it (bench/path_skeleton.py, one request at a time, 1 ms "
                f"apart): client → relay process → store process whose IO thread writes and fdatasyncs, and back "
                f"(Magnetar's shape) p50 {base['path_skeleton_three_process_p50_ms']} ms; client → one process "
                f"fdatasyncing on its loop (Redis's shape) p50 {base['path_skeleton_one_process_p50_ms']} ms.", ""]
               if base.get("path_skeleton_three_process_p50_ms") is not None else []),
             *([f"The end-to-end path with no work in it (bench/path_skeleton.py: producer → relay → store "
                f"fdatasync → relay → consumer, at {settings['rate']:,}/s): with the official client's "
                f"{CLIENT_BATCH_DELAY_MS} ms batch hold p50 {base[f'path_skeleton_e2e_{SKELETON_HOLD_KEY}_p50_ms']} / "
                f"p99 {base[f'path_skeleton_e2e_{SKELETON_HOLD_KEY}_p99_ms']} ms; without it p50 "
                f"{base['path_skeleton_e2e_hold_0ms_p50_ms']} / p99 {base['path_skeleton_e2e_hold_0ms_p99_ms']} ms.", ""]
               if base.get(f"path_skeleton_e2e_{SKELETON_HOLD_KEY}_p99_ms") is not None else []),
             *([f"Peer servers: {'; '.join(f'{name}: {text}' for name, text in results['servers'].items())}.", ""]
               if results.get("servers") else [])]
    for line in summary["skipped"]:
        lines.append(f"**SKIPPED** {line}")
    for line in summary["invalid"]:
        lines.append(f"**NOT VALID** {line}")
    if summary["skipped"] or summary["invalid"]:
        lines.append("")
    header = ["workload"] + [LABELS[name] for name in names] + ["best peer", "Magnetar 1x1 / best peer",
                                                                  "Magnetar 3x2 / best peer"]
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in summary["rows"]:
        cells = [row["row"]] + [_cell(row["values"].get(name)) for name in names]
        cells += [LABELS.get(row["best_peer"], "-") if row["best_peer"] else "-",
                  _cell(row["magnetar_1x1_over_best"]), _cell(row["magnetar_3x2_over_best"])]
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["other load on the machine, % of a core (median of the windows)"]
    cells += [_cell(summary["medians"][name].get("other_load_pct")) for name in names] + ["", "", ""]
    lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Ratios: for rates above 1 is better, for latencies below 1 is better. Other load: CPU "
              "the machine spent beyond the system's own processes during its windows (2 cores = 200%).", "",
              "## The issue's aims", "", "| aim | Magnetar | reference | met (medians) | met per repeat |",
              "|---|---|---|---|---|"]
    for aim in summary["aims"]:
        met = {True: "yes", False: "**no**", None: "-"}[aim["met"]]
        lines.append(f"| {aim['aim']} | {_cell(aim['value'])} | {_cell(aim['reference'])} | {met} | "
                     f"{aim['met_in_repeats']} |")
    if summary.get("e2e_floor"):
        lines += ["", "### The e2e aim against the floor of Magnetar's path, per repeat", "",
                  "The end-to-end skeleton's p99 (the design's hops and the fdatasync before dispatch, nothing "
                  "else) with and without the client's batch hold, beside the aim's reference:", "",
                  "| repeat | best peer's e2e p99 ms | skeleton p50 / p99, batch hold | skeleton p99, no hold | "
                  "Magnetar 1x1 e2e p99 | floor above the reference |", "|---|---|---|---|---|---|"]
        for floor in summary["e2e_floor"]:
            reference = floor["best_peer_e2e_p99_ms"]
            above = "-" if reference is None else ("**yes**" if floor["skeleton_hold_p99_ms"] > reference else "no")
            lines.append(f"| {floor['repeat']} | {_cell(reference)} ({LABELS.get(floor['best_peer'], '-')}) | "
                         f"{_cell(floor.get('skeleton_hold_p50_ms'))} / {_cell(floor['skeleton_hold_p99_ms'])} | "
                         f"{_cell(floor['skeleton_no_hold_p99_ms'])} | "
                         f"{_cell(floor['magnetar_1x1_e2e_p99_ms'])} | {above} |")
    last = results["runs"][-1]
    lines += ["", "## CPU per process (last repeat; % of one core over each workload's window)", ""]
    for name in names:
        system = last["systems"].get(name)
        if not system:
            continue
        lines.append(f"- **{LABELS[name]}**")
        for workload in WORKLOADS + (MAGNETAR_ONLY_WORKLOADS if name in MAGNETAR else ()):
            cpu = (system.get(workload) or {}).get("cpu") or {}
            cells = ", ".join(f"{proc} {value['cpu_pct']}%" for proc, value in sorted(cpu.get("processes", {}).items()))
            other = cpu.get("other_load_pct")
            lines.append(f"  - {workload}: {cells or '-'}; other load {_cell(other)}% ({cpu.get('verdict', '-')})")
    lines += ["", "## Magnetar's stages in the same run (last repeat; mean / p50 / p99 ms)", ""]
    for name in MAGNETAR:
        system = last["systems"].get(name)
        if not system:
            continue
        lines.append(f"- **{LABELS[name]}**")
        for workload in ("durable_ack", "e2e", "publish"):
            stages = (system.get(workload) or {}).get("stages") or {}
            cells = ", ".join(f"{key} {s['mean_ms']}/{s.get('p50_ms', '-')}/{s.get('p99_ms', '-')}"
                              for key, s in stages.items())
            lines.append(f"  - {workload}: {cells or '-'}")
    return "\n".join(lines) + "\n"


# --- running (shell) ------------------------------------------------------------------------------

def order_for(repeat: int, systems: list[str]) -> list[str]:
    """Every system once, rotated by ``repeat`` (interleaving over the repeats)."""
    if not systems:
        return []
    shift = repeat % len(systems)
    return systems[shift:] + systems[:shift]


async def run_peer(args: argparse.Namespace, system: str) -> dict:
    base_dir = tempfile.mkdtemp(prefix=f"magnetar-peers-{system}-", dir=args.dir)
    server = PeerServer(system, base_dir)
    sampler = CpuSampler()
    result: dict = {"system": system}
    client = None
    try:
        await asyncio.to_thread(server.start)
        names: dict[str, int] = {}
        for pid, name in sorted(server.pids().items()):
            label = name if name not in names else f"{name}-{pid}"
            names[label] = pid
            sampler.watch(label, pid)
        sampler.start()
        argv = [sys.executable, os.path.join(BENCH_DIR, "peer_clients.py"), "--system", CLIENT_OF[system],
                "--port", str(server.port), "--ack-messages", str(args.ack_messages),
                "--e2e-seconds", str(args.e2e_seconds), "--publish-seconds", str(args.publish_seconds),
                "--rate", str(args.rate)]
        client = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                      stderr=asyncio.subprocess.PIPE)
        sampler.watch("client", client.pid)
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                stdout, stderr = await client.communicate()
        except TimeoutError:
            raise RuntimeError(f"the client did not finish in {CLIENT_TIMEOUT_S:.0f}s") from None
        summary = last_json_line(stdout.decode())
        if client.returncode != 0 or summary is None or not summary.get("summary"):
            raise RuntimeError(f"client exited {client.returncode}: {stderr.decode(errors='replace')[-1500:]}")
        for workload in WORKLOADS:
            measured = summary[workload]
            start, end = measured.get("started_unix_s"), measured.get("ended_unix_s")
            if start and end and end > start:
                measured["cpu"] = sampler.report(start, end)
            result[workload] = measured
    finally:
        if client is not None and client.returncode is None:
            client.kill()
            await client.wait()
        await sampler.stop()
        await asyncio.to_thread(server.stop)
        if args.keep_data:
            print(f"kept {base_dir}", file=sys.stderr)
        else:
            shutil.rmtree(base_dir, ignore_errors=True)
    return result


async def run_magnetar(args: argparse.Namespace, system: str) -> dict:
    config = system.split("-", 1)[1]
    result = await latency.run_system(args, REPO_DIR, "current", config)
    result["system"] = system
    return result


def problems(name: str, system: dict, e2e_scheduled: int | None = None) -> list[str]:
    """What makes a system's workload not valid: errors, or not all messages read (for
    e2e: not all of the ``e2e_scheduled`` counted messages received)."""
    found = []
    for workload in WORKLOADS + MAGNETAR_ONLY_WORKLOADS:
        measured = system.get(workload) or {}
        if measured.get("errors"):
            texts = " ".join(measured.get("error_texts") or [])
            found.append(f"{name} {workload}: {measured['errors']} errors{' ' + texts if texts else ''}")
        if measured.get("complete") is False:
            if workload == "e2e":
                found.append(f"{name} e2e: incomplete ({measured.get('received')} of "
                             f"{e2e_scheduled if e2e_scheduled is not None else '?'} received)")
            else:
                found.append(f"{name} {workload}: incomplete ({measured.get('messages')} of "
                             f"{measured.get('expected')})")
    return found


# Which workload each headline number comes from.
HEADLINE_WORKLOAD = {"publish_msgs_per_s": "publish", "e2e_p50_ms": "e2e", "e2e_p99_ms": "e2e", "e2e_p999_ms": "e2e",
                     "ack_p50_ms": "durable_ack", "ack_p99_ms": "durable_ack", "ack_p999_ms": "durable_ack",
                     "drain_msgs_per_s": "drain", "work_queue_msgs_per_s": "work_queue",
                     "fanout_msgs_per_s": "fanout", "publish_each_msgs_per_s": "publish_each",
                     "raw_e2e_p50_ms": "raw_e2e", "raw_e2e_p99_ms": "raw_e2e", "raw_publish_msgs_per_s": "raw_publish",
                     "raw_drain_msgs_per_s": "raw_drain", "raw_work_queue_msgs_per_s": "raw_work_queue",
                     "raw_fanout_msgs_per_s": "raw_fanout"}


def valid_headline(system: dict) -> dict:
    """The system's headline without the numbers of workloads that had errors or did
    not read everything: those count neither in medians nor for the best peer."""
    invalid = {workload for workload in WORKLOADS + MAGNETAR_ONLY_WORKLOADS
               if (system.get(workload) or {}).get("errors") or (system.get(workload) or {}).get("complete") is False}
    return {key: (None if HEADLINE_WORKLOAD.get(key) in invalid else value)
            for key, value in system["headline"].items()}


def other_load_pct(system: dict) -> float | None:
    """The machine's load beyond the system's own processes, median over its workloads'
    windows (% of one core): how disturbed its measurement was."""
    values = [(system.get(workload) or {}).get("cpu", {}).get("other_load_pct") for workload in WORKLOADS]
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 1) if values else None


async def main_async(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    runs = []
    for repeat in range(args.repeat):
        probe_dir = tempfile.mkdtemp(prefix="magnetar-peers-probe-", dir=args.dir)
        try:
            baselines = {"fdatasync_ms": await asyncio.to_thread(latency.fdatasync_baseline, probe_dir),
                         "fdatasync_after_1ms_idle_ms": await asyncio.to_thread(
                             latency.fdatasync_baseline, probe_dir, idle_s=latency.FSYNC_IDLE_S),
                         "tcp_echo_ms": await asyncio.to_thread(latency.tcp_echo_baseline),
                         "path_skeleton_ms": await asyncio.to_thread(path_skeleton.skeleton_baseline, probe_dir),
                         "path_skeleton_e2e_ms": await asyncio.to_thread(
                             path_skeleton.e2e_skeleton, probe_dir, SKELETON_E2E_SECONDS, args.rate,
                             (float(CLIENT_BATCH_DELAY_MS), 0.0))}
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        run = {"repeat": repeat, "baselines": baselines, "order": order_for(repeat, args.systems),
               "systems": {}, "skipped": {}}
        for system in run["order"]:
            began = time.monotonic()
            try:
                measured = await (run_magnetar(args, system) if system in MAGNETAR else run_peer(args, system))
            except Exception as error:   # noqa: BLE001 - any failure skips the system, loudly
                reason = f"{type(error).__name__}: {error}".replace("\n", " ")[:800]
                run["skipped"][system] = reason
                print(f"SKIPPED {system} in repeat {repeat}: {reason}", file=sys.stderr, flush=True)
                continue
            measured["headline"] = latency.headline(measured)
            measured["seconds"] = round(time.monotonic() - began, 1)
            measured["problems"] = problems(system, measured, int(args.rate * args.e2e_seconds))
            run["systems"][system] = measured
            print(json.dumps({"repeat": repeat, "system": system, "seconds": measured["seconds"],
                              **measured["headline"]}), flush=True)
        runs.append(run)
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
               "settings": {"message_bytes": latency.MESSAGE_BYTES, "max_pending": 1000, "rate": args.rate,
                            "e2e_seconds": args.e2e_seconds, "publish_seconds": args.publish_seconds,
                            "ack_messages": args.ack_messages, "repeat": args.repeat, "systems": args.systems,
                            "magnetar_consume": args.consume},
               "servers": server_versions(), "labels": LABELS, "runs": runs}
    results["summary"] = summarize(runs)
    results["total_seconds"] = round(time.monotonic() - started, 1)
    return results


def preflight(systems: list[str]) -> str | None:
    """What is missing for the peers asked for, or None."""
    peers = sorted({CLIENT_OF[name] for name in systems if name in CLIENT_OF})
    missing = missing_binaries(peers)
    missing += [f"python module {PYTHON_CLIENTS[peer]}" for peer in peers
                if importlib.util.find_spec(PYTHON_CLIENTS[peer]) is None]
    if missing:
        return (f"missing for the peers: {', '.join(missing)}. Run `make bench-peers-setup` (apt packages "
                "redis-server rabbitmq-server, and the `bench` extra of pyproject.toml with its nats-server).")
    return None


def merge_results(documents: list[dict]) -> dict:
    """The repeats of several runs with the same settings as one run of all of them
    (every repeat kept, renumbered in order; nothing chosen or left out)."""
    def comparable(settings: dict) -> dict:
        return {key: value for key, value in settings.items() if key != "repeat"}
    first = documents[0]
    for document in documents[1:]:
        if comparable(document["settings"]) != comparable(first["settings"]):
            raise ValueError("results with different settings cannot be pooled")
    runs = []
    for document in documents:
        for run in document["runs"]:
            runs.append({**run, "repeat": len(runs), "from_run": document["date"]})
    merged = {**first, "runs": runs, "settings": {**first["settings"], "repeat": len(runs)},
              "merged_from": [document["date"] for document in documents],
              "total_seconds": sum(document.get("total_seconds", 0) for document in documents)}
    merged["summary"] = summarize(runs)
    return merged


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/peers.json")
    parser.add_argument("--report", default="bench/results/peers.md")
    parser.add_argument("--systems", type=lambda text: text.split(","), default=list(SYSTEMS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--ack-messages", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--publish-seconds", type=float, default=4.0)
    parser.add_argument("--consume", choices=["batch", "per-message"], default="batch",
                        help="Magnetar's drain and fan-out: batch_receive + one cumulative ack per batch "
                             "(as the Redis peer reads with XREAD COUNT), or one message at a time")
    parser.add_argument("--dir", default=None, help="where data goes (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--from-json", default=None,
                        help="run nothing: write the report again from this results file")
    parser.add_argument("--merge", nargs="+", default=None, metavar="RESULTS_JSON",
                        help="run nothing: pool the repeats of these results files (same settings) into --out")
    args = parser.parse_args()
    if args.merge:
        documents = []
        for path in args.merge:
            with open(path) as handle:
                documents.append(json.load(handle))
        merged = merge_results(documents)
        with open(args.out, "w") as handle:
            json.dump(merged, handle, indent=1)
        args.from_json = args.out
    if args.from_json:
        with open(args.from_json) as handle:
            results = json.load(handle)
        settings = results["settings"]
        scheduled = int(settings["rate"] * settings["e2e_seconds"])
        for run in results["runs"]:
            for name, system in run["systems"].items():
                system["problems"] = problems(name, system, scheduled)
        results["summary"] = summarize(results["runs"])
        with open(args.from_json, "w") as handle:
            json.dump(results, handle, indent=1)
        with open(args.report, "w") as handle:
            handle.write(report_markdown(results))
        print(f"report written to {args.report} from {args.from_json}")
        return 0
    for system in args.systems:
        if system not in SYSTEMS:
            parser.error(f"--systems: {system} is not one of {', '.join(SYSTEMS)}")
    missing = preflight(args.systems)
    if missing:
        print(f"bench/peers.py: {missing}", file=sys.stderr)
        return 2
    # SIGTERM as Ctrl-C: the servers' finally blocks stop every process they started,
    # and whatever is still running when the run ends, however it ends, is stopped here.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = asyncio.run(main_async(args))
    finally:
        stop_all()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    report = report_markdown(results)
    with contextlib.suppress(Exception):
        for run in results["runs"]:
            for system in run["systems"].values():
                for workload in WORKLOADS:
                    for stage in ((system.get(workload) or {}).get("stages") or {}).values():
                        stage.pop("what", None)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    with open(args.report, "w") as handle:
        handle.write(report)
    print(report)
    print(f"results written to {args.out} and {args.report} (total {results['total_seconds']} s)")
    found = [problem for run in results["runs"] for system in run["systems"].values()
             for problem in system["problems"]]
    if found:
        print("the run was not correct:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
