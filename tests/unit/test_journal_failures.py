"""The journal (bookie/journal.py) and the bookie's admission of adds after the journal
failed.

What it proves:
- when opening the next journal file fails during rotation (a full disk), the journal
  fails, and close_file does not close the previous file's descriptor number a second
  time (by then the process may have given that number to another file);
- after a write failure, wait_for_room raises the journal's BookieStorageError at once,
  also for a caller that was already waiting for room when the failure came; it does
  not wait out its timeout (which BookieNode.admit reported as a retriable Overloaded);
- BookieNode.admit on a failed journal raises BookieStorageError at once.

How: real files in a temp directory with fsync off. Faults are injected at the OS-call
edge: vectored writes (os.pwritev, and os.writev which the code used before) raise
ENOSPC, after a gate the test opens where it needs a waiter in place first; os.open
refuses the next journal file's name.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import pytest

from bookie.config import BookieConfig, JournalConfig, LedgerStorageConfig
from bookie.format import journal_add_record, journal_file_name
from bookie.journal import Journal
from bookie.ledger_storage_disk import DiskLedgerStorage
from bookie.node import AddItem, BookieNode
from common.entry import encode_entry
from common.errors import BookieStorageError

KIB = 1024
MIB = 1024 * KIB


def _entry(ledger_id: int, entry_id: int, payload_size: int = 16) -> bytes:
    payload = bytes((ledger_id + entry_id + i) % 251 for i in range(payload_size))
    return encode_entry(ledger_id, entry_id, entry_id - 1, 10**9, payload)


class _Running:
    """A journal with its writer task; always stopped at the end of a test."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.task = asyncio.get_running_loop().create_task(journal.run())

    def add(self, ledger_id: int, entry_id: int, payload_size: int = 16) -> asyncio.Future[None]:
        entry = _entry(ledger_id, entry_id, payload_size)
        return self.journal.append(journal_add_record(entry), len(entry), [(ledger_id, entry_id)])

    async def stop(self) -> None:
        if not self.task.done():
            await self.journal.close()
        await asyncio.wait_for(asyncio.gather(self.task, return_exceptions=True), 5)
        self.journal.close_file()


@pytest.fixture
async def running():
    started: list[_Running] = []

    def start(journal_dir, **overrides) -> _Running:
        overrides.setdefault("fsync_enabled", False)
        journal = Journal(JournalConfig(journal_dir=str(journal_dir), **overrides), on_durable=lambda tokens: None,
                          first_journal_id=1)
        journal.open()
        started.append(_Running(journal))
        return started[-1]

    yield start
    for item in started:
        await item.stop()


async def test_a_failed_rotation_does_not_close_a_reused_descriptor(tmp_path, running, monkeypatch):
    """The group that fills the first file is written, then creating journal file 2
    fails: the journal fails with BookieStorageError. A file opened afterwards (which
    may get the old descriptor's number) is still open after close_file."""
    harness = running(tmp_path, file_bytes_max=1 * MIB, group_bytes_max=1 * MIB)
    real_open = os.open
    refused = journal_file_name(2)

    def refusing_open(path, flags, mode=0o777):
        if os.path.basename(str(path)) == refused:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", refusing_open)
    future = harness.add(1, 0, payload_size=1 * MIB)
    with pytest.raises(BookieStorageError):
        await asyncio.wait_for(future, 5)
    await asyncio.wait_for(harness.task, 5)
    assert isinstance(harness.journal.failed, BookieStorageError)
    other_path = tmp_path / "unrelated"
    other_path.write_bytes(b"x")
    other_fd = real_open(other_path, os.O_RDONLY)
    try:
        harness.journal.close_file()
        os.fstat(other_fd)                 # raises EBADF if close_file closed it
    finally:
        os.close(other_fd)


async def test_wait_for_room_raises_the_failure_at_once(tmp_path, running, monkeypatch):
    """A waiter blocked on a full queue when the write fails raises BookieStorageError
    promptly, and so does every later wait_for_room; neither waits out its timeout."""
    gate = threading.Event()

    def failing_write(fd, buffers, *_offset_and_flags):
        gate.wait(5)
        raise OSError(errno.ENOSPC, "No space left on device")

    harness = running(tmp_path, group_bytes_max=64 * KIB, queue_bytes_max=64 * KIB)
    monkeypatch.setattr(os, "pwritev", failing_write)
    monkeypatch.setattr(os, "writev", failing_write)       # the same edge for the old code
    future = harness.add(1, 0, payload_size=64 * KIB)
    waiter = asyncio.ensure_future(harness.journal.wait_for_room(1, timeout_s=30.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()                  # the queue is full: it waits
    started = time.monotonic()
    gate.set()
    with pytest.raises(BookieStorageError):
        await asyncio.wait_for(future, 5)
    with pytest.raises(BookieStorageError):
        await waiter
    with pytest.raises(BookieStorageError):
        await harness.journal.wait_for_room(10 * MIB, timeout_s=30.0)
    with pytest.raises(BookieStorageError):
        await harness.journal.wait_for_room(1, timeout_s=30.0)
    # Far below the 30 s a waiter would sit out (which would end in Overloaded anyway).
    assert time.monotonic() - started < 10.0


async def test_admit_on_a_failed_journal_raises_the_failure(tmp_path, monkeypatch):
    """BookieNode.admit after a journal write failure raises BookieStorageError at once,
    not Overloaded after write_cache_wait_s_max (a retriable error for a fatal state)."""
    config = BookieConfig(
        metadata_url="memory://",
        journal=JournalConfig(journal_dir=str(tmp_path / "journal"), fsync_enabled=False),
        storage=LedgerStorageConfig(ledger_dirs=(str(tmp_path / "ledgers"),), write_cache_bytes_max=1 * MIB,
                                    entry_bytes_max=8 * KIB, entry_log_bytes_max=1 * MIB,
                                    write_cache_wait_s_max=30.0),
    )
    storage = DiskLedgerStorage(config.storage, read_threads=1, fsync_enabled=False)
    node = BookieNode(config, storage, "bookie-1")
    node.open()
    assert node.journal is not None
    writer = asyncio.ensure_future(node.journal.run())
    try:
        def failing_write(fd, buffers, *_offset_and_flags):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwritev", failing_write)
        monkeypatch.setattr(os, "writev", failing_write)   # the same edge for the old code
        items = [AddItem(1, 0, _entry(1, 0))]
        await node.admit(items)
        _outcomes, future = node.submit_adds(items)
        assert future is not None
        with pytest.raises(BookieStorageError):
            await asyncio.wait_for(future, 5)
        started = time.monotonic()
        with pytest.raises(BookieStorageError):
            await node.admit([AddItem(1, 1, _entry(1, 1))])
        assert time.monotonic() - started < 10.0   # not the 30 s wait for room
    finally:
        await node.close()
        await asyncio.wait_for(asyncio.gather(writer, return_exceptions=True), 5)
        node.journal.close_file()
        await storage.close()
