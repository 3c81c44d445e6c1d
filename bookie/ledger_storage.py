"""The ledger storage interface: where entries live once the journal has them.

The bookie calls ``put_entry`` and ``fence`` from the journal's durable callback (on
the event loop, synchronously, in journal order), reads with ``read_entries``, and
makes everything put so far durable on the ledger disks with ``flush`` (after which
the journal up to the flush's start may be trimmed). Implementations: the disk one in
``ledger_storage_disk.py``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from common.errors import MagnetarError


@dataclass(slots=True)
class LedgerState:
    """What a bookie knows of one ledger it stores."""

    fenced: bool = False
    # Highest last_add_confirmed piggybacked on any stored entry; -1 if none.
    last_add_confirmed: int = -1
    # Highest entry id stored; -1 if none.
    last_entry_id: int = -1


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    entry_id: int
    entry: bytes | None
    error: MagnetarError | None = None


@dataclass(frozen=True, slots=True)
class StorageStats:
    write_cache_bytes: int
    read_cache_bytes: int
    read_cache_hits: int
    read_cache_misses: int
    ledger_count: int
    entry_log_count: int
    flushes: int
    flushed_bytes: int
    compacted_logs: int
    compacted_bytes: int


class LedgerStorage(abc.ABC):
    @abc.abstractmethod
    def open(self) -> None:
        """Blocking start-up (index, states, a new active log); before serving."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def put_entry(self, ledger_id: int, entry_id: int, last_add_confirmed: int, entry: bytes) -> None:
        """Makes a journal-durable entry readable. Event loop only, never blocks."""

    @abc.abstractmethod
    def fence(self, ledger_id: int) -> LedgerState: ...

    @abc.abstractmethod
    def ledger_state(self, ledger_id: int) -> LedgerState | None: ...

    @abc.abstractmethod
    async def wait_for_room(self, ledger_id: int, size_bytes: int) -> None:
        """Back-pressure before journaling: waits while the write cache is full;
        raises Overloaded after the configured wait."""

    def has_room(self, ledger_id: int, size_bytes: int) -> bool:
        """True when wait_for_room would return at once. A storage that cannot tell
        says False, and its writers take the waiting path."""
        return False

    @abc.abstractmethod
    async def read_entries(self, ledger_id: int, entry_ids: list[int], bytes_max: int) -> list[ReadOutcome]:
        """Outcomes for a prefix of ``entry_ids`` (at least one), stopping once the
        returned entries pass ``bytes_max``."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Writes everything put so far to the ledger disks, durably."""

    @abc.abstractmethod
    def needs_flush(self) -> bool:
        """True when the write cache is past its flush threshold."""

    @abc.abstractmethod
    def ledger_ids(self) -> set[int]: ...

    @abc.abstractmethod
    async def delete_ledgers(self, ledger_ids: list[int]) -> None: ...

    @abc.abstractmethod
    async def compact(self, live_ratio_min: float, bytes_max: int) -> tuple[int, int]:
        """Compacts entry logs whose live share is below ``live_ratio_min``; returns
        (logs compacted, bytes reclaimed)."""

    @abc.abstractmethod
    def stats(self) -> StorageStats: ...

    @abc.abstractmethod
    def directories(self) -> list[str]: ...
