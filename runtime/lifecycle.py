"""A process's start-up as named components, started in order and stopped in reverse
(BookKeeper's ``LifecycleComponentStack``).

Theory of operation:
- A component is a name, an async ``start`` and an async ``stop``. The stack knows
  which components have started; a component whose ``start`` raised has not.
- ``start`` starts the components one after the other. When one fails, the ones
  already started are stopped, newest first, and the start's error is raised: a failed
  start leaves nothing running, and the first error is the one reported (a stop that
  fails meanwhile is logged, not raised).
- ``stop`` stops the started components newest first, each once. Every stop runs even
  if an earlier one failed; the first such failure is raised once all have run. A
  second ``stop`` (a ``finally`` after the orderly one) finds nothing left to stop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Component:
    name: str
    start: Callable[[], Awaitable[None]]
    stop: Callable[[], Awaitable[None]]


class LifecycleStack:
    def __init__(self, owner: str, components: Sequence[Component]) -> None:
        names = [component.name for component in components]
        assert len(set(names)) == len(names), names
        self.owner = owner
        self._components = tuple(components)
        self._started: list[Component] = []
        self._start_called = False

    @property
    def started(self) -> list[str]:
        """The names of the components running now, in start order."""
        return [component.name for component in self._started]

    async def start(self) -> None:
        assert not self._start_called, "a stack starts once"
        self._start_called = True
        for component in self._components:
            try:
                await component.start()
            except BaseException as error:
                log.info("start-up failed, stopping what started: owner=%s component=%s error=%r", self.owner,
                         component.name, error)
                await self._stop_started(raise_first=False)
                raise
            self._started.append(component)
        assert len(self._started) == len(self._components)

    async def stop(self) -> None:
        await self._stop_started(raise_first=True)
        assert not self._started

    async def _stop_started(self, *, raise_first: bool) -> None:
        first: Exception | None = None
        while self._started:
            component = self._started.pop()
            try:
                await component.stop()
            except Exception as error:
                log.warning("stopping a component failed: owner=%s component=%s error=%r", self.owner,
                            component.name, error)
                if first is None:
                    first = error
        if raise_first and first is not None:
            raise first
