"""One round of a periodic loop (the leader's decisions, the load report), bounded and
never silent.

A loop that awaits its round directly stalls for as long as the round does, and says
nothing: in issue 32's partitions run the leader's decide loop and the load reporter
both went quiet for 8+ minutes after an etcd fault (no round failed, none ended), and
two bundles stayed without an owner. ``run_round`` runs the round as a task of its own
and watches it: a round that fails is logged (an operating error at WARNING, anything
else at ERROR with its traceback: the loop goes on either way), one that outlives its
bound is logged at WARNING and cancelled, and one that does not end even then is
logged again at every further bound, so a stall cannot go unseen. A broken invariant
(AssertionError) is raised to the loop's owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Coroutine

from common.errors import MagnetarError

log = logging.getLogger(__name__)


async def run_round(coroutine: Coroutine[Any, Any, Any], *, what: str, bound_s: float) -> bool:
    """Runs ``coroutine`` (one round of the loop named ``what``); True if it ended well."""
    started = time.monotonic()
    task = asyncio.ensure_future(coroutine)
    timed_out = False
    try:
        done, _ = await asyncio.wait({task}, timeout=bound_s)
        if not done:
            log.warning("%s round took longer than its bound, cancelling it: bound_s=%.1f", what, bound_s)
            timed_out = True
            task.cancel()
            while not done:
                done, _ = await asyncio.wait({task}, timeout=bound_s)
                if not done:
                    log.error("%s round still running after it was cancelled: seconds=%.1f", what,
                              time.monotonic() - started)
    except asyncio.CancelledError:
        # The loop is stopping: its round stops with it, before the loop's owner goes on
        # (bounded: a round that ignores its cancellation is left behind after bound_s).
        task.cancel()
        await asyncio.wait({task}, timeout=bound_s)
        raise
    if task.cancelled():
        if not timed_out:
            # Nobody here cancelled it: a CancelledError came out of what it awaited.
            log.warning("%s round ended by a cancellation it did not ask for", what)
        return False
    error = task.exception()
    if error is None:
        return True
    if isinstance(error, AssertionError):
        raise error
    if isinstance(error, MagnetarError):
        log.warning("%s round failed: error=%s", what, error)
    else:
        log.error("%s round failed: error=%r", what, error, exc_info=error)
    return False
