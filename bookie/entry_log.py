"""Entry logs: the interleaved data files of one ledger directory.

Theory of operation:
- All ledgers share one active entry log (like BookKeeper's entry logger); a flush
  appends a sorted batch of entries with vectored writes and one fdatasync, and returns
  each entry's (log_id, offset, size) for the index.
- The active log rotates at ``entry_log_bytes_max``. A process always starts a new
  active log, so a log written partly before a crash is never appended to; its
  unindexed tail is dead space that compaction reclaims.
- Writes go to explicit offsets (``fileio.write_all``): the bytes of a batch land at
  ``active_size``, which moves only once the whole batch is written. A batch that
  failed half-way (a full disk) and is retried overwrites its partial bytes, so the
  offsets handed to the index are always where the entries really are.
- Rotation creates the new log before it closes the old one: if creating fails, the
  old log stays active and usable, and no closed descriptor is ever written to.
- Reads are ``pread`` on a cached descriptor per log and are safe from any thread.
  Each read holds its log's descriptor (a count under a lock) for the ``pread``; a
  deleted log's descriptor is closed by whichever of ``delete_log`` and the last
  reader comes later, so a reader never preads a closed number that the process may
  already have reused for another file.
- Every method that writes runs on the directory's single flush thread (the caller
  guarantees it), so writes, rotations and deletions are ordered among themselves.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass

from bookie.fileio import create_file, write_all
from bookie.format import (
    ENTRY_LOG_MAGIC,
    ENTRY_LOG_RECORD_HEAD_SIZE,
    FILE_HEADER_SIZE,
    encode_file_header,
    entry_log_file_name,
    entry_log_record_head,
    parse_file_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EntryLocation:
    log_id: int
    offset: int   # byte offset of the entry (after its record head) in the log
    size: int


@dataclass(slots=True)
class _ReadFile:
    """A log's cached read descriptor and how many reads hold it at this moment."""

    fd: int
    readers: int = 0
    # Dropped from the cache (log deleted, logger closed): the last reader closes fd.
    closing: bool = False


class EntryLogger:
    def __init__(self, directory: str, *, log_bytes_max: int, fsync_enabled: bool = True) -> None:
        self.directory = directory
        self.log_bytes_max = log_bytes_max
        self.fsync_enabled = fsync_enabled
        os.makedirs(directory, exist_ok=True)
        self._read_files: dict[int, _ReadFile] = {}
        # Logs being deleted right now: a read of one fails like a read of a deleted log
        # (the caller looks the index up again) rather than caching a doomed file.
        self._deleting: set[int] = set()
        self._read_files_lock = threading.Lock()
        self._active_id = -1
        self._active_fd = -1
        self._active_size = 0
        # Logs sealed by rotation since the last take_sealed: (log_id, final size).
        self._sealed: list[tuple[int, int]] = []
        # The logs on disk, kept current by this logger so that counting them (for
        # metrics, on the event loop) lists no directory.
        self._known_log_ids: set[int] = set(self.log_ids())

    # --- files ---------------------------------------------------------------------------

    def log_ids(self) -> list[int]:
        ids = []
        for name in os.listdir(self.directory):
            log_id = parse_file_id(name, "entrylog")
            if log_id is not None:
                ids.append(log_id)
        return sorted(ids)

    @property
    def log_count(self) -> int:
        """How many entry logs are on disk (no IO; safe from any thread)."""
        return len(self._known_log_ids)

    def path(self, log_id: int) -> str:
        return os.path.join(self.directory, entry_log_file_name(log_id))

    def file_size(self, log_id: int) -> int:
        try:
            return os.path.getsize(self.path(log_id))
        except FileNotFoundError:
            return 0

    @property
    def active_log_id(self) -> int:
        return self._active_id

    @property
    def active_size(self) -> int:
        return self._active_size

    def open_new_log(self) -> int:
        """Starts a new active log (at start-up and on rotation); flush thread only."""
        existing = self.log_ids()
        log_id = max(existing[-1] if existing else 0, self._active_id) + 1
        header = encode_file_header(ENTRY_LOG_MAGIC, log_id)
        # The new log exists before the old one is closed: if creating it fails (a full
        # disk), the old log is still the active one and still open, so the next batch
        # can write (or rotate) again instead of writing to a closed descriptor.
        fd = create_file(self.path(log_id), header, fsync=self.fsync_enabled)
        self._known_log_ids = set(existing) | {log_id}
        old_fd, old_id, old_size = self._active_fd, self._active_id, self._active_size
        self._active_id, self._active_fd, self._active_size = log_id, fd, len(header)
        if old_fd >= 0:
            self._sealed.append((old_id, old_size))
            os.close(old_fd)
        log.info("entry log opened: log_id=%d directory=%s", log_id, self.directory)
        return log_id

    # --- writes (flush thread) -------------------------------------------------------------

    def append_batch(self, entries: list[bytes]) -> list[EntryLocation]:
        """Appends entries and fdatasyncs; returns their locations in order. Rotates
        before a batch would push the active log past its size limit. If it raises,
        nothing it wrote is counted, and calling it again with the same entries is
        safe (the retry overwrites whatever the failed attempt left in the active log)."""
        assert self._active_fd >= 0, "open_new_log first"
        locations: list[EntryLocation] = []
        buffers: list[bytes] = []
        pending_size = 0
        for entry in entries:
            record_size = ENTRY_LOG_RECORD_HEAD_SIZE + len(entry)
            if self._active_size + pending_size + record_size > self.log_bytes_max and (
                    pending_size or self._active_size > FILE_HEADER_SIZE):
                self._write_buffers(buffers, pending_size)
                buffers, pending_size = [], 0
                self._sync_active()
                self.open_new_log()
            offset = self._active_size + pending_size + ENTRY_LOG_RECORD_HEAD_SIZE
            locations.append(EntryLocation(self._active_id, offset, len(entry)))
            buffers.append(entry_log_record_head(len(entry)))
            buffers.append(entry)
            pending_size += record_size
        self._write_buffers(buffers, pending_size)
        self._sync_active()
        return locations

    def _write_buffers(self, buffers: list[bytes], size: int) -> None:
        # At active_size, not at the descriptor's position: see the module docstring.
        written = write_all(self._active_fd, buffers, self._active_size)
        assert written == size, (written, size)
        self._active_size += size

    def _sync_active(self) -> None:
        if self.fsync_enabled:
            os.fdatasync(self._active_fd)

    def take_sealed(self) -> list[tuple[int, int]]:
        sealed, self._sealed = self._sealed, []
        return sealed

    def rotate(self) -> None:
        """Closes the active log (so it can be compacted) and opens a new one."""
        if self._active_size > FILE_HEADER_SIZE:
            self._sync_active()
            self.open_new_log()

    def delete_log(self, log_id: int) -> None:
        assert log_id != self._active_id, "the active log is never deleted"
        with self._read_files_lock:
            assert log_id not in self._deleting, log_id
            self._deleting.add(log_id)
            cached = self._read_files.pop(log_id, None)
            if cached is not None:
                cached.closing = True
            # A read holding the descriptor closes it when it is done (_release).
            close_now = cached is not None and cached.readers == 0
        try:
            if close_now:
                assert cached is not None
                os.close(cached.fd)
            try:
                os.unlink(self.path(log_id))
            except FileNotFoundError:
                pass
            self._known_log_ids.discard(log_id)
        finally:
            with self._read_files_lock:
                self._deleting.discard(log_id)

    # --- reads (any thread) ------------------------------------------------------------------

    def _acquire(self, log_id: int) -> _ReadFile:
        """The log's read descriptor, held until ``_release``; raises OSError if the log
        is gone or going."""
        with self._read_files_lock:
            if log_id in self._deleting:
                raise FileNotFoundError(errno.ENOENT, "entry log is being deleted", self.path(log_id))
            cached = self._read_files.get(log_id)
            if cached is None:
                cached = self._read_files[log_id] = _ReadFile(os.open(self.path(log_id), os.O_RDONLY))
            assert not cached.closing, log_id
            cached.readers += 1
            return cached

    def _release(self, cached: _ReadFile) -> None:
        with self._read_files_lock:
            assert cached.readers > 0, cached
            cached.readers -= 1
            close_now = cached.closing and cached.readers == 0
        if close_now:
            os.close(cached.fd)

    def _pread(self, log_id: int, size: int, offset: int) -> bytes:
        cached = self._acquire(log_id)
        try:
            return os.pread(cached.fd, size, offset)
        finally:
            self._release(cached)

    def read(self, location: EntryLocation) -> bytes:
        """Reads one entry; raises OSError if the log is gone (compacted meanwhile)."""
        data = self._pread(location.log_id, location.size, location.offset)
        if len(data) != location.size:
            raise OSError(f"short read from entry log {location.log_id}: "
                          f"{len(data)} of {location.size} bytes at {location.offset}")
        return data

    def read_span(self, log_id: int, offset: int, size: int) -> bytes:
        """Reads a contiguous byte span (several entries at once for range reads)."""
        data = self._pread(log_id, size, offset)
        if len(data) != size:
            raise OSError(f"short read from entry log {log_id}: {len(data)} of {size} bytes")
        return data

    def close(self) -> None:
        if self._active_fd >= 0:
            fd = self._active_fd
            try:
                self._sync_active()
            finally:
                self._active_fd = -1
                os.close(fd)
        with self._read_files_lock:
            cached_files = list(self._read_files.values())
            self._read_files.clear()
            idle = []
            for cached in cached_files:
                cached.closing = True
                if cached.readers == 0:
                    idle.append(cached.fd)
        for fd in idle:
            os.close(fd)
