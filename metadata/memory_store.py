"""An in-memory metadata store with etcd's semantics, for pure-logic tests and the
simulator. It keeps one global revision counter like etcd, so versions compare the
same way; leases expire only when revoked or when a test calls ``expire_lease``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import AsyncIterator, Sequence

from metadata.store import Compare, Delete, Lease, MetadataStore, Put, Record, Watch, WatchEvent

# A watcher that falls this far behind is a bug in the test using it, not a load to absorb.
_WATCH_QUEUE_EVENTS_MAX = 100_000
# Events kept for watches that start in the past, like etcd's history before compaction.
_HISTORY_EVENTS_MAX = 100_000


class _MemoryWatch(Watch):
    def __init__(self, store: "MemoryStore", prefix: str) -> None:
        self._store = store
        self.prefix = prefix
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize=_WATCH_QUEUE_EVENTS_MAX)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[WatchEvent]:
        while True:
            event = await self.queue.get()
            if event is None:
                return
            yield event

    async def close(self) -> None:
        if self in self._store._watches:
            self._store._watches.remove(self)
            self.queue.put_nowait(None)


class MemoryStore(MetadataStore):
    def __init__(self) -> None:
        self._data: dict[str, Record] = {}
        self._revision = 1  # like etcd, whose first revision is 1 (0 means "now" to watches)
        self._lease_ids = itertools.count(1)
        self._leases: dict[int, Lease] = {}
        self._watches: list[_MemoryWatch] = []
        self._history: collections.deque[WatchEvent] = collections.deque(maxlen=_HISTORY_EVENTS_MAX)

    def _notify(self, event: WatchEvent) -> None:
        self._history.append(event)
        for watch in self._watches:
            if event.key.startswith(watch.prefix):
                watch.queue.put_nowait(event)

    async def get(self, key: str) -> Record | None:
        return self._data.get(key)

    async def get_prefix(self, prefix: str, *, limit: int = 0, keys_only: bool = False) -> list[Record]:
        records = sorted((r for k, r in self._data.items() if k.startswith(prefix)),
                         key=lambda r: r.key)
        if keys_only:
            records = [Record(r.key, b"", r.version, r.create_version, r.lease_id) for r in records]
        return records[:limit] if limit else records

    async def get_prefix_at(self, prefix: str) -> tuple[list[Record], int]:
        return await self.get_prefix(prefix), self._revision

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        revision = await self.transaction([], [Put(key, value, lease.lease_id if lease else 0)])
        assert revision is not None
        return revision

    async def delete(self, key: str) -> bool:
        existed = key in self._data
        if existed:
            await self.transaction([], [Delete(key)])
        return existed

    async def delete_prefix(self, prefix: str) -> int:
        keys = [k for k in self._data if k.startswith(prefix)]
        if keys:
            await self.transaction([], [Delete(k) for k in keys])
        return len(keys)

    async def transaction(
        self, compares: Sequence[Compare], operations: Sequence[Put | Delete]
    ) -> int | None:
        for compare in compares:
            record = self._data.get(compare.key)
            current = record.version if record is not None else 0
            if current != compare.version:
                return None
        for operation in operations:
            if isinstance(operation, Put) and operation.lease_id:
                lease = self._leases.get(operation.lease_id)
                if lease is None or lease.is_lost:
                    from common.errors import MetadataLeaseExpired

                    raise MetadataLeaseExpired(f"lease {operation.lease_id} is not alive")
        self._revision += 1
        revision = self._revision
        for operation in operations:
            if isinstance(operation, Put):
                previous = self._data.get(operation.key)
                created = previous.create_version if previous is not None else revision
                self._data[operation.key] = Record(operation.key, operation.value, revision,
                                                   created, operation.lease_id)
                self._notify(WatchEvent("put", operation.key, operation.value, revision))
            elif operation.key in self._data:
                del self._data[operation.key]
                self._notify(WatchEvent("delete", operation.key, b"", revision))
        return revision

    async def grant_lease(self, ttl_s: int) -> Lease:
        lease = Lease(lease_id=next(self._lease_ids), ttl_s=ttl_s)
        self._leases[lease.lease_id] = lease
        return lease

    async def revoke_lease(self, lease: Lease) -> None:
        self.expire_lease(lease)

    def expire_lease(self, lease: Lease) -> None:
        """Drops the lease and every key under it, as etcd does on expiry."""
        self._leases.pop(lease.lease_id, None)
        lease.lost.set()
        doomed = [k for k, r in self._data.items() if r.lease_id == lease.lease_id]
        if doomed:
            self._revision += 1
            for key in doomed:
                del self._data[key]
                self._notify(WatchEvent("delete", key, b"", self._revision))

    def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
        watch = _MemoryWatch(self, prefix)
        if start_version:
            if self._history and self._history[0].version > start_version + 1:
                watch.queue.put_nowait(WatchEvent("reset", prefix))
            for event in self._history:
                if event.version > start_version and event.key.startswith(prefix):
                    watch.queue.put_nowait(event)
        self._watches.append(watch)
        return watch

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.close()
