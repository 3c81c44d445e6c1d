"""Named start-up components (runtime/lifecycle.py): started in order, stopped in
reverse, and a failed start stops exactly what had started."""

from __future__ import annotations

import asyncio

import pytest

from runtime.lifecycle import Component, LifecycleStack


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def component(self, name: str, *, start_fails: bool = False, stop_fails: bool = False) -> Component:
        async def start() -> None:
            await asyncio.sleep(0)
            self.events.append(f"start {name}")
            if start_fails:
                raise RuntimeError(f"{name} would not start")

        async def stop() -> None:
            await asyncio.sleep(0)
            self.events.append(f"stop {name}")
            if stop_fails:
                raise OSError(f"{name} would not stop")

        return Component(name, start, stop)


def test_starts_in_order_and_stops_in_reverse():
    recorder = Recorder()
    stack = LifecycleStack("test", [recorder.component(name) for name in ("store", "port", "storage", "server")])

    async def run() -> None:
        await stack.start()
        assert stack.started == ["store", "port", "storage", "server"]
        await stack.stop()
        assert stack.started == []
        await stack.stop()     # a second stop (a finally after the orderly one) stops nothing

    asyncio.run(run())
    assert recorder.events == ["start store", "start port", "start storage", "start server",
                               "stop server", "stop storage", "stop port", "stop store"]


def test_a_failed_start_stops_what_started_newest_first_and_raises_its_error():
    recorder = Recorder()
    stack = LifecycleStack("test", [recorder.component("store"), recorder.component("port"),
                                    recorder.component("storage", start_fails=True), recorder.component("server")])
    with pytest.raises(RuntimeError, match="storage would not start"):
        asyncio.run(stack.start())
    # The failed component is not stopped (it never started) and the later one never starts.
    assert recorder.events == ["start store", "start port", "start storage", "stop port", "stop store"]
    assert stack.started == []


def test_a_stop_failing_after_a_failed_start_is_logged_and_the_start_error_wins(caplog):
    recorder = Recorder()
    stack = LifecycleStack("test", [recorder.component("store"), recorder.component("port", stop_fails=True),
                                    recorder.component("storage", start_fails=True)])
    with pytest.raises(RuntimeError, match="storage would not start"):
        asyncio.run(stack.start())
    assert recorder.events == ["start store", "start port", "start storage", "stop port", "stop store"]
    assert "component=port" in caplog.text


def test_every_stop_runs_and_the_first_failure_is_raised_at_the_end():
    recorder = Recorder()
    stack = LifecycleStack("test", [recorder.component("store", stop_fails=True), recorder.component("port"),
                                    recorder.component("server", stop_fails=True)])

    async def run() -> None:
        await stack.start()
        with pytest.raises(OSError, match="server would not stop"):
            await stack.stop()

    asyncio.run(run())
    assert recorder.events[3:] == ["stop server", "stop port", "stop store"]


def test_a_stack_starts_once_and_names_are_unique():
    recorder = Recorder()
    stack = LifecycleStack("test", [recorder.component("store")])

    async def run() -> None:
        await stack.start()
        with pytest.raises(AssertionError):
            await stack.start()
        await stack.stop()

    asyncio.run(run())
    with pytest.raises(AssertionError):
        LifecycleStack("test", [recorder.component("store"), recorder.component("store")])
