"""The fan-out case of issue 14, small: no subscription stalls with backlog and permits.

Proves: on ``magnetar standalone --bookies 1 --copies 1``, 4 exclusive subscriptions
created before publishing, 10,000 batched 1 KiB messages, drained at once by 4
consumers in one official client (asyncio API where installed; receiver queue 1,000, a
cumulative ack per received batch): every subscription receives every message, and the
broker's dispatcher invariant (``magnetar_dispatcher_stalls_total``: a consumer with
permits and backlog that got no read within 1 s) stayed at 0. The full case (50,000
messages, 20 runs in a row) is ``make fanout-check``.

How: bench/fanout_check.py's run, one run; a subscription that gets nothing for 20 s
while it has messages to get ends the run as stalled.
"""

from __future__ import annotations

import os

from bench.fanout_check import dispatcher_invariant, fanout_run, running_standalone

MESSAGES = int(os.environ.get("FANOUT_TEST_MESSAGES", "10000"))


async def test_four_exclusive_subscriptions_drain_a_batched_backlog_at_once(tmp_path):
    async with running_standalone(str(tmp_path / "standalone"), bookies=1, copies=1) as (_process, ready):
        result = await fanout_run(ready["service_url"], 0, MESSAGES)
        invariant = dispatcher_invariant([ready["admin_url"]])
    assert result["stalled"] == [], result
    assert result["received"] == {name: MESSAGES for name in result["received"]}, result
    assert invariant["stalls"] == 0, invariant
    assert invariant["wait_s_max"] <= 1.0, invariant
