"""What every client of the issue-16 benchmarks shares, whichever system it drives:
the message (1 KiB with its due time in the first 8 bytes), the sizes of the workloads
and the fixed-rate schedule of the end-to-end case.

Theory of operation of the schedule (no coordinated omission): message ``i`` is due at
``t0 + i / rate``. The sender waits until then, or sends at once when it is late, and
puts the *due* time in the payload; the consumer (same process, same clock:
``perf_counter_ns``) records receive time minus due time. A stall of the sender, the
client or the server therefore counts against every message it delayed, not only the
one that was slow. The first ``warmup`` messages are sent on the same schedule but not
counted (``measure_from_ns`` is the due time of the first counted one).

``FixedRate`` is used from a thread (``run_sync``: the official Pulsar client,
bench/latency_client.py) and from an event loop (``run_async``: the peers' asyncio
clients, bench/peer_clients.py; the schedule runs in a thread there too), so both
measure exactly the same schedule.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Callable

MESSAGE_BYTES = 1024
FANOUT_SUBSCRIPTIONS = 4
WORK_QUEUE_CONSUMERS = 4
# At most this many publishes awaiting their acknowledgement (the bound).
MAX_PENDING = 1000
# The publish case sends in bursts of this many (one payload, one start time each) and
# learns of each burst's acknowledgement at once: a pipeline's reply (Redis), the
# receipt of its last message (Pulsar's producer completes sends in order).
PUBLISH_BATCH = 50
# Messages before the measured ones of the latency cases (first connection, stream or
# queue creation, warm-up), not counted.
WARMUP_MESSAGES = 200
# A consumer that gets nothing for this long has read all there is.
RECEIVE_IDLE_S = 3.0

_DUE = struct.Struct(">q")


def payload(due_ns: int, filler: bytes) -> bytes:
    """A message: its due time (``perf_counter_ns``) then ``filler``."""
    return _DUE.pack(due_ns) + filler


def due_of(data: bytes) -> int:
    return _DUE.unpack_from(data)[0]


def filler_bytes(random_bytes: Callable[[int], bytes]) -> bytes:
    return random_bytes(MESSAGE_BYTES - _DUE.size)


class FixedRate:
    """``total`` sends at ``rate`` per second, the first ``warmup`` of them not counted."""

    def __init__(self, rate: float, total: int, warmup: int = WARMUP_MESSAGES,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        assert rate > 0 and total > warmup >= 0, (rate, total, warmup)
        self.rate = float(rate)
        self.total = total
        self.warmup = warmup
        self.clock = clock
        self.t0: int | None = None
        # Set when the schedule starts: a consumer compares due times with it.
        self.measure_from_ns: int | None = None
        self.started_unix_s: float | None = None   # wall clock of the first counted send
        self.late_max_ns = 0

    def start(self) -> None:
        self.t0 = self.clock()
        self.measure_from_ns = self.due(self.warmup)

    def due(self, index: int) -> int:
        assert self.t0 is not None, "start() first"
        return self.t0 + int(index * 1e9 / self.rate)

    def wait_ns(self, index: int) -> int:
        """How long to wait before sending ``index`` (<= 0: now), and the lateness kept."""
        if index == self.warmup:
            self.started_unix_s = time.time()
        wait = self.due(index) - self.clock()
        if wait < 0:
            self.late_max_ns = max(self.late_max_ns, -wait)
        return wait

    def counted(self, due_ns: int) -> bool:
        return self.measure_from_ns is not None and due_ns >= self.measure_from_ns

    def run_sync(self, send: Callable[[int, int], None]) -> None:
        """Calls ``send(index, due_ns)`` on schedule, sleeping in this thread."""
        self.start()
        for index in range(self.total):
            wait = self.wait_ns(index)
            if wait > 0:
                time.sleep(wait / 1e9)
            send(index, self.due(index))

    async def run_async(self, send: Callable[[int, int], None]) -> None:
        """Calls ``send(index, due_ns)`` on schedule in the running event loop. The
        schedule itself runs in a thread with ``time.sleep``, as ``run_sync`` does: an
        event loop's timers wake on whole milliseconds (epoll), which at 1,000 msgs/s
        would send most messages late by a fraction of a millisecond and charge it to
        the system measured. ``send`` must not block: it starts a task if it must wait."""
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.run_sync, lambda index, due: loop.call_soon_threadsafe(send, index, due))

    def late_max_ms(self) -> float:
        return round(self.late_max_ns / 1e6, 3)
