"""Event-loop lag: how late a timer fires. Every server runs one; a lag of more than a
few milliseconds means something blocked the loop or hogged it, and every request in
flight waited that long. Exported as a Prometheus histogram."""

from __future__ import annotations

import asyncio
import os
import time

from prometheus_client import CollectorRegistry, Histogram

from runtime.gc_pauses import GcPauses

# The monitor wakes this often; its own cost is one timer per interval (about 1 % of a
# core at 10 ms on the 2-core test machine, idle or not).
INTERVAL_S = 0.01
# Another interval, from the server's environment. The test suite (tests/conftest.py)
# sets 0.1 s for every server it starts: it keeps many idle bookies and brokers alive
# over a run, and their monitors' wake-ups were CPU the tests competed for. Lag is
# measured the same way, just sampled ten times less often.
INTERVAL_ENV = "MAGNETAR_LOOP_MONITOR_INTERVAL_S"
INTERVAL_S_RANGE = (0.001, 10.0)


def interval_s() -> float:
    """INTERVAL_S, or the environment's INTERVAL_ENV (ignored unless a number in
    INTERVAL_S_RANGE: a monitor never stops a server from starting)."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return INTERVAL_S
    low, high = INTERVAL_S_RANGE
    return value if low <= value <= high else INTERVAL_S
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class LoopMonitor:
    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.lag = Histogram(f"{prefix}_event_loop_lag_seconds", "How late a 10 ms timer fired",
                             buckets=LAG_BUCKETS_S, registry=registry)
        self.worst_s = 0.0
        self.interval_s = interval_s()
        # The collector's pauses are one cause of lag; measured while the monitor runs.
        self.gc_pauses = GcPauses(registry, prefix)

    async def run(self) -> None:
        self.gc_pauses.install()
        try:
            while True:
                started = time.perf_counter()
                await asyncio.sleep(self.interval_s)
                lag = time.perf_counter() - started - self.interval_s
                self.lag.observe(max(lag, 0.0))
                self.worst_s = max(self.worst_s, lag)
        finally:
            self.gc_pauses.remove()
