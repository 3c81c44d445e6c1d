"""Reading archive files, verified: the footer metadata first (for pruning), then record
batches, each checked against its checksum before it is returned. Blocking file IO:
run it in a worker thread when called from an event loop.

What is checked, and when:
- on open: Arrow's footer is there (a truncated file has none), its custom metadata is
  ours (magic, version, its own CRC32C, consistent batch ranges), the schema is the
  archive schema, the batch count matches, and, when the caller knows it from the
  manifest, the file size;
- on every batch read: Arrow decodes it, its row count, first and last entry id match
  the footer, and the CRC32C of its canonical serialization matches the footer's
  (archive/format.py);
- ``verify_file``: all of the above for every batch, plus the whole-file CRC32C and size
  the manifest recorded when the file was written.

Every failure is ArchiveCorrupt naming the file (and the batch, when one is at fault):
never data. A file that is not there is ArchiveNotFound; storage failing is
ArchiveUnavailable.

This is the reader the brokers use to serve archived ledgers and the Spark data source
uses for analytics (issue 11): ``ArchiveFile.metadata`` prunes files and batches by
publish time, ledger/entry range and key (``BatchMetadata.overlaps_time``,
``overlaps_entries``, ``may_contain_key``); ``iter_batches`` yields verified
``pyarrow.RecordBatch`` objects of the documented schema.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from archive.format import COLUMN_INDEX, FileMetadata, batch_checksum, check_schema, decode_footer
from archive.location import file_size, filesystem, open_input
from common.errors import ArchiveCorrupt, ArchiveError, ArchiveNotFound, ArchiveUnavailable

# Whole-file checksums are computed over reads of this size.
VERIFY_READ_BYTES = 4 * 1024 * 1024


class ArchiveFile:
    """One open archive file. Use as a context manager, or call ``close``."""

    def __init__(self, url: str, source, reader: ipc.RecordBatchFileReader, metadata: FileMetadata) -> None:
        self.url = url
        self._source = source
        self._reader = reader
        self.metadata = metadata
        self.batches_read = 0
        self.closed = False

    @classmethod
    def open(cls, url: str, *, size_bytes: int | None = None) -> "ArchiveFile":
        """Opens and checks a file's footer. ``size_bytes`` (from the manifest), when
        given, must match the file's size: a truncation is found before any read."""
        if size_bytes is not None:
            actual = file_size(url)
            if actual != size_bytes:
                raise ArchiveCorrupt(url, f"file is {actual} bytes, the manifest recorded {size_bytes} "
                                          "(truncated or replaced)")
        source = open_input(url)
        try:
            try:
                reader = ipc.open_file(source)
                custom = reader.metadata
                schema = reader.schema
                batch_count = reader.num_record_batches
            except (pa.ArrowException, ValueError) as error:
                raise ArchiveCorrupt(url, f"not a readable Arrow IPC file: {error}") from None
            except OSError as error:
                raise ArchiveUnavailable(f"archive IO failed: url={url} error={error}") from None
            metadata = decode_footer(url, custom)
            check_schema(url, schema)
            if batch_count != len(metadata.batches):
                raise ArchiveCorrupt(url, f"file has {batch_count} record batches, its metadata lists "
                                          f"{len(metadata.batches)}")
        except BaseException:
            source.close()
            raise
        return cls(url, source, reader, metadata)

    def __enter__(self) -> "ArchiveFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True
        self._source.close()

    @property
    def batch_count(self) -> int:
        return len(self.metadata.batches)

    def read_batch(self, index: int) -> pa.RecordBatch:
        """Record batch ``index``, verified against the footer."""
        expected = self.metadata.batches[index]
        try:
            batch = self._reader.get_batch(index)
        except (pa.ArrowException, ValueError) as error:
            raise ArchiveCorrupt(self.url, f"does not decode: {error}", index) from None
        except OSError as error:
            raise ArchiveUnavailable(f"archive IO failed: url={self.url} error={error}") from None
        if batch.num_rows != expected.row_count:
            raise ArchiveCorrupt(self.url, f"has {batch.num_rows} rows, the footer says {expected.row_count}", index)
        try:
            computed = batch_checksum(batch)
        except (pa.ArrowException, ValueError) as error:
            raise ArchiveCorrupt(self.url, f"does not serialize: {error}", index) from None
        if computed != expected.crc32c:
            raise ArchiveCorrupt(self.url, f"CRC32C {computed:#010x} does not match the footer's "
                                           f"{expected.crc32c:#010x}", index)
        entry_ids = batch.column(COLUMN_INDEX["entry_id"])
        first, last = entry_ids[0].as_py(), entry_ids[len(entry_ids) - 1].as_py()
        if (first, last) != (expected.first_entry_id, expected.last_entry_id):
            raise ArchiveCorrupt(self.url, f"holds entries {first}..{last}, the footer says "
                                           f"{expected.first_entry_id}..{expected.last_entry_id}", index)
        self.batches_read += 1
        return batch

    def iter_batches(self, indexes: Iterable[int] | None = None) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(index, verified batch) for ``indexes`` (default: every batch, in order)."""
        for index in (range(self.batch_count) if indexes is None else indexes):
            yield index, self.read_batch(index)


def read_metadata(url: str, *, size_bytes: int | None = None) -> FileMetadata:
    """A file's footer metadata alone (for planning and pruning)."""
    with ArchiveFile.open(url, size_bytes=size_bytes) as archive_file:
        return archive_file.metadata


def whole_file_checksum(url: str) -> tuple[int, int]:
    """(size in bytes, CRC32C) of a file's bytes."""
    fs, path = filesystem(url)
    checksum = 0
    size = 0
    try:
        with fs.open(path, "rb") as handle:
            while chunk := handle.read(VERIFY_READ_BYTES):
                checksum = crc32c.crc32c(chunk, checksum)
                size += len(chunk)
    except FileNotFoundError:
        raise ArchiveNotFound(f"archive file not found: {url}") from None
    except OSError as error:
        raise ArchiveUnavailable(f"archive IO failed: url={url} error={error}") from None
    return size, checksum


def verify_file(url: str, *, size_bytes: int | None = None, crc32c_expected: int | None = None) -> FileMetadata:
    """Checks a whole file: size and CRC32C against the manifest's (when given), the
    footer, and every record batch. Returns the footer metadata; raises ArchiveError."""
    if size_bytes is not None or crc32c_expected is not None:
        size, checksum = whole_file_checksum(url)
        if size_bytes is not None and size != size_bytes:
            raise ArchiveCorrupt(url, f"file is {size} bytes, the manifest recorded {size_bytes}")
        if crc32c_expected is not None and checksum != crc32c_expected:
            raise ArchiveCorrupt(url, f"file CRC32C {checksum:#010x} does not match the manifest's "
                                      f"{crc32c_expected:#010x}")
    with ArchiveFile.open(url, size_bytes=size_bytes) as archive_file:
        for _index, _batch in archive_file.iter_batches():
            pass
        return archive_file.metadata


__all__ = ["ArchiveError", "ArchiveFile", "read_metadata", "verify_file", "whole_file_checksum"]
