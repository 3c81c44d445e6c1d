"""The bookie's shared file writes (bookie/fileio.py) and the small files written with
them (the checkpoint, cookies).

What it proves:
- write_all writes every buffer back to back at the given offset, across more than
  IOV_MAX buffers and through short writes, without moving to the descriptor's own
  position; a retry at the same offset after a failed attempt leaves exactly the
  retried bytes;
- create_file refuses an existing file, writes the header, fsyncs the file and its
  directory when asked (and only then), and closes its descriptor when it fails;
- replace_file, and the cookie writer that uses it, fsync the file and then the
  directory after the rename (a cookie's name must survive a crash as well as its bytes).

How: real temp files. The OS calls are wrapped at the edge (os.pwritev to shorten or
fail writes, os.fsync to record which descriptors were synced and whether they were
directories), so the tests see exactly what reached the kernel.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

from bookie import fileio
from bookie.registration import COOKIE_FILE, _read_local_cookie, _write_local_cookie
from metadata.bookie_record import Cookie


def _buffers(count: int) -> list[bytes]:
    return [bytes([i % 251]) * (1 + i % 7) for i in range(count)]


@pytest.mark.parametrize("count", [1, fileio.IOV_MAX - 1, fileio.IOV_MAX, fileio.IOV_MAX + 1, 3 * fileio.IOV_MAX + 5])
def test_write_all_writes_every_buffer_at_the_offset(tmp_path, count):
    """Buffers land back to back from the offset, whatever their count; the bytes
    before the offset are untouched and the return value is the total size."""
    path = tmp_path / "f"
    path.write_bytes(b"H" * 10)
    buffers = _buffers(count)
    fd = os.open(path, os.O_WRONLY)
    try:
        written = fileio.write_all(fd, buffers, 10)
    finally:
        os.close(fd)
    assert written == sum(len(b) for b in buffers)
    assert path.read_bytes() == b"H" * 10 + b"".join(buffers)


def test_write_all_finishes_short_writes(tmp_path, monkeypatch):
    """A pwritev that writes only part of its chunk (a signal, a nearly full disk) is
    finished at the right offsets."""
    real_pwritev = os.pwritev

    def short_pwritev(fd, buffers, offset, flags=0):
        total = sum(len(b) for b in buffers)
        head = b"".join(buffers)[:max(1, total // 3)]
        return real_pwritev(fd, [head], offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    buffers = _buffers(2 * fileio.IOV_MAX + 3)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        fileio.write_all(fd, buffers, 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(buffers)


def test_a_retry_at_the_same_offset_overwrites_a_partial_write(tmp_path, monkeypatch):
    """The first attempt writes its first chunk, then ENOSPC; the retry at the same
    offset (with other, shorter content) leaves the retried bytes at the offset: no
    byte of the failed attempt shifts them. Writing at the descriptor's position (the
    old code) would put the retry after the stray chunk."""
    real_pwritev = os.pwritev
    calls = []

    def failing_second_call(fd, buffers, offset, flags=0):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", failing_second_call)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            fileio.write_all(fd, [b"x"] * (fileio.IOV_MAX + 1), 4)
        retry = [b"y"] * 3
        fileio.write_all(fd, retry, 4)
    finally:
        os.close(fd)
    assert path.read_bytes()[4:7] == b"yyy"


@pytest.fixture
def fsync_log(monkeypatch):
    """Records ('dir' or 'file', path-ish) for every os.fsync, then really fsyncs."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


@pytest.mark.parametrize("fsync", [True, False])
def test_create_file_writes_the_header_and_syncs_file_then_directory(tmp_path, fsync_log, fsync):
    """The new file holds the header and is open for writing after it; with fsync the
    file and then its directory are fsynced, without fsync neither."""
    path = str(tmp_path / "new")
    fd = fileio.create_file(path, b"HEADER", fsync=fsync)
    try:
        fileio.write_all(fd, [b"body"], 6)
    finally:
        os.close(fd)
    assert open(path, "rb").read() == b"HEADERbody"
    assert fsync_log == (["file", "dir"] if fsync else [])


def test_create_file_refuses_an_existing_file(tmp_path):
    """O_EXCL: a file that already exists is never reused (nor truncated)."""
    path = tmp_path / "old"
    path.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        fileio.create_file(str(path), b"HEADER", fsync=False)
    assert path.read_bytes() == b"keep"


def test_create_file_closes_its_descriptor_when_it_fails(tmp_path, monkeypatch):
    """A failure after the open (ENOSPC on the header) closes the descriptor."""
    opened: list[int] = []
    closed: list[int] = []
    real_open, real_close = os.open, os.close

    def recording_open(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        opened.append(fd)
        return fd

    def recording_close(fd):
        closed.append(fd)
        real_close(fd)

    def failing_pwritev(fd, buffers, offset, flags=0):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "close", recording_close)
    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    with pytest.raises(OSError):
        fileio.create_file(str(tmp_path / "new"), b"HEADER", fsync=True)
    assert opened and closed == opened


def test_replace_file_syncs_the_file_then_the_directory(tmp_path, fsync_log):
    """The new contents replace the old ones, and no temporary file is left behind."""
    path = tmp_path / "checkpoint"
    path.write_bytes(b"old")
    fileio.replace_file(str(path), b"new contents")
    assert path.read_bytes() == b"new contents"
    assert os.listdir(tmp_path) == ["checkpoint"]
    assert fsync_log == ["file", "dir"]


def test_a_cookie_is_written_durably_with_its_directory(tmp_path, fsync_log):
    """The cookie file is fsynced and so is the directory holding its (renamed) name;
    before bookie/fileio.py the cookie writer did not fsync the directory."""
    cookie = Cookie("bookie-1", "instance-1", str(tmp_path), [str(tmp_path / "ledgers")])
    _write_local_cookie(str(tmp_path), cookie)
    assert _read_local_cookie(str(tmp_path)) == cookie
    assert sorted(os.listdir(tmp_path)) == [COOKIE_FILE]
    assert fsync_log == ["file", "dir"]
