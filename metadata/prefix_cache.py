"""A local mirror of every key under an etcd prefix, kept current by a watch started at
the listing's revision (nothing missed, nothing applied twice), with a callback per
change. If the watch breaks for good or history was compacted, the mirror reloads and
reports every key that appeared, changed or vanished meanwhile."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from common.errors import MagnetarError
from runtime.tasks import cancel_and_wait, log_failure
from metadata.store import MetadataStore, Record

log = logging.getLogger(__name__)

# Pause before reloading after a watch failure (etcd away); the watch itself retries
# reconnecting for its own bounded time first.
_RELOAD_PAUSE_S = 0.5

Listener = Callable[[str, Record | None, Record | None], None]   # key, old, new


class PrefixCache:
    def __init__(self, store: MetadataStore, prefix: str, on_change: Listener | None = None) -> None:
        self._store = store
        self.prefix = prefix
        self.records: dict[str, Record] = {}
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        self.revision = 0

    async def start(self) -> None:
        await self._reload()
        self._task = asyncio.get_running_loop().create_task(self._follow(), name=f"follow {self.prefix}")
        self._task.add_done_callback(lambda task: log_failure(task, owner="prefix cache"))

    async def _reload(self) -> None:
        records, revision = await self._store.get_prefix_at(self.prefix)
        fresh = {record.key: record for record in records}
        old = self.records
        self.records = fresh
        self.revision = revision
        for key in set(old) | set(fresh):
            # Versions, not whole records: a record learned from a watch event carries no
            # lease id, so an unchanged leased key would otherwise be reported again.
            old_version = old[key].version if key in old else 0
            fresh_version = fresh[key].version if key in fresh else 0
            if old_version != fresh_version:
                self._notify(key, old.get(key), fresh.get(key))
        self.changed.set()

    def _notify(self, key: str, old: Record | None, new: Record | None) -> None:
        if self._on_change is not None:
            try:
                self._on_change(key, old, new)
            except Exception:
                log.exception("prefix cache listener failed: prefix=%s key=%s", self.prefix, key)

    async def _follow(self) -> None:
        while True:
            watch = self._store.watch_prefix(self.prefix, start_version=self.revision)
            try:
                async for event in watch:
                    if event.kind == "reset":
                        await self._reload()
                        break
                    old = self.records.get(event.key)
                    if event.kind == "delete":
                        self.records.pop(event.key, None)
                        new = None
                    else:
                        new = Record(event.key, event.value, event.version,
                                     old.create_version if old else event.version)
                        self.records[event.key] = new
                    self.revision = event.version
                    self._notify(event.key, old, new)
                    self.changed.set()
                else:
                    return
            except AssertionError:
                raise                    # a broken invariant: logged by the done-callback, critical
            except Exception as error:   # an operating error, or a foreign one: never end silently
                if isinstance(error, MagnetarError):
                    log.warning("prefix watch failed, reloading: prefix=%s error=%s", self.prefix, error)
                else:
                    log.error("prefix watch failed, reloading: prefix=%s error=%r", self.prefix, error,
                              exc_info=error)
                await asyncio.sleep(_RELOAD_PAUSE_S)
                try:
                    await self._reload()
                except MagnetarError:
                    continue
            finally:
                await watch.close()

    def get(self, key: str) -> Record | None:
        return self.records.get(key)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
