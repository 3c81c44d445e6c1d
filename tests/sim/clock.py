"""An asyncio event loop on a virtual clock, for the simulator.

``loop.time()`` is a number the loop advances itself: whenever nothing is ready to run,
the loop jumps straight to its next timer instead of sleeping. So ``asyncio.sleep``,
``asyncio.timeout`` and ``call_later`` in the code under test (the real ledger client
and bookie code) take no wall-clock time, and a run is a deterministic function of its
seed: the same callbacks run in the same order. Nothing in a simulation may use
threads or real IO (the loop would not wait for them).
"""

from __future__ import annotations

import asyncio
import selectors


class SimulationDeadlock(RuntimeError):
    """Nothing ready and no timer pending while the simulation still awaits something."""


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events:
            return events
        assert self.loop is not None
        if timeout is None:
            raise SimulationDeadlock("no callback ready and no timer pending")
        if timeout > 0:
            self.loop.now += timeout
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now


def run_virtual(coroutine):
    """Runs ``coroutine`` to completion on a fresh virtual-clock loop."""
    loop = VirtualClockLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coroutine)
    finally:
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
