"""A token bucket that paces a sender at a target rate without sleeping per message.

Tokens accrue at ``rate_per_s`` up to ``capacity``; the sender takes all the tokens there
are, sends that many messages back to back, then sleeps until the next token. At 10,000
msgs/s a token comes every 100 µs, far below what ``time.sleep`` resolves reliably, so
the sender wakes, finds several tokens, and sends a small burst: the rate over any
interval longer than a few milliseconds is the target, and sleeping per message (which
would undershoot by the sleep overshoot on every message) is avoided.

The capacity bounds how much a stalled sender catches up afterwards: a stall shorter than
``capacity / rate_per_s`` loses nothing; tokens beyond that are dropped (the achieved rate
then falls below the target, and the runner reports it).

Pure: the caller passes the time (monotonic seconds).
"""

from __future__ import annotations


class TokenBucket:
    def __init__(self, rate_per_s: float, capacity: float, now_s: float) -> None:
        assert rate_per_s > 0, rate_per_s
        assert capacity >= 1, capacity
        self.rate_per_s = float(rate_per_s)
        self.capacity = float(capacity)
        self.tokens = 1.0  # the first message goes at once; no burst at start
        self.updated_s = now_s

    def _refill(self, now_s: float) -> None:
        if now_s > self.updated_s:
            self.tokens = min(self.capacity, self.tokens + (now_s - self.updated_s) * self.rate_per_s)
            self.updated_s = now_s

    def take(self, now_s: float, wanted: int) -> int:
        """Takes up to ``wanted`` whole tokens; returns how many were taken."""
        assert wanted >= 0, wanted
        self._refill(now_s)
        granted = min(wanted, int(self.tokens))
        self.tokens -= granted
        assert self.tokens >= 0, self.tokens
        return granted

    def seconds_until_token(self, now_s: float) -> float:
        self._refill(now_s)
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s
