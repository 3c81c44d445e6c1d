"""Where archive files live: an fsspec location URL, and the few file operations the
writer, reader and garbage collector need on it. Shell (blocking file IO): call it from
a worker thread, never from an event loop.

A location is a URL: a local directory (``/var/magnetar/archive`` or
``file:///var/magnetar/archive``; the default, ``data/standalone/archive`` in
standalone), an object store (``s3://bucket/prefix``, ``gs://…``: the user installs the
fsspec plugin, s3fs or gcsfs), or fsspec's in-memory filesystem (``memory://…``, for
tests). A topic's files go under ``<location>/<tenant>/<namespace>/<encoded topic>/``.

Durability: on a local filesystem a file is written under a temporary name, fsync'ed,
renamed to its final name, and the directory is fsync'ed, so after a crash the final
name is either absent or names the complete file (POSIX rename is atomic). Other
filesystems have no fsync; a rename there is the store's own (an object store's copy
then delete, which publishes the whole object at once).

An object store's endpoint (an S3-compatible store other than AWS: SeaweedFS, MinIO,
Ceph) is ``MAGNETAR_ARCHIVE_ENDPOINT_URL`` in the environment, or ``use_endpoint`` (the
broker's ``--archive-endpoint-url``, the Spark source's ``archiveEndpointUrl``); its
credentials are never options or flags: botocore's own chain finds them
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_SHARED_CREDENTIALS_FILE``, an
instance role), so they appear in no command line, plan or log.

Errors: a missing file is ArchiveNotFound, any other IO failure ArchiveUnavailable
(retriable); the message names the URL.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    import fsspec

from common.errors import ArchiveNotFound, ArchiveUnavailable, ConfigError

# Local writes go through a buffer of this size: pyarrow writes a record batch as many
# small buffers (one per column buffer, plus padding), which unbuffered would be as many
# system calls.
WRITE_BUFFER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class FileInfo:
    name: str
    url: str
    size_bytes: int
    modified_s: float       # seconds since the epoch (0: the store does not say)


ENDPOINT_ENV = "MAGNETAR_ARCHIVE_ENDPOINT_URL"
# Protocols that take an S3 endpoint (s3fs registers both).
_S3_PROTOCOLS = ("s3://", "s3a://")
_endpoint_url = [""]


def use_endpoint(endpoint_url: str) -> None:
    """Sets this process's S3 endpoint ("": the environment's, else AWS's own)."""
    if endpoint_url and not endpoint_url.startswith(("http://", "https://")):
        raise ConfigError(f"archive endpoint URL must be http:// or https://: {endpoint_url!r}")
    _endpoint_url[0] = endpoint_url


def endpoint_url() -> str:
    return _endpoint_url[0] or os.environ.get(ENDPOINT_ENV, "")


def _storage_options(url: str) -> dict:
    if not url.startswith(_S3_PROTOCOLS):
        return {}
    # No listing cache: the garbage collector and the tools must see what is there now,
    # not what this process listed before.
    options: dict = {"use_listings_cache": False}
    if endpoint_url():
        options["endpoint_url"] = endpoint_url()
    return options


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of a URL (fsspec caches filesystem instances). fsspec is
    imported here, on first use: a tenth of a CPU-second that every broker start paid,
    archive or not."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **_storage_options(url))
    except (ValueError, ImportError) as error:
        hint = " (an s3:// location needs the s3 extra: pip install 'magnetar[s3]')" \
            if url.startswith(_S3_PROTOCOLS) and isinstance(error, ImportError) else ""
        raise ConfigError(f"archive location {url!r} is not usable: {error}{hint}") from None


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


@contextlib.contextmanager
def _io(url: str) -> Iterator[None]:
    """Maps IO errors to the catalogue's, naming the URL."""
    try:
        yield
    except FileNotFoundError:
        raise ArchiveNotFound(f"archive file not found: {url}") from None
    except OSError as error:
        raise ArchiveUnavailable(f"archive IO failed: url={url} error={error}") from None


class ArchiveLocation:
    """One archive location (the policy's or the broker's URL)."""

    def __init__(self, url: str) -> None:
        if not url:
            raise ConfigError("an archive location URL is required")
        self.fs, self.root = filesystem(url)
        self.local = is_local(self.fs)
        # Normalised: what the manifest records is the full URL of every file.
        self.url = self.url_of(self.root)

    def url_of(self, path: str) -> str:
        if self.local:
            return f"file://{path}"
        return self.fs.unstrip_protocol(path)

    def topic_directory(self, topic_path: str) -> str:
        """``topic_path`` is tenant/namespace/encoded-local-name (a partition's own)."""
        assert topic_path and not topic_path.startswith("/") and ".." not in topic_path.split("/"), topic_path
        return posixpath.join(self.root, topic_path)

    # --- writing --------------------------------------------------------------------------

    def write_temp(self, directory: str, temp_name: str, write: Callable[[object], None]) -> str:
        """Creates ``directory/temp_name`` (it must not exist), lets ``write`` fill it
        through a binary file object, and makes it durable (fsync on a local disk).
        Returns its path. A failure removes the partial file."""
        path = posixpath.join(directory, temp_name)
        with _io(self.url_of(path)):
            if self.local:
                _makedirs_durable(directory)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    with os.fdopen(fd, "wb", buffering=WRITE_BUFFER_BYTES) as handle:
                        write(handle)
                        handle.flush()
                        os.fsync(handle.fileno())
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    raise
            else:
                self.fs.makedirs(directory, exist_ok=True)
                try:
                    with self.fs.open(path, "wb") as handle:
                        write(handle)
                except BaseException:
                    with contextlib.suppress(OSError):
                        self.fs.rm(path)
                    raise
        return path

    def publish(self, temp_path: str, final_path: str, *, between: Callable[[], None] | None = None) -> None:
        """Renames a written temporary file to its final name, durably. On an object
        store the rename is a server-side copy (the final object appears whole, at once)
        then the temporary object's delete; ``between`` (tests' crash point) runs between
        the two."""
        assert posixpath.dirname(temp_path) == posixpath.dirname(final_path), (temp_path, final_path)
        with _io(self.url_of(final_path)):
            if self.local:
                if os.path.exists(final_path):
                    # Names are unique per write attempt; an existing one is a bug.
                    raise FileExistsError(errno.EEXIST, "archive file exists", final_path)
                os.rename(temp_path, final_path)
                _fsync_directory(posixpath.dirname(final_path))
            else:
                self.fs.copy(temp_path, final_path)
                if between is not None:
                    between()
                self.fs.rm(temp_path)

    # --- listing and deleting ---------------------------------------------------------------

    def list_directory(self, directory: str) -> list[FileInfo]:
        """The files of a directory (none if it does not exist)."""
        with _io(self.url_of(directory)):
            if self.local:
                if not os.path.isdir(directory):
                    return []
                found = []
                for entry in os.scandir(directory):
                    if entry.is_file():
                        with contextlib.suppress(FileNotFoundError):
                            stat = entry.stat()
                            found.append(FileInfo(entry.name, self.url_of(entry.path), stat.st_size, stat.st_mtime))
                return sorted(found, key=lambda info: info.name)
            try:
                listed = self.fs.ls(directory, detail=True, refresh=True)
            except FileNotFoundError:
                return []
            found = []
            for info in listed:
                if info.get("type") != "file":
                    continue
                path = info["name"]
                modified = info.get("mtime") or info.get("created") or info.get("LastModified") or 0
                if hasattr(modified, "timestamp"):
                    modified = modified.timestamp()
                found.append(FileInfo(posixpath.basename(path), self.url_of(path), int(info.get("size") or 0),
                                      float(modified)))
            return sorted(found, key=lambda info: info.name)


def delete_file(url: str) -> bool:
    """Deletes a file; False if it was not there."""
    fs, path = filesystem(url)
    with _io(url):
        try:
            fs.rm(path)
        except FileNotFoundError:
            return False
    return True


def file_size(url: str) -> int:
    fs, path = filesystem(url)
    with _io(url):
        return int(fs.size(path))


def open_input(url: str):
    """A pyarrow-readable source for a file: memory-mapped when local (reads are then
    zero-copy), else the filesystem's file object."""
    import pyarrow as pa

    fs, path = filesystem(url)
    with _io(url):
        if is_local(fs):
            return pa.memory_map(path, "r")
        return pa.PythonFile(fs.open(path, "rb"), mode="r")


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_durable(directory: str) -> None:
    """Creates ``directory`` and its missing parents, fsync'ing each parent whose
    listing changed, so the directory survives a crash with the file in it."""
    missing = []
    current = directory
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        _fsync_directory(os.path.dirname(path))
