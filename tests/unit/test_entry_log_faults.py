"""Entry logs (bookie/entry_log.py) under disk faults and concurrent deletion.

What it proves:
- a batch whose second vectored write fails (ENOSPC) and is then retried leaves every
  entry readable at the locations the retry returned: the retry overwrites the bytes
  the failed attempt left instead of landing after them (the old code wrote at the
  descriptor's position while counting offsets from the last complete batch);
- the same through DiskLedgerStorage: a failed flush raises BookieStorageError, the
  entries stay readable, and after a good flush and a restart every entry is read back
  from disk byte for byte;
- when creating the next log fails during rotation, the active log stays open and
  usable: the next batch goes on (the old code had already closed its descriptor);
- delete_log while a reader is inside pread on that log does not close the
  descriptor under the reader: the reader gets its bytes, not EBADF, and not the bytes
  of whatever file reused the descriptor number.

How: real files in a temp directory. Faults are injected at the OS-call edge: writes
are counted across os.writev and os.pwritev (so the same injection hits the old and
the new code) and the Nth raises ENOSPC; os.open fails for the new log's name;
os.pread waits on an event, so the test decides when the read proceeds.
"""

from __future__ import annotations

import errno
import os
import threading

import pytest

from bookie.config import LedgerStorageConfig
from bookie.entry_log import EntryLocation, EntryLogger
from bookie.format import ENTRY_LOG_RECORD_HEAD_SIZE, FILE_HEADER_SIZE, entry_log_file_name
from bookie.ledger_storage_disk import DiskLedgerStorage
from common.entry import ENTRY_HEADER_SIZE, encode_entry
from common.errors import BookieStorageError

KIB = 1024
MIB = 1024 * KIB
BIG = 10**9
# Each entry is two buffers (record head, entry), so this many entries take three
# vectored writes of at most IOV_MAX (1024) buffers.
ENTRY_COUNT = 1100


def _entry(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = bytes((ledger_id * 31 + entry_id * 7 + i) % 251 for i in range(size - ENTRY_HEADER_SIZE))
    return encode_entry(ledger_id, entry_id, entry_id - 1, BIG, payload)


@pytest.fixture
def enospc_on_write(monkeypatch):
    """``arm(n)``: the n-th vectored write from now (os.writev or os.pwritev) raises
    ENOSPC after writing nothing; the others go through."""
    real_writev, real_pwritev = os.writev, os.pwritev
    state = {"countdown": 0}

    def tick() -> None:
        if state["countdown"] > 0:
            state["countdown"] -= 1
            if state["countdown"] == 0:
                raise OSError(errno.ENOSPC, "No space left on device")

    def writev(fd, buffers):
        tick()
        return real_writev(fd, buffers)

    def pwritev(fd, buffers, offset, flags=0):
        tick()
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "writev", writev)
    monkeypatch.setattr(os, "pwritev", pwritev)

    def arm(n: int) -> None:
        state["countdown"] = n

    return arm


@pytest.fixture
def logger(tmp_path):
    entry_logger = EntryLogger(str(tmp_path / "entrylogs"), log_bytes_max=64 * MIB, fsync_enabled=False)
    entry_logger.open_new_log()
    yield entry_logger
    entry_logger.close()


@pytest.mark.parametrize("failing_write", [2, 3])
def test_a_batch_retried_after_a_failed_write_is_readable(logger, enospc_on_write, failing_write):
    """ENOSPC on the 2nd (or 3rd) vectored write of a batch, then the same batch again:
    every location the retry returns reads back its own entry, and a later batch too."""
    entries = [_entry(1, i) for i in range(ENTRY_COUNT)]
    enospc_on_write(failing_write)
    with pytest.raises(OSError):
        logger.append_batch(entries)
    assert logger.active_size == FILE_HEADER_SIZE
    locations = logger.append_batch(entries)
    assert [logger.read(location) for location in locations] == entries
    later = [_entry(2, i) for i in range(10)]
    later_locations = logger.append_batch(later)
    assert [logger.read(location) for location in later_locations] == later
    assert logger.active_size == FILE_HEADER_SIZE + sum(ENTRY_LOG_RECORD_HEAD_SIZE + len(e)
                                                        for e in entries + later)


def _storage_config(tmp_path) -> LedgerStorageConfig:
    return LedgerStorageConfig(ledger_dirs=(str(tmp_path / "ledgers"),), write_cache_bytes_max=4 * MIB,
                               read_cache_bytes_max=256 * KIB, entry_bytes_max=8 * KIB,
                               entry_log_bytes_max=16 * MIB, write_cache_wait_s_max=1.0)


async def test_a_flush_that_hit_a_full_disk_loses_nothing(tmp_path, enospc_on_write):
    """The first flush fails on its second vectored write: BookieStorageError, and every
    entry is still readable. The next flush succeeds; after a restart (empty caches)
    every entry comes back from disk byte for byte."""
    config = _storage_config(tmp_path)
    storage = DiskLedgerStorage(config, read_threads=2, fsync_enabled=False)
    storage.open()
    try:
        written = {}
        for entry_id in range(ENTRY_COUNT):
            written[entry_id] = _entry(1, entry_id)
            storage.put_entry(1, entry_id, entry_id - 1, written[entry_id])
        enospc_on_write(2)
        with pytest.raises(BookieStorageError):
            await storage.flush()
        outcomes = await storage.read_entries(1, list(range(ENTRY_COUNT)), BIG)
        assert [o.entry for o in outcomes] == [written[i] for i in range(ENTRY_COUNT)]
        await storage.flush()
        assert storage.stats().write_cache_bytes == 0
    finally:
        await storage.close()
    fresh = DiskLedgerStorage(config, read_threads=2, fsync_enabled=False)
    fresh.open()
    try:
        outcomes = await fresh.read_entries(1, list(range(ENTRY_COUNT)), BIG)
        assert [o.error for o in outcomes] == [None] * ENTRY_COUNT
        assert [o.entry for o in outcomes] == [written[i] for i in range(ENTRY_COUNT)]
    finally:
        await fresh.close()


def test_a_failed_rotation_keeps_the_active_log_usable(tmp_path, monkeypatch):
    """Creating the next log fails (ENOSPC) when a batch needs a rotation: the batch
    raises, and the next batch still lands in a readable place (once the disk has
    room again, in a new log)."""
    directory = tmp_path / "entrylogs"
    entry_logger = EntryLogger(str(directory), log_bytes_max=4 * KIB, fsync_enabled=False)
    entry_logger.open_new_log()
    first_log = entry_logger.active_log_id
    real_open = os.open
    refuse = {"name": entry_log_file_name(first_log + 1)}

    def failing_open(path, flags, mode=0o777):
        if refuse["name"] and os.path.basename(str(path)) == refuse["name"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", failing_open)
    try:
        first = [_entry(1, i, 1000) for i in range(3)]
        first_locations = entry_logger.append_batch(first)
        more = [_entry(1, i, 1000) for i in range(3, 6)]
        with pytest.raises(OSError):
            entry_logger.append_batch(more)         # needs a new log, which cannot be made
        assert entry_logger.active_log_id == first_log
        refuse["name"] = None                       # the disk has room again
        more_locations = entry_logger.append_batch(more)
        assert entry_logger.active_log_id > first_log
        assert [entry_logger.read(loc) for loc in first_locations + more_locations] == first + more
    finally:
        entry_logger.close()


def test_delete_log_never_closes_a_descriptor_a_reader_holds(tmp_path, monkeypatch):
    """A reader is inside pread on log 1 when the flush thread deletes log 1 and then
    opens another file (which may get the same descriptor number). When the reader
    goes on it reads the entry it asked for; its descriptor is closed only after."""
    entry_logger = EntryLogger(str(tmp_path / "entrylogs"), log_bytes_max=4 * KIB, fsync_enabled=False)
    entry_logger.open_new_log()
    entry = _entry(1, 0, 1000)
    (location,) = entry_logger.append_batch([entry])
    entry_logger.rotate()                           # log 1 is sealed; it may be deleted
    assert location.log_id != entry_logger.active_log_id

    inside = threading.Event()
    proceed = threading.Event()
    real_pread = os.pread
    held_fds: list[int] = []

    def gated_pread(fd, size, offset):
        if threading.current_thread().name == "reader":
            held_fds.append(fd)
            inside.set()
            proceed.wait(5)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", gated_pread)
    result: dict[str, object] = {}

    def read() -> None:
        try:
            result["data"] = entry_logger.read(location)
        except OSError as error:
            result["error"] = error

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    try:
        assert inside.wait(5)
        entry_logger.delete_log(location.log_id)
        # Another file, as the process might open one now; with the descriptor closed it
        # would get its number and the reader would read this file's bytes instead.
        other_path = tmp_path / "other"
        other_path.write_bytes(b"\xee" * 4 * KIB)
        other_fd = os.open(other_path, os.O_RDONLY)
        try:
            os.fstat(held_fds[0])                   # still the reader's: not closed
            proceed.set()
            reader.join(5)
            assert not reader.is_alive()
            assert result == {"data": entry}
            os.fstat(other_fd)                      # the reader's close did not hit it
            if other_fd != held_fds[0]:
                with pytest.raises(OSError):
                    os.fstat(held_fds[0])           # closed once the reader let go
        finally:
            os.close(other_fd)
        with pytest.raises(OSError):
            entry_logger.read(location)             # the log is gone for new reads
    finally:
        proceed.set()
        reader.join(5)
        entry_logger.close()


def test_reads_during_a_delete_fail_cleanly_and_later_logs_read_fine(tmp_path):
    """After delete_log, a read of the deleted log raises OSError (the storage then
    looks the index up again); reads of the other logs go on with their own fds."""
    entry_logger = EntryLogger(str(tmp_path / "entrylogs"), log_bytes_max=4 * KIB, fsync_enabled=False)
    entry_logger.open_new_log()
    try:
        entries = [_entry(1, i, 1000) for i in range(12)]      # four per log
        locations = entry_logger.append_batch(entries)
        log_ids = sorted({loc.log_id for loc in locations})
        assert len(log_ids) >= 3
        for loc, entry in zip(locations, entries):
            assert entry_logger.read(loc) == entry    # caches a descriptor per log
        entry_logger.delete_log(log_ids[0])
        for loc, entry in zip(locations, entries):
            if loc.log_id == log_ids[0]:
                with pytest.raises(OSError):
                    entry_logger.read(loc)
            else:
                assert entry_logger.read(loc) == entry
        assert entry_logger.log_count == len(os.listdir(tmp_path / "entrylogs"))
        with pytest.raises(OSError):
            entry_logger.read(EntryLocation(log_ids[0], FILE_HEADER_SIZE, 10))
    finally:
        entry_logger.close()
