"""The pure parts of the peers benchmark (bench/peers.py, bench/peer_servers.py,
bench/load_shapes.py), with no server started.

Proves that: every command line, configuration file and environment a peer is started
with binds the loopback only (Redis, NATS, epmd, RabbitMQ's AMQP and Erlang
distribution listeners) and asks for the durability the report names (Redis AOF
``appendfsync always``, NATS ``sync_interval: always`` only in that variant);
listening sockets from ``ss`` are read and any beyond the loopback is named; the best
peer of a row is the highest rate or the lowest latency among the peers only; the
summary's ratios and the issue's aims come out of the medians, with a count per
repeat, and a skipped peer is a line of its own in the report; systems are
interleaved by rotation; a missing peer names `make bench-peers-setup`; the fixed-rate
schedule's due times, counting and lateness.
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import peer_servers  # noqa: E402
import peers  # noqa: E402
from load_shapes import MESSAGE_BYTES, FixedRate, due_of, filler_bytes, payload  # noqa: E402
from peer_servers import (  # noqa: E402
    epmd_argv,
    is_loopback,
    nats_argv,
    nats_config,
    non_loopback,
    parse_listeners,
    rabbitmq_config,
    rabbitmq_env,
    redis_argv,
)

ADDRESS = re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")


def addresses(text: str) -> set[str]:
    return set(ADDRESS.findall(text))


# --- command lines: the loopback only ------------------------------------------------------

def test_redis_binds_the_loopback_and_fsyncs_every_write(tmp_path):
    argv = redis_argv(6390, str(tmp_path))
    assert argv[argv.index("--bind") + 1] == "127.0.0.1"
    assert addresses(" ".join(argv)) == {"127.0.0.1"}
    assert argv[argv.index("--port") + 1] == "6390"
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "always"
    assert argv[argv.index("--save") + 1] == ""          # no RDB snapshots
    assert argv[argv.index("--dir") + 1] == str(tmp_path)


def test_nats_listens_on_the_loopback_and_syncs_always_only_when_asked(tmp_path):
    argv = nats_argv(4333, str(tmp_path), str(tmp_path / "nats.conf"))
    assert argv[argv.index("-a") + 1] == "127.0.0.1"
    assert argv[argv.index("-sd") + 1] == str(tmp_path)
    assert "-js" in argv
    assert addresses(" ".join(argv)) == {"127.0.0.1"}
    default, always = nats_config(4333, False), nats_config(4333, True)
    for text in (default, always):
        assert "listen: 127.0.0.1:4333" in text
        assert addresses(text) == {"127.0.0.1"}
        assert "http" not in text                           # no monitoring port
    assert "sync_interval" not in default and "jetstream: enabled" in default
    assert "sync_interval: always" in always


def test_rabbitmq_and_its_epmd_bind_the_loopback_only(tmp_path):
    assert epmd_argv(4370) == ["epmd", "-address", "127.0.0.1", "-port", "4370"]
    assert rabbitmq_config(5673) == "listeners.tcp.default = 127.0.0.1:5673\n"
    env = rabbitmq_env({"PATH": "/bin", "RABBITMQ_NODE_IP_ADDRESS": "0.0.0.0"}, str(tmp_path),
                       {"amqp": 5673, "dist": 25673, "epmd": 4370})
    assert env["PATH"] == "/bin"
    assert env["RABBITMQ_NODE_IP_ADDRESS"] == "127.0.0.1"    # ours wins over the caller's
    assert env["ERL_EPMD_ADDRESS"] == "127.0.0.1"
    assert env["RABBITMQ_NODE_PORT"] == "5673" and env["RABBITMQ_DIST_PORT"] == "25673"
    assert env["ERL_EPMD_PORT"] == "4370"
    assert "-kernel inet_dist_use_interface {127,0,0,1}" in env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert env["RABBITMQ_NODENAME"] == "rabbit-bench@localhost"
    for key in ("RABBITMQ_MNESIA_BASE", "RABBITMQ_LOG_BASE", "RABBITMQ_CONFIG_FILE", "RABBITMQ_ENABLED_PLUGINS_FILE",
                "RABBITMQ_CONF_ENV_FILE", "HOME"):
        assert env[key].startswith(str(tmp_path)), key
    assert "0.0.0.0" not in " ".join(value for key, value in env.items() if key != "PATH")


SS = """\
LISTEN 0      511        127.0.0.1:6390       0.0.0.0:*    users:(("redis-server",pid=101,fd=6))
LISTEN 0      4096       127.0.0.1:4370       0.0.0.0:*    users:(("epmd",pid=102,fd=3))
LISTEN 0      4096           [::1]:4370          [::]:*    users:(("epmd",pid=102,fd=4))
LISTEN 0      128          0.0.0.0:25672      0.0.0.0:*    users:(("beam.smp",pid=103,fd=18))
LISTEN 0      128             [::]:5672          [::]:*    users:(("beam.smp",pid=103,fd=35))
LISTEN 0      128          0.0.0.0:22         0.0.0.0:*    users:(("sshd",pid=1,fd=3))
"""


def test_listeners_beyond_the_loopback_are_named_for_our_processes_only():
    listeners = parse_listeners(SS)
    assert ("127.0.0.1:6390", 101) in listeners and ("[::1]:4370", 102) in listeners
    assert is_loopback("127.0.0.1:1") and is_loopback("[::1]:2") and is_loopback("[::ffff:127.0.0.1]:3")
    assert not is_loopback("0.0.0.0:1") and not is_loopback("[::]:1") and not is_loopback("*:1")
    assert non_loopback(listeners, {101, 102}) == []
    assert non_loopback(listeners, {101, 102, 103}) == ["0.0.0.0:25672 (pid 103)", "[::]:5672 (pid 103)"]


def test_a_missing_peer_names_the_setup_target(monkeypatch):
    monkeypatch.setattr(peers, "missing_binaries", lambda names: ["nats-server"] if "nats" in names else [])
    message = peers.preflight(["magnetar-1x1", "nats-sync-always"])
    assert "nats-server" in message and "make bench-peers-setup" in message
    assert peers.preflight(["magnetar-1x1", "magnetar-3x2"]) is None
    monkeypatch.setattr(peer_servers.shutil, "which", lambda name: None)
    assert peer_servers.missing_binaries(["redis"]) == ["redis-server"]


# --- the report -----------------------------------------------------------------------------

def headline(publish, e2e_p99, ack_p50, drain, work, fanout, e2e_p50=1.0):
    return {"publish_msgs_per_s": publish, "e2e_p50_ms": e2e_p50, "e2e_p99_ms": e2e_p99, "e2e_p999_ms": e2e_p99 * 2,
            "ack_p50_ms": ack_p50, "ack_p99_ms": ack_p50 * 3, "ack_p999_ms": ack_p50 * 4,
            "raw_ack_p50_ms": None, "raw_ack_p99_ms": None, "drain_msgs_per_s": drain,
            "work_queue_msgs_per_s": work, "fanout_msgs_per_s": fanout}


def run(repeat, systems, skipped=None, fsync_p50=0.2):
    return {"repeat": repeat, "baselines": {"fdatasync_ms": {"p50": fsync_p50, "p99": 1.0},
                                            "tcp_echo_ms": {"p50": 0.01},
                                            "path_skeleton_ms": {"three_process": {"p50": 0.8 + repeat / 10},
                                                                 "one_process": {"p50": 0.5}},
                                            "path_skeleton_e2e_ms": {"hold_1ms": {"p50": 1.7, "p99": (2.6, 2.7, 2.8)[repeat]},
                                                                     "hold_0ms": {"p50": 0.7, "p99": 1.3}}},
            "systems": {name: {"headline": row} for name, row in systems.items()}, "skipped": skipped or {}}


def test_best_peer_is_among_the_peers_only_and_follows_the_direction():
    values = {"magnetar-1x1": 100.0, "redis": 40.0, "nats": 60.0, "rabbitmq": None}
    assert peers.best_peer(values, True) == ("nats", 60.0)
    assert peers.best_peer(values, False) == ("redis", 40.0)
    assert peers.best_peer({"magnetar-1x1": 1.0}, True) is None
    assert peers.ratio(30.0, 60.0) == 0.5 and peers.ratio(None, 1.0) is None and peers.ratio(1.0, 0) is None


def test_summary_ratios_and_aims_from_the_medians_with_a_count_per_repeat():
    runs = [
        run(0, {"magnetar-1x1": headline(20_000, 8.0, 0.9, 50_000, 40_000, 60_000),
                "magnetar-3x2": headline(12_000, 20.0, 2.0, 50_000, 40_000, 60_000),
                "redis": headline(40_000, 2.0, 0.8, 120_000, 30_000, 130_000),
                "nats": headline(27_000, 4.0, 1.0, 33_000, 32_000, 40_000)}),
        run(1, {"magnetar-1x1": headline(22_000, 6.0, 1.1, 52_000, 41_000, 62_000),
                "magnetar-3x2": headline(10_000, 10.0, 2.2, 50_000, 40_000, 60_000),
                "redis": headline(38_000, 3.0, 0.7, 110_000, 35_000, 120_000),
                "nats": headline(26_000, 5.0, 1.1, 30_000, 31_000, 41_000)},
            skipped={"rabbitmq": "RuntimeError: not listening"}),
        run(2, {"magnetar-1x1": headline(21_000, 7.0, 1.0, 51_000, 39_000, 61_000),
                "magnetar-3x2": headline(11_000, 15.0, 2.1, 50_000, 40_000, 60_000),
                "redis": headline(39_000, 2.5, 0.75, 115_000, 36_000, 125_000),
                "nats": headline(25_000, 4.5, 1.2, 31_000, 33_000, 39_000)}),
    ]
    runs[2]["systems"]["nats"]["problems"] = ["nats e2e: incomplete (900 of 1000)"]
    summary = peers.summarize(runs)
    assert summary["systems"] == ["magnetar-1x1", "magnetar-3x2", "redis", "nats"]
    rows = {row["key"]: row for row in summary["rows"]}
    publish = rows["publish_msgs_per_s"]
    assert publish["values"]["magnetar-1x1"] == 21_000 and publish["best_peer"] == "redis"
    assert publish["best_peer_value"] == 39_000
    assert publish["magnetar_1x1_over_best"] == round(21_000 / 39_000, 3)
    assert publish["magnetar_3x2_over_best"] == round(11_000 / 39_000, 3)
    e2e = rows["e2e_p99_ms"]
    assert e2e["best_peer"] == "redis" and e2e["best_peer_value"] == 2.5
    assert e2e["magnetar_1x1_over_best"] == round(7.0 / 2.5, 3)
    work = rows["work_queue_msgs_per_s"]
    assert work["best_peer"] == "redis" and work["best_peer_value"] == 35_000   # median of 30k, 35k, 36k
    aims = {aim["aim"]: aim for aim in summary["aims"]}
    ack = aims["durable ack p50 <= 1.0 ms (1x1)"]
    assert ack["value"] == 1.0 and ack["met"] is True and ack["met_in_repeats"] == "2 of 3"
    assert aims["e2e p99 at 1,000/s <= best peer's p99 (1x1)"]["met"] is False
    assert aims["publish >= best peer (1x1)"]["met"] is False
    assert aims["work queue ahead of the best peer (1x1)"]["met"] is True
    assert aims["work queue ahead of the best peer (1x1)"]["met_in_repeats"] == "3 of 3"
    three_e2e = aims["3x2 e2e p99 <= 2x the 1x1's"]
    assert three_e2e["value"] == 15.0 and three_e2e["reference"] == 14.0 and three_e2e["met"] is False
    assert three_e2e["met_in_repeats"] == "1 of 3"                           # 20>16, 10<=12, 15>14
    assert aims["3x2 publish >= 50% of the 1x1's"]["met"] is True
    assert summary["skipped"] == ["repeat 1: rabbitmq: RuntimeError: not listening"]
    assert summary["invalid"] == ["repeat 2: nats e2e: incomplete (900 of 1000)"]
    assert summary["baselines"]["fdatasync_p50_ms"] == 0.2
    assert summary["baselines"]["path_skeleton_three_process_p50_ms"] == 0.9      # median of 0.8, 0.9, 1.0
    assert summary["baselines"]["path_skeleton_one_process_p50_ms"] == 0.5
    assert summary["baselines"]["path_skeleton_e2e_hold_1ms_p99_ms"] == 2.7      # median of 2.6, 2.7, 2.8
    assert summary["baselines"]["path_skeleton_e2e_hold_0ms_p50_ms"] == 0.7
    # Per repeat: the best peer's e2e p99 of that repeat (redis 2.0, 3.0, 2.5) against
    # the skeleton's with the batch hold (2.6, 2.7, 2.8).
    assert [(floor["best_peer"], floor["best_peer_e2e_p99_ms"], floor["skeleton_hold_p99_ms"])
            for floor in summary["e2e_floor"]] == [("redis", 2.0, 2.6), ("redis", 3.0, 2.7), ("redis", 2.5, 2.8)]
    assert [floor["magnetar_1x1_e2e_p99_ms"] for floor in summary["e2e_floor"]] == [8.0, 6.0, 7.0]

    results = {"date": "2026-11-26T20:00:00", "cpus": 2, "runs": runs, "summary": summary,
               "settings": {"repeat": 3, "max_pending": 1000, "rate": 1000, "e2e_seconds": 5.0,
                            "publish_seconds": 4.0}}
    report = peers.report_markdown(results)
    assert "**SKIPPED** repeat 1: rabbitmq: RuntimeError: not listening" in report
    assert "**NOT VALID** repeat 2: nats e2e: incomplete (900 of 1000)" in report
    assert "| publish msgs/s | 21,000 | 11,000 | 39,000 | 26,000 | Redis AOF always | 0.538 | 0.282 |" in report
    assert "| durable ack p50 <= 1.0 ms (1x1) | 1 | 1 | yes | 2 of 3 |" in report
    assert "fdatasync p50 0.2 ms" in report
    assert "(Magnetar's shape) p50 0.9 ms" in report and "(Redis's shape) p50 0.5 ms" in report
    assert "1 ms batch hold p50 1.7 / p99 2.7 ms; without it p50 0.7 / p99 1.3 ms" in report
    assert "| 0 | 2 (Redis AOF always) | 1.7 / 2.6 | 1.3 | 8 | **yes** |" in report
    assert "| 1 | 3 (Redis AOF always) | 1.7 / 2.7 | 1.3 | 6 | no |" in report


def test_problems_name_errors_and_incomplete_workloads():
    system = {"e2e": {"errors": 3, "complete": False, "received": 900},
              "drain": {"complete": False, "messages": 10, "expected": 20},
              "publish": {"errors": 0}, "durable_ack": {"cpu": {"other_load_pct": 50.0}},
              "fanout": {"cpu": {"other_load_pct": 10.0}}, "work_queue": {"cpu": {"other_load_pct": 30.0}}}
    assert peers.problems("redis", system, 1000) == ["redis e2e: 3 errors", "redis e2e: incomplete (900 of 1000 received)",
                                                     "redis drain: incomplete (10 of 20)"]
    assert peers.other_load_pct(system) == 30.0
    assert peers.other_load_pct({}) is None


def test_numbers_of_a_workload_that_was_not_valid_are_left_out():
    row = headline(1_000, 900.0, 1.0, 2_000, 3_000, 4_000)
    system = {"headline": row, "e2e": {"errors": 5, "complete": False}, "drain": {"complete": True}}
    valid = peers.valid_headline(system)
    assert valid["e2e_p50_ms"] is None and valid["e2e_p99_ms"] is None and valid["e2e_p999_ms"] is None
    assert valid["publish_msgs_per_s"] == 1_000 and valid["drain_msgs_per_s"] == 2_000
    runs = [run(0, {"magnetar-1x1": headline(20_000, 8.0, 0.9, 1, 1, 1), "rabbitmq": row})]
    runs[0]["systems"]["rabbitmq"]["e2e"] = {"errors": 5, "complete": False}
    e2e = {r["key"]: r for r in peers.summarize(runs)["rows"]}["e2e_p99_ms"]
    assert e2e["values"]["rabbitmq"] is None and e2e["best_peer"] is None


def test_magnetar_only_publish_row_has_no_best_peer_and_counts_its_errors():
    one = {**headline(60_000, 5.0, 0.9, 1, 1, 1), "publish_each_msgs_per_s": 20_000}
    runs = [run(0, {"magnetar-1x1": one, "redis": headline(39_000, 2.0, 0.3, 1, 1, 1)})]
    each = {r["key"]: r for r in peers.summarize(runs)["rows"]}["publish_each_msgs_per_s"]
    assert each["values"]["magnetar-1x1"] == 20_000 and each["values"]["redis"] is None
    assert each["best_peer"] is None and each["magnetar_1x1_over_best"] is None
    failed = {"headline": one, "publish_each": {"errors": 2}}
    assert peers.valid_headline(failed)["publish_each_msgs_per_s"] is None
    assert peers.valid_headline(failed)["publish_msgs_per_s"] == 60_000
    assert peers.problems("magnetar-1x1", failed) == ["magnetar-1x1 publish_each: 2 errors"]


def test_runs_with_the_same_settings_pool_every_repeat():
    settings = {"repeat": 1, "max_pending": 1000, "rate": 1000, "e2e_seconds": 5.0, "publish_seconds": 4.0}
    first = {"date": "A", "cpus": 2, "settings": settings, "total_seconds": 10,
             "runs": [run(0, {"magnetar-1x1": headline(10_000, 8.0, 0.9, 1, 1, 1)})]}
    second = {"date": "B", "cpus": 2, "settings": {**settings, "repeat": 2}, "total_seconds": 20,
              "runs": [run(0, {"magnetar-1x1": headline(20_000, 8.0, 0.9, 1, 1, 1)}),
                       run(1, {"magnetar-1x1": headline(30_000, 8.0, 0.9, 1, 1, 1)})]}
    merged = peers.merge_results([first, second])
    assert [r["repeat"] for r in merged["runs"]] == [0, 1, 2]
    assert [r["from_run"] for r in merged["runs"]] == ["A", "B", "B"]
    assert merged["settings"]["repeat"] == 3 and merged["total_seconds"] == 30
    assert merged["summary"]["medians"]["magnetar-1x1"]["publish_msgs_per_s"] == 20_000
    assert "Pooled: the repeats of 2 runs" in peers.report_markdown(merged)
    other = {**second, "settings": {**settings, "rate": 500}}
    try:
        peers.merge_results([first, other])
    except ValueError:
        pass
    else:
        raise AssertionError("different settings were pooled")


def test_aims_without_a_system_are_unknown_not_met():
    aims = peers.aims({"redis": headline(40_000, 2.0, 0.8, 1, 1, 1)})
    assert all(aim["met"] is None for aim in aims)


def test_systems_are_interleaved_by_rotation():
    systems = ["a", "b", "c"]
    assert peers.order_for(0, systems) == ["a", "b", "c"]
    assert peers.order_for(1, systems) == ["b", "c", "a"]
    assert peers.order_for(3, systems) == ["a", "b", "c"]
    assert peers.order_for(0, []) == []


# --- the schedule ------------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def test_fixed_rate_due_times_counting_and_lateness():
    clock = FakeClock()
    schedule = FixedRate(1000, 10, warmup=2, clock=clock)
    schedule.start()
    assert schedule.due(0) == 1_000_000 and schedule.due(5) == 1_000_000 + 5_000_000
    assert schedule.measure_from_ns == schedule.due(2)
    assert not schedule.counted(schedule.due(1)) and schedule.counted(schedule.due(2))
    assert schedule.wait_ns(3) == 3_000_000                 # early: wait until due
    clock.now = schedule.due(4) + 2_500_000                  # late by 2.5 ms: send at once
    assert schedule.wait_ns(4) == -2_500_000
    assert schedule.late_max_ms() == 2.5
    assert schedule.started_unix_s is None                   # set when the first counted one goes
    schedule.wait_ns(2)
    assert schedule.started_unix_s is not None


def test_fixed_rate_sends_every_message_in_order_with_its_due_time():
    schedule = FixedRate(100_000, 20, warmup=5)
    sent = []
    schedule.run_sync(lambda index, due: sent.append((index, due)))
    assert [index for index, _ in sent] == list(range(20))
    assert [due for _, due in sent] == [schedule.due(index) for index in range(20)]


def test_a_message_carries_its_due_time_in_1_kib():
    filler = filler_bytes(lambda size: b"x" * size)
    data = payload(123_456_789, filler)
    assert len(data) == MESSAGE_BYTES and due_of(data) == 123_456_789


def test_the_environments_own_nats_server_comes_before_the_one_on_path(tmp_path, monkeypatch):
    """The bench extra's nats-server (next to this Python) is used when it is there and
    executable; else the name, found on PATH."""
    python = tmp_path / "python"
    monkeypatch.setattr(peer_servers.sys, "executable", str(python))
    assert peer_servers.nats_server_binary() == "nats-server"
    local = tmp_path / "nats-server"
    local.write_text("#!/bin/sh\n")
    assert peer_servers.nats_server_binary() == "nats-server"      # not executable
    local.chmod(0o755)
    assert peer_servers.nats_server_binary() == str(local)
