"""Futures whose owner-side callbacks run where the result becomes known.

An asyncio future runs its done-callbacks in the loop's next turn. On the publish path a
result passes through several futures in a row (the bookie client's add, the write
handle's entry, the managed ledger's append): each link costs a loop turn before the
next one even starts, three turns between the bookie's reply being read and the
receipt being written (docs/performance.md, step 17). An ``EagerFuture`` is an ordinary
future to whoever awaits it, and also keeps a second kind of callback, registered with
``call_when_done``, that runs inside ``set_result`` / ``set_exception`` / ``cancel``
itself.

That is only safe where the code that settles the future is at a consistent point and
the callback does not reach back into it; it is used for the links of one chain whose
both ends are known (the modules that use it say why). A callback that raises is
reported to the loop's exception handler, as asyncio reports a failing done-callback,
and the remaining callbacks still run.

``settle_all`` settles several futures first and runs their eager callbacks after, in
order: a callback that looks at its neighbours (a reply that merges every settled batch)
sees them all settled, as a done-callback in the next turn would.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable

Callback = Callable[[asyncio.Future[Any]], None]


class EagerFuture(asyncio.Future):
    """An asyncio future with callbacks run at once when it is settled."""

    _eager: list[Callback] | None = None

    def call_when_done(self, callback: Callback) -> None:
        """Calls ``callback(self)`` when the future is settled, inside the call that
        settles it; if it is already done, in the loop's next turn (as
        ``add_done_callback``: never inside the caller's own frame)."""
        if self.done():
            self.get_loop().call_soon(callback, self)
            return
        if self._eager is None:
            self._eager = [callback]
        else:
            self._eager.append(callback)

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self.run_eager()

    def set_exception(self, exception: BaseException | type[BaseException]) -> None:
        super().set_exception(exception)
        self.run_eager()

    def cancel(self, msg: Any = None) -> bool:
        cancelled = super().cancel(msg=msg)
        if cancelled:
            self.run_eager()
        return cancelled

    def set_result_quietly(self, result: Any) -> None:
        """Sets the result without running the eager callbacks (``run_eager`` does,
        later): for ``settle_all``."""
        super().set_result(result)

    def run_eager(self) -> None:
        """Runs (once) the eager callbacks registered so far."""
        callbacks, self._eager = self._eager, None
        if not callbacks:
            return
        for callback in callbacks:
            try:
                callback(self)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as error:  # noqa: BLE001 - reported like a failing done-callback
                self.get_loop().call_exception_handler({
                    "message": f"exception in an eager future callback {callback!r}",
                    "exception": error, "future": self})


def call_when_done(future: asyncio.Future[Any], callback: Callback) -> None:
    """``future.call_when_done(callback)`` for an EagerFuture; ``add_done_callback``
    (the next loop turn) for any other future."""
    if isinstance(future, EagerFuture):
        future.call_when_done(callback)
    else:
        future.add_done_callback(callback)


def settle_all(futures: Iterable[asyncio.Future[Any]], result: Any = None) -> None:
    """Sets ``result`` on every future not yet done, then runs the eager callbacks of
    those it settled, in the order given."""
    settled: list[EagerFuture] = []
    for future in futures:
        if future.done():
            continue
        if isinstance(future, EagerFuture):
            future.set_result_quietly(result)
            settled.append(future)
        else:
            future.set_result(result)
    for future in settled:
        future.run_eager()


def new_eager_future() -> EagerFuture:
    """An EagerFuture of the running loop."""
    return EagerFuture(loop=asyncio.get_running_loop())
