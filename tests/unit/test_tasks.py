"""Stopping background tasks (runtime/tasks.py: cancel_and_wait), and the periodic
check (every).

What it proves: every task given is cancelled and has finished when the call returns
(None entries are skipped); a task that had already crashed with an operating error is
logged at WARNING with its traceback and not raised; a task that died of an
AssertionError (a broken invariant) makes the call raise it, but only after the other
tasks finished; and the caller's own cancellation is never swallowed: a task cancelled
while it waits in cancel_and_wait stays cancelled (the bug was a plain return, so a
shutdown that cancelled the waiter carried on as if nothing happened). The wait is
bounded: a task whose cancellation was swallowed (Python 3.11's asyncio.wait_for does
that when its result and the cancellation arrive together; a prefix cache's watch hung
a test teardown for 300 s so) is cancelled again and stops; a task that ignores every
cancellation makes the call raise AssertionError naming it instead of hanging.

How: real tasks on the test's event loop; nothing sleeps longer than it takes to yield.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from common.errors import MetadataUnavailable
from runtime.tasks import STOP_ATTEMPTS_MAX, cancel_and_wait


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_every_task_is_cancelled_and_finished():
    """Two sleeping tasks and a None: both tasks are done (cancelled) afterwards."""
    first = asyncio.create_task(_forever())
    second = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    await cancel_and_wait(first, None, second)
    assert first.done() and first.cancelled()
    assert second.done() and second.cancelled()


async def test_a_task_that_crashed_with_an_operating_error_is_logged_with_its_traceback(caplog):
    """The error is not raised; it is logged at WARNING with exc_info attached."""
    async def crash() -> None:
        raise MetadataUnavailable("etcd away")

    task = asyncio.create_task(crash(), name="crasher")
    await asyncio.sleep(0)
    assert task.done()
    with caplog.at_level(logging.DEBUG, logger="runtime.tasks"):
        await cancel_and_wait(task)
    records = [r for r in caplog.records if "crasher" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].exc_info is not None and records[0].exc_info[0] is MetadataUnavailable


async def test_an_assertion_error_is_raised_after_every_task_finished():
    """A broken invariant crashes the caller; the other task was still stopped first."""
    async def broken() -> None:
        assert False, "invariant"

    crashed = asyncio.create_task(broken())
    sleeper = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    with pytest.raises(AssertionError, match="invariant"):
        await cancel_and_wait(crashed, sleeper)
    assert sleeper.done() and sleeper.cancelled()


async def test_the_callers_own_cancellation_is_raised_again():
    """The waiter is cancelled while cancel_and_wait waits for a task that takes a
    while to stop: the waiter ends cancelled, and never runs the code after the call."""
    stopping = asyncio.Event()
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopping.set()
            await release.wait()      # cleanup that outlasts the waiter's cancellation

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    after_the_call = []

    async def waiter() -> None:
        await cancel_and_wait(task)
        after_the_call.append(True)

    waiting = asyncio.create_task(waiter())
    await stopping.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()
    assert after_the_call == []
    release.set()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_task_cancelled_before_the_call_is_not_the_callers_cancellation():
    """A task that was already cancelled does not make the (uncancelled) caller raise."""
    task = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_a_task_whose_cancellation_was_swallowed_is_cancelled_again():
    """The task waits with asyncio.wait_for; its result and the cancellation arrive in
    one loop iteration, so wait_for returns and the task goes on waiting. The second
    request, a bounded while later, stops it."""
    reply = asyncio.Event()

    async def swallows_once() -> None:
        await asyncio.wait_for(reply.wait(), 5.0)
        await asyncio.Event().wait()      # e.g. a watch on a quiet prefix

    task = asyncio.create_task(swallows_once())
    for _ in range(3):
        await asyncio.sleep(0)            # the task now waits in wait_for
    assert not task.done()
    reply.set()                           # the reply, then (no await between) the cancel
    async with asyncio.timeout(5.0):
        await cancel_and_wait(task, stop_wait_s=0.05)
    assert task.cancelled()


async def test_a_task_that_ignores_every_cancellation_raises_instead_of_hanging(caplog):
    """A task that catches every cancellation: after STOP_ATTEMPTS_MAX requests the
    call raises AssertionError naming it (and says so at CRITICAL)."""
    release = asyncio.Event()
    requests = []

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                requests.append(True)

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="runtime.tasks"):
        with pytest.raises(AssertionError, match="stubborn"):
            async with asyncio.timeout(5.0):
                await cancel_and_wait(task, stop_wait_s=0.05)
    assert len(requests) == STOP_ATTEMPTS_MAX
    assert any(r.levelno == logging.CRITICAL and "stubborn" in r.getMessage() for r in caplog.records)
    release.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_every_checks_after_each_interval_until_the_check_says_stop():
    """``every`` (the connections' keep-alive driver) waits one interval before each
    check, passes the monotonic time, and returns when a check returns False."""
    import time

    from runtime.tasks import every

    started_s = time.monotonic()
    seen: list[float] = []

    def check(now_s: float) -> bool:
        seen.append(now_s)
        return len(seen) < 3

    await asyncio.wait_for(every(0.01, check), timeout=5)
    assert len(seen) == 3
    assert seen == sorted(seen)
    assert seen[0] - started_s >= 0.009
