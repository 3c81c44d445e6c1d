"""File writes shared by the bookie's stores (journal, entry logs, checkpoint, cookies).

Theory of operation:
- ``write_all`` writes a list of buffers at an explicit byte offset with ``pwritev``,
  never at the descriptor's own position. A write that fails half-way (ENOSPC on the
  second of two vectored chunks, say) leaves bytes on disk past what the caller
  counted; a caller that retries at the same offset overwrites them, so its recorded
  offsets stay the file's real offsets. A write at the descriptor's position would
  instead land after the stray bytes, and every later offset would be wrong.
- ``create_file`` makes a new file (never an existing one) with its header and, when
  asked, fsyncs it and its directory, so that the file and its name survive a crash.
- ``replace_file`` swaps a small file's contents atomically: a temporary file is
  written and fsynced, renamed over the target, and the directory is fsynced, so a
  crash leaves either the old contents or the new ones, never a torn mix.

Every function here blocks; callers run them on an IO thread or before serving.
"""

from __future__ import annotations

import os
from typing import Sequence

# Linux's IOV_MAX: a single pwritev takes at most this many buffers.
IOV_MAX = 1024


def write_all(fd: int, buffers: Sequence[bytes], offset: int) -> int:
    """Writes ``buffers`` back to back starting at byte ``offset`` of ``fd`` and returns
    the bytes written (their total size). Finishes short writes; raises OSError on any
    failure, after which the bytes from ``offset`` on are unspecified."""
    assert offset >= 0, offset
    written_total = 0
    for start in range(0, len(buffers), IOV_MAX):
        chunk = buffers[start:start + IOV_MAX]
        chunk_size = sum(len(buffer) for buffer in chunk)
        position = offset + written_total
        written = os.pwritev(fd, chunk, position)
        if written != chunk_size:
            # A short write (rare: a signal, a nearly full disk): finish it byte-wise.
            _finish_short_write(fd, chunk, written, position + written)
        written_total += chunk_size
    assert written_total == sum(len(buffer) for buffer in buffers), written_total
    return written_total


def _finish_short_write(fd: int, chunk: Sequence[bytes], written: int, position: int) -> None:
    remaining = memoryview(b"".join(chunk))[written:]
    while remaining:
        count = os.pwrite(fd, remaining, position)
        if count <= 0:
            raise OSError(f"write made no progress at offset {position}")
        remaining = remaining[count:]
        position += count


def fsync_directory(path: str) -> None:
    """Makes the names in ``path`` (a created, renamed or removed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_file(path: str, header: bytes, *, fsync: bool) -> int:
    """Creates ``path`` (which must not exist) holding ``header`` and returns a
    descriptor open for writing. With ``fsync`` the file and its directory entry are
    durable on return. On failure the descriptor is closed; the file may remain, with
    at most its header, which readers of both journal and entry logs skip."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, [header], 0)
        if fsync:
            os.fsync(fd)
            fsync_directory(os.path.dirname(path) or ".")
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_file(path: str, data: bytes) -> None:
    """Atomically replaces the contents of ``path`` with ``data``, durably (file and
    directory fsynced): after a crash the file holds the old data or the new."""
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, [data], 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_directory(os.path.dirname(path) or ".")
