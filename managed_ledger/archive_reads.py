"""Serving reads of archived ledgers: entries rebuilt from archive files, with a
read-ahead so a backlog drain from the archive runs as fast as one from the bookies.

Theory of operation. A read of entries [first, last] of an archived ledger finds the
file of the ledger's manifest record that holds ``first``, the record batch that holds
it (the footer's entry ranges), and takes the batch's entries from the cache or decodes
them (archive/reader.py verifies the batch, archive/entries.py rebuilds each entry and
checks it against the producer's CRC32C). File IO and decoding run in the archive's
bounded executor, never on the event loop. After each read the next
``read_ahead_batches`` batches (into the next file of the ledger, and the first batches
of the next archived ledger, which is where a sequential reader goes) are decoded in the
background, so a consumer draining a backlog finds them ready.

Bounds: the cache holds at most ``cache_bytes_max`` bytes of rebuilt entries (least
recently used go first), at most ``open_files_max`` files stay open, and at most one
decode of a given batch is in flight (readers of the same batch share it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from concurrent.futures import Executor
from typing import Callable

from archive.entries import entries_of_batch
from archive.manifest import FileRecord, LedgerRecord
from archive.reader import ArchiveFile
from common.errors import ArchiveError, ArchiveNotFound
from common.position import ManagedEntry, Position

log = logging.getLogger(__name__)

_BatchKey = tuple[str, int]              # (file url, batch index)


class _OpenFile:
    """An open archive file and the lock that serializes its use by worker threads."""

    def __init__(self, archive_file: ArchiveFile) -> None:
        self.file = archive_file
        self.lock = threading.Lock()


class ArchiveReads:
    """Rebuilt entries of archived ledgers, for every topic of a broker."""

    def __init__(self, executor: Executor, *, cache_bytes_max: int, read_ahead_batches: int,
                 open_files_max: int = 16) -> None:
        assert cache_bytes_max > 0 and read_ahead_batches >= 0 and open_files_max > 0
        self._executor = executor
        self._cache_bytes_max = cache_bytes_max
        self._read_ahead_batches = read_ahead_batches
        self._open_files_max = open_files_max
        self._cache: collections.OrderedDict[_BatchKey, list[tuple[int, bytes]]] = collections.OrderedDict()
        self._cache_bytes = 0
        self._inflight: dict[_BatchKey, asyncio.Future[list[tuple[int, bytes]]]] = {}
        self._files: collections.OrderedDict[str, _OpenFile] = collections.OrderedDict()
        self._files_lock = threading.Lock()
        # Batches already reported unreadable: an operator is told once, not per retry.
        self._reported: set[_BatchKey] = set()
        self.batches_decoded = 0
        self.entries_served = 0
        self.read_ahead_hits = 0

    # --- blocking part (worker threads) ---------------------------------------------------------

    def _open(self, record: FileRecord) -> _OpenFile:
        with self._files_lock:
            opened = self._files.get(record.url)
            if opened is not None:
                self._files.move_to_end(record.url)
                return opened
        archive_file = ArchiveFile.open(record.url, size_bytes=record.size_bytes)
        with self._files_lock:
            opened = self._files.get(record.url)
            if opened is None:
                opened = _OpenFile(archive_file)
                self._files[record.url] = opened
                while len(self._files) > self._open_files_max:
                    _url, evicted = self._files.popitem(last=False)
                    with evicted.lock:
                        evicted.file.close()
            else:
                archive_file.close()
        return opened

    def _decode(self, record: FileRecord, batch_index: int) -> list[tuple[int, bytes]]:
        opened = self._open(record)
        with opened.lock:
            if opened.file.closed:      # evicted between open and lock: reopen
                return self._decode(record, batch_index)
            batch = opened.file.read_batch(batch_index)
        return entries_of_batch(batch, record.url, batch_index)

    def forget(self, urls: set[str]) -> None:
        """Drops the cached entries and open files of these files (a topic that closed
        here: its next owner reads them again, from the files)."""
        for key in [key for key in self._cache if key[0] in urls]:
            evicted = self._cache.pop(key)
            self._cache_bytes -= sum(len(data) for _entry_id, data in evicted)
        with self._files_lock:
            closing = [self._files.pop(url) for url in list(self._files) if url in urls]
        for opened in closing:
            with opened.lock:
                opened.file.close()

    def close(self) -> None:
        with self._files_lock:
            for opened in self._files.values():
                with opened.lock:
                    opened.file.close()
            self._files.clear()

    # --- event loop part --------------------------------------------------------------------------

    def _batch(self, record: FileRecord, batch_index: int) -> asyncio.Future[list[tuple[int, bytes]]]:
        """The entries of a batch: cached, in flight, or decoded now."""
        key = (record.url, batch_index)
        loop = asyncio.get_running_loop()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            future: asyncio.Future[list[tuple[int, bytes]]] = loop.create_future()
            future.set_result(cached)
            return future
        pending = self._inflight.get(key)
        if pending is not None:
            return pending
        pending = asyncio.ensure_future(loop.run_in_executor(self._executor, self._decode, record, batch_index))
        self._inflight[key] = pending
        pending.add_done_callback(lambda done: self._on_decoded(key, done))
        return pending

    def _on_decoded(self, key: _BatchKey, done: asyncio.Future) -> None:
        self._inflight.pop(key, None)
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            if isinstance(error, ArchiveError) and key not in self._reported and len(self._reported) < 10_000:
                self._reported.add(key)
                log.error("archive batch unreadable, not served: url=%s batch_index=%d error=%s", key[0], key[1],
                          error)
            return
        entries = done.result()
        self.batches_decoded += 1
        size = sum(len(data) for _entry_id, data in entries)
        self._cache[key] = entries
        self._cache_bytes += size
        while self._cache_bytes > self._cache_bytes_max and len(self._cache) > 1:
            _key, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= sum(len(data) for _entry_id, data in evicted)

    async def read(self, ledger: LedgerRecord, first: int, last: int, bytes_max: int,
                   following: Callable[[int], LedgerRecord | None] | None = None) -> list[ManagedEntry]:
        """Entries first..last (at most about bytes_max, at least one) of an archived
        ledger. ``following(ledger_id)`` names the next archived ledger of the topic,
        for the read-ahead."""
        assert 0 <= first <= last < ledger.entry_count, (first, last, ledger.entry_count)
        entries: list[ManagedEntry] = []
        size = 0
        entry_id = first
        place: tuple[FileRecord, int] | None = None
        while entry_id <= last and (size < bytes_max or not entries):
            record = ledger.file_for_entry(entry_id)
            if record is None:
                raise ArchiveNotFound(f"ledger {ledger.ledger_id} entry {entry_id} is in no file of its archive")
            batch_index = await self._batch_index(record, entry_id)
            key = (record.url, batch_index)
            if key in self._cache:
                self.read_ahead_hits += 1
            batch_entries = await self._batch(record, batch_index)
            for batch_entry_id, data in batch_entries:
                if batch_entry_id < entry_id:
                    continue
                if batch_entry_id > last or (size >= bytes_max and entries):
                    break
                entries.append(ManagedEntry(Position(ledger.ledger_id, batch_entry_id), data))
                size += len(data)
                entry_id = batch_entry_id + 1
            else:
                entry_id = max(entry_id, batch_entries[-1][0] + 1)
            place = (record, batch_index)
        if place is not None:
            self._read_ahead(ledger, place[0], place[1], following)
        self.entries_served += len(entries)
        assert entries, (ledger.ledger_id, first, last)
        return entries

    async def _batch_index(self, record: FileRecord, entry_id: int) -> int:
        """The batch of ``record`` holding ``entry_id``, from the file's footer."""
        loop = asyncio.get_running_loop()
        with self._files_lock:
            opened = self._files.get(record.url)
        if opened is None:
            opened = await loop.run_in_executor(self._executor, self._open, record)
        return opened.file.metadata.batch_for_entry(entry_id)

    def _read_ahead(self, ledger: LedgerRecord, record: FileRecord, batch_index: int,
                    following: Callable[[int], LedgerRecord | None] | None) -> None:
        """Starts decoding the batches after (record, batch_index), into the next file
        and the next archived ledger."""
        if self._read_ahead_batches == 0:
            return
        with self._files_lock:
            opened = self._files.get(record.url)
        if opened is None:
            return
        wanted = self._read_ahead_batches
        index = batch_index + 1
        files = list(ledger.files)
        position = files.index(record)
        current_batches = opened.file.batch_count
        while wanted > 0:
            if index < current_batches:
                self._batch(files[position], index)
                wanted -= 1
                index += 1
                continue
            position += 1
            if position >= len(files):
                next_ledger = following(ledger.ledger_id) if following is not None else None
                if next_ledger is None:
                    return
                ledger, files, position = next_ledger, list(next_ledger.files), 0
            with self._files_lock:
                next_open = self._files.get(files[position].url)
            # Batch 0 of a file not yet open: decoding it opens the file.
            self._batch(files[position], 0)
            wanted -= 1
            if next_open is None:
                return          # its batch count is known once opened; stop here
            current_batches = next_open.file.batch_count
            index = 1
