"""runtime/eager_future.py: callbacks run inside the call that settles the future."""

from __future__ import annotations

import asyncio

import pytest

from runtime.eager_future import EagerFuture, call_when_done, new_eager_future, settle_all


async def test_callback_runs_inside_set_result() -> None:
    future = new_eager_future()
    seen: list[object] = []
    future.call_when_done(lambda f: seen.append(f.result()))
    future.set_result(7)
    assert seen == [7]                 # no loop turn in between
    assert await future == 7           # and still an ordinary future to an awaiter


async def test_exception_and_cancel_run_the_callbacks() -> None:
    failed, cancelled = new_eager_future(), new_eager_future()
    seen: list[str] = []
    failed.call_when_done(lambda f: seen.append(type(f.exception()).__name__))
    cancelled.call_when_done(lambda f: seen.append("cancelled" if f.cancelled() else "?"))
    failed.set_exception(ValueError("no"))
    assert cancelled.cancel()
    assert seen == ["ValueError", "cancelled"]
    assert not cancelled.cancel()      # a second cancel runs nothing again
    assert seen == ["ValueError", "cancelled"]
    with pytest.raises(ValueError):
        await failed


async def test_registered_when_done_runs_in_the_next_turn() -> None:
    future = new_eager_future()
    future.set_result(1)
    seen: list[int] = []
    future.call_when_done(lambda f: seen.append(f.result()))
    assert seen == []                  # never inside the registering caller's frame
    await asyncio.sleep(0)
    assert seen == [1]


async def test_a_failing_callback_is_reported_and_the_others_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        future = new_eager_future()
        seen: list[str] = []

        def broken(_f: asyncio.Future) -> None:
            raise RuntimeError("callback broke")

        future.call_when_done(broken)
        future.call_when_done(lambda _f: seen.append("second"))
        future.set_result(None)        # does not raise into the settler
        assert seen == ["second"]
        assert len(reported) == 1
        assert isinstance(reported[0]["exception"], RuntimeError)
        assert reported[0]["future"] is future
    finally:
        loop.set_exception_handler(None)


async def test_settle_all_settles_every_future_before_any_callback() -> None:
    futures = [new_eager_future() for _ in range(3)]
    plain = asyncio.get_running_loop().create_future()
    views: list[list[bool]] = []
    for future in futures:
        future.call_when_done(lambda _f: views.append([f.done() for f in futures]))
    futures[1].set_result("earlier")   # already done: left as it is
    views.clear()
    settle_all(futures + [plain], "now")
    assert views == [[True, True, True], [True, True, True]]   # two settled here, each saw all three done
    assert [f.result() for f in futures] == ["now", "earlier", "now"]
    assert plain.result() == "now"


async def test_call_when_done_on_a_plain_future_is_add_done_callback() -> None:
    plain = asyncio.get_running_loop().create_future()
    seen: list[int] = []
    call_when_done(plain, lambda f: seen.append(f.result()))
    plain.set_result(3)
    assert seen == []
    await asyncio.sleep(0)
    assert seen == [3]


async def test_an_eager_future_is_awaited_by_a_task_and_cancelled_with_it() -> None:
    future = EagerFuture(loop=asyncio.get_running_loop())
    seen: list[bool] = []
    future.call_when_done(lambda f: seen.append(f.cancelled()))
    task = asyncio.get_running_loop().create_task(asyncio.wait_for(future, 0.01))
    with pytest.raises(TimeoutError):
        await task
    assert seen == [True]              # the timeout cancelled it through cancel()
