"""Creating a producer, consumer or reader while the broker is away: the public client
tries again, as the official clients do, until the operation timeout has passed.

Theory of operation: ``within_operation_timeout`` runs one attempt (a lookup, a
registration) and, when it fails with a retriable error (no broker reachable, a topic
being loaded or moved), waits the reconnection back-off (jittered, exponential) and
tries again. A non-retriable error (not authorized, an exclusive subscription taken)
is raised at once. The whole, attempts and waits, is bounded by
``operation_timeout_ms``: past it the last error is raised (or OperationTimeout when an
attempt itself ran out of time). Once created, a producer or consumer reconnects
without end by itself (client/producer.py, client/consumer.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Awaitable, Callable, TypeVar

from common.errors import MagnetarError, OperationTimeout

from client.config import ClientConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


async def within_operation_timeout(config: ClientConfig, attempt: Callable[[], Awaitable[T]], what: str) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.operation_timeout_s
    last: MagnetarError | None = None
    tries = 0
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                try:
                    return await attempt()
                except MagnetarError as error:
                    if not error.retriable:
                        raise
                    last = error
                    wait_s = config.backoff_jittered_s(tries, random.random())
                    if loop.time() + wait_s >= deadline:
                        raise
                    log.info("%s failed, trying again: attempt=%d wait_s=%.2f error=%s", what, tries, wait_s, error)
                await asyncio.sleep(wait_s)
                tries += 1
    except TimeoutError:
        raise OperationTimeout(f"{what} did not succeed within {config.operation_timeout_s:g} s"
                               + (f" (last error: {last})" if last is not None else "")) from None
