"""A bookie for the simulator: the real ``BookieNode`` (add validation, fencing,
journal-then-storage ordering, reads) over two ports implemented in memory:

- ``SimJournal``: the journal's contract (``append`` returns a future resolved only
  after the group's fsync; ``on_durable`` gets tokens in append order; an fsync error
  fails this and every later append) over a ``SimDisk``. The records are the real
  journal encoding (bookie/format.py), replayed on restart by the real decoder, which
  stops at the first torn or corrupt record.
- ``MemoryLedgerStorage``: the ``LedgerStorage`` interface in memory (the disk one is
  covered by its own tests; what matters here is the node logic above it).

A crash drops the node and the unsynced tail of the journal (or, with a torn write, a
random prefix of it survives); a restart replays every journal file through
``BookieNode.apply_replayed``, as the real start-up does.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from bookie.config import BookieConfig, JournalConfig, LedgerStorageConfig
from bookie.format import FILE_HEADER_SIZE, JOURNAL_MAGIC, encode_file_header, iter_journal_records
from bookie.ledger_storage import LedgerState, LedgerStorage, ReadOutcome, StorageStats
from bookie.node import BookieNode
from common.errors import BookieStorageError, NoSuchEntry


class MemoryLedgerStorage(LedgerStorage):
    def __init__(self) -> None:
        self._entries: dict[int, dict[int, bytes]] = {}
        self._states: dict[int, LedgerState] = {}

    def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def put_entry(self, ledger_id: int, entry_id: int, last_add_confirmed: int, entry: bytes) -> None:
        self._entries.setdefault(ledger_id, {})[entry_id] = bytes(entry)
        state = self._states.setdefault(ledger_id, LedgerState())
        state.last_add_confirmed = max(state.last_add_confirmed, last_add_confirmed)
        state.last_entry_id = max(state.last_entry_id, entry_id)

    def fence(self, ledger_id: int) -> LedgerState:
        state = self._states.setdefault(ledger_id, LedgerState())
        state.fenced = True
        self._entries.setdefault(ledger_id, {})
        return LedgerState(state.fenced, state.last_add_confirmed, state.last_entry_id)

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        state = self._states.get(ledger_id)
        return None if state is None else LedgerState(state.fenced, state.last_add_confirmed, state.last_entry_id)

    async def wait_for_room(self, ledger_id: int, size_bytes: int) -> None:
        pass

    async def read_entries(self, ledger_id: int, entry_ids: list[int], bytes_max: int) -> list[ReadOutcome]:
        stored = self._entries.get(ledger_id, {})
        outcomes: list[ReadOutcome] = []
        size = 0
        for entry_id in entry_ids:
            data = stored.get(entry_id)
            if data is None:
                outcomes.append(ReadOutcome(entry_id, None, NoSuchEntry(ledger_id, entry_id)))
            else:
                outcomes.append(ReadOutcome(entry_id, data))
                size += len(data)
            if size >= bytes_max:
                break
        return outcomes

    async def flush(self) -> None:
        pass

    def needs_flush(self) -> bool:
        return False

    def ledger_ids(self) -> set[int]:
        return set(self._states)

    async def delete_ledgers(self, ledger_ids: list[int]) -> None:
        for ledger_id in ledger_ids:
            self._entries.pop(ledger_id, None)
            self._states.pop(ledger_id, None)

    async def compact(self, live_ratio_min: float, bytes_max: int) -> tuple[int, int]:
        return 0, 0

    def stats(self) -> StorageStats:
        return StorageStats(0, 0, 0, 0, len(self._states), 0, 0, 0, 0, 0)

    def directories(self) -> list[str]:
        return []

    def entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._entries.get(ledger_id, {}).get(entry_id)


@dataclass
class SimDisk:
    """Journal files: synced bytes survive a crash, the unsynced tail does not (or
    partly, with a torn write)."""

    files: list[bytearray] = field(default_factory=list)
    unsynced: bytearray = field(default_factory=bytearray)

    def new_file(self) -> None:
        self.unsynced.clear()
        self.files.append(bytearray(encode_file_header(JOURNAL_MAGIC, len(self.files) + 1)))

    def crash(self, rng: random.Random, torn: bool) -> int:
        """Loses the unsynced tail; with ``torn`` a random prefix of it reached the disk.
        Returns the bytes kept."""
        kept = rng.randrange(len(self.unsynced) + 1) if torn and self.unsynced else 0
        if kept and self.files:
            self.files[-1] += self.unsynced[:kept]
        self.unsynced.clear()
        return kept


class SimJournal:
    def __init__(self, disk: SimDisk, on_durable, faults: "JournalFaults") -> None:
        self._disk = disk
        self._on_durable = on_durable
        self._faults = faults
        self._queue: list[tuple[list[bytes], list[object], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self.failed: BaseException | None = None
        self.applied_position = None
        disk.new_file()

    def append(self, buffers: list[bytes], size_bytes: int, tokens: list[object]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failed is not None:
            future.set_exception(self.failed)
            return future
        self._queue.append((buffers, tokens, future))
        self._wake.set()
        return future

    async def wait_for_room(self, size_bytes: int, timeout_s: float) -> None:
        pass

    async def run(self) -> None:
        """The group-commit writer: write what is queued, fsync, then hand it on."""
        while self.failed is None:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            group, self._queue = self._queue, []
            for buffers, _tokens, _future in group:
                for buffer in buffers:
                    self._disk.unsynced += buffer
            await asyncio.sleep(self._faults.fsync_latency_s())
            if self._faults.fsync_fails():
                self.failed = BookieStorageError("simulated fdatasync failure")
                for _buffers, _tokens, future in group + self._queue:
                    if not future.done():
                        future.set_exception(self.failed)
                self._queue.clear()
                return
            self._disk.files[-1] += self._disk.unsynced
            self._disk.unsynced.clear()
            for _buffers, tokens, future in group:
                self._on_durable(tokens)
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        pass


class JournalFaults:
    """What the fault plan decides for a journal: fsync latency and failures."""

    def __init__(self, rng: random.Random, fsync_error_rate: float) -> None:
        self._rng = rng
        self._fsync_error_rate = fsync_error_rate

    def fsync_latency_s(self) -> float:
        return self._rng.uniform(0.0002, 0.003)

    def fsync_fails(self) -> bool:
        return self._rng.random() < self._fsync_error_rate


def _config(bookie_id: str) -> BookieConfig:
    return BookieConfig(metadata_url="memory://", journal=JournalConfig(journal_dir=f"/sim/{bookie_id}/journal"),
                        storage=LedgerStorageConfig(ledger_dirs=(f"/sim/{bookie_id}/ledgers",)))


class SimBookie:
    """One bookie's lifetimes: start, crash, restart over the same disk."""

    def __init__(self, bookie_id: str, rng: random.Random, faults: JournalFaults, on_crash) -> None:
        self.bookie_id = bookie_id
        self.disk = SimDisk()
        self._rng = rng
        self._faults = faults
        self._config = _config(bookie_id)
        self._on_crash = on_crash
        self.node: BookieNode | None = None
        self.storage: MemoryLedgerStorage | None = None
        self._journal_task: asyncio.Task | None = None
        self.restarts = 0
        self.torn_bytes = 0
        # ledger id -> highest last_add_confirmed ever seen here (across restarts).
        self.last_add_confirmed_seen: dict[int, int] = {}
        self.violations: list[str] = []

    @property
    def up(self) -> bool:
        return self.node is not None

    def start(self) -> None:
        assert self.node is None
        storage = MemoryLedgerStorage()
        node = BookieNode(self._config, storage, self.bookie_id)
        for data in self.disk.files:
            for record in iter_journal_records(bytes(data), FILE_HEADER_SIZE):
                node.apply_replayed(record)
        node.journal = SimJournal(self.disk, node._on_durable, self._faults)  # type: ignore[assignment]
        self.node, self.storage = node, storage
        self._journal_task = asyncio.get_running_loop().create_task(self._watch_journal(node))
        self.check_last_add_confirmed()

    async def _watch_journal(self, node: BookieNode) -> None:
        journal = node.journal
        assert isinstance(journal, SimJournal)
        await journal.run()
        if journal.failed is not None and self.node is node:
            self._on_crash(self, "fsync error")

    def crash(self, torn: bool) -> None:
        if self.node is None:
            return
        self.check_last_add_confirmed()
        self.torn_bytes += self.disk.crash(self._rng, torn)
        task, self._journal_task = self._journal_task, None
        self.node = None
        self.storage = None
        self.restarts += 1
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def check_last_add_confirmed(self) -> None:
        """The checker "last_add_confirmed never regresses", per bookie and ledger."""
        if self.storage is None:
            return
        for ledger_id in self.storage.ledger_ids():
            state = self.storage.ledger_state(ledger_id)
            assert state is not None
            before = self.last_add_confirmed_seen.get(ledger_id, -1)
            if state.last_add_confirmed < before:
                self.violations.append(f"bookie {self.bookie_id} ledger {ledger_id}: last_add_confirmed "
                                       f"went from {before} to {state.last_add_confirmed}")
            self.last_add_confirmed_seen[ledger_id] = max(before, state.last_add_confirmed)
