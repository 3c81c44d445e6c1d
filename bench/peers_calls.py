"""Magnetar, pulsar-lite and Redis through every way a Python user calls a client, in one
run (issue 40, items 1-2): the workloads of bench/call_styles.py (publish with the
producer's batching on and off, drain with a cumulative ack and with an ack per message,
work queue, fan-out to 4 subscriptions, end to end at 1,000 msgs/s) in each call style
(official client blocking per message, blocking ``batch_receive``, ``pulsar.asyncio``,
listener callbacks, and the project's own asyncio client); Redis through redis-py
asyncio (bench/peer_clients.py); with the client process's and the servers' CPU per
1,000 messages beside each rate and each system's durability stated in the report.

Theory of operation:
- Each repeat starts each system once, in an order rotated by one each repeat:
  ``magnetar standalone --bookies 1 --copies 1`` (bench/latency.py's ``Standalone``,
  free loopback ports), pulsar-lite (the binary of the PyPI package,
  bench/peer_servers.py; RocksDB, no fsync per acknowledgement), Redis (AOF
  ``appendfsync always``) and, with ``--baseline-tree``, Magnetar from that tree. Every
  style then runs in a fresh client process on topics of its own, the styles' order
  rotated by one each repeat.
- bench/cpu_accounting.py samples every server process and the client over the run;
  each workload's window (from the client's summary) gives CPU seconds per process.
  "servers" is broker + bookies for Magnetar (etcd, the gateway and auto-recovery are
  kept apart in the JSON: they are idle on this path), the one process for pulsar-lite.
  Per 1,000 messages = CPU seconds x 1,000 / messages (fan-out: deliveries).
- The report (``summarize``, ``report_markdown``; pure) shows medians over the repeats.

    python bench/peers_calls.py --quick                  # about 9-10 minutes a repeat (loaded machine)
    python bench/peers_calls.py --repeat 3 --baseline-tree /tmp/before   # + servers' CPU before/after
    python bench/peers_calls.py --from-json bench/results/peers_calls.json   # report again
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
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

from call_styles import STYLES, WORKLOADS  # noqa: E402
from cpu_accounting import CpuSampler  # noqa: E402
from harness import last_json_line  # noqa: E402

SYSTEMS = ("magnetar", "pulsar-lite", "redis")
# Magnetar from another source tree (``--baseline-tree``), same harness, same run: the
# "before" of a change to the servers' CPU per message.
BASELINE = "magnetar-baseline"
# What each system promised when it acknowledged (stated beside every number).
DURABILITY = {"magnetar": "fdatasync before every ack and before dispatch",
              "pulsar-lite": "no fsync (acked from memory/RocksDB WAL unsynced)",
              "redis": "AOF appendfsync always (fsync before the replies of a loop round)"}
SHORT = {"magnetar": "Magnetar (fsync)", "pulsar-lite": "pulsar-lite (no fsync)", "redis": "Redis (fsync)"}
STYLE_LABELS = {"sync": "official, blocking, per message", "sync_batch": "official, blocking, batch_receive",
                "asyncio": "official, pulsar.asyncio", "listener": "official, listener callbacks",
                "magnetar": "own asyncio client (client/)", "redis": "redis-py asyncio (Streams)"}
# Redis is driven by its own usual client (bench/peer_clients.py), one "style".
REDIS_STYLE = "redis"
# The baseline of the ratio columns: the harness, the official pulsar.asyncio
# API against Magnetar, measured in the same run.
BASELINE_STYLE = "asyncio"
WORKLOAD_NOTES = {
    "publish": "producer batching on (1 ms delay; the own client has no batching: one entry per message); "
               "Redis: XADD pipelines of 100 on a bounded pool, 1,000 awaiting",
    "publish_unbatched": "producer batching off, one entry per message (Redis: not applicable)",
    "drain": "1 exclusive consumer, cumulative ack per 1,000 (batch_receive: per batch); "
             "Redis: XREAD count 1,000, no ack exists for a plain reader",
    "drain_ack_each": "1 exclusive consumer, an individual ack per message (Redis: not applicable)",
    "work_queue": "4 consumers on a shared subscription, an ack per message; Redis: a consumer group, "
                  "XREADGROUP count 1,000, XACK per message pipelined",
    "fanout": "4 subscriptions, counted per delivery; Redis: 4 XREAD readers",
    "e2e": "1,000 msgs/s, producer batching off, an ack per message; Redis: XADD pipelined as messages come, "
           "XREAD BLOCK",
}
CLIENT_TIMEOUT_S = 400.0
QUICK = {"messages": 10_000, "e2e_seconds": 3.0}
FULL = {"messages": 40_000, "e2e_seconds": 10.0}


# --- the report (pure) -------------------------------------------------------------------------

def server_cpu_s(processes: dict[str, dict], system: str) -> float | None:
    """The servers' CPU seconds of one window: broker + bookies, or the peer's process."""
    if system.startswith("magnetar"):
        names = [name for name in processes if name == "broker" or name.startswith("bookie")]
    else:
        names = [name for name in processes if name != "client"]
    if not names:
        return None
    return sum(processes[name]["cpu_s"] for name in names)


def per_thousand(cpu_s: float | None, messages: int | None) -> float | None:
    if cpu_s is None or not messages:
        return None
    return round(cpu_s * 1000.0 / messages, 4)


def cell_of(system: str, workload: str, measured: dict) -> dict:
    """One (system, style, workload) as the report needs it."""
    processes = (measured.get("cpu") or {}).get("processes") or {}
    messages = measured.get("messages")
    client = processes.get("client", {}).get("cpu_s")
    complete = measured.get("complete")
    if complete is None:   # Redis' publish: a timed run; complete when every send was acknowledged
        complete = bool(messages) and not measured.get("errors")
    cell = {"complete": complete, "error": measured.get("error"), "messages": messages,
            "client_cpu_s_per_1k": per_thousand(client, messages),
            "servers_cpu_s_per_1k": per_thousand(server_cpu_s(processes, system), messages),
            "client_cpu_pct": processes.get("client", {}).get("cpu_pct"),
            "other_load_pct": (measured.get("cpu") or {}).get("other_load_pct")}
    if workload == "e2e":
        latency = measured.get("latency_ms") or {}
        cell.update(p50_ms=latency.get("p50"), p99_ms=latency.get("p99"), duplicates=measured.get("duplicates"))
    else:
        cell["msgs_per_s"] = measured.get("msgs_per_s")
    return cell


def _median(values) -> float | None:
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 4) if values else None


def summarize(runs: list[dict]) -> dict:
    """Medians over the repeats per (system, style, workload); a cell that had an error
    or did not read everything keeps its numbers out of the medians and says so."""
    table: dict = {}
    for system in SYSTEMS + (BASELINE,):
        for style in STYLES + (REDIS_STYLE,):
            for workload in WORKLOADS:
                cells = [run["cells"][system][style][workload] for run in runs
                         if workload in run.get("cells", {}).get(system, {}).get(style, {})]
                if not cells:
                    continue
                valid = [cell for cell in cells if cell.get("complete") and not cell.get("error")]
                keys = ("p50_ms", "p99_ms", "duplicates") if workload == "e2e" else ("msgs_per_s",)
                summary = {key: _median(cell.get(key) for cell in valid)
                           for key in keys + ("client_cpu_s_per_1k", "servers_cpu_s_per_1k", "client_cpu_pct")}
                summary["valid"] = f"{len(valid)} of {len(cells)}"
                summary["errors"] = sorted({cell["error"] for cell in cells if cell.get("error")})
                table.setdefault(system, {}).setdefault(style, {})[workload] = summary
    return table


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _ratio(value, reference) -> float | None:
    return round(value / reference, 2) if value and reference else None


def _notes(cells: dict[str, dict]) -> str:
    notes = []
    for system, cell in cells.items():
        notes += [f"{SHORT[system].split(' ')[0]}: {error}" for error in cell.get("errors", [])[:1]]
        if cell.get("duplicates"):
            notes.append(f"{SHORT[system].split(' ')[0]} duplicates {_num(cell['duplicates'])}")
    return "; ".join(notes)


def server_cpu_section(table: dict, settings: dict) -> list[str]:
    """Broker + bookie CPU-seconds per 1,000 messages, this tree against the baseline
    tree, per workload and call style (same harness, same run)."""
    styles = [style for style in STYLES if style in table.get("magnetar", {})]
    lines = [f"## Servers' CPU per 1,000 messages: this tree against the baseline ({settings.get('baseline_rev')})",
             "", "Broker + bookie CPU-seconds per 1,000 messages (deliveries, for fan-out), medians; "
             "`now / before (change)`. Same harness, same run, the two servers one after the other.", "",
             "| workload | " + " | ".join(STYLE_LABELS[style] for style in styles) + " |",
             "|---|" + "---|" * len(styles)]
    for workload in WORKLOADS:
        cells = []
        for style in styles:
            now = table.get("magnetar", {}).get(style, {}).get(workload, {}).get("servers_cpu_s_per_1k")
            before = table.get(BASELINE, {}).get(style, {}).get(workload, {}).get("servers_cpu_s_per_1k")
            change = f" ({(now / before - 1) * 100:+.0f} %)" if now and before else ""
            cells.append(f"{_num(now)} / {_num(before)}{change}")
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return lines + [""]


def report_markdown(results: dict) -> str:
    table = results["summary"]
    settings = results["settings"]
    systems = settings.get("systems", list(SYSTEMS))
    redis_measured = "redis" in systems
    lines = [f"# Every way of calling a client: Magnetar, pulsar-lite and Redis in one run ({results['date']}, "
             f"{settings['repeat']} repeat(s), medians)", "",
             f"1 KiB messages, {settings['messages']:,} per workload (fan-out: x4 deliveries), at most 1,000 "
             f"awaiting receipts; e2e at {settings['rate']:,} msgs/s for {settings['e2e_seconds']} s. One client "
             f"process per style, each against the same server of its system (started once a repeat). "
             f"Machine: {results['cpus']} cores shared with other work (see the other-load line at the end).", "",
             "What each system promised when it acknowledged (durability, beside every number below):", ""]
    lines += [f"- **{SHORT[system]}**: {DURABILITY[system]}"
              + {"magnetar": "; `magnetar standalone --bookies 1 --copies 1`",
                 "pulsar-lite": f"; pulsar-lite {results.get('pulsar_lite')} (its PyPI package's native broker)",
                 "redis": f"; redis-server {results.get('redis_version') or ''}, one process"}[system]
              for system in systems if system in SHORT]
    lines += ["", "Ratios, all from this run: `M/L` Magnetar over pulsar-lite with the same client and call "
              "style; `M/R` Magnetar over Redis (redis-py asyncio, Redis' usual client); `x base` this style "
              f"over the baseline, the issue's harness ({STYLE_LABELS[BASELINE_STYLE]}) against Magnetar. CPU "
              "columns: CPU-seconds per 1,000 messages (deliveries, for fan-out) over each workload's window; "
              "servers = broker + bookie (Magnetar), the one server process (pulsar-lite, Redis).", ""]
    for workload in WORKLOADS:
        lines += [f"## {workload}", "", WORKLOAD_NOTES.get(workload, ""), ""]
        redis = table.get("redis", {}).get(REDIS_STYLE, {}).get(workload, {})
        base = table.get("magnetar", {}).get(BASELINE_STYLE, {}).get(workload, {})
        if redis_measured:
            if workload == "e2e":
                redis_text = f"{_num(redis.get('p50_ms'))} / {_num(redis.get('p99_ms'))} ms p50 / p99"
            else:
                redis_text = f"{_num(redis.get('msgs_per_s'))} msgs/s" if redis.get("msgs_per_s") else "-"
            lines += [f"Redis (fsync), {STYLE_LABELS[REDIS_STYLE]}: {redis_text}; client "
                      f"{_num(redis.get('client_cpu_s_per_1k'))}, server {_num(redis.get('servers_cpu_s_per_1k'))} "
                      f"CPU-s/1k; valid {redis.get('valid', '-')}"
                      + (f"; {redis['errors'][0]}" if redis.get("errors") else ""), ""]
        if workload == "e2e":
            lines += ["| style | Magnetar (fsync) p50 / p99 ms | pulsar-lite (no fsync) p50 / p99 ms | M/R p50 / p99 | "
                      "client CPU-s/1k M / L | servers CPU-s/1k M / L | valid M / L | notes |",
                      "|---|---|---|---|---|---|---|---|"]
        else:
            lines += ["| style | Magnetar (fsync) msgs/s | pulsar-lite (no fsync) msgs/s | M/L | M/R | x base | "
                      "client CPU-s/1k M / L | servers CPU-s/1k M / L | client % of a core M / L | valid M / L | "
                      "notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for style in STYLES:
            mag = table.get("magnetar", {}).get(style, {}).get(workload, {})
            lite = table.get("pulsar-lite", {}).get(style, {}).get(workload, {})
            if not mag and not lite:
                continue
            notes = _notes({"magnetar": mag, "pulsar-lite": lite})
            cpu = (f"{_num(mag.get('client_cpu_s_per_1k'))} / {_num(lite.get('client_cpu_s_per_1k'))} | "
                   f"{_num(mag.get('servers_cpu_s_per_1k'))} / {_num(lite.get('servers_cpu_s_per_1k'))}")
            valid = f"{mag.get('valid', '-')} / {lite.get('valid', '-')}"
            if workload == "e2e":
                vs_redis = (f"{_num(_ratio(mag.get('p50_ms'), redis.get('p50_ms')))} / "
                            f"{_num(_ratio(mag.get('p99_ms'), redis.get('p99_ms')))}")
                lines.append(f"| {STYLE_LABELS[style]} | {_num(mag.get('p50_ms'))} / {_num(mag.get('p99_ms'))} | "
                             f"{_num(lite.get('p50_ms'))} / {_num(lite.get('p99_ms'))} | {vs_redis} | {cpu} | "
                             f"{valid} | {notes} |")
            else:
                rate = mag.get("msgs_per_s")
                lines.append(f"| {STYLE_LABELS[style]} | {_num(rate)} | {_num(lite.get('msgs_per_s'))} | "
                             f"{_num(_ratio(rate, lite.get('msgs_per_s')))} | "
                             f"{_num(_ratio(rate, redis.get('msgs_per_s')))} | "
                             f"{_num(_ratio(rate, base.get('msgs_per_s')))} | {cpu} | "
                             f"{_num(mag.get('client_cpu_pct'))} / {_num(lite.get('client_cpu_pct'))} | {valid} | "
                             f"{notes} |")
        lines.append("")
    if BASELINE in table:
        lines += server_cpu_section(table, settings)
    other = [cell.get("other_load_pct") for run in results["runs"] for system in run["cells"].values()
             for style in system.values() for cell in style.values()]
    other = [value for value in other if value is not None]
    if other:
        lines.append(f"Other load on the machine during the windows: median {statistics.median(other):.0f} %, "
                     f"max {max(other):.0f} % of one core.")
    skipped = [f"repeat {run['repeat']}: {problem}" for run in results["runs"] for problem in run.get("skipped", [])]
    if skipped:
        lines += ["", "Not measured:", *[f"- {line}" for line in skipped]]
    return "\n".join(lines) + "\n"


# --- running (shell) ---------------------------------------------------------------------------

class Server:
    """One system's server processes, started once per repeat."""

    def __init__(self, system: str, base_dir: str, tree: str | None = None) -> None:
        self.system = system
        self.base_dir = base_dir
        self.tree = tree
        self.handle = None

    def start(self) -> tuple[str, dict[str, int]]:
        """Its service URL and its processes by name."""
        if self.system.startswith("magnetar"):
            import latency
            self.handle = latency.Standalone(self.tree or REPO_DIR, self.base_dir, 1, 1)
            self.handle.start()
            return self.handle.ready["service_url"], latency.children_of(self.handle.process.pid)
        from peer_servers import PeerServer
        self.handle = PeerServer(self.system, self.base_dir)
        self.handle.start()
        processes = {(self.system if index == 0 else f"{self.system}-{pid}"): pid
                     for index, pid in enumerate(sorted(self.handle.pids()))}
        if self.system == "redis":
            return str(self.handle.port), processes
        return f"pulsar://127.0.0.1:{self.handle.port}", processes

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()


def client_argv(args: argparse.Namespace, url: str, style: str) -> list[str]:
    if style == REDIS_STYLE:
        # Redis' publish runs for a time, not a count: about as long as Magnetar's best.
        return [sys.executable, os.path.join(BENCH_DIR, "peer_clients.py"), "--system", "redis", "--port", url,
                "--rate", str(args.rate), "--e2e-seconds", str(args.e2e_seconds),
                "--publish-seconds", f"{max(1.0, args.messages / 20_000):g}", "--ack-messages", "200"]
    return [sys.executable, os.path.join(BENCH_DIR, "call_styles.py"), "--service-url", url, "--style", style,
            "--messages", str(args.messages), "--rate", str(args.rate), "--e2e-seconds", str(args.e2e_seconds)]


async def run_style(args: argparse.Namespace, url: str, style: str, sampler: CpuSampler, system: str) -> dict:
    argv = client_argv(args, url, style)
    client = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                  stderr=asyncio.subprocess.PIPE)
    sampler.watch("client", client.pid)
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            stdout, stderr = await client.communicate()
    except TimeoutError:
        client.kill()
        await client.wait()
        raise RuntimeError(f"the {style} client did not finish in {CLIENT_TIMEOUT_S:.0f}s") from None
    summary = last_json_line(stdout.decode())
    if client.returncode != 0 or not summary or not summary.get("summary"):
        raise RuntimeError(f"{style} client exited {client.returncode}: {stderr.decode(errors='replace')[-800:]}")
    raw, cells = {}, {}
    for workload in WORKLOADS:
        if style == REDIS_STYLE and workload not in summary:
            continue   # no such way of calling Redis (no batching switch, no per-message ack to a reader)
        measured = summary.get(workload) or {"error": "not run", "complete": False}
        start, end = measured.get("started_unix_s"), measured.get("ended_unix_s")
        if start and end and end > start:
            measured["cpu"] = sampler.report(start, end)
        raw[workload] = measured
        cells[workload] = cell_of(system, workload, measured)
    return {"raw": raw, "cells": cells}


async def run_repeat(args: argparse.Namespace, repeat: int) -> dict:
    run: dict = {"repeat": repeat, "cells": {}, "raw": {}, "skipped": []}
    shift = repeat % len(args.styles)
    styles = args.styles[shift:] + args.styles[:shift]
    systems = args.systems[repeat % len(args.systems):] + args.systems[:repeat % len(args.systems)]
    for system in systems:
        base_dir = tempfile.mkdtemp(prefix=f"magnetar-calls-{system}-", dir=args.dir)
        server = Server(system, base_dir, args.baseline_tree if system == BASELINE else None)
        sampler = CpuSampler()
        try:
            try:
                url, processes = await asyncio.to_thread(server.start)
            except Exception as error:   # noqa: BLE001 - reported in the results
                run["skipped"].append(f"{system}: did not start: {type(error).__name__}: {error}"[:600])
                continue
            for name, pid in processes.items():
                sampler.watch(name, pid)
            sampler.start()
            for style in (styles if system != "redis" else [REDIS_STYLE]):
                try:
                    measured = await run_style(args, url, style, sampler, system)
                except Exception as error:   # noqa: BLE001 - one style failing does not stop the others
                    run["skipped"].append(f"{system} {style}: {type(error).__name__}: {error}"[:600])
                    continue
                run["cells"].setdefault(system, {})[style] = measured["cells"]
                run["raw"].setdefault(system, {})[style] = measured["raw"]
                print(json.dumps({"repeat": repeat, "system": system, "style": style,
                                  **{workload: {k: v for k, v in cell.items() if v is not None}
                                     for workload, cell in measured["cells"].items()}}), flush=True)
        finally:
            await sampler.stop()
            await asyncio.to_thread(server.stop)
            shutil.rmtree(base_dir, ignore_errors=True)
    return run


async def main_async(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    runs = [await run_repeat(args, repeat) for repeat in range(args.repeat)]
    try:
        lite_version = importlib.metadata.version("pulsar-lite")
    except importlib.metadata.PackageNotFoundError:
        lite_version = None
    redis_version = None
    if "redis" in args.systems:
        from peer_servers import server_versions
        redis_version = server_versions().get("redis", "").split(" sha=")[0].replace("Redis server ", "")
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(), "pulsar_lite": lite_version,
               "redis_version": redis_version,
               "pulsar_client": importlib.metadata.version("pulsar-client"),
               "settings": {"messages": args.messages, "rate": args.rate, "e2e_seconds": args.e2e_seconds,
                            "repeat": args.repeat, "systems": args.systems, "styles": args.styles,
                            "baseline_tree": args.baseline_tree, "baseline_rev": baseline_rev(args.baseline_tree),
                            "quick": args.quick},
               "runs": runs}
    results["summary"] = summarize(runs)
    results["total_seconds"] = round(time.monotonic() - started, 1)
    return results


def baseline_rev(tree: str | None) -> str | None:
    """What the baseline tree says it is (a file ``REV`` written beside its source)."""
    if not tree:
        return None
    try:
        with open(os.path.join(tree, "REV")) as handle:
            return handle.read().strip()[:80]
    except OSError:
        return os.path.basename(os.path.normpath(tree))


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/peers_calls.json")
    parser.add_argument("--report", default="bench/results/peers_calls.md")
    parser.add_argument("--systems", type=lambda text: text.split(","), default=list(SYSTEMS))
    parser.add_argument("--styles", type=lambda text: text.split(","), default=list(STYLES))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK['messages']:,} messages and {QUICK['e2e_seconds']:g} s of e2e per style "
                             f"(default {FULL['messages']:,} and {FULL['e2e_seconds']:g} s)")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=None)
    parser.add_argument("--dir", default=None, help="where data goes (default: the temp dir)")
    parser.add_argument("--baseline-tree", default=None,
                        help="also run Magnetar from this source tree (e.g. a `git archive` of the commit before "
                             "a change, with its generated protobuf modules), as 'magnetar-baseline': the report "
                             "then compares the servers' CPU per message")
    parser.add_argument("--from-json", default=None, help="run nothing: write the report again from this file")
    args = parser.parse_args()
    if args.from_json:
        with open(args.from_json) as handle:
            results = json.load(handle)
        results["summary"] = summarize(results["runs"])
        with open(args.report, "w") as handle:
            handle.write(report_markdown(results))
        return 0
    shape = QUICK if args.quick else FULL
    args.messages = args.messages or shape["messages"]
    args.e2e_seconds = args.e2e_seconds or shape["e2e_seconds"]
    for system in args.systems:
        if system not in SYSTEMS:
            parser.error(f"--systems: {system} is not one of {', '.join(SYSTEMS)}")
    for style in args.styles:
        if style not in STYLES:
            parser.error(f"--styles: {style} is not one of {', '.join(STYLES)}")
    from peer_servers import missing_binaries
    if args.baseline_tree:
        args.systems.append(BASELINE)
    missing = missing_binaries([system for system in args.systems if not system.startswith("magnetar")])
    if missing:
        print(f"bench/peers_calls.py: missing {', '.join(missing)}: run `make bench-peers-setup` first "
              f"(redis-server from apt, pulsar-lite from the bench extra)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = asyncio.run(main_async(args))
    finally:
        from peer_servers import stop_all
        stop_all()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)
    report = report_markdown(results)
    with open(args.report, "w") as handle:
        handle.write(report)
    print(report)
    print(f"results written to {args.out} and {args.report} (total {results['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
