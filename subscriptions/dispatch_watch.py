"""The dispatcher invariant, checked from outside: a subscription that has entries to
deliver and a consumer that can take them gets a read within a bounded time. Pure (the
caller passes the time).

Theory of operation: a watchdog (the broker's, broker/topic_upkeep.py) samples every
dispatcher on an interval and hands its ``DispatchWatch`` three facts: whether the
dispatcher could send now (a consumer with permits on a writable connection, and a
read position at or before the last confirmed entry), whether a read is in progress,
and how many reads it has started so far. The watch keeps when the current wait began
(the first sample that saw work and no read since); a wait that passes ``bound_s`` is
a stall: counted once per episode, and the caller wakes the dispatcher (so a lost
wake-up costs at most one bound, never forever) and logs it. The longest wait seen is
kept for the metrics, stalls or not, at the sampling interval's resolution.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DispatchWatch:
    # A wait longer than this is a stall (the bound: none waits more than 1 s).
    bound_s: float = 1.0
    stalls: int = 0
    wait_s_max: float = 0.0
    _waiting_since_s: float | None = None
    _reads_seen: int = -1
    _stalled: bool = False

    @property
    def resting(self) -> bool:
        """No wait under way and no stall: a sample with no work would change nothing
        but the read count it remembers."""
        return self._waiting_since_s is None and not self._stalled

    def observe(self, now_s: float, *, has_work: bool, reading: bool, reads_started: int) -> bool:
        """Takes one sample; returns True when this sample begins a stall (the caller
        wakes the dispatcher and logs it)."""
        assert reads_started >= self._reads_seen or self._reads_seen < 0, (reads_started, self._reads_seen)
        progressed = reads_started != self._reads_seen
        self._reads_seen = reads_started
        if not has_work or reading or progressed:
            self._waiting_since_s = now_s if has_work and not reading else None
            self._stalled = False
            return False
        if self._waiting_since_s is None:
            self._waiting_since_s = now_s
            return False
        waited_s = now_s - self._waiting_since_s
        self.wait_s_max = max(self.wait_s_max, waited_s)
        if waited_s <= self.bound_s or self._stalled:
            return False
        self._stalled = True
        self.stalls += 1
        return True
