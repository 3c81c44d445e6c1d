"""The pure part of bench/latency_raw.py: one workload's figures from its consumers'
summaries (the rate over their joint wall-clock window, complete only with every
message and no duplicate, an unconfirmed final ack an error), and the raw backlog's
subscriptions."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import latency_raw  # noqa: E402


def summary(messages, first, last, duplicates=0, confirmed=True):
    return {"messages": messages, "first_message_unix_s": first, "last_message_unix_s": last,
            "duplicates": duplicates, "ack_confirmed": confirmed}


def test_combined_rate_spans_every_consumer_window():
    result = latency_raw._combined([summary(300, 10.0, 11.0), summary(100, 10.5, 12.0)], 400)
    assert result["messages"] == 400 and result["complete"] and result["errors"] == 0
    assert result["msgs_per_s"] == 200.0          # 400 messages from 10.0 to 12.0
    assert (result["started_unix_s"], result["ended_unix_s"]) == (10.0, 12.0)
    assert result["per_consumer"] == [300, 100]


def test_combined_is_incomplete_when_short_or_duplicated_and_errs_without_the_last_ack():
    assert not latency_raw._combined([summary(399, 10.0, 11.0)], 400)["complete"]
    assert not latency_raw._combined([summary(400, 10.0, 11.0, duplicates=1)], 400)["complete"]
    assert latency_raw._combined([summary(400, 10.0, 11.0, confirmed=False)], 400)["errors"] == 1
    nothing = latency_raw._combined([summary(0, None, None)], 10)
    assert nothing["msgs_per_s"] is None and not nothing["complete"]


def test_the_backlog_has_a_drain_a_shared_work_queue_and_a_subscription_per_fanout_consumer():
    subscriptions = dict(latency_raw.subscriptions())
    assert subscriptions.pop("drain") == "exclusive" and subscriptions.pop("work-queue") == "shared"
    assert subscriptions == {f"fanout-{n}": "exclusive" for n in range(latency_raw.FANOUT_SUBSCRIPTIONS)}
