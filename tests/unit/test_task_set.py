"""The owner of background tasks (runtime/tasks.py: TaskSet, log_failure).

What it proves: a spawned task is held until it ends and then dropped; a task that
fails is logged once, when it ends (an operating error at WARNING, another exception
at ERROR with its traceback), even if nobody ever looks at it; ``close`` cancels the
tasks still running and returns only after each has finished (their ``finally`` blocks
ran); after ``close`` nothing can be spawned (ShuttingDown, and the coroutine is closed
rather than left "never awaited"); a task that died of an AssertionError (a broken
invariant) makes ``close`` raise it once the others are stopped; and the caller's own
cancellation while ``close`` waits is not swallowed.

How: real tasks on the test's event loop; log records captured with caplog.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import pytest

from common.errors import MetadataUnavailable, ShuttingDown
from runtime.tasks import TaskSet, log_failure


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_task_is_held_until_it_ends():
    """The set holds the task while it runs (len 1) and drops it once it ended."""
    tasks = TaskSet("test")
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        return "done"

    task = tasks.spawn(work(), name="worker")
    gc.collect()
    assert len(tasks) == 1 and list(tasks) == [task]
    release.set()
    assert await task == "done"
    await asyncio.sleep(0)
    assert len(tasks) == 0
    await tasks.close()


async def test_a_failure_is_logged_once_when_the_task_ends(caplog):
    """An operating error is logged at WARNING without traceback; any other exception
    at ERROR with it; closing the set afterwards logs neither again."""
    tasks = TaskSet("owner-x")

    async def operating() -> None:
        raise MetadataUnavailable("etcd away")

    async def unexpected() -> None:
        raise KeyError("bug")

    with caplog.at_level(logging.DEBUG, logger="runtime.tasks"):
        tasks.spawn(operating(), name="op")
        tasks.spawn(unexpected(), name="bug")
        for _ in range(3):
            await asyncio.sleep(0)
        await tasks.close()
    records = [r for r in caplog.records if "background task failed" in r.getMessage()]
    assert len(records) == 2
    by_task = {("op" if "task=op" in r.getMessage() else "bug"): r for r in records}
    assert by_task["op"].levelno == logging.WARNING and by_task["op"].exc_info is None
    assert "owner=owner-x" in by_task["op"].getMessage()
    assert by_task["bug"].levelno == logging.ERROR
    assert by_task["bug"].exc_info is not None and by_task["bug"].exc_info[0] is KeyError


async def test_close_cancels_and_waits_for_running_tasks():
    """Two tasks still running at close: both cancelled, and their cleanup ran before
    close returned."""
    tasks = TaskSet("test")
    cleaned: list[str] = []

    async def runner(name: str) -> None:
        try:
            await _forever()
        finally:
            await asyncio.sleep(0)       # cleanup that itself awaits
            cleaned.append(name)

    first = tasks.spawn(runner("a"))
    second = tasks.spawn(runner("b"))
    await asyncio.sleep(0)
    await tasks.close()
    assert sorted(cleaned) == ["a", "b"]
    assert first.cancelled() and second.cancelled()
    assert len(tasks) == 0 and tasks.closed


async def test_nothing_can_be_spawned_after_close():
    """spawn after close raises ShuttingDown and closes the coroutine (no
    "coroutine was never awaited" warning)."""
    tasks = TaskSet("test")
    await tasks.close()
    coroutine = _forever()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ShuttingDown):
            tasks.spawn(coroutine)
        assert coroutine.cr_frame is None     # closed
        gc.collect()


async def test_a_broken_invariant_is_raised_by_close_after_the_others_stopped():
    """A task that died of AssertionError: close stops the other task, then raises."""
    tasks = TaskSet("test")

    async def broken() -> None:
        assert False, "invariant"

    tasks.spawn(broken())
    sleeper = tasks.spawn(_forever())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    with pytest.raises(AssertionError, match="invariant"):
        await tasks.close()
    assert sleeper.cancelled()


async def test_the_callers_cancellation_during_close_is_raised_again():
    """A caller cancelled while close waits for a slow task ends cancelled."""
    tasks = TaskSet("test")
    stopping = asyncio.Event()
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await _forever()
        finally:
            stopping.set()
            await release.wait()

    slow = tasks.spawn(slow_to_stop())
    await asyncio.sleep(0)
    closer = asyncio.ensure_future(tasks.close())
    await stopping.wait()
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    release.set()
    await asyncio.gather(slow, return_exceptions=True)


async def test_log_failure_as_a_done_callback(caplog):
    """log_failure retrieves and logs a shared task's failure; a success or a
    cancellation logs nothing."""
    async def fails() -> None:
        raise MetadataUnavailable("gone")

    with caplog.at_level(logging.DEBUG, logger="runtime.tasks"):
        failing = asyncio.ensure_future(fails())
        failing.add_done_callback(log_failure)
        fine = asyncio.ensure_future(asyncio.sleep(0))
        fine.add_done_callback(log_failure)
        cancelled = asyncio.ensure_future(_forever())
        cancelled.add_done_callback(log_failure)
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(failing, fine, cancelled, return_exceptions=True)
        await asyncio.sleep(0)
    records = [r for r in caplog.records if "background task failed" in r.getMessage()]
    assert len(records) == 1 and "gone" in records[0].getMessage()


async def test_join_waits_for_tasks_to_end_by_themselves_within_a_bound():
    """join returns True once the running tasks finished on their own, and False after
    its timeout when one does not (which close then cancels)."""
    tasks = TaskSet("test")
    release = asyncio.Event()

    async def finishes() -> None:
        await release.wait()

    tasks.spawn(finishes())
    asyncio.get_running_loop().call_later(0.01, release.set)
    assert await tasks.join(timeout_s=5.0)
    stuck = tasks.spawn(_forever())
    assert not await tasks.join(timeout_s=0.01)
    await tasks.close()
    assert stuck.cancelled()
