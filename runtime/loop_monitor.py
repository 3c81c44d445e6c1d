"""Event-loop lag: how late a timer fires. Every server runs one; a lag of more than a
few milliseconds means something blocked the loop or hogged it, and every request in
flight waited that long. Exported as a Prometheus histogram."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Histogram

from runtime.gc_pauses import GcPauses

# The monitor wakes this often; its own cost is one timer per interval.
INTERVAL_S = 0.01
LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class LoopMonitor:
    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.lag = Histogram(f"{prefix}_event_loop_lag_seconds", "How late a 10 ms timer fired",
                             buckets=LAG_BUCKETS_S, registry=registry)
        self.worst_s = 0.0
        # The collector's pauses are one cause of lag; measured while the monitor runs.
        self.gc_pauses = GcPauses(registry, prefix)

    async def run(self) -> None:
        self.gc_pauses.install()
        try:
            while True:
                started = time.perf_counter()
                await asyncio.sleep(INTERVAL_S)
                lag = time.perf_counter() - started - INTERVAL_S
                self.lag.observe(max(lag, 0.0))
                self.worst_s = max(self.worst_s, lag)
        finally:
            self.gc_pauses.remove()
