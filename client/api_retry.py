"""Creating a producer, consumer or reader while the broker is away: the public client
tries again, as the official clients do, until the operation timeout has passed.

Theory of operation: ``within_operation_timeout`` runs one attempt (a lookup, a
registration) and, when it fails with a retriable error (no broker reachable, a topic
being loaded or moved), waits the reconnection back-off (jittered, exponential; the
last wait cut short to end at the deadline) and tries again. A non-retriable error
(not authorized, an exclusive subscription taken) is raised at once, and the last
error once an attempt fails at or after ``operation_timeout_ms``. Each attempt is
bounded by itself (the connect timeout, and the operation timeout of each request),
so the whole takes at most the operation timeout plus one attempt. Once created, a
producer or consumer reconnects without end by itself (client/producer.py,
client/consumer.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Awaitable, Callable, TypeVar

from common.errors import MagnetarError

from client.config import ClientConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


async def within_operation_timeout(config: ClientConfig, attempt: Callable[[], Awaitable[T]], what: str) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.operation_timeout_s
    tries = 0
    while True:
        try:
            return await attempt()
        except MagnetarError as error:
            left_s = deadline - loop.time()
            if not error.retriable or left_s <= 0:
                raise
            wait_s = min(config.backoff_jittered_s(tries, random.random()), left_s)
            log.info("%s failed, trying again: attempt=%d wait_s=%.2f error=%s", what, tries, wait_s, error)
        await asyncio.sleep(wait_s)
        tries += 1
