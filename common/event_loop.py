"""Which asyncio event loop a Magnetar process runs on.

The standard asyncio loop, unless ``--event-loop uvloop`` (or MAGNETAR_EVENT_LOOP=uvloop)
asks for uvloop. uvloop was tried as the servers' default for issue 16 and measured with
bench/latency.py against the standard loop, same tree, same run, 3 repeats
(bench/results/latency_uvloop_vs_asyncio.md, docs/performance.md): no workload gained
in all three repeats, and the durable-ack p50 (1x1) and the 3x2 publish rate were worse
in two of three. The path is a chain of wake-ups across gRPC's threads and the journal
thread (docs/performance.md), which a faster loop does not shorten. It stays a choice,
to measure again on a quiet machine.
"""

from __future__ import annotations

import asyncio

EVENT_LOOPS = ("asyncio", "uvloop")


def install(choice: str) -> str:
    """Makes every later ``asyncio.run`` of this process use the chosen loop; returns
    its name."""
    assert choice in EVENT_LOOPS, choice
    if choice == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(None)    # the standard policy
    return choice
