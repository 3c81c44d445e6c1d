"""Stopping background tasks and servers."""

from __future__ import annotations

import asyncio
import logging
import signal

log = logging.getLogger(__name__)


# A task asked to stop gets this long to end before it is asked again. What our tasks
# do once cancelled is bounded by the metadata call timeout (5 s, metadata/etcd_store.py),
# so 10 s is ample; a task still running by then lost the request on the way (on Python
# 3.11 ``asyncio.wait_for`` returns its result instead of raising when that result and
# the cancellation arrive together, CPython gh-86296, and libraries we use call it).
STOP_WAIT_S = 10.0
# Requests to stop before giving up: a task that outlives this many ignores them.
STOP_ATTEMPTS_MAX = 3


async def cancel_and_wait(*tasks: asyncio.Task | None, stop_wait_s: float = STOP_WAIT_S) -> None:
    """Cancels the tasks and waits until each has finished.

    The wait is bounded: a task still running ``stop_wait_s`` after it was cancelled is
    cancelled again (a swallowed cancellation is a one-off race), up to
    STOP_ATTEMPTS_MAX times; one that still runs then is a broken invariant and raises
    AssertionError naming it, instead of hanging its caller (a shutdown, a close) for
    ever.

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
    assert stop_wait_s > 0, stop_wait_s
    running = [task for task in tasks if task is not None]
    pending = set(running)
    for attempt in range(STOP_ATTEMPTS_MAX):
        if not pending:
            break
        for task in pending:
            task.cancel()
        # asyncio.wait never cancels what it waits for, and raises the caller's own
        # cancellation as it comes.
        _done, pending = await asyncio.wait(pending, timeout=stop_wait_s)
        if pending and attempt + 1 < STOP_ATTEMPTS_MAX:
            log.warning("tasks did not stop when cancelled, cancelling again: tasks=%s attempt=%d",
                        sorted(task.get_name() for task in pending), attempt + 1)
    broken: AssertionError | None = None
    for task in running:
        if not task.done() or task.cancelled():
            continue
        error = task.exception()
        if error is None:
            continue
        if isinstance(error, AssertionError):
            log.critical("background task broke an invariant: task=%s", task.get_name(), exc_info=error)
            broken = broken or error
        elif isinstance(error, Exception):
            log.warning("background task failed before it was stopped: task=%s error=%r", task.get_name(), error,
                        exc_info=error)
        else:
            raise error   # KeyboardInterrupt, SystemExit: not ours to swallow
    if pending:
        names = sorted(task.get_name() for task in pending)
        log.critical("tasks ignored every request to stop: tasks=%s attempts=%d", names, STOP_ATTEMPTS_MAX)
        raise AssertionError(f"tasks {names} did not stop after {STOP_ATTEMPTS_MAX} cancellations "
                             f"{stop_wait_s:g} s apart")
    if broken is not None:
        raise broken


def stop_on_signals(stopping: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stopping`` (a server's cue for its orderly shutdown);
    call from inside the running event loop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
