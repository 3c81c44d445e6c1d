"""Ledger storage flushes (bookie/ledger_storage_disk.py) when the index commit fails,
and what a flush does on the event loop.

What it proves:
- a SQLite error from the index commit (a full disk under the index) fails the flush
  with BookieStorageError, like an IO error, and loses nothing: the entries stay
  readable, the ledger states stay pending, and after a later good flush and a
  restart every entry and state comes back from disk (before, the sqlite3.Error
  escaped with the flushing cache still set, and the next flush dropped it unindexed);
- the sizes of entry logs sealed by a rotation inside the failed flush are recorded by
  the next flush (before, they were lost, so compaction never considered those logs);
- IndexWriter.commit_flush raises the original error when SQLite itself already
  rolled the transaction back, not "cannot rollback - no transaction is active";
- a flush sorts its entries on the flush thread, not on the event loop, and does not
  copy them into the read cache (readers find them on disk through the index);
- delete_ledgers drops its ledgers from the read cache in one pass.

How: real temp directories, fsync off. Faults are injected at the SQLite edge: the
index writer's connection is wrapped so that chosen statements raise
sqlite3.OperationalError("database or disk is full").
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading

import pytest

from bookie.config import LedgerStorageConfig
from bookie.index import IndexWriter
from bookie.ledger_storage import LedgerState
from bookie.ledger_storage_disk import DiskLedgerStorage
from bookie.write_cache import WriteCache
from common.entry import ENTRY_HEADER_SIZE, encode_entry
from common.entry_cache import EntryCache
from common.errors import BookieStorageError

KIB = 1024
MIB = 1024 * KIB
BIG = 10**9


def _entry(ledger_id: int, entry_id: int, size: int = 1000) -> bytes:
    payload = bytes((ledger_id * 13 + entry_id * 5 + i) % 251 for i in range(size - ENTRY_HEADER_SIZE))
    return encode_entry(ledger_id, entry_id, entry_id - 1, BIG, payload)


def _config(tmp_path, **overrides) -> LedgerStorageConfig:
    settings = dict(ledger_dirs=(str(tmp_path / "ledgers"),), write_cache_bytes_max=1 * MIB,
                    read_cache_bytes_max=256 * KIB, entry_bytes_max=8 * KIB, entry_log_bytes_max=64 * KIB,
                    write_cache_wait_s_max=1.0)
    settings.update(overrides)
    return LedgerStorageConfig(**settings)


class _FailingConnection:
    """Wraps the index writer's sqlite3 connection; ``fail_next`` makes the next
    statement starting with that word raise a full-disk OperationalError. With
    ``auto_rollback`` the transaction is rolled back first, as SQLite does itself on
    some errors (SQLITE_FULL among them), so the caller finds no transaction open."""

    def __init__(self, inner: sqlite3.Connection) -> None:
        self._inner = inner
        self.fail_next: str | None = None
        self.auto_rollback = False

    def _check(self, sql: str) -> None:
        if self.fail_next is not None and sql.lstrip().upper().startswith(self.fail_next):
            self.fail_next = None
            if self.auto_rollback and self._inner.in_transaction:
                self._inner.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")

    def execute(self, sql, *args):
        self._check(sql)
        return self._inner.execute(sql, *args)

    def executemany(self, sql, *args):
        self._check(sql)
        return self._inner.executemany(sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self._inner.in_transaction

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _wrap_index(storage: DiskLedgerStorage) -> _FailingConnection:
    (directory,) = storage._dirs
    writer = directory.index_writer
    assert writer is not None
    wrapped = _FailingConnection(writer._db)
    writer._db = wrapped
    return wrapped


def _put(storage, ledger_id: int, entry_ids) -> dict[int, bytes]:
    written = {}
    for entry_id in entry_ids:
        written[entry_id] = _entry(ledger_id, entry_id)
        storage.put_entry(ledger_id, entry_id, entry_id - 1, written[entry_id])
    return written


async def _assert_readable(storage, ledger_id: int, written: dict[int, bytes]) -> None:
    wanted = sorted(written)
    outcomes = await storage.read_entries(ledger_id, wanted, BIG)
    assert [o.entry_id for o in outcomes] == wanted
    assert [o.error for o in outcomes] == [None] * len(wanted)
    assert [o.entry for o in outcomes] == [written[i] for i in wanted]


@pytest.mark.parametrize("failing_statement", ["INSERT", "COMMIT"])
async def test_an_index_error_fails_the_flush_and_loses_nothing(tmp_path, failing_statement):
    """The index commit fails once: BookieStorageError, entries readable, state still
    pending. Entries put after the failure are flushed together with the failed ones
    by the next flush; after a restart all of them and the fence are there."""
    config = _config(tmp_path)
    storage = DiskLedgerStorage(config, read_threads=2, fsync_enabled=False)
    storage.open()
    try:
        connection = _wrap_index(storage)
        written = _put(storage, 1, range(40))
        storage.fence(2)
        connection.fail_next = failing_statement
        with pytest.raises(BookieStorageError):
            await storage.flush()
        await _assert_readable(storage, 1, written)
        assert storage.stats().flushes == 0
        written.update(_put(storage, 1, range(40, 50)))
        await storage.flush()
        await storage.flush()               # nothing left behind for a later flush to drop
        assert storage.stats().write_cache_bytes == 0
        await _assert_readable(storage, 1, written)
    finally:
        await storage.close()
    fresh = DiskLedgerStorage(config, read_threads=2, fsync_enabled=False)
    fresh.open()
    try:
        await _assert_readable(fresh, 1, written)
        assert fresh.ledger_state(1) == LedgerState(fenced=False, last_add_confirmed=48, last_entry_id=49)
        assert fresh.ledger_state(2) == LedgerState(fenced=True)
    finally:
        await fresh.close()


async def test_logs_sealed_in_a_failed_flush_are_recorded_by_the_next(tmp_path):
    """The failed flush rotates through several entry logs (64 KiB each) before its
    commit fails; after the next flush every sealed log on disk has its size in the
    index, so compaction can consider it."""
    storage = DiskLedgerStorage(_config(tmp_path), read_threads=2, fsync_enabled=False)
    storage.open()
    try:
        connection = _wrap_index(storage)
        _put(storage, 1, range(200))            # ~200 KiB: at least three logs
        connection.fail_next = "COMMIT"
        with pytest.raises(BookieStorageError):
            await storage.flush()
        _put(storage, 3, range(5))
        await storage.flush()
        (directory,) = storage._dirs
        logger = directory.entry_logger
        sealed = set(logger.log_ids()) - {logger.active_log_id}
        assert len(sealed) >= 3
        sizes = await asyncio.get_running_loop().run_in_executor(
            directory._flush_thread, directory.index_writer.log_sizes)
        assert sealed <= set(sizes), (sealed, sizes)
        for log_id in sealed:
            assert sizes[log_id] == logger.file_size(log_id)
    finally:
        await storage.close()


def test_commit_flush_raises_the_original_error_after_sqlites_own_rollback(tmp_path):
    """SQLite rolled back by itself (as on SQLITE_FULL at COMMIT): commit_flush raises
    the full-disk error, not the ROLLBACK's "no transaction is active", and the
    connection is usable afterwards."""
    writer = IndexWriter(str(tmp_path / "index.sqlite"))
    try:
        wrapped = _FailingConnection(writer._db)
        writer._db = wrapped
        wrapped.fail_next = "COMMIT"
        wrapped.auto_rollback = True
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            writer.commit_flush([], [], [(1, 100)])
        assert not wrapped.in_transaction
        writer.commit_flush([], [], [(1, 100)])
        assert writer.log_sizes() == {1: 100}
    finally:
        writer.close()


async def test_a_flush_sorts_on_the_flush_thread_and_leaves_the_read_cache_alone(tmp_path, monkeypatch):
    """The swapped write cache is sorted on the flush thread; the flushed entries are
    not copied into the read cache, and are then read from disk (by the index)."""
    sorting_threads: list[str] = []
    original = WriteCache.sorted_items

    def recording_sorted_items(self):
        sorting_threads.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(WriteCache, "sorted_items", recording_sorted_items)
    storage = DiskLedgerStorage(_config(tmp_path), read_threads=2, fsync_enabled=False)
    storage.open()
    try:
        written = _put(storage, 1, range(30))
        await storage.flush()
        assert sorting_threads and all(name.startswith("flush-") for name in sorting_threads), sorting_threads
        stats = storage.stats()
        assert stats.read_cache_bytes == 0
        assert stats.write_cache_bytes == 0
        await _assert_readable(storage, 1, written)
        stats = storage.stats()
        assert stats.read_cache_misses == 30 and stats.read_cache_hits == 0
        assert stats.read_cache_bytes == sum(len(e) for e in written.values())
    finally:
        await storage.close()


async def test_delete_ledgers_clears_the_read_cache_in_one_pass(tmp_path, monkeypatch):
    """Deleting several ledgers scans the read cache once (delete_ledgers with all of
    them), not once per ledger; their entries are gone, the others stay."""
    calls: list[set[int]] = []
    original = EntryCache.delete_ledgers

    def recording_delete_ledgers(self, ledger_ids):
        calls.append(set(ledger_ids))
        return original(self, ledger_ids)

    def no_single_deletes(self, ledger_id):
        raise AssertionError("delete_ledger called once per ledger")

    monkeypatch.setattr(EntryCache, "delete_ledgers", recording_delete_ledgers, raising=False)
    monkeypatch.setattr(EntryCache, "delete_ledger", no_single_deletes)
    storage = DiskLedgerStorage(_config(tmp_path), read_threads=2, fsync_enabled=False)
    storage.open()
    try:
        kept = {}
        for ledger_id in range(1, 6):
            written = _put(storage, ledger_id, range(5))
            if ledger_id in (2, 5):
                kept[ledger_id] = written
        await storage.flush()
        for ledger_id in range(1, 6):
            await storage.read_entries(ledger_id, list(range(5)), BIG)     # fills the read cache
        await storage.delete_ledgers([1, 3, 4])
        assert calls == [{1, 3, 4}]
        for ledger_id, written in kept.items():
            await _assert_readable(storage, ledger_id, written)
        assert storage.stats().read_cache_bytes == sum(len(e) for w in kept.values() for e in w.values())
        assert storage.ledger_ids() == {2, 5}
    finally:
        await storage.close()


def test_entry_cache_delete_ledgers_drops_exactly_those_ledgers():
    """delete_ledgers removes every entry of the named ledgers and their bytes, keeps
    the others with their recency, and an empty set changes nothing."""
    cache = EntryCache(10_000)
    for ledger_id in range(1, 5):
        for entry_id in range(3):
            cache.put(ledger_id, entry_id, bytes([ledger_id]) * (10 * ledger_id))
    cache.delete_ledgers(set())
    assert len(cache) == 12
    cache.delete_ledgers({1, 3, 7})
    assert len(cache) == 6
    assert cache.size_bytes == 3 * 20 + 3 * 40
    assert cache.get(1, 0) is None and cache.get(3, 2) is None
    assert cache.get(2, 0) == b"\x02" * 20 and cache.get(4, 2) == b"\x04" * 40
    cache.delete_ledger(2)
    assert cache.size_bytes == 3 * 40


def test_the_index_file_survives_a_failed_flush_unchanged(tmp_path):
    """Nothing of a failed commit_flush reaches the index: a transaction is all or
    nothing (checked with rows, ledger states and a log size)."""
    from bookie.entry_log import EntryLocation
    from bookie.index import LedgerRow

    writer = IndexWriter(str(tmp_path / "index.sqlite"))
    try:
        wrapped = _FailingConnection(writer._db)
        writer._db = wrapped
        wrapped.fail_next = "COMMIT"
        with pytest.raises(sqlite3.OperationalError):
            writer.commit_flush([(1, 0, EntryLocation(1, 20, 100))], [LedgerRow(1, False, -1, 0)], [(1, 124)])
        assert writer.location_of(1, 0) is None
        assert writer.ledger_rows() == []
        assert writer.log_sizes() == {}
        assert os.path.exists(tmp_path / "index.sqlite")
    finally:
        writer.close()
