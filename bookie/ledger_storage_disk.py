"""Ledger storage on one or more ledger directories (the data disks).

Theory of operation:
- A ledger lives in directory ``ledger_id % len(dirs)``; each directory has its own
  write cache, entry logger, index and flush thread, so several disks work in parallel.
- ``put_entry`` puts a journal-durable entry into the directory's active write cache,
  where readers find it at once. A flush swaps the active cache for an empty one and,
  on the flush thread, appends the swapped entries (sorted by ledger, then entry) to
  the entry log, fdatasyncs, and commits their index rows together with the ledger
  states in one SQLite transaction. Only then are they dropped from memory (not
  copied to the read cache, which holds entries read from disk). Readers look in:
  active cache, flushing cache, read cache, disk. A failed flush (IO or SQLite
  error) puts its entries and ledger states back as pending; nothing is lost, since
  the checkpoint moves only after a flush succeeded.
- Reads from disk run on a shared pool of reader threads. Contiguous entries are read
  with one pread, each entry's header and digest are checked before it is returned:
  a flipped byte on disk is a DigestMismatch, never data.
- Compaction (on the flush thread, so ordered with flushes) copies the live entries of
  a sparse entry log into the active log, re-points the index, then deletes the log.

Invariants: an entry is in exactly one of (write caches, index) from the reader's view
at any moment it is readable; the index only points at fdatasynced bytes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field

from bookie.config import LedgerStorageConfig
from bookie.entry_log import EntryLocation, EntryLogger
from bookie.format import ENTRY_LOG_RECORD_HEAD_SIZE, FILE_HEADER_SIZE
from bookie.index import IndexReader, IndexWriter, LedgerRow
from bookie.ledger_storage import LedgerState, LedgerStorage, ReadOutcome, StorageStats
from common.entry_cache import EntryCache
from bookie.write_cache import WriteCache
from common.entry import verify_entry
from common.errors import (
    BookieStorageError,
    DigestMismatch,
    MagnetarError,
    MalformedFrame,
    NoSuchEntry,
    Overloaded,
)

log = logging.getLogger(__name__)

# A read racing a compaction that deleted the log it looked up retries this often.
_READ_ATTEMPTS_MAX = 3
# Spans of adjacent entries are read with one pread up to this size.
_READ_SPAN_BYTES_MAX = 4 * 1024 * 1024
# Compaction copies live entries in batches of this many (bounds its memory: at most
# this many maximal entries, ~5 GiB in theory, ~1 MiB for typical 1 KiB entries).
_COMPACTION_BATCH_ENTRIES = 1024


@dataclass
class _DiskRead:
    found: dict[int, bytes] = field(default_factory=dict)
    errors: dict[int, MagnetarError] = field(default_factory=dict)
    not_indexed: set[int] = field(default_factory=set)


@dataclass
class _DirStats:
    flushes: int = 0
    flushed_bytes: int = 0
    compacted_logs: int = 0
    compacted_bytes: int = 0


class _Directory:
    """The storage of one ledger directory."""

    def __init__(self, path: str, config: LedgerStorageConfig, read_pool: concurrent.futures.Executor,
                 write_cache_bytes_max: int, read_cache_bytes_max: int, fsync_enabled: bool) -> None:
        self.path = path
        self.config = config
        self._read_pool = read_pool
        self._write_cache_bytes_max = write_cache_bytes_max
        self.active = WriteCache()
        self.flushing: WriteCache | None = None
        self.read_cache = EntryCache(read_cache_bytes_max)
        self.states: dict[int, LedgerState] = {}
        self._dirty: set[int] = set()
        self._flush_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"flush-{os.path.basename(path)}")
        self._flush_lock = asyncio.Lock()
        self._room = asyncio.Event()
        self.entry_logger = EntryLogger(os.path.join(path, "entrylogs"),
                                        log_bytes_max=config.entry_log_bytes_max,
                                        fsync_enabled=fsync_enabled)
        self._index_path = os.path.join(path, "index.sqlite")
        self.index_writer: IndexWriter | None = None
        self.index_reader = IndexReader(self._index_path)
        self._sealed_logs: list[tuple[int, int]] = []
        self.stats = _DirStats()

    # --- start-up / shut-down ---------------------------------------------------------------

    def open(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        self.index_writer = IndexWriter(self._index_path)
        for row in self.index_writer.ledger_rows():
            self.states[row.ledger_id] = LedgerState(row.fenced, row.last_add_confirmed, row.last_entry_id)
        # Logs on disk that the index has no size for (the active log of a crashed
        # process) are sealed now so compaction can reclaim their dead tails.
        known = self.index_writer.log_sizes()
        for log_id in self.entry_logger.log_ids():
            size = self.entry_logger.file_size(log_id)
            if size <= FILE_HEADER_SIZE and not self.index_writer.log_has_entries(log_id):
                # An empty active log of an earlier run: nothing to keep.
                self.entry_logger.delete_log(log_id)
                if log_id in known:
                    self.index_writer.forget_log(log_id)
            elif log_id not in known:
                self._sealed_logs.append((log_id, size))
        self.entry_logger.open_new_log()

    async def close(self) -> None:
        await self.flush()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._flush_thread, self._close_files)
        self._flush_thread.shutdown(wait=True)
        self.index_reader.close()

    def _close_files(self) -> None:
        self.entry_logger.close()
        if self.index_writer is not None:
            self.index_writer.close()

    # --- writes -------------------------------------------------------------------------------

    def put(self, ledger_id: int, entry_id: int, last_add_confirmed: int, entry: bytes) -> None:
        self.active.put(ledger_id, entry_id, entry)
        state = self.states.get(ledger_id)
        if state is None:
            state = self.states[ledger_id] = LedgerState()
        if entry_id > state.last_entry_id:
            state.last_entry_id = entry_id
        if last_add_confirmed > state.last_add_confirmed:
            state.last_add_confirmed = last_add_confirmed
        self._dirty.add(ledger_id)

    def fence(self, ledger_id: int) -> LedgerState:
        state = self.states.get(ledger_id)
        if state is None:
            state = self.states[ledger_id] = LedgerState()
        state.fenced = True
        self._dirty.add(ledger_id)
        return state

    def needs_flush(self) -> bool:
        return self.active.size_bytes >= self._write_cache_bytes_max // 2

    def has_room(self, size_bytes: int) -> bool:
        return self.active.size_bytes + size_bytes <= self._write_cache_bytes_max

    async def wait_for_room(self, size_bytes: int) -> None:
        if self.has_room(size_bytes):
            return
        try:
            async with asyncio.timeout(self.config.write_cache_wait_s_max):
                while self.active.size_bytes + size_bytes > self._write_cache_bytes_max:
                    self._room.clear()
                    await self._room.wait()
        except TimeoutError:
            raise Overloaded(f"write cache full in {self.path}: flushes are not keeping up") from None

    async def flush(self) -> None:
        async with self._flush_lock:
            # Only a flush sets it, under this lock, and every flush clears it on the
            # way out (done or failed): a leftover would be dropped, unindexed.
            assert self.flushing is None, "a failed flush left its entries behind"
            if not self.active.entry_count and not self._dirty and not self._sealed_logs:
                return
            self.flushing, self.active = self.active, WriteCache()
            self._room.set()
            rows = [LedgerRow(lid, s.fenced, s.last_add_confirmed, s.last_entry_id)
                    for lid in self._dirty if (s := self.states.get(lid)) is not None]
            self._dirty = set()
            loop = asyncio.get_running_loop()
            try:
                # The swapped cache is not changed any more (puts and deletes go to the
                # active one), so the flush thread may sort and read it as it is.
                await loop.run_in_executor(self._flush_thread, self._flush_on_thread, self.flushing, rows)
            except (OSError, sqlite3.Error) as error:
                # The entries are still in the journal and back in the write cache (still
                # readable); the checkpoint does not move, so the next flush (or the next
                # start's replay) writes them again.
                log.error("ledger storage flush failed: directory=%s error=%s", self.path, error)
                self._merge_back(rows)
                raise BookieStorageError(f"flush failed in {self.path}: {error}") from error
            except BaseException:
                self._merge_back(rows)
                raise
            # Their index rows are committed: readers find the entries on disk now. They
            # are not copied into the read cache: tailing readers are served from the
            # write cache before a flush, the OS page cache holds the pages just
            # written, and copying would cost per-entry work on the event loop and
            # evict the entries that readers really asked for.
            self.stats.flushes += 1
            self.stats.flushed_bytes += self.flushing.size_bytes
            self.flushing = None

    def _merge_back(self, rows: list[LedgerRow]) -> None:
        """After a failed flush: the flushed entries and ledger states become pending
        again (those of ledgers deleted meanwhile excepted)."""
        assert self.flushing is not None
        states = self.states
        for ledger_id, entry_id, entry in self.flushing.sorted_items():
            if ledger_id in states and self.active.get(ledger_id, entry_id) is None:
                self.active.put(ledger_id, entry_id, entry)
        self.flushing = None
        self._dirty.update(row.ledger_id for row in rows if row.ledger_id in states)

    def _flush_on_thread(self, flushing: WriteCache, rows: list[LedgerRow]) -> None:
        assert self.index_writer is not None
        sealed = self._sealed_logs
        self._sealed_logs = []
        try:
            index_rows: list[tuple[int, int, EntryLocation]] = []
            items = flushing.sorted_items()
            if items:
                locations = self.entry_logger.append_batch([entry for _, _, entry in items])
                assert len(locations) == len(items), (len(locations), len(items))
                index_rows = [(lid, eid, loc) for (lid, eid, _), loc in zip(items, locations)]
            sealed = sealed + self.entry_logger.take_sealed()
            active = (self.entry_logger.active_log_id, self.entry_logger.active_size)
            self.index_writer.commit_flush(index_rows, rows, sealed + [active])
        except BaseException:
            # The sizes of sealed logs are recorded by the next flush instead; without
            # them compaction would never consider those logs.
            self._sealed_logs = sealed + self.entry_logger.take_sealed()
            raise

    # --- reads -------------------------------------------------------------------------------

    def _from_memory(self, ledger_id: int, entry_id: int) -> bytes | None:
        entry = self.active.get(ledger_id, entry_id)
        if entry is None and self.flushing is not None:
            entry = self.flushing.get(ledger_id, entry_id)
        if entry is None:
            entry = self.read_cache.get(ledger_id, entry_id)
        return entry

    async def read(self, ledger_id: int, wanted: list[int], bytes_max: int) -> list[ReadOutcome]:
        found: dict[int, bytes] = {}
        missing: list[int] = []
        for entry_id in wanted:
            entry = self._from_memory(ledger_id, entry_id)
            if entry is None:
                missing.append(entry_id)
            else:
                found[entry_id] = entry
        # Every entry is in memory or in the index at any moment (a flush drops its
        # entries from memory only after their index rows committed), so an entry in
        # neither does not exist.
        disk = _DiskRead()
        if missing:
            loop = asyncio.get_running_loop()
            disk = await loop.run_in_executor(self._read_pool, self._read_from_disk, ledger_id, missing,
                                              bytes_max)
            for entry_id, entry in disk.found.items():
                found[entry_id] = entry
                self.read_cache.put(ledger_id, entry_id, entry)
        outcomes: list[ReadOutcome] = []
        size = 0
        for entry_id in wanted:
            if outcomes and size >= bytes_max:
                break
            entry = found.get(entry_id)
            if entry is not None:
                outcomes.append(ReadOutcome(entry_id, entry))
                size += len(entry)
            elif entry_id in disk.errors:
                outcomes.append(ReadOutcome(entry_id, None, disk.errors[entry_id]))
            elif entry_id in disk.not_indexed:
                outcomes.append(ReadOutcome(entry_id, None, NoSuchEntry(ledger_id, entry_id)))
            else:
                break  # past the disk read's byte budget: the caller asks again
        return outcomes

    def _read_from_disk(self, ledger_id: int, wanted: list[int], bytes_max: int) -> "_DiskRead":
        """On a reader thread."""
        for attempt in range(_READ_ATTEMPTS_MAX):
            locations = self.index_reader.locations(ledger_id, wanted)
            try:
                return self._read_locations(ledger_id, wanted, locations, bytes_max)
            except OSError as error:
                # The log may have been compacted away between lookup and read.
                if attempt + 1 == _READ_ATTEMPTS_MAX:
                    log.error("entry log read failed: directory=%s ledger_id=%d error=%s",
                              self.path, ledger_id, error)
                    failed = BookieStorageError(f"read failed: {error}")
                    return _DiskRead(errors={eid: failed for eid in wanted})
        raise AssertionError("unreachable")

    def _read_locations(self, ledger_id: int, wanted: list[int], locations: dict[int, EntryLocation],
                        bytes_max: int) -> "_DiskRead":
        result = _DiskRead()
        chosen: list[int] = []
        size = 0
        for entry_id in wanted:
            location = locations.get(entry_id)
            if location is None:
                result.not_indexed.add(entry_id)
                continue
            if chosen and size >= bytes_max:
                continue  # past the budget: neither found nor missing
            chosen.append(entry_id)
            size += location.size
        # Records of adjacent entries in one log are read with one pread per span.
        chosen.sort(key=lambda eid: (locations[eid].log_id, locations[eid].offset))
        span: list[int] = []
        span_bytes = 0
        for entry_id in chosen:
            location = locations[entry_id]
            if span:
                previous = locations[span[-1]]
                adjacent = (location.log_id == previous.log_id
                            and location.offset == previous.offset + previous.size + ENTRY_LOG_RECORD_HEAD_SIZE
                            and span_bytes + location.size <= _READ_SPAN_BYTES_MAX)
                if not adjacent:
                    self._read_span(ledger_id, span, locations, result)
                    span, span_bytes = [], 0
            span.append(entry_id)
            span_bytes += location.size
        if span:
            self._read_span(ledger_id, span, locations, result)
        return result

    def _read_span(self, ledger_id: int, span: list[int], locations: dict[int, EntryLocation],
                   result: "_DiskRead") -> None:
        first, last = locations[span[0]], locations[span[-1]]
        data = self.entry_logger.read_span(first.log_id, first.offset, last.offset + last.size - first.offset)
        view = memoryview(data)
        for entry_id in span:
            location = locations[entry_id]
            start = location.offset - first.offset
            entry = view[start:start + location.size]
            try:
                header = verify_entry(entry)
                if header.ledger_id != ledger_id or header.entry_id != entry_id:
                    raise MalformedFrame(f"index points at entry {header.ledger_id}/{header.entry_id}")
            except (DigestMismatch, MalformedFrame) as error:
                log.error("corrupt entry on disk: directory=%s ledger_id=%d entry_id=%d log_id=%d "
                          "offset=%d error=%s", self.path, ledger_id, entry_id, location.log_id,
                          location.offset, error)
                # Name the entry that was asked for: a corrupted header carries wrong ids.
                result.errors[entry_id] = DigestMismatch(ledger_id, entry_id, str(error))
                continue
            result.found[entry_id] = bytes(entry)

    # --- deletion and compaction ------------------------------------------------------------------

    async def delete_ledgers(self, ledger_ids: list[int]) -> None:
        for ledger_id in ledger_ids:
            self.active.delete_ledger(ledger_id)
            self.states.pop(ledger_id, None)
            self._dirty.discard(ledger_id)
        # One pass over the read cache for all of them, not one per ledger.
        self.read_cache.delete_ledgers(set(ledger_ids))
        async with self._flush_lock:
            assert self.index_writer is not None
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._flush_thread, self.index_writer.delete_ledgers, ledger_ids)

    async def compact(self, live_ratio_min: float, bytes_max: int) -> tuple[int, int]:
        compacted = 0
        reclaimed = 0
        async with self._flush_lock:
            loop = asyncio.get_running_loop()
            candidates = await loop.run_in_executor(self._flush_thread, self._compaction_candidates,
                                                    live_ratio_min)
        for log_id, size_bytes, live_bytes in candidates:
            if reclaimed >= bytes_max:
                break
            async with self._flush_lock:
                moved = await loop.run_in_executor(self._flush_thread, self._compact_log, log_id)
            compacted += 1
            reclaimed += size_bytes - moved
            log.info("entry log compacted: directory=%s log_id=%d size_bytes=%d live_bytes=%d moved_bytes=%d",
                     self.path, log_id, size_bytes, live_bytes, moved)
        self.stats.compacted_logs += compacted
        self.stats.compacted_bytes += reclaimed
        return compacted, reclaimed

    def _compaction_candidates(self, live_ratio_min: float) -> list[tuple[int, int, int]]:
        """Flush thread: sealed logs whose live share is below ``live_ratio_min``, as
        (log_id, size_bytes, live_bytes), sparsest first."""
        assert self.index_writer is not None
        active_id = self.entry_logger.active_log_id
        active_size = self.entry_logger.active_size
        # The active log is never compacted; if it is mostly dead, seal it so that this
        # round can (otherwise a quiet bookie would never give space back).
        if active_size > FILE_HEADER_SIZE and \
                self.index_writer.log_live_bytes(active_id) < live_ratio_min * active_size:
            self.entry_logger.rotate()
            self.index_writer.commit_flush([], [], [(active_id, active_size)] + self.entry_logger.take_sealed())
        candidates = []
        for log_id, size_bytes in self.index_writer.log_sizes().items():
            if log_id == self.entry_logger.active_log_id:
                continue
            live_bytes = self.index_writer.log_live_bytes(log_id)
            if live_bytes < live_ratio_min * size_bytes:
                candidates.append((log_id, size_bytes, live_bytes))
        candidates.sort(key=lambda c: c[2] / max(c[1], 1))
        return candidates

    def _compact_log(self, log_id: int) -> int:
        """Flush thread: copies the entries the index still has in ``log_id`` to the
        active log, re-points the index, and deletes the log once nothing points into
        it. Returns the bytes copied."""
        assert self.index_writer is not None
        moved_bytes = 0
        after_offset = -1
        while True:
            live = self.index_writer.live_entries(log_id, after_offset, _COMPACTION_BATCH_ENTRIES)
            if not live:
                break
            entries = []
            for ledger_id, entry_id, offset, size in live:
                # Copied as they are: a corrupt entry stays detectable by its digest.
                entries.append(self.entry_logger.read(EntryLocation(log_id, offset, size)))
            locations = self.entry_logger.append_batch(entries)
            self.index_writer.relocate(
                [(ledger_id, entry_id, offset, location)
                 for (ledger_id, entry_id, offset, _size), location in zip(live, locations)], log_id)
            moved_bytes += sum(size for *_, size in live)
            after_offset = live[-1][2]
        self.index_writer.forget_log(log_id)
        self.entry_logger.delete_log(log_id)
        return moved_bytes


class DiskLedgerStorage(LedgerStorage):
    def __init__(self, config: LedgerStorageConfig, *, read_threads: int, fsync_enabled: bool = True) -> None:
        self.config = config
        self._read_pool = concurrent.futures.ThreadPoolExecutor(max_workers=read_threads,
                                                                thread_name_prefix="ledger-read")
        count = len(config.ledger_dirs)
        self._dirs = [
            _Directory(path, config, self._read_pool,
                       write_cache_bytes_max=config.write_cache_bytes_max // count,
                       read_cache_bytes_max=config.read_cache_bytes_max // count,
                       fsync_enabled=fsync_enabled)
            for path in config.ledger_dirs
        ]

    def _dir(self, ledger_id: int) -> _Directory:
        return self._dirs[ledger_id % len(self._dirs)]

    def open(self) -> None:
        for directory in self._dirs:
            directory.open()

    async def close(self) -> None:
        for directory in self._dirs:
            await directory.close()
        self._read_pool.shutdown(wait=True)

    def put_entry(self, ledger_id: int, entry_id: int, last_add_confirmed: int, entry: bytes) -> None:
        self._dir(ledger_id).put(ledger_id, entry_id, last_add_confirmed, entry)

    def fence(self, ledger_id: int) -> LedgerState:
        return self._dir(ledger_id).fence(ledger_id)

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        return self._dir(ledger_id).states.get(ledger_id)

    def has_room(self, ledger_id: int, size_bytes: int) -> bool:
        return self._dir(ledger_id).has_room(size_bytes)

    async def wait_for_room(self, ledger_id: int, size_bytes: int) -> None:
        await self._dir(ledger_id).wait_for_room(size_bytes)

    async def read_entries(self, ledger_id: int, entry_ids: list[int], bytes_max: int) -> list[ReadOutcome]:
        return await self._dir(ledger_id).read(ledger_id, entry_ids, bytes_max)

    async def flush(self) -> None:
        started = time.perf_counter()
        await asyncio.gather(*(directory.flush() for directory in self._dirs))
        log.debug("ledger storage flushed: seconds=%.3f", time.perf_counter() - started)

    def needs_flush(self) -> bool:
        return any(directory.needs_flush() for directory in self._dirs)

    def ledger_ids(self) -> set[int]:
        ids: set[int] = set()
        for directory in self._dirs:
            ids.update(directory.states)
        return ids

    async def delete_ledgers(self, ledger_ids: list[int]) -> None:
        by_dir: dict[int, list[int]] = {}
        for ledger_id in ledger_ids:
            by_dir.setdefault(ledger_id % len(self._dirs), []).append(ledger_id)
        for index, ids in by_dir.items():
            await self._dirs[index].delete_ledgers(ids)

    async def compact(self, live_ratio_min: float, bytes_max: int) -> tuple[int, int]:
        logs = 0
        reclaimed = 0
        for directory in self._dirs:
            count, size = await directory.compact(live_ratio_min, bytes_max - reclaimed)
            logs += count
            reclaimed += size
        return logs, reclaimed

    def stats(self) -> StorageStats:
        return StorageStats(
            write_cache_bytes=sum(d.active.size_bytes + (d.flushing.size_bytes if d.flushing else 0)
                                  for d in self._dirs),
            read_cache_bytes=sum(d.read_cache.size_bytes for d in self._dirs),
            read_cache_hits=sum(d.read_cache.hits for d in self._dirs),
            read_cache_misses=sum(d.read_cache.misses for d in self._dirs),
            ledger_count=sum(len(d.states) for d in self._dirs),
            entry_log_count=sum(d.entry_logger.log_count for d in self._dirs),
            flushes=sum(d.stats.flushes for d in self._dirs),
            flushed_bytes=sum(d.stats.flushed_bytes for d in self._dirs),
            compacted_logs=sum(d.stats.compacted_logs for d in self._dirs),
            compacted_bytes=sum(d.stats.compacted_bytes for d in self._dirs),
        )

    def directories(self) -> list[str]:
        return [d.path for d in self._dirs]
