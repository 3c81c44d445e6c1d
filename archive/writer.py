"""Writing archive files: the entries of a ledger slice built into record batches
(``SliceBuilder``, pure), then written safely (``write_temp`` and ``publish``, blocking:
run them in a worker thread).

Theory of operation. The archiver reads a closed ledger's entries in order and feeds
them to a SliceBuilder, which packs whole entries into record batches of at most
``batch_rows_max`` rows (or ``batch_bytes_max`` bytes; a batch may exceed either by
one entry, because an entry is never split) and reports ``full`` once the slice holds
``file_bytes_max`` bytes. A ledger is archived as one file or, when large, several
slices of consecutive entries. The batches of a slice are built in memory (bounded by
``file_bytes_max`` plus a batch), so the footer metadata, which Arrow writes when the
file is opened, already knows every batch's checksum and statistics.

Writing a slice is the sequence whose crash points the tests exercise:

    write_temp   temporary name, all bytes written, fsync       (crash: a temp file;
                                                                 GC removes it)
    publish      rename to the final name, fsync the directory  (crash: an orphan
                                                                 file no manifest names;
                                                                 GC removes it)
    verify       read back, every batch checksum (reader.py)
    manifest     compare-and-swap of the ledger's manifest record (archive/manifest.py,
                 by the archiver): only now does the file count

A final name carries a token unique to the attempt (format.file_name), so no write ever
replaces a file a manifest names, whoever else archives the same ledger at the same
time. The whole-file CRC32C and size computed while writing go to the manifest, so
``verify`` can check every byte later.
"""

from __future__ import annotations

import posixpath
import secrets
from dataclasses import dataclass, field
from typing import Callable

import crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from archive.format import (
    COMPRESSIONS,
    FILE_BATCHES_MAX,
    SCHEMA,
    BatchMetadata,
    FileMetadata,
    encode_footer,
    file_name,
    temp_name,
)
from archive.location import ArchiveLocation
from archive.rows import BatchBuilder
from common.errors import ConfigError
from common.version import __version__

MIB = 1024 * 1024


@dataclass(frozen=True)
class WriterConfig:
    # Rows per record batch (the namespace policy's archiveBatchRows). 8,192 rows of
    # 1 KiB messages is 8 MiB: a batch a reader decodes at once and Spark hands over.
    batch_rows_max: int = 8192
    # Bytes per record batch, whatever the row count (large messages).
    batch_bytes_max: int = 16 * MIB
    # Bytes per file (a ledger slice); the writer holds one slice in memory.
    file_bytes_max: int = 128 * MIB
    compression: str = "none"

    def __post_init__(self) -> None:
        if not 1 <= self.batch_rows_max <= 1 << 20:
            raise ConfigError("batch_rows_max must be in [1, 1048576]")
        if not 64 * 1024 <= self.batch_bytes_max <= 256 * MIB:
            raise ConfigError("batch_bytes_max must be in [64 KiB, 256 MiB]")
        if not self.batch_bytes_max <= self.file_bytes_max <= 4096 * MIB:
            raise ConfigError("file_bytes_max must be in [batch_bytes_max, 4 GiB]")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"compression must be one of {', '.join(COMPRESSIONS)}")
        # A slice must fit the format's bound on batches per file.
        if self.file_bytes_max // self.batch_bytes_max + 1 > FILE_BATCHES_MAX:
            raise ConfigError("file_bytes_max / batch_bytes_max exceeds the batches a file may hold")


class SliceBuilder:
    """The record batches of one file: consecutive whole entries of one ledger."""

    def __init__(self, config: WriterConfig, topic: str, partition: int, ledger_id: int) -> None:
        self.config = config
        self.topic = topic
        self.partition = partition
        self.ledger_id = ledger_id
        self.batches: list[pa.RecordBatch] = []
        self.batch_metadata: list[BatchMetadata] = []
        self._builder = BatchBuilder(topic, partition, ledger_id)
        self.size_bytes = 0
        self.payload_bytes = 0
        self.first_entry_id = -1
        self.last_entry_id = -1

    @property
    def empty(self) -> bool:
        return self.first_entry_id < 0

    @property
    def full(self) -> bool:
        return self.size_bytes >= self.config.file_bytes_max or \
            len(self.batches) + 1 >= FILE_BATCHES_MAX

    def add_entry(self, entry_id: int, stored: bytes | memoryview) -> None:
        assert not self.full
        builder = self._builder
        before_payload = builder.payload_bytes
        builder.add_entry(entry_id, stored)
        self.size_bytes += len(stored)
        self.payload_bytes += builder.payload_bytes - before_payload
        if self.first_entry_id < 0:
            self.first_entry_id = entry_id
        self.last_entry_id = entry_id
        if builder.row_count >= self.config.batch_rows_max or builder.size_bytes >= self.config.batch_bytes_max:
            self._finish_batch()

    def _finish_batch(self) -> None:
        if self._builder.row_count == 0:
            return
        batch, metadata = self._builder.finish()
        self.batches.append(batch)
        self.batch_metadata.append(metadata)
        self._builder = BatchBuilder(self.topic, self.partition, self.ledger_id)

    def finish(self) -> tuple[list[pa.RecordBatch], FileMetadata]:
        self._finish_batch()
        assert self.batches, "an empty slice is never written"
        metadata = FileMetadata(
            topic=self.topic, partition=self.partition, ledger_id=self.ledger_id,
            first_entry_id=self.first_entry_id, last_entry_id=self.last_entry_id,
            row_count=sum(b.num_rows for b in self.batches), payload_bytes=self.payload_bytes,
            publish_time_ms_min=min(b.publish_time_ms_min for b in self.batch_metadata),
            publish_time_ms_max=max(b.publish_time_ms_max for b in self.batch_metadata),
            compression=self.config.compression, batches=tuple(self.batch_metadata),
            writer_version=__version__)
        metadata.check()
        return self.batches, metadata


@dataclass(frozen=True)
class WrittenFile:
    """A file written under its temporary name, ready to publish."""

    url: str                     # the final name's URL (what the manifest records)
    path: str                    # the final path on the location's filesystem
    temp_path: str
    size_bytes: int
    crc32c: int                  # of the whole file
    metadata: FileMetadata = field(repr=False)


class _HashingSink:
    """A file object that checksums and counts what passes through it."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self.crc32c = 0
        self.size_bytes = 0
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data)
        self._handle.write(view)
        self.crc32c = crc32c.crc32c(view, self.crc32c)
        self.size_bytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self.closed = True      # the location closes the real file


def new_token() -> str:
    return secrets.token_hex(8)


def write_temp(location: ArchiveLocation, topic_path: str, batches: list[pa.RecordBatch],
               metadata: FileMetadata, *, token: str | None = None) -> WrittenFile:
    """Writes a slice under a temporary name in the topic's directory, durably."""
    assert len(batches) == len(metadata.batches), (len(batches), len(metadata.batches))
    directory = location.topic_directory(topic_path)
    name = file_name(metadata.ledger_id, metadata.first_entry_id, token or new_token())
    footer = encode_footer(metadata)
    options = ipc.IpcWriteOptions(compression=COMPRESSIONS[metadata.compression])
    sinks: list[_HashingSink] = []

    def write(handle) -> None:
        sink = _HashingSink(handle)
        sinks.append(sink)
        with ipc.new_file(pa.PythonFile(sink, mode="w"), SCHEMA, options=options, metadata=footer) as writer:
            for batch in batches:
                writer.write_batch(batch)

    temp_path = location.write_temp(directory, temp_name(name), write)
    sink = sinks[0]
    path = posixpath.join(directory, name)
    return WrittenFile(location.url_of(path), path, temp_path, sink.size_bytes, sink.crc32c, metadata)


def publish(location: ArchiveLocation, written: WrittenFile, *, between: Callable[[], None] | None = None) -> None:
    """Renames the temporary file to its final name, durably (``between``: see
    ``ArchiveLocation.publish``)."""
    location.publish(written.temp_path, written.path, between=between)
