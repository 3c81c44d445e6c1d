"""The journal's IO thread (bookie/io_thread.py): calls run in order on one thread, each
outcome reaches its callback there, a failure is handed over rather than lost, and
shutdown lets the submitted calls finish."""

from __future__ import annotations

import threading

import pytest

from bookie.io_thread import IoThread


def test_calls_run_in_order_on_one_named_thread_and_hand_over_their_results():
    io = IoThread("journal-test")
    ran: list[tuple[int, str]] = []
    outcomes: list[tuple[object, object, str]] = []
    done = threading.Event()

    def call(index: int) -> int:
        ran.append((index, threading.current_thread().name))
        return index * 10

    def outcome(result: object, error: BaseException | None) -> None:
        outcomes.append((result, error, threading.current_thread().name))
        if len(outcomes) == 50:
            done.set()

    for index in range(50):
        io.submit(call, (index,), outcome)
    assert done.wait(10)
    io.shutdown(10)
    assert [index for index, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"journal-test"}
    assert outcomes == [(index * 10, None, "journal-test") for index in range(50)]


def test_a_failing_call_hands_over_its_error_and_the_next_call_still_runs():
    io = IoThread("journal-test")
    outcomes: list[tuple[object, object]] = []
    boom = OSError(5, "Input/output error")

    def fail() -> None:
        raise boom

    io.submit(fail, (), lambda result, error: outcomes.append((result, error)))
    io.submit(lambda: "after", (), lambda result, error: outcomes.append((result, error)))
    io.shutdown(10)
    assert outcomes == [(None, boom), ("after", None)]


def test_shutdown_waits_for_submitted_calls_then_refuses_more():
    io = IoThread("journal-test")
    release = threading.Event()
    finished: list[str] = []
    io.submit(lambda: release.wait(10), (), lambda result, error: finished.append("first"))
    io.submit(lambda: None, (), lambda result, error: finished.append("second"))
    threading.Timer(0.05, release.set).start()
    io.shutdown(10)
    assert finished == ["first", "second"]
    with pytest.raises(RuntimeError, match="after shutdown"):
        io.submit(lambda: None, (), lambda result, error: None)


def test_shutdown_without_a_call_starts_no_thread():
    before = threading.active_count()
    io = IoThread("journal-test")
    io.shutdown(1)
    assert threading.active_count() == before


def test_an_outcome_that_raises_is_logged_and_the_thread_goes_on(caplog):
    io = IoThread("journal-test")
    outcomes: list[object] = []

    def broken(result: object, error: BaseException | None) -> None:
        raise RuntimeError("outcome bug")

    io.submit(lambda: 1, (), broken)
    io.submit(lambda: 2, (), lambda result, error: outcomes.append(result))
    io.shutdown(10)
    assert outcomes == [2]
    assert "io thread outcome failed" in caplog.text
