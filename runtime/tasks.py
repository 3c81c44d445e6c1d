"""Owning, stopping and watching background tasks, and stopping servers.

Every task has an owner (STYLE.md, "Async patterns"): a component that starts a task
in the background keeps it in a ``TaskSet``, which holds a strong reference until the
task ends (asyncio keeps only a weak one: an unreferenced task may be collected while
it runs), logs its failure when it ends (nobody else may ever look at it), and on the
component's ``close`` cancels and awaits whatever still runs. A task shared through
``asyncio.shield`` by several callers gets ``log_failure`` as a done-callback instead.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any, Callable, Coroutine, TypeVar

from common.errors import MagnetarError, ShuttingDown

log = logging.getLogger(__name__)

T = TypeVar("T")


def log_failure(task: asyncio.Task[Any], *, owner: str = "") -> AssertionError | None:
    """Logs how a finished task failed, if it did (and so marks its exception as
    retrieved): an operating error (``MagnetarError``) at WARNING, anything else at
    ERROR with its traceback, a broken invariant (``AssertionError``) at CRITICAL.
    Returns that AssertionError, for an owner that re-raises it. Usable as a
    done-callback: ``task.add_done_callback(log_failure)``."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is None:
        return None
    name = task.get_name()
    if isinstance(error, AssertionError):
        log.critical("background task broke an invariant: owner=%s task=%s", owner, name, exc_info=error)
        return error
    if isinstance(error, MagnetarError):
        log.warning("background task failed: owner=%s task=%s error=%s", owner, name, error)
    else:
        log.error("background task failed: owner=%s task=%s error=%r", owner, name, error, exc_info=error)
    return None


class TaskSet:
    """The background tasks of one component (``owner`` names it in logs).

    ``spawn`` starts a task and keeps it until it ends; a task that fails is logged
    when it ends (``log_failure``). ``close`` refuses new tasks, cancels those still
    running and waits for them (``cancel_and_wait``); an AssertionError any task died
    of, earlier or while stopping, is raised from ``close`` once all have finished, so
    a broken invariant still crashes the process. Bounded by what the owner starts:
    each owner documents why its tasks are few (one per event it reacts to, at most
    one per bundle, stream or client...).
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._broken: AssertionError | None = None

    def spawn(self, coroutine: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Starts ``coroutine`` as a task owned by this set. Raises ShuttingDown (and
        closes the coroutine, so it is not reported as never awaited) once the set is
        closed: nothing may start behind an owner's shutdown."""
        if self._closed:
            coroutine.close()
            raise ShuttingDown(f"{self.owner} is closed: no new background task")
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        broken = log_failure(task, owner=self.owner)
        if broken is not None and self._broken is None:
            self._broken = broken

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self):
        return iter(list(self._tasks))

    async def join(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the tasks running now to end by themselves (an
        owner whose tasks finish work, such as closing a channel, lets them before
        ``close`` cancels the rest). True if all ended in time."""
        running = [task for task in self._tasks if not task.done()]
        if not running:
            return True
        _done, pending = await asyncio.wait(running, timeout=timeout_s)
        return not pending

    async def close(self) -> None:
        """Cancels every task still running and waits until each has finished."""
        self._closed = True
        # Tasks already done are left to their done-callback (logged once, there).
        running = [task for task in self._tasks if not task.done()]
        try:
            await cancel_and_wait(*running)
        finally:
            for task in running:
                self._tasks.discard(task)
        if self._broken is not None:
            raise self._broken


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


async def every(interval_s: float, check: Callable[[float], bool]) -> None:
    """Calls ``check(now_s)`` (``time.monotonic()``) every ``interval_s``, first after one
    interval, until it returns False: a periodic check (a connection's keep-alive) in a
    task its caller owns."""
    assert interval_s > 0, interval_s
    while True:
        await asyncio.sleep(interval_s)
        if not check(time.monotonic()):
            return


def stop_on_signals(stopping: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stopping`` (a server's cue for its orderly shutdown);
    call from inside the running event loop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
