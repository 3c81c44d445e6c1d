"""The pure parts of the subscriptions benchmark (bench/subscriptions_bench.py), with no
sockets and no processes.

Proves that: backlogs round up to whole batches; the consumer and producer command
lines carry the options the case needs (start gate, stop condition, acks); summaries
are found as the last JSON line of noisy output; several consumer processes add up over
the span from the earliest first message to the latest last one; the position check
catches duplicates and missing entries across the consumers of a shared subscription;
ratios are taken to the baselines of the same run; --quick shrinks only what was not
set explicitly, and bad client names or counts are refused.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import subscriptions_bench as bench  # noqa: E402


@pytest.mark.parametrize("messages, batch, expected", [(1, 10, 10), (10, 10, 10), (11, 10, 20), (999, 1, 999)])
def test_round_up_to_whole_batches(messages, batch, expected):
    assert bench.round_up(messages, batch) == expected


def test_raw_consumer_argv_shared_case():
    argv = bench.raw_consumer_argv("pulsar://h:1", "t", "s", "shared", messages=None, idle_timeout_s=2.0,
                                   seconds_max=90.0, permits=500, positions_out="/tmp/p")
    assert argv[1].endswith("raw_consumer.py")
    assert "--wait-for-start" in argv
    assert argv[argv.index("-t") + 1] == "shared"
    assert argv[argv.index("--idle-timeout-s") + 1] == "2.0"
    assert argv[argv.index("--positions-out") + 1] == "/tmp/p"
    assert argv[argv.index("--ack") + 1] == "individual"
    assert "--messages" not in argv


def test_official_consumer_argv_fanout_case():
    argv = bench.official_consumer_argv("pulsar://h:1", "t", "fanout-0", "exclusive", messages=1000,
                                        idle_timeout_s=None, seconds_max=30.0)
    assert argv[argv.index("perf") + 1] == "consume"
    assert "--wait-for-start" in argv
    assert argv[argv.index("--messages") + 1] == "1000"
    assert argv[argv.index("--initial-position") + 1] == "earliest"
    assert "--idle-timeout-s" not in argv


def test_raw_producer_argv():
    argv = bench.raw_producer_argv("pulsar://h:1", "t", 1000, 10, 32)
    assert argv[1].endswith("raw_producer.py")
    assert argv[argv.index("--messages") + 1] == "1000"
    assert argv[argv.index("--batch-messages") + 1] == "10"
    assert argv[argv.index("--message-bytes") + 1] == str(bench.MESSAGE_BYTES)


@pytest.mark.parametrize("batch, window", [(1, 640), (10, 640), (100, 64), (1000, 16)])
def test_producer_window_keeps_about_the_same_messages_in_flight(batch, window):
    assert bench.producer_window(batch) == window


def test_last_json_line_skips_noise():
    text = 'starting\n{"progress": 1}\n2024-01-01 WARN client\n{"messages": 5}\n\n'
    assert bench.last_json_line(text) == {"messages": 5}
    assert bench.last_json_line("no json here\n[1, 2]\n") is None


def test_consumers_add_up_over_their_joint_span():
    runs = [
        {"messages": 100, "first_message_unix_s": 10.0, "last_message_unix_s": 11.0, "errors": 0},
        {"messages": 300, "first_message_unix_s": 10.5, "last_message_unix_s": 12.0, "errors": 1},
    ]
    result = bench.aggregate_consumers(runs, message_bytes=1000)
    assert result["messages"] == 400
    assert result["messages_per_process"] == [100, 300]
    assert result["seconds"] == 2.0
    assert result["msgs_per_s"] == 200.0
    assert result["MB_per_s"] == 0.2
    assert result["errors"] == 1
    assert (result["window_start_unix_s"], result["window_end_unix_s"]) == (10.0, 12.0)


def test_consumers_without_messages_have_no_rate():
    result = bench.aggregate_consumers([{"messages": 0, "first_message_unix_s": None,
                                         "last_message_unix_s": None}])
    assert result["msgs_per_s"] is None and result["window_start_unix_s"] is None


def test_position_check():
    ok = bench.position_check([[(1, 0), (1, 2)], [(1, 1)]], 3)
    assert ok["ok"] and ok["duplicates"] == 0 and ok["missing"] == 0
    duplicated = bench.position_check([[(1, 0), (1, 1)], [(1, 1), (1, 2)]], 3)
    assert not duplicated["ok"] and duplicated["duplicates"] == 1 and duplicated["missing"] == 0
    missing = bench.position_check([[(1, 0)], [(1, 2)]], 3)
    assert not missing["ok"] and missing["missing"] == 1
    assert not bench.position_check([], 1)["ok"]


def test_ratios_to_the_baselines():
    baseline = bench.combine_baselines({"disk_MB_per_s": 200.0, "cpu_frames_per_s": 100_000.0},
                                       {"disk_MB_per_s": 100.0, "cpu_frames_per_s": 50_000.0})
    assert baseline["raw_write_fdatasync_MB_per_s"] == {"before": 200.0, "after": 100.0, "mean": 150.0}
    # one copy: every byte written twice, 1 KiB messages.
    assert baseline["disk_ceiling_msgs_per_s"] == round(75e6 / 1024)
    assert baseline["cpu_codec_frames_per_s"]["mean"] == 75_000
    result = bench.ratios(75_000.0, baseline)
    assert result["ratio_to_cpu_baseline"] == 1.0
    assert result["ratio_to_disk_ceiling"] == round(75_000 / baseline["disk_ceiling_msgs_per_s"], 4)
    assert bench.ratios(None, baseline) == {"ratio_to_disk_ceiling": None, "ratio_to_cpu_baseline": None}


def test_acks_confirmed_only_asks_raw_runs():
    assert bench.acks_confirmed([{"ack_confirmed": True}, {"messages": 1}])
    assert not bench.acks_confirmed([{"ack_confirmed": True}, {"ack_confirmed": False}])


def test_quick_shrinks_only_defaults():
    args = bench.parse_args(["--quick", "--fanout-messages", "12345"])
    assert args.shared_messages == bench.QUICK["shared_messages"]
    assert args.fanout_messages == 12345
    assert bench.parse_args([]).drain_messages == 1_000_000


def test_client_lists():
    assert bench.parse_args(["--shared-clients", "raw", "--drain-clients", ""]).shared_clients == ["raw"]
    assert bench.parse_args(["--drain-clients", ""]).drain_clients == []
    with pytest.raises(SystemExit):
        bench.parse_args(["--fanout-clients", "java"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--shared-consumers", "0"])


def test_cpu_baseline_decodes_frames():
    assert bench.cpu_baseline(0.02) > 0
