"""The metadata store interface: keys, leases, compare-and-swap and watches.

Every piece of Magnetar's metadata lives behind this interface (bookies, ledgers,
managed ledgers, cursors, bundle ownership, policies, load reports, the leader). The
production implementation is etcd (``metadata/etcd_store.py``); an in-memory one
(``metadata/memory_store.py``) serves pure-logic tests and the simulator. Both pass
the shared suite in ``tests/integration/test_metadata_store.py``.

Theory of operation:
- Keys are strings relative to the store's root (one root per cluster), values bytes.
- Every stored value has a ``version``: etcd's ``mod_revision``, which increases on
  every write anywhere in the store. A compare-and-swap names the version it read;
  ``version=0`` means "the key must not exist". This is the only way a component may
  change shared state that another could change at the same time.
- A lease is granted with a TTL and kept alive by the store in the background; keys
  put under it vanish when the lease expires (its owner died or lost etcd). A lease's
  ``lost`` event fires when the store knows the lease is gone, so its owner can stop
  acting on what it held and re-acquire.
- A watch yields events for a prefix in revision order. If the store had to skip
  history (etcd compacted it during an outage), the watch yields a ``reset`` event and
  the caller must re-read the prefix.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Literal, Sequence


@dataclass(frozen=True)
class Record:
    key: str
    value: bytes
    version: int          # mod revision: the compare-and-swap token
    create_version: int   # revision at which the key was created
    lease_id: int = 0


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["put", "delete", "reset"]
    key: str
    value: bytes = b""
    version: int = 0


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: the key's version equals ``version``
    (0 means "does not exist")."""

    key: str
    version: int


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease_id: int = 0


@dataclass(frozen=True)
class Delete:
    key: str


@dataclass
class Lease:
    """A granted lease, kept alive by the store that granted it. ``refreshed_at``
    (monotonic) is when etcd last confirmed it: an owner that has not heard so for most
    of the TTL must stop acting on what the lease holds, because etcd may drop it soon."""

    lease_id: int
    ttl_s: int
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    refreshed_at: float = field(default_factory=time.monotonic)

    @property
    def is_lost(self) -> bool:
        return self.lost.is_set()


class Watch(abc.ABC):
    """An async iterator of WatchEvents; close it when done."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> "Watch":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class MetadataStore(abc.ABC):
    """See the module docstring for the contract every implementation keeps."""

    @abc.abstractmethod
    async def get(self, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def get_prefix(self, prefix: str, *, limit: int = 0, keys_only: bool = False) -> list[Record]:
        """Records whose key starts with ``prefix``, in key order (``limit`` 0: all;
        ``keys_only``: values left empty, for listings of many keys)."""

    @abc.abstractmethod
    async def get_prefix_at(self, prefix: str) -> tuple[list[Record], int]:
        """The records under ``prefix`` and the store revision they were read at, so a
        watch started from that revision misses nothing and repeats nothing."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Unconditional write; returns the new version."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Unconditional delete; True if the key existed."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int: ...

    @abc.abstractmethod
    async def transaction(
        self,
        compares: Sequence[Compare],
        operations: Sequence[Put | Delete],
    ) -> int | None:
        """Applies every operation if every compare holds; returns the new revision,
        or None when a compare failed (and nothing was applied)."""

    @abc.abstractmethod
    async def grant_lease(self, ttl_s: int) -> Lease:
        """Grants a lease and keeps it alive until ``revoke_lease`` or loss."""

    @abc.abstractmethod
    async def revoke_lease(self, lease: Lease) -> None: ...

    @abc.abstractmethod
    def watch_prefix(self, prefix: str, *, start_version: int = 0) -> Watch:
        """Events for keys under ``prefix`` after ``start_version`` (0: from now)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # --- conveniences built on the primitives above -----------------------------

    async def create(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Writes ``key`` only if it does not exist; raises MetadataKeyExists."""
        from common.errors import MetadataKeyExists

        lease_id = lease.lease_id if lease is not None else 0
        revision = await self.transaction([Compare(key, 0)], [Put(key, value, lease_id)])
        if revision is None:
            raise MetadataKeyExists(key)
        return revision

    async def compare_and_set(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        """Writes ``key`` only if its version is ``expected_version`` (0: absent);
        raises MetadataVersionConflict otherwise. Returns the new version."""
        from common.errors import MetadataVersionConflict

        lease_id = lease.lease_id if lease is not None else 0
        revision = await self.transaction(
            [Compare(key, expected_version)], [Put(key, value, lease_id)]
        )
        if revision is None:
            raise MetadataVersionConflict(key)
        return revision

    async def compare_and_delete(self, key: str, *, expected_version: int) -> None:
        from common.errors import MetadataVersionConflict

        revision = await self.transaction([Compare(key, expected_version)], [Delete(key)])
        if revision is None:
            raise MetadataVersionConflict(key)

    async def increment(self, key: str, *, attempts_max: int = 64) -> int:
        """Atomically adds one to a decimal counter and returns the new value.

        Compare-and-swap in a loop; ``attempts_max`` bounds it under contention (64
        concurrent creators on one counter is far past anything a cluster does).
        """
        from common.errors import MetadataVersionConflict

        for _ in range(attempts_max):
            record = await self.get(key)
            current = int(record.value) if record is not None else 0
            expected = record.version if record is not None else 0
            revision = await self.transaction(
                [Compare(key, expected)], [Put(key, str(current + 1).encode())]
            )
            if revision is not None:
                return current + 1
        raise MetadataVersionConflict(key)
