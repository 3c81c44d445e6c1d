"""runtime/write_batch.py: writes held in a scope leave once per transport, in order, when
the outermost scope ends; outside a scope they leave at once; a transport released
before its close gets what was held for it; a closed transport gets nothing; the scope
ends (and writes) even when its work raises; a transport whose write fails does not cost
the others theirs; each thread has its own scope."""

from __future__ import annotations

import threading

import pytest

from runtime import write_batch


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []
        self.closing = False

    def writelines(self, buffers) -> None:
        self.calls.append([bytes(b) for b in buffers])

    def is_closing(self) -> bool:
        return self.closing


def test_outside_a_scope_every_write_leaves_at_once() -> None:
    transport = RecordingTransport()
    write_batch.write(transport, [b"a"])
    write_batch.write(transport, [b"b", b"c"])
    assert transport.calls == [[b"a"], [b"b", b"c"]]


def test_a_scope_sends_once_per_transport_in_order_when_it_ends() -> None:
    first, second = RecordingTransport(), RecordingTransport()
    with write_batch.batched_writes():
        write_batch.write(first, [b"m1"])
        write_batch.write(second, [b"x"])
        write_batch.write(first, [b"r1", b"r2"])
        with write_batch.batched_writes():         # joins the outer scope
            write_batch.write(first, [b"m2"])
        assert first.calls == [] and second.calls == []
    assert first.calls == [[b"m1", b"r1", b"r2", b"m2"]]
    assert second.calls == [[b"x"]]
    write_batch.write(first, [b"after"])           # the scope is over
    assert first.calls[-1] == [b"after"]


def test_begin_opens_a_scope_only_when_none_is_open() -> None:
    transport = RecordingTransport()
    assert write_batch.begin() is True
    try:
        assert write_batch.begin() is False          # joins: the outer caller ends it
        write_batch.write(transport, [b"held"])
        assert transport.calls == []
    finally:
        write_batch.end()
    assert transport.calls == [[b"held"]]
    write_batch.end()                                # no scope open: nothing to write
    assert transport.calls == [[b"held"]]


def test_release_writes_what_is_held_before_a_close_and_a_closed_transport_gets_nothing() -> None:
    closing, closed = RecordingTransport(), RecordingTransport()
    with write_batch.batched_writes():
        write_batch.write(closing, [b"error"])
        write_batch.release(closing)
        assert closing.calls == [[b"error"]]
        closing.closing = True
        write_batch.write(closed, [b"lost"])
        closed.closing = True
    assert closing.calls == [[b"error"]]
    assert closed.calls == []
    write_batch.release(closing)                   # no scope: nothing to do


def test_the_scope_writes_even_when_its_work_raises() -> None:
    transport = RecordingTransport()
    with pytest.raises(RuntimeError):
        with write_batch.batched_writes():
            write_batch.write(transport, [b"before the error"])
            raise RuntimeError("handler failed")
    assert transport.calls == [[b"before the error"]]
    write_batch.write(transport, [b"next"])
    assert transport.calls[-1] == [b"next"]


def test_a_transport_that_fails_its_write_does_not_cost_the_others_theirs() -> None:
    class Failing(RecordingTransport):
        def writelines(self, buffers) -> None:
            raise RuntimeError("write after write_eof")

    failing, healthy = Failing(), RecordingTransport()
    with pytest.raises(RuntimeError, match="write_eof"):
        with write_batch.batched_writes():
            write_batch.write(failing, [b"x"])
            write_batch.write(healthy, [b"y"])
    assert healthy.calls == [[b"y"]]


def test_each_thread_has_its_own_scope() -> None:
    here, there = RecordingTransport(), RecordingTransport()
    with write_batch.batched_writes():
        write_batch.write(here, [b"held"])
        thread = threading.Thread(target=write_batch.write, args=(there, [b"at once"]))
        thread.start()
        thread.join()
        assert there.calls == [[b"at once"]]
        assert here.calls == []
    assert here.calls == [[b"held"]]
