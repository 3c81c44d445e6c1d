"""Stopping background tasks and servers."""

from __future__ import annotations

import asyncio
import logging
import signal

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancels the tasks and waits until each has finished.

    A task that failed with an operating error before it was stopped is logged (at
    WARNING, with its traceback), not raised: the caller is shutting it down and has no
    better use for the error. Two things are never swallowed:
    - the caller's own cancellation (someone is stopping *us* while we wait): it is
      raised again, so ``cancel_and_wait`` inside a cancelled task cannot turn that
      cancellation into a normal return;
    - an ``AssertionError`` a task died of: a broken invariant crashes the process
      (STYLE.md, "Errors"), however it was found. It is raised once every task has
      finished, so no task is left running behind it.
    """
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    broken: AssertionError | None = None
    for task in running:
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise   # the caller was cancelled, not (only) the task
        except AssertionError as error:
            log.critical("background task broke an invariant: task=%s", task.get_name(), exc_info=error)
            broken = broken or error
        except Exception as error:
            log.warning("background task failed before it was stopped: task=%s error=%r", task.get_name(), error,
                        exc_info=error)
    if broken is not None:
        raise broken


def stop_on_signals(stopping: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stopping`` (a server's cue for its orderly shutdown);
    call from inside the running event loop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
