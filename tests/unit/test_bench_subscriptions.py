"""The pure parts of the subscriptions benchmark (bench/subscriptions_bench.py), with no
sockets and no processes.

Proves that: backlogs round up to whole batches; the consumer and producer command
lines mean what the case needs (start gate, stop condition, acks), as the programs they
start read them: each argv is fed to that program's own parser (raw_consumer,
raw_producer, ``magnetar perf consume``) and the parsed fields are checked; several
consumer processes add up over the span from the earliest first message to the latest
last one; the position check catches duplicates and missing entries across the
consumers of a shared subscription; ratios are taken to the baselines of the same run
(msgs/s to the disk ceiling, entries/s to the codec's frames/s); --quick shrinks only
what was not set explicitly, and bad client names or counts are refused.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import raw_consumer  # noqa: E402
import raw_producer  # noqa: E402
import subscriptions_bench as bench  # noqa: E402
from magnetar.cli import build_parser  # noqa: E402
from magnetar.tools.perf_consumer import PerfConsumer  # noqa: E402


@pytest.mark.parametrize("messages, batch, expected", [(1, 10, 10), (10, 10, 10), (11, 10, 20), (999, 1, 999)])
def test_round_up_to_whole_batches(messages, batch, expected):
    assert bench.round_up(messages, batch) == expected


def test_raw_consumer_argv_shared_case():
    """A shared consumer: no message count, stops when idle, writes its positions."""
    argv = bench.raw_consumer_argv("pulsar://h:1", "t", "s", "shared", messages=None, idle_timeout_s=2.0,
                                   seconds_max=90.0, permits=500, positions_out="/tmp/p")
    assert argv[:2] == [sys.executable, os.path.join(bench.BENCH_DIR, "raw_consumer.py")]
    args = raw_consumer.parse_args(argv[2:])
    assert (args.topic, args.service_url, args.subscription) == ("t", "pulsar://h:1", "s")
    assert (args.subscription_type, args.initial_position) == ("shared", "earliest")
    assert args.wait_for_start is True
    assert (args.messages, args.idle_timeout_s, args.seconds) == (None, 2.0, 90.0)
    assert args.permits == 500
    assert (args.ack, args.ack_group_entries) == ("individual", 1)
    assert args.positions_out == "/tmp/p"


def test_raw_consumer_argv_counted_case():
    """An exclusive consumer that knows its count: no idle stop, no positions file."""
    argv = bench.raw_consumer_argv("pulsar://h:1", "t", "drain-raw", "exclusive", messages=5000,
                                   idle_timeout_s=None, seconds_max=30.0, permits=10_000, positions_out=None)
    args = raw_consumer.parse_args(argv[2:])
    assert (args.subscription, args.subscription_type) == ("drain-raw", "exclusive")
    assert (args.messages, args.idle_timeout_s, args.seconds) == (5000, None, 30.0)
    assert args.positions_out is None
    assert args.wait_for_start is True


def test_official_consumer_argv_fanout_case():
    argv = bench.official_consumer_argv("pulsar://h:1", "t", "fanout-0", "exclusive", messages=1000,
                                        idle_timeout_s=None, seconds_max=30.0)
    assert argv[:3] == [sys.executable, "-m", "magnetar"]
    args = build_parser(argv[3:]).parse_args(argv[3:])
    assert (args.command, args.perf_mode) == ("perf", "consume")
    assert (args.topic, args.service_url, args.subscription) == ("t", "pulsar://h:1", "fanout-0")
    assert (args.subscription_type, args.initial_position) == ("exclusive", "earliest")
    assert args.wait_for_start is True
    assert (args.messages, args.idle_timeout_s, args.seconds) == (1000, None, 30.0)
    assert args.progress_interval_s == 0
    assert PerfConsumer.check_arguments(args) is None


def test_official_consumer_argv_shared_case():
    argv = bench.official_consumer_argv("pulsar://h:1", "t", "shared", "shared", messages=None,
                                        idle_timeout_s=2.0, seconds_max=90.0)
    args = build_parser(argv[3:]).parse_args(argv[3:])
    assert (args.subscription, args.subscription_type) == ("shared", "shared")
    assert (args.messages, args.idle_timeout_s, args.seconds) == (None, 2.0, 90.0)
    assert args.wait_for_start is True
    assert PerfConsumer.check_arguments(args) is None


def test_raw_producer_argv():
    argv = bench.raw_producer_argv("pulsar://h:1", "t", 1000, 10, 32)
    assert argv[:2] == [sys.executable, os.path.join(bench.BENCH_DIR, "raw_producer.py")]
    args = raw_producer.parse_args(argv[2:])
    assert (args.topic, args.service_url) == ("t", "pulsar://h:1")
    assert (args.messages, args.seconds) == (1000, None)
    assert (args.batch_messages, args.message_bytes, args.window_entries) == (10, bench.MESSAGE_BYTES, 32)


@pytest.mark.parametrize("batch, window", [(1, 640), (10, 640), (100, 64), (1000, 16)])
def test_producer_window_keeps_about_the_same_messages_in_flight(batch, window):
    assert bench.producer_window(batch) == window


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
                                         "last_message_unix_s": None, "errors": 0}])
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
    """The disk baseline is the median of every probe before and after; msgs/s goes to
    the one-copy disk ceiling, entries/s (msgs/s over messages per entry) to the
    frames/s of the codec baseline."""
    baseline = bench.combine_baselines({"disk_MB_per_s": [200.0, 190.0, 210.0], "cpu_frames_per_s": 100_000.0},
                                       {"disk_MB_per_s": [100.0, 140.0, 160.0], "cpu_frames_per_s": 50_000.0})
    disk = baseline["raw_write_fdatasync_MB_per_s"]
    assert disk == {"median": 175.0, "before": 200.0, "after": 140.0, "min": 100.0, "max": 210.0,
                    "probes_count": 6, "baseline_unstable": True}
    # one copy: every byte written twice, 1 KiB messages; from the median.
    assert baseline["disk_ceiling_msgs_per_s"] == round(87.5e6 / 1024)
    assert baseline["cpu_codec_frames_per_s"] == {"before": 100_000, "after": 50_000, "mean": 75_000}
    result = bench.ratios(750_000.0, 10, baseline)
    assert result["entries_per_s"] == 75_000.0
    assert result["entries_ratio_to_cpu_baseline"] == 1.0
    assert result["ratio_to_disk_ceiling"] == round(750_000 / baseline["disk_ceiling_msgs_per_s"], 4)
    assert "ratio_to_cpu_baseline" not in result
    assert bench.ratios(75_000.0, 1, baseline)["entries_ratio_to_cpu_baseline"] == 1.0
    assert bench.ratios(None, 10, baseline) == {"entries_per_s": None, "ratio_to_disk_ceiling": None,
                                                "entries_ratio_to_cpu_baseline": None}


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
