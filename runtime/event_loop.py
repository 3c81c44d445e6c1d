"""Which asyncio event loop a Magnetar process runs on.

The standard asyncio loop, unless ``--event-loop uvloop`` (or MAGNETAR_EVENT_LOOP=uvloop)
asks for uvloop. uvloop was tried as the servers' default for issue 16 and measured with
bench/latency.py against the standard loop, same tree, same run, 3 repeats
(bench/results/latency_uvloop_vs_asyncio.md, docs/performance.md step 2): no workload
gained in all three repeats while adds still went over gRPC. Measured again after the add
socket (step 24, bench/results/latency_uvloop_2026-11-27.md and
latency_uvloop_3x2_2026-11-27.md): with one bookie uvloop's e2e and durable-ack tails and
the raw client's reads were better in 3 of 3 repeats, with the default three bookies its
e2e p99 was worse in 3 of 3; a second run of both kept only uvloop's lower one-bookie
durable-ack p50 and higher raw drain. No direction that holds across shapes and runs: the
standard loop stays the default, uvloop a choice (tested:
tests/integration/test_standalone_uvloop.py).
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
