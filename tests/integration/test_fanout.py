"""The fan-out case of issue 14, small: no subscription stalls with backlog and permits.

Proves: on ``magnetar standalone --bookies 1 --copies 1``, 4 exclusive subscriptions
created before publishing, 10,000 batched 1 KiB messages, drained at once by 4
consumers in one official client (asyncio API where installed; receiver queue 1,000, a
cumulative ack per received batch): every subscription receives every message, and the
broker's dispatcher invariant (``magnetar_dispatcher_stalls_total``: a consumer with
permits and backlog that got no read within 1 s) stayed at 0. The full case (50,000
messages, 20 runs in a row) is ``make fanout-check``.

The same with the broker's entry cache at 1 MiB (a backlog of 4,000 messages, ~4 MiB, is
then read back from the bookie, with the managed ledger reading ahead of the consumers):
every message still arrives, no stall, and the broker says it read ahead
(``magnetar_broker_read_ahead_entries`` above 0); and 3,000 distinct messages read back
by one consumer come every one, in order, once.

How: bench/fanout_check.py's run, one run; a subscription that gets nothing for 20 s
while it has messages to get ends the run as stalled.
"""

from __future__ import annotations

import asyncio
import os

import pulsar

from bench.fanout_check import dispatcher_invariant, fanout_run, metric_values, running_standalone, scrape
from tests.cluster import receive_in_order

MESSAGES = int(os.environ.get("FANOUT_TEST_MESSAGES", "10000"))
# With a 1 MiB broker cache: about 4 MiB of backlog, read back from the bookie.
SMALL_CACHE_MESSAGES = 4000


async def test_four_exclusive_subscriptions_drain_a_batched_backlog_at_once(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1) as (_process, ready):
        result = await fanout_run(ready["service_url"], 0, MESSAGES)
        invariant = dispatcher_invariant([ready["admin_url"]])
    assert result["stalled"] == [], result
    assert result["received"] == {name: MESSAGES for name in result["received"]}, result
    assert invariant["stalls"] == 0, invariant
    assert invariant["wait_s_max"] <= 1.0, invariant


def _ordered_backlog_is_read_back(service_url: str, count: int) -> int:
    """Publishes ``count`` distinct 1 KiB messages (batched) to a fresh topic whose
    subscription exists, then reads them back from the earliest: every one, in order,
    once (returns the repeats)."""
    topic = f"persistent://public/default/read-ahead-{os.getpid()}"
    expected = [f"{index:08d}".encode() * 128 for index in range(count)]
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        client.subscribe(topic, "ordered", initial_position=pulsar.InitialPosition.Earliest).close()
        # Blocking when 1,000 sends are pending (else send_async fails the rest at once);
        # batches of 16 KiB, so that a read ahead (at most an eighth of the 1 MiB cache)
        # holds several entries.
        producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                          batching_max_allowed_size_in_bytes=16 * 1024,
                                          block_if_queue_full=True)
        failed = []
        for payload in expected:
            producer.send_async(payload, lambda result, _id: failed.append(result) if result != pulsar.Result.Ok
                                else None)
        producer.flush()
        producer.close()
        assert failed == []
        consumer = client.subscribe(topic, "ordered", receiver_queue_size=1000)
        return asyncio.run(receive_in_order(consumer, expected))
    finally:
        client.close()


async def test_a_backlog_larger_than_the_entry_cache_is_read_ahead_from_the_bookie(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1,
                                  env={"MAGNETAR_ENTRY_CACHE_MIB": "1"}) as (_process, ready):
        result = await fanout_run(ready["service_url"], 0, SMALL_CACHE_MESSAGES)
        repeats = await asyncio.to_thread(_ordered_backlog_is_read_back, ready["service_url"], 3000)
        invariant = dispatcher_invariant([ready["admin_url"]])
        metrics = scrape(f"{ready['admin_url']}/metrics")
    assert repeats == 0
    assert result["stalled"] == [], result
    assert result["received"] == {name: SMALL_CACHE_MESSAGES for name in result["received"]}, result
    assert invariant["stalls"] == 0, invariant
    assert sum(metric_values(metrics, "magnetar_broker_read_ahead_entries")) > 0
    assert sum(metric_values(metrics, "magnetar_broker_entry_cache_bytes")) <= 1024 * 1024
