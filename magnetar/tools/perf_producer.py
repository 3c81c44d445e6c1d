"""``magnetar perf produce``: publish at a target rate (or as fast as the cluster
acknowledges) with the official client, and measure throughput and publish latency.

How the measurement is kept honest:
- Sends are asynchronous (``send_async``) with a bounded window per producer: a
  semaphore of ``--max-pending`` permits is taken before each send and given back by the
  send's callback. The sender therefore runs as fast as acknowledgements come back, never
  faster, and nothing queues without bound in the client (its own queue is sized above
  the window, so it never rejects a send; the pending bytes are bounded too, client.py).
- With ``--rate`` the sender is paced by a token bucket (token_bucket.py), not by one
  sleep per message, which at 10,000 msgs/s would undershoot badly.
- A message counts once its callback reports success, i.e. once the broker acknowledged
  it (for Magnetar: on Qa bookies' journals). Throughput is acknowledged messages over
  the time from the first send to the last acknowledgement.
- Publish latency is from just before ``send_async`` to the callback (monotonic clock),
  so it includes the client's batching delay, as pulsar-perf's does.
- Each payload carries a header (perf_payload.py) with the wall-clock send time in ns, a
  producer id and a sequence number, and the message's event time is set too, so that
  ``perf consume`` measures end-to-end latency and can spot duplicates and gaps.

The client invokes callbacks on its IO thread; they only count and release permits.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import threading
import time
from dataclasses import dataclass

import pulsar

from magnetar.tools import perf_payload
from magnetar.tools.client import PENDING_BYTES_MAX
from magnetar.tools.perf_stats import MB, PerfStats, ProgressReporter
from magnetar.tools.token_bucket import TokenBucket

# A stall shorter than this is caught up after it; see token_bucket.py.
TOKEN_BUCKET_CAPACITY_S = 0.1
# Messages sent between two looks at the clock and the deadline when not paced.
SEND_BURST_MAX = 64
# How long one wait for a window permit lasts before the deadline is checked again.
PERMIT_WAIT_S = 0.1


@dataclass
class _ProducerSlot:
    producer: pulsar.Producer
    producer_id: int
    window: threading.BoundedSemaphore
    next_sequence: int = 0


class PerfProducer:
    def __init__(self, client: pulsar.Client, args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        self.stats = PerfStats()
        self._filler = os.urandom(max(0, args.size - perf_payload.HEADER_BYTES))
        self._slots: list[_ProducerSlot] = []
        self.sent = 0  # handed to the client, acknowledged or not

    @staticmethod
    def check_arguments(args: argparse.Namespace) -> str | None:
        """What is wrong with the arguments, or None."""
        if args.size < perf_payload.HEADER_BYTES:
            return f"--size must be at least {perf_payload.HEADER_BYTES} (the perf header)"
        if args.rate < 0 or args.producers < 1 or args.max_pending < 1:
            return "--rate must be >= 0, --producers and --max-pending >= 1"
        if args.messages is not None and args.messages < 1:
            return "--messages must be >= 1"
        pending_bytes = args.producers * args.max_pending * args.size
        if pending_bytes > PENDING_BYTES_MAX:
            return (f"--producers x --max-pending x --size = {pending_bytes} bytes pending; "
                    f"keep it at most {PENDING_BYTES_MAX}")
        return None

    def _create_producers(self) -> None:
        args = self.args
        for _ in range(args.producers):
            producer = self.client.create_producer(
                args.topic, batching_enabled=args.batching, batching_max_messages=args.batch_max_messages,
                batching_max_allowed_size_in_bytes=args.batch_max_bytes,
                batching_max_publish_delay_ms=args.batch_max_delay_ms,
                send_timeout_millis=args.send_timeout_s * 1000,
                # Twice our window: ours bounds what is pending, the client's must never
                # be the one to refuse a send (whatever order it frees a slot and calls back in).
                max_pending_messages=2 * args.max_pending, block_if_queue_full=False)
            self._slots.append(_ProducerSlot(producer, random.getrandbits(32),
                                             threading.BoundedSemaphore(args.max_pending)))

    def _on_sent(self, slot: _ProducerSlot, started_ns: int, size_bytes: int, result, message_id) -> None:
        # On the client's IO thread: must not raise (it would end the process).
        try:
            if result == pulsar.Result.Ok:
                self.stats.record(size_bytes, (time.perf_counter_ns() - started_ns) // 1000)
            else:
                self.stats.record_error(str(result))
        except BaseException as error:  # noqa: BLE001
            self.stats.record_error(f"callback failed: {error!r}")
        finally:
            slot.window.release()

    def _send(self, slot: _ProducerSlot, deadline_s: float | None) -> bool:
        """Sends one message once a window permit is free; False if the deadline came first."""
        while not slot.window.acquire(timeout=PERMIT_WAIT_S):
            if deadline_s is not None and time.monotonic() >= deadline_s:
                return False
        send_time_ns = time.time_ns()
        payload = perf_payload.encode(perf_payload.PerfHeader(slot.producer_id, slot.next_sequence, send_time_ns),
                                      self._filler)
        slot.next_sequence += 1
        started_ns = time.perf_counter_ns()
        try:
            slot.producer.send_async(payload, functools.partial(self._on_sent, slot, started_ns, len(payload)),
                                     event_timestamp=send_time_ns // 1_000_000)
        except pulsar.PulsarException as error:
            slot.window.release()
            self.stats.record_error(f"send_async: {error!r}")
        self.sent += 1
        return True

    def _send_loop(self, started_s: float) -> None:
        args = self.args
        deadline_s = started_s + args.seconds if args.messages is None else None
        remaining = args.messages
        bucket = (TokenBucket(args.rate, max(1.0, args.rate * TOKEN_BUCKET_CAPACITY_S), started_s)
                  if args.rate > 0 else None)
        slot_count = len(self._slots)
        while remaining is None or remaining > 0:
            now_s = time.monotonic()
            if deadline_s is not None and now_s >= deadline_s:
                return
            burst = SEND_BURST_MAX if remaining is None else min(SEND_BURST_MAX, remaining)
            if bucket is not None:
                burst = bucket.take(now_s, burst)
                if burst == 0:
                    wait_s = bucket.seconds_until_token(now_s)
                    if deadline_s is not None:
                        wait_s = min(wait_s, max(0.0, deadline_s - now_s))
                    time.sleep(wait_s)
                    continue
            for _ in range(burst):
                if not self._send(self._slots[self.sent % slot_count], deadline_s):
                    return
            if remaining is not None:
                remaining -= burst

    def _drain(self) -> bool:
        """Waits for every pending send to complete or fail (bounded by the send timeout):
        all the window permits back means nothing is pending."""
        for slot in self._slots:
            slot.producer.flush()
        deadline_s = time.monotonic() + self.args.send_timeout_s + 10
        for slot in self._slots:
            for _ in range(self.args.max_pending):
                if not slot.window.acquire(timeout=max(0.0, deadline_s - time.monotonic())):
                    return False
        return True

    def run(self) -> dict:
        args = self.args
        self._create_producers()
        reporter = ProgressReporter(args.progress_interval_s, self.stats.take_interval)
        started_s = time.monotonic()
        started_unix_s = time.time()
        self.stats.take_interval()  # the first interval starts now, not at construction
        reporter.start()
        interrupted = False
        try:
            self._send_loop(started_s)
        except KeyboardInterrupt:
            interrupted = True
        drained = self._drain()
        elapsed_s = time.monotonic() - started_s
        reporter.stop()
        for slot in self._slots:
            slot.producer.close()
        summary = self._summary(elapsed_s, drained=drained, interrupted=interrupted)
        # Wall-clock bounds, so that a runner can add up several producer processes exactly.
        summary["started_unix_s"] = round(started_unix_s, 6)
        summary["ended_unix_s"] = round(started_unix_s + elapsed_s, 6)
        return summary

    def _summary(self, elapsed_s: float, *, drained: bool, interrupted: bool) -> dict:
        args = self.args
        stats = self.stats
        rate_achieved = stats.messages / elapsed_s
        return {
            "mode": "produce", "topic": args.topic, "producers": args.producers, "size_bytes": args.size,
            "batching": args.batching, "batch_max_delay_ms": args.batch_max_delay_ms if args.batching else None,
            "max_pending": args.max_pending, "rate_target": args.rate or None,
            "seconds": round(elapsed_s, 3), "sent": self.sent, "messages": stats.messages,
            "msgs_per_s": round(rate_achieved, 1), "MB_per_s": round(stats.bytes / elapsed_s / MB, 3),
            "errors": stats.errors, "first_error": stats.first_error,
            # A paced run that could not keep up measures a lower rate than asked for.
            "rate_sustained": (rate_achieved >= 0.95 * args.rate) if args.rate else None,
            "publish_latency_ms": stats.latency.summary_ms(),
            "drained": drained, "interrupted": interrupted,
        }
