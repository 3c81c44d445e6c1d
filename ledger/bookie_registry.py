"""The client's view of registered bookies: a listing of ``/bookies/`` kept current by a
watch started at the listing's revision (so no change is missed or applied twice).
Placement reads it to choose ensembles; the bookie client pool resolves addresses."""

from __future__ import annotations

import asyncio
import logging

from ledger.errors import MagnetarError, MalformedFrame
from magnetar.tasks import cancel_and_wait
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.store import MetadataStore, Watch

log = logging.getLogger(__name__)


class BookieRegistry:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._bookies: dict[str, BookieRecord] = {}
        self._watch: Watch | None = None
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()

    async def start(self) -> None:
        revision = await self._reload()
        self._task = asyncio.get_running_loop().create_task(self._follow(revision))

    async def _reload(self) -> int:
        records, revision = await self._store.get_prefix_at(keys.BOOKIES)
        bookies: dict[str, BookieRecord] = {}
        for record in records:
            try:
                bookie = BookieRecord.decode(record.value)
            except MalformedFrame as error:
                log.warning("ignoring bad bookie record: key=%s error=%s", record.key, error)
                continue
            bookies[bookie.bookie_id] = bookie
        self._bookies = bookies
        self.changed.set()
        return revision

    async def _follow(self, revision: int) -> None:
        while True:
            self._watch = self._store.watch_prefix(keys.BOOKIES, start_version=revision)
            try:
                async for event in self._watch:
                    if event.kind == "reset":
                        revision = await self._reload()
                        break
                    bookie_id = event.key[len(keys.BOOKIES):]
                    if event.kind == "delete":
                        self._bookies.pop(bookie_id, None)
                    else:
                        try:
                            self._bookies[bookie_id] = BookieRecord.decode(event.value)
                        except MalformedFrame:
                            continue
                    revision = event.version
                    self.changed.set()
                else:
                    return
            except MagnetarError as error:
                log.warning("bookie registry watch failed, reloading: error=%s", error)
                await asyncio.sleep(1.0)
                try:
                    revision = await self._reload()
                except MagnetarError:
                    continue
            finally:
                await self._watch.close()

    async def refresh(self) -> None:
        """Re-reads the listing now (used before choosing an ensemble at start-up)."""
        await self._reload()

    def all(self) -> list[BookieRecord]:
        return list(self._bookies.values())

    def writable(self) -> list[BookieRecord]:
        return [b for b in self._bookies.values() if not b.read_only]

    def get(self, bookie_id: str) -> BookieRecord | None:
        return self._bookies.get(bookie_id)

    def address_of(self, bookie_id: str) -> str:
        record = self._bookies.get(bookie_id)
        return record.address if record is not None else bookie_id

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self._watch is not None:
            await self._watch.close()
