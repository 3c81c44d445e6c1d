"""bundles/rounds.py: a loop's round never stalls or ends it without a line in the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bundles.rounds import run_round
from common.errors import MetadataUnavailable


async def _fails_with(error: BaseException) -> None:
    await asyncio.sleep(0)
    raise error


async def _hangs() -> None:
    await asyncio.Event().wait()


async def _swallows_cancellation() -> None:
    # Like a wait that returns its result although it was cancelled (CPython gh-86296),
    # then waits on: cancelled once, it does not end.
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0.25)


def test_a_good_round_is_true():
    async def good():
        return 1
    assert asyncio.run(run_round(good(), what="leader", bound_s=1))


def test_a_failed_round_is_logged_and_the_loop_goes_on(caplog):
    caplog.set_level(logging.WARNING)
    assert not asyncio.run(run_round(_fails_with(MetadataUnavailable("etcd away")), what="leader", bound_s=1))
    assert "leader round failed: error=etcd away" in caplog.text
    assert not asyncio.run(run_round(_fails_with(KeyError("x")), what="leader", bound_s=1))
    assert "leader round failed: error=KeyError" in caplog.text


def test_a_cancellation_from_inside_the_round_is_logged_not_taken_for_the_loops(caplog):
    # grpc.aio raises CancelledError from a call whose channel was closed under it.
    caplog.set_level(logging.WARNING)
    assert not asyncio.run(run_round(_fails_with(asyncio.CancelledError()), what="load report", bound_s=1))
    assert "load report round ended by a cancellation it did not ask for" in caplog.text


def test_a_round_past_its_bound_is_logged_and_cancelled(caplog):
    caplog.set_level(logging.WARNING)

    async def scenario():
        started = asyncio.get_running_loop().time()
        assert not await run_round(_hangs(), what="leader", bound_s=0.2)
        return asyncio.get_running_loop().time() - started
    assert asyncio.run(scenario()) < 2
    assert "leader round took longer than its bound, cancelling it" in caplog.text


def test_a_round_that_ignores_its_cancellation_is_logged_again(caplog):
    caplog.set_level(logging.WARNING)
    assert asyncio.run(run_round(_swallows_cancellation(), what="leader", bound_s=0.1))
    assert "leader round still running after it was cancelled" in caplog.text


def test_a_broken_invariant_reaches_the_loops_owner():
    with pytest.raises(AssertionError):
        asyncio.run(run_round(_fails_with(AssertionError("broken")), what="leader", bound_s=1))


def test_stopping_the_loop_stops_its_round():
    async def scenario():
        inner_cancelled = asyncio.Event()

        async def round_():
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                inner_cancelled.set()
                raise
        loop_task = asyncio.ensure_future(run_round(round_(), what="leader", bound_s=5))
        await asyncio.sleep(0.05)
        loop_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop_task
        return inner_cancelled.is_set()
    assert asyncio.run(scenario())
