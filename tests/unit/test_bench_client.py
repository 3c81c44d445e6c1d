"""The pure parts of bench/client_bench.py (`make bench-client`), with no server started.

Proves that: fan-out counts every delivery (messages x subscriptions), the other
workloads each message once; the case order puts our client beside each other client and
reverses on every other repeat, so each pair alternates which goes first; the summary
takes medians over the runs that did not fail, and checks the issue's aims per workload
(drain and fan-out >= 5x the official client, produce and work queue >= 2x, >= Redis
everywhere) from them, with no verdict where a side has no run; a consuming case in which
nothing arrives for STALL_S fails naming what each consumer received.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from bench import client_bench  # noqa: E402


def _run(rate: float, cpu: float) -> dict:
    return {"msgs_per_s": rate, "cpu_s_per_100k": cpu, "elapsed_s": 1.0, "cpu_s": 1.0}


def test_fanout_counts_every_delivery():
    assert client_bench.deliveries("fanout", 1_000) == 1_000 * client_bench.FANOUT_SUBSCRIPTIONS
    for workload in ("produce", "drain", "work_queue"):
        assert client_bench.deliveries(workload, 1_000) == 1_000


def test_ours_runs_beside_each_other_client_and_pairs_alternate():
    first = client_bench.case_order(["ours", "official", "redis"], 0)
    second = client_bench.case_order(["ours", "official", "redis"], 1)
    assert first[1] == "ours" and second[1] == "ours"
    assert second == first[::-1]
    assert client_bench.case_order(["ours", "official"], 0) == ["official", "ours"]
    assert client_bench.case_order(["ours", "official"], 1) == ["ours", "official"]


def test_summary_medians_and_aims():
    runs = {"ours": [_run(100.0, 1.0), _run(300.0, 3.0), {"failed": "exit status -11"}],
            "official": [_run(40.0, 4.0), _run(40.0, 4.0)],
            "redis": [_run(250.0, 2.0), _run(150.0, 2.0)]}
    drain = client_bench.summarize("drain", runs)
    assert drain["ours"]["msgs_per_s_median"] == 200.0
    assert drain["ours"]["failed_runs"] == 1
    assert drain["ratio_ours_to_official"] == 5.0
    assert drain["aim_vs_official"] == 5.0 and drain["aim_vs_official_met"] is True
    assert drain["cpu_ratio_official_to_ours"] == 2.0
    assert drain["ratio_ours_to_redis"] == 1.0 and drain["aim_vs_redis_met"] is True

    work = client_bench.summarize("work_queue", {**runs, "official": [_run(101.0, 1.0)]})
    assert work["aim_vs_official"] == 2.0 and work["aim_vs_official_met"] is False

    lost = client_bench.summarize("fanout", {"ours": [{"failed": "no result within 150 s"}],
                                             "official": [_run(40.0, 4.0)]})
    assert lost["ours"]["msgs_per_s_median"] is None
    assert lost["ratio_ours_to_official"] is None and lost["aim_vs_official_met"] is None
    assert "ratio_ours_to_redis" not in lost


def test_a_stalled_case_fails_naming_each_consumer_and_a_finished_one_returns(monkeypatch):
    monkeypatch.setattr(client_bench, "STALL_S", 0.5)

    async def stalled() -> None:
        received = [3, 0]
        never = asyncio.Event()
        tasks = [asyncio.create_task(asyncio.sleep(60)) for _ in received]
        with pytest.raises(RuntimeError, match=r"stalled.*\[3, 0\]"):
            await client_bench._until_done(tasks, received, never)
        assert all(task.cancelled() for task in tasks)

    async def finished() -> tuple[float, float]:
        received, done = [0], asyncio.Event()

        async def consume() -> None:
            for _ in range(5):
                received[0] += 1
                await asyncio.sleep(0)
            done.set()
        return await client_bench._until_done([asyncio.create_task(consume())], received, done, cancel=False)

    asyncio.run(stalled())
    end, cpu_end = asyncio.run(finished())
    assert end > 0 and cpu_end > 0
