"""Counters of a perf run, shared between the threads that record (the client's callback
or the receive loop) and the one that reports progress every few seconds.

Each message is recorded once, into an interval histogram and a whole-run histogram.
Reporting swaps the interval histogram for an empty one under the lock, so each interval
line covers exactly the messages of that interval and the final summary all of them.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from magnetar.tools.latency_histogram import LatencyHistogram

MB = 1e6  # MB/s as pulsar-perf and disk tools report it: 10**6 bytes
# The event a consumer announces on stderr once its subscription exists
# ({"event": "subscribed", ...}): runners (bench/harness.py) wait for it before they
# start producers, or let several consumers go at once. Both perf consume and
# bench/raw_consumer.py announce it; defined here, where neither pulls in the client.
READY_EVENT = "subscribed"


def announce_ready(**details) -> None:
    print(json.dumps({"event": READY_EVENT, **details}), file=sys.stderr, flush=True)


def is_ready_line(line: bytes | str) -> bool:
    """Whether a line of a consumer's stderr is its announcement (any other line, JSON
    or not, is not)."""
    try:
        document = json.loads(line)
    except ValueError:   # JSONDecodeError, and UnicodeDecodeError for stray bytes
        return False
    return isinstance(document, dict) and document.get("event") == READY_EVENT


class PerfStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages = 0
        self.bytes = 0
        self.errors = 0
        self.first_error: str | None = None
        self.latency = LatencyHistogram()
        self._interval_latency = LatencyHistogram()
        self._interval_messages = 0
        self._interval_bytes = 0
        self._interval_started_s = time.monotonic()

    def record(self, size_bytes: int, latency_us: int | None) -> None:
        with self._lock:
            self.messages += 1
            self.bytes += size_bytes
            self._interval_messages += 1
            self._interval_bytes += size_bytes
            if latency_us is not None:
                self.latency.record(latency_us)
                self._interval_latency.record(latency_us)

    def record_error(self, text: str) -> None:
        with self._lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = text

    def take_interval(self) -> dict:
        """Rates and latency since the previous call."""
        now_s = time.monotonic()
        with self._lock:
            histogram, self._interval_latency = self._interval_latency, LatencyHistogram()
            messages, self._interval_messages = self._interval_messages, 0
            size_bytes, self._interval_bytes = self._interval_bytes, 0
            elapsed_s, self._interval_started_s = now_s - self._interval_started_s, now_s
            total_messages, errors = self.messages, self.errors
        elapsed_s = max(elapsed_s, 1e-9)
        latency = histogram.summary_ms()
        return {"msgs_per_s": round(messages / elapsed_s, 1), "MB_per_s": round(size_bytes / elapsed_s / MB, 3),
                "latency_ms": {key: latency[key] for key in ("p50", "p99", "max")},
                "total_messages": total_messages, "errors": errors}


class ProgressReporter:
    """Prints one JSON line to stderr every ``interval_s`` with what ``describe`` returns,
    on its own daemon thread, until stopped."""

    def __init__(self, interval_s: float, describe) -> None:
        self._interval_s = interval_s
        self._describe = describe
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perf-progress", daemon=True)

    def start(self) -> None:
        if self._interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s + 1)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            print(json.dumps({"progress": self._describe()}), file=sys.stderr, flush=True)
