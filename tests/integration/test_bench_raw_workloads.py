"""bench/latency_raw.py against a real broker and bookies, on a small scale: the raw
client's fixed-rate case receives every message it scheduled once, and the publish it
times writes a backlog that the drain, the work queue (4 shared consumers) and the
fan-out (4 subscriptions) each read completely, without a duplicate."""

from __future__ import annotations

import os
import sys

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH_DIR)

import latency_raw  # noqa: E402
from load_shapes import FANOUT_SUBSCRIPTIONS, filler_bytes  # noqa: E402

from tests.cluster import unique  # noqa: E402


async def test_raw_workloads_read_back_everything_they_wrote(pulsar_cluster):
    url = pulsar_cluster.brokers[0].service_url
    prefix = f"persistent://public/default/{unique('raw-bench')}"

    e2e = await latency_raw.raw_e2e(url, prefix, rate=400, seconds=0.5, filler=filler_bytes(os.urandom))
    assert e2e["complete"] and e2e["errors"] == 0 and e2e["duplicates"] == 0
    assert e2e["received"] == e2e["messages"] == 200     # 0.5 s at 400/s, after the warm-up's
    assert 0 < e2e["latency_ms"]["p50"] <= e2e["latency_ms"]["p99"]

    published = await latency_raw.raw_publish(url, prefix, seconds=0.5)
    backlog = published["messages"]
    assert backlog > 0 and backlog % latency_raw.PUBLISH_BATCH == 0 and published["errors"] == 0

    drain = await latency_raw.raw_drain(url, prefix, backlog)
    assert drain["complete"] and drain["messages"] == backlog and drain["ack_confirmed"]

    work = await latency_raw.raw_work_queue(url, prefix, backlog, idle_s=0.5)
    assert work["complete"] and work["messages"] == backlog and work["duplicates"] == 0
    assert len(work["per_consumer"]) == 4

    fanout = await latency_raw.raw_fanout(url, prefix, backlog)
    assert fanout["complete"] and fanout["per_consumer"] == [backlog] * FANOUT_SUBSCRIPTIONS
