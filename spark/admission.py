"""When a streaming query's next micro-batch may start: ``minMessagesPerTrigger`` and
``maxTriggerDelay``, the Kafka source's ``minOffsetsPerTrigger`` and ``maxTriggerDelay``.

A trigger that finds fewer new messages than the minimum is put off (the reader answers
its start offsets again, so Spark runs no batch), until the minimum is there or the
delay since the last batch the rule let through has passed; then whatever is there is
read. The first trigger of a reader is never put off (as the Kafka source: its clock
starts at zero), so a query (re)started with a backlog below the minimum reads it at
once. Pure: the reader keeps the clock and counts the messages."""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.errors import ConfigError

DEFAULT_DELAY_S = 15 * 60.0    # the Kafka source's maxTriggerDelay default, 15 minutes
_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|min|m|h)?\s*$")


def parse_delay_s(text: str | None) -> float:
    """``maxTriggerDelay``: ``15m``, ``30s``, ``500ms``, ``1h``, or a number of
    milliseconds; the default 15 minutes when absent."""
    if text is None:
        return DEFAULT_DELAY_S
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"option maxTriggerDelay must be a duration such as 15m, 30s or 500ms, not {text!r}")
    number, unit = int(match.group(1)), match.group(2) or "ms"
    return number * _UNITS_S[unit]


@dataclass
class TriggerAdmission:
    """The rule for one reader: ``minimum`` messages, or ``delay_s`` since the last
    batch it let through. ``last_s`` None: no batch yet (the first is never put off)."""

    minimum: int
    delay_s: float
    last_s: float | None = None

    def admit(self, now_s: float, available: int) -> bool:
        """True when a batch of ``available`` new messages starts at ``now_s`` (the
        clock restarts); False when it is put off. ``available`` may be counted only up
        to ``minimum`` (more makes no difference)."""
        assert available >= 0, available
        if self.last_s is None or now_s - self.last_s >= self.delay_s or available >= self.minimum:
            self.last_s = now_s
            return True
        return False
