"""The pure parts of the call-styles benchmark (bench/peers_calls.py) and of the floor
benchmark (bench/floor.py), with no server started.

Proves that: a cell's CPU per 1,000 messages counts broker + bookies for Magnetar (and
for the baseline tree's Magnetar) and the one server process for a peer, never etcd or
the client; Redis' timed publish is complete when every send was acknowledged; the
report states each system's durability, shows Magnetar over pulsar-lite, over Redis and
over the issue's harness style from the same run, and compares the servers' CPU with
the baseline tree when there is one; pulsar-lite's command line binds the loopback; the
floor's ratios come from the same repeat's skeleton, an aim is met only at or under its
limit, and a missing figure is never counted as met.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import floor  # noqa: E402
import peers_calls  # noqa: E402
from peer_servers import is_loopback, pulsar_lite_argv, pulsar_lite_config  # noqa: E402


def _measured(rate: float, messages: int = 1000, *, servers: dict[str, float], client: float = 1.0,
              complete: bool | None = True) -> dict:
    processes = {name: {"cpu_s": cpu} for name, cpu in servers.items()}
    processes["client"] = {"cpu_s": client, "cpu_pct": 50.0}
    processes["etcd"] = {"cpu_s": 100.0}
    measured = {"messages": messages, "msgs_per_s": rate, "cpu": {"processes": processes, "other_load_pct": 10.0}}
    if complete is not None:
        measured["complete"] = complete
    return measured


def test_server_cpu_counts_broker_and_bookies_or_the_peer_process_only() -> None:
    processes = {"broker": {"cpu_s": 1.0}, "bookie-0": {"cpu_s": 0.5}, "etcd": {"cpu_s": 9.0},
                 "gateway": {"cpu_s": 9.0}, "client": {"cpu_s": 9.0}}
    assert peers_calls.server_cpu_s(processes, "magnetar") == 1.5
    assert peers_calls.server_cpu_s(processes, peers_calls.BASELINE) == 1.5
    assert peers_calls.server_cpu_s({"redis": {"cpu_s": 0.25}, "client": {"cpu_s": 3.0}}, "redis") == 0.25
    cell = peers_calls.cell_of("magnetar", "publish", _measured(1000.0, 2000, servers={"broker": 1.0, "bookie-0": 1.0}))
    assert cell["servers_cpu_s_per_1k"] == 1.0 and cell["client_cpu_s_per_1k"] == 0.5


def test_redis_timed_publish_is_complete_only_without_errors() -> None:
    ok = _measured(5000.0, servers={"redis": 0.1}, complete=None)
    assert peers_calls.cell_of("redis", "publish", ok)["complete"] is True
    failed = {**_measured(5000.0, servers={"redis": 0.1}, complete=None), "errors": 3}
    assert peers_calls.cell_of("redis", "publish", failed)["complete"] is False


def _results() -> dict:
    cells = {"magnetar": {}, "pulsar-lite": {}, "redis": {}, peers_calls.BASELINE: {}}
    rates = {"sync": 4000.0, "asyncio": 2000.0}
    for style, rate in rates.items():
        cells["magnetar"][style] = {"publish": peers_calls.cell_of(
            "magnetar", "publish", _measured(rate, servers={"broker": 0.02, "bookie-0": 0.01}))}
        cells[peers_calls.BASELINE][style] = {"publish": peers_calls.cell_of(
            peers_calls.BASELINE, "publish", _measured(rate, servers={"broker": 0.04, "bookie-0": 0.02}))}
        cells["pulsar-lite"][style] = {"publish": peers_calls.cell_of(
            "pulsar-lite", "publish", _measured(rate * 2, servers={"pulsar-lite": 0.01}))}
    cells["redis"]["redis"] = {"publish": peers_calls.cell_of("redis", "publish", _measured(8000.0,
                                                                                           servers={"redis": 0.01}))}
    runs = [{"repeat": 0, "cells": cells, "skipped": []}]
    return {"date": "today", "cpus": 2, "pulsar_lite": "0.2.0", "redis_version": "v=7", "runs": runs,
            "settings": {"messages": 1000, "rate": 1000, "e2e_seconds": 1.0, "repeat": 1,
                         "systems": ["magnetar", "pulsar-lite", "redis", peers_calls.BASELINE],
                         "baseline_rev": "abc (before)"},
            "summary": peers_calls.summarize(runs)}


def test_report_states_durability_and_ratios_from_the_same_run() -> None:
    report = peers_calls.report_markdown(_results())
    for system in ("magnetar", "pulsar-lite", "redis"):
        assert peers_calls.DURABILITY[system] in report
    sync_row = next(line for line in report.splitlines() if line.startswith("| official, blocking, per message | 4,000"))
    cells = [cell.strip() for cell in sync_row.split("|")[1:-1]]
    # Magnetar 4,000 against pulsar-lite 8,000 (M/L 0.5), Redis 8,000 (M/R 0.5), the asyncio baseline 2,000 (x2).
    assert cells[1:6] == ["4,000", "8,000", "0.5", "0.5", "2"]
    assert "8,000 msgs/s" in report   # Redis' own line


def test_report_compares_servers_cpu_with_the_baseline_tree() -> None:
    report = peers_calls.report_markdown(_results())
    assert "against the baseline (abc (before))" in report
    publish = next(line for line in report.splitlines() if line.startswith("| publish | "))
    # 0.03 CPU-s per 1,000 now against 0.06 before.
    assert "0.03 / 0.06 (-50 %)" in publish


def test_pulsar_lite_listens_on_the_loopback_only() -> None:
    argv = pulsar_lite_argv(6650, "/tmp/data", "/tmp/lite.toml")
    address = argv[argv.index("--addr") + 1]
    assert is_loopback(address.rsplit(":", 1)[0])
    assert 'addr = "127.0.0.1:' in pulsar_lite_config(8080)


def _floor_run(ack: float, e2e_p50: float, e2e_p99: float) -> dict:
    return {"repeat": 0,
            "skeleton": {"ack": {"three_process": {"p50": 1.0}},
                         "e2e": {"hold_0ms": {"p50": 2.0, "p99": 4.0}, "hold_1ms": {"p50": 3.0, "p99": 5.0}}},
            "magnetar": {"durable_ack": {"latency_ms": {"p50": ack}},
                         "e2e_unbatched": {"latency_ms": {"p50": e2e_p50, "p99": e2e_p99}},
                         "e2e": {"latency_ms": {"p50": 6.0, "p99": 10.0}}}}


def test_floor_aims_are_ratios_to_the_same_repeats_skeleton() -> None:
    verdict = floor.judge(_floor_run(1.2, 2.4, 6.0))
    assert verdict["ratios"]["ack_p50"] == 1.2 and verdict["met"]["ack_p50"]
    assert verdict["ratios"]["e2e_p50"] == 1.2 and verdict["met"]["e2e_p50"]
    assert verdict["ratios"]["e2e_p99"] == 1.5 and verdict["met"]["e2e_p99"]
    assert verdict["ratios"]["e2e_batched_p50"] == 2.0 and verdict["ratios"]["e2e_batched_p99"] == 2.0
    worse = floor.judge(_floor_run(1.3, 2.5, 6.1))
    assert not any(worse["met"].values())


def test_floor_missing_figures_are_not_met_and_the_report_says_so() -> None:
    run = _floor_run(1.0, 2.0, 4.0)
    del run["magnetar"]["e2e_unbatched"]
    verdict = floor.judge(run)
    assert verdict["met"]["ack_p50"] and not verdict["met"]["e2e_p50"] and not verdict["met"]["e2e_p99"]
    report = floor.report_markdown({"date": "today", "pulsar_client": "3.13.0", "runs": [run, run, run],
                                    "settings": {"ack_messages": 1000, "rate": 1000, "e2e_seconds": 5.0}})
    assert "durable ack p50: met in 3 of 3 repeats" in report
    assert "e2e p50 (batching off): met in 0 of 3 repeats" in report and "aim NOT met" in report


def test_floor_cpu_per_ack_counts_servers_and_the_warm_up() -> None:
    run = _floor_run(1.0, 2.0, 4.0)
    run["magnetar"]["durable_ack"].update(messages=800, cpu={"processes": {
        "broker": {"cpu_s": 0.6}, "bookie-0": {"cpu_s": 0.4}, "etcd": {"cpu_s": 5.0}, "client": {"cpu_s": 5.0}}})
    run["skeleton"]["ack"]["cpu_ms_per_request"] = {"relay": 0.1, "store": 0.15, "one_process_store": 0.2}
    # 1.0 CPU-s over 800 measured + 200 warm-up messages: 1 ms each; the skeleton 0.25 ms.
    assert floor.ack_cpu_ms(run) == (1.0, 0.25)


def test_ack_cpu_ratios_come_from_the_same_run_and_never_from_a_missing_figure() -> None:
    """bench/ack_cpu.py: CPU ms per entry from a side's ticks over its own entries; the new
    tree over the baseline and each side over the skeleton; a side without entries has
    no figure and gives no ratio."""
    import ack_cpu
    tick_ms = 1000 / ack_cpu.CLOCK_TICKS_PER_S
    sides = {"new": {"ticks": 60, "entries": 1000, "latencies_us": [900, 800, 1000]},
             "baseline": {"ticks": 66, "entries": 1000, "latencies_us": [1000]},
             "skeleton": {"ticks": 33, "entries": 1000, "latencies_us": [600, 700]},
             "baseline_copy": {"ticks": 0, "entries": 0, "latencies_us": []}}
    result = ack_cpu.summarize(sides, new="new", baseline="baseline")
    assert result["sides"]["new"] == {"entries": 1000, "cpu_ms_per_entry": round(60 * tick_ms / 1000, 4),
                                      "p50_ms": 0.9}
    assert result["new_over_baseline"] == round(60 / 66, 3)
    assert result["over_skeleton"]["new"] == round(60 / 33, 3)
    assert result["over_skeleton"]["baseline_copy"] is None
    assert result["sides"]["baseline_copy"]["cpu_ms_per_entry"] is None
    assert ack_cpu.summarize(sides, new="new", baseline=None)["new_over_baseline"] is None
