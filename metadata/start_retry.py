"""Metadata calls a process makes while it starts, retried while etcd is unavailable.

A process that has just started opens its first connection to etcd; on a loaded machine
(or while etcd itself is starting) that first handshake can time out. Giving up at once
turns a slow second into a failed start, so the first calls are retried, with a doubling
back-off, for a bounded time; after that the error is the process's to report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, TypeVar

from common.errors import MetadataUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a starting process waits for etcd before its start fails.
START_WAIT_S = 30.0
RETRY_DELAY_S_MIN = 0.25
RETRY_DELAY_S_MAX = 4.0


async def while_unavailable(step: str, call: Callable[[], Awaitable[T]], *,
                            wait_s: float = START_WAIT_S) -> T:
    """``call()``'s result, retried on MetadataUnavailable until ``wait_s`` has passed
    (then the last error is raised). Other errors are raised at once."""
    deadline = time.monotonic() + wait_s
    delay = RETRY_DELAY_S_MIN
    while True:
        try:
            return await call()
        except MetadataUnavailable as error:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("metadata unavailable while starting, retrying: step=%s retry_in_s=%.2f error=%s",
                        step, delay, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_DELAY_S_MAX)
