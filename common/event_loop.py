"""Which asyncio event loop a Magnetar process runs on.

The servers (bookie, broker, gateway, auto-recovery) run on uvloop: measured with
bench/latency.py (docs/performance.md), its libuv loop takes less CPU per socket read
and write and per cross-thread wake-up (the journal's IO thread, gRPC's poller thread)
than the standard selector loop, which every stage of a publish pays several times.
``asyncio`` is kept as a choice (``--event-loop asyncio``) to compare the two and as a
way out should a platform lack uvloop; ``auto`` is uvloop for the servers, the standard
loop for the tools and the standalone supervisor (which forks children with a
``preexec_fn``, and gains nothing from a faster loop).
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# The commands that serve traffic: they take uvloop under ``auto``.
SERVER_COMMANDS = frozenset({"bookie", "broker", "gateway", "autorecovery"})


def chosen_loop(choice: str, command: str | None) -> str:
    """"uvloop" or "asyncio" for ``command`` under ``choice`` (pure)."""
    assert choice in EVENT_LOOPS, choice
    if choice == "auto":
        return "uvloop" if command in SERVER_COMMANDS else "asyncio"
    return choice


def install(choice: str, command: str | None) -> str:
    """Makes every later ``asyncio.run`` of this process use the chosen loop; returns
    its name. uvloop missing (a platform without a wheel) falls back to asyncio under
    ``auto`` and is an error when asked for by name."""
    loop = chosen_loop(choice, command)
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
            log.warning("uvloop is not installed, using the standard asyncio loop")
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return loop
