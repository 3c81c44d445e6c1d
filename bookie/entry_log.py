"""Entry logs: the interleaved data files of one ledger directory.

Theory of operation:
- All ledgers share one active entry log (like BookKeeper's entry logger); a flush
  appends a sorted batch of entries with vectored writes and one fdatasync, and returns
  each entry's (log_id, offset, size) for the index.
- The active log rotates at ``entry_log_bytes_max``. A process always starts a new
  active log, so a log written partly before a crash is never appended to; its
  unindexed tail is dead space that compaction reclaims.
- Reads are ``pread`` on a cached descriptor per log and are safe from any thread.
- Every method that writes runs on the directory's single flush thread (the caller
  guarantees it), so writes, rotations and deletions are ordered among themselves.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

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

_IOV_MAX = 1024


@dataclass(frozen=True, slots=True)
class EntryLocation:
    log_id: int
    offset: int   # byte offset of the entry (after its record head) in the log
    size: int


class EntryLogger:
    def __init__(self, directory: str, *, log_bytes_max: int, fsync_enabled: bool = True) -> None:
        self.directory = directory
        self.log_bytes_max = log_bytes_max
        self.fsync_enabled = fsync_enabled
        os.makedirs(directory, exist_ok=True)
        self._read_fds: dict[int, int] = {}
        self._read_fds_lock = threading.Lock()
        self._active_id = -1
        self._active_fd = -1
        self._active_size = 0
        # Logs sealed by rotation since the last take_sealed: (log_id, final size).
        self._sealed: list[tuple[int, int]] = []

    # --- files ---------------------------------------------------------------------------

    def log_ids(self) -> list[int]:
        ids = []
        for name in os.listdir(self.directory):
            log_id = parse_file_id(name, "entrylog")
            if log_id is not None:
                ids.append(log_id)
        return sorted(ids)

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
        if self._active_fd >= 0:
            os.close(self._active_fd)
            self._sealed.append((self._active_id, self._active_size))
        fd = os.open(self.path(log_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        header = encode_file_header(ENTRY_LOG_MAGIC, log_id)
        os.write(fd, header)
        if self.fsync_enabled:
            os.fsync(fd)
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._active_id = log_id
        self._active_fd = fd
        self._active_size = len(header)
        log.info("entry log opened: log_id=%d directory=%s", log_id, self.directory)
        return log_id

    # --- writes (flush thread) -------------------------------------------------------------

    def append_batch(self, entries: list[bytes]) -> list[EntryLocation]:
        """Appends entries and fdatasyncs; returns their locations in order. Rotates
        before a batch would push the active log past its size limit."""
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
        written_total = 0
        for start in range(0, len(buffers), _IOV_MAX):
            chunk = buffers[start:start + _IOV_MAX]
            chunk_size = sum(len(b) for b in chunk)
            written = os.writev(self._active_fd, chunk)
            if written != chunk_size:
                remaining = memoryview(b"".join(chunk))[written:]
                while remaining:
                    count = os.write(self._active_fd, remaining)
                    if count <= 0:
                        raise OSError("entry log write made no progress")
                    remaining = remaining[count:]
            written_total += chunk_size
        assert written_total == size, (written_total, size)
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
        with self._read_fds_lock:
            fd = self._read_fds.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(self.path(log_id))
        except FileNotFoundError:
            pass

    # --- reads (any thread) ------------------------------------------------------------------

    def _read_fd(self, log_id: int) -> int:
        with self._read_fds_lock:
            fd = self._read_fds.get(log_id)
            if fd is None:
                fd = os.open(self.path(log_id), os.O_RDONLY)
                self._read_fds[log_id] = fd
            return fd

    def read(self, location: EntryLocation) -> bytes:
        """Reads one entry; raises OSError if the log is gone (compacted meanwhile)."""
        fd = self._read_fd(location.log_id)
        data = os.pread(fd, location.size, location.offset)
        if len(data) != location.size:
            raise OSError(f"short read from entry log {location.log_id}: "
                          f"{len(data)} of {location.size} bytes at {location.offset}")
        return data

    def read_span(self, log_id: int, offset: int, size: int) -> bytes:
        """Reads a contiguous byte span (several entries at once for range reads)."""
        fd = self._read_fd(log_id)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"short read from entry log {log_id}: {len(data)} of {size} bytes")
        return data

    def close(self) -> None:
        if self._active_fd >= 0:
            self._sync_active()
            os.close(self._active_fd)
            self._active_fd = -1
        with self._read_fds_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
