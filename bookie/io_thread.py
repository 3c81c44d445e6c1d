"""The journal's IO thread: one thread that runs calls in the order they were handed
to it and gives each outcome to a callback, on that thread.

Why not a one-worker ``ThreadPoolExecutor`` (what the journal used before): every
group crosses to the IO thread and back, and the executor's hand-off costs more than
the hand-off itself (a future with its condition, a work item, the idle semaphore,
the done-callback run under the future's lock). Measured on this machine
(`bench/thread_hop_bench.py`, bench/results/thread_hop.json, a 1 KiB write +
fdatasync awaited by a coroutine): p50 218 → 178 us back to back and 509 → 446 us
after a millisecond of rest, executor → a plain thread fed by a ``SimpleQueue``.

Bounded: the journal hands over one group at a time (``Journal._in_flight``), so the
queue holds at most that one call and the stop marker. Owned: started on the first
call, stopped (and joined) by ``shutdown``.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

Outcome = Callable[[Any, "BaseException | None"], None]


class IoThread:
    def __init__(self, name: str) -> None:
        self._name = name
        self._requests: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Outcome] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def submit(self, call: Callable[..., Any], args: tuple[Any, ...], outcome: Outcome) -> None:
        """Runs ``call(*args)`` on the thread after every call submitted before it, then
        ``outcome(result, None)`` or, if it raised, ``outcome(None, error)`` (there too;
        an outcome that raises is logged and the thread goes on)."""
        if self._stopped:
            raise RuntimeError(f"{self._name}: submit after shutdown")
        if self._thread is None:
            # A daemon thread, so a journal never closed cannot hold the interpreter
            # open at exit; the bookie closes its journal (joining the thread) first.
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._requests.put((call, args, outcome))

    def _run(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            call, args, outcome = request
            try:
                result = call(*args)
            except BaseException as error:  # noqa: BLE001 - handed to the caller, as a future would
                result, failure = None, error
            else:
                failure = None
            try:
                outcome(result, failure)
            except Exception:
                # As an executor does with a failing done-callback: logged, and the thread
                # goes on (dead, it would leave every later call unanswered).
                log.exception("io thread outcome failed: thread=%s", self._name)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Lets the calls already submitted finish, then stops the thread and waits for
        it (at most ``timeout_s``; None: as long as they take)."""
        self._stopped = True
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join(timeout_s)
