"""Stopping background tasks and servers."""

from __future__ import annotations

import asyncio
import logging
import signal

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancels the tasks and waits until each has finished. A task that failed
    before it was cancelled is logged, not raised: the caller is shutting it down."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception as error:
            log.debug("background task failed before it was stopped: task=%s error=%r", task.get_name(), error)


def stop_on_signals(stopping: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stopping`` (a server's cue for its orderly shutdown);
    call from inside the running event loop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
