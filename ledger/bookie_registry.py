"""The client's view of registered bookies: the records under ``/bookies/``, mirrored by
a ``PrefixCache`` (listing, then a watch from the listing's revision, reloading after a
broken watch) and decoded once per change. Placement reads it to choose ensembles; the
bookie client pool resolves addresses.

``refresh`` replaces the mirror with one started from a fresh listing when the listing
differs from the mirror (used when too few bookies are known, in case the watch lags
a bookie that registered a moment ago).
Each mirror writes only its own table, and the registry switches tables only once the
new mirror has its listing, so a reader sees one consistent table at any moment and a
late event of the old mirror never lands in the new table.

Bookies an operator marked for decommissioning (``/autorecovery/decommissioned/``,
mirrored too) stay readable but are never writable: no new ledger, ensemble change or
re-replication chooses them.
"""

from __future__ import annotations

import asyncio
import logging

from common.errors import MalformedFrame
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.prefix_cache import PrefixCache
from metadata.store import MetadataStore, Record

log = logging.getLogger(__name__)


class BookieRegistry:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        # bookie_id (the key under /bookies/) -> its record, as the current mirror has it.
        self._bookies: dict[str, BookieRecord] = {}
        self._cache: PrefixCache | None = None
        # Serialises start, refresh and close (each swaps or stops the mirror).
        self._lock = asyncio.Lock()
        self._closed = False
        self.changed = asyncio.Event()
        self._decommissioned: PrefixCache | None = None

    async def start(self) -> None:
        async with self._lock:
            assert self._cache is None, "started twice"
            await self._mirror_again()
            self._decommissioned = PrefixCache(self._store, keys.DECOMMISSIONED)
            await self._decommissioned.start()

    async def refresh(self) -> None:
        """Re-reads the listing now (used before choosing an ensemble at start-up). If
        the mirror already agrees with it, the mirror is kept (a client short of
        bookies may call this for every ledger it tries to create)."""
        async with self._lock:
            cache = self._cache
            if cache is not None:
                listed = {record.key: record.version for record in await self._store.get_prefix(keys.BOOKIES, keys_only=True)}
                mirrored = {key: record.version for key, record in cache.records.items()}
                if listed == mirrored:
                    return
            await self._mirror_again()

    async def _mirror_again(self) -> None:
        """Starts a mirror from a fresh listing, then switches to its table and stops
        the previous mirror. Raises (keeping the previous mirror) if listing fails."""
        if self._closed:
            return
        bookies: dict[str, BookieRecord] = {}
        cache = PrefixCache(self._store, keys.BOOKIES,
                            lambda key, _old, new: self._on_change(bookies, key, new))
        await cache.start()
        previous, self._cache, self._bookies = self._cache, cache, bookies
        self.changed.set()
        if previous is not None:
            await previous.close()

    def _on_change(self, bookies: dict[str, BookieRecord], key: str, new: Record | None) -> None:
        bookie_id = key[len(keys.BOOKIES):]
        if new is None:
            bookies.pop(bookie_id, None)
        else:
            try:
                bookies[bookie_id] = BookieRecord.decode(new.value)
            except MalformedFrame as error:
                # Not a usable registration: the bookie is treated as unregistered.
                log.warning("ignoring bad bookie record: key=%s error=%s", key, error)
                bookies.pop(bookie_id, None)
        if bookies is self._bookies:
            self.changed.set()

    def all(self) -> list[BookieRecord]:
        return list(self._bookies.values())

    def decommissioned(self) -> set[str]:
        cache = self._decommissioned
        if cache is None:
            return set()
        return {key[len(keys.DECOMMISSIONED):] for key in cache.records}

    def writable(self) -> list[BookieRecord]:
        leaving = self.decommissioned()
        return [b for b in self._bookies.values() if not b.read_only and b.bookie_id not in leaving]

    def get(self, bookie_id: str) -> BookieRecord | None:
        return self._bookies.get(bookie_id)

    def address_of(self, bookie_id: str) -> str:
        record = self._bookies.get(bookie_id)
        return record.address if record is not None else bookie_id

    def add_address_of(self, bookie_id: str) -> str:
        """The bookie's add socket ("" when it has none, or is not registered)."""
        record = self._bookies.get(bookie_id)
        return record.add_address if record is not None else ""

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            cache, self._cache = self._cache, None
            decommissioned, self._decommissioned = self._decommissioned, None
        if cache is not None:
            await cache.close()
        if decommissioned is not None:
            await decommissioned.close()
