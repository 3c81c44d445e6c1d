"""Archive files written and read back (archive/writer.py, archive/reader.py,
archive/location.py), on the local filesystem and on fsspec's in-memory filesystem.

Proves: a slice written temp → rename reads back verified, with the documented schema,
through our reader and through plain ``pyarrow.ipc``; a temporary file is hidden until
the rename and a final name is never reused; a flipped byte anywhere in a record batch
is reported as ArchiveCorrupt naming the file and that batch (never data); a truncated
file is reported naming the file (by the manifest's size before any read, and by the
missing footer without it); verify_file checks the whole-file CRC32C; a missing file
is ArchiveNotFound.
"""

from __future__ import annotations

import os
import uuid

import fsspec
import pyarrow.ipc as ipc
import pytest

from archive.format import SCHEMA
from archive.location import ArchiveLocation, delete_file
from archive.reader import ArchiveFile, read_metadata, verify_file
from archive.entries import entries_of_batch
from archive.writer import SliceBuilder, WriterConfig, publish, write_temp
from common.errors import ArchiveCorrupt, ArchiveNotFound, ConfigError
from tests.unit import archive_entries

TOPIC = "persistent://public/default/orders"
TOPIC_PATH = "persistent/public/default/orders"


@pytest.fixture(params=["local", "memory"])
def location(request, tmp_path) -> ArchiveLocation:
    if request.param == "local":
        yield ArchiveLocation(str(tmp_path / "archive"))
        return
    url = f"memory://archive-{uuid.uuid4().hex[:8]}"
    yield ArchiveLocation(url)
    memory = fsspec.filesystem("memory")
    if memory.exists(url.removeprefix("memory://")):
        memory.rm(url.removeprefix("memory://"), recursive=True)


def write_slice(location: ArchiveLocation, entries: list[bytes], *, compression: str = "none",
                batch_rows_max: int = 16):
    builder = SliceBuilder(WriterConfig(batch_rows_max=batch_rows_max, compression=compression), TOPIC, -1, 11)
    for entry_id, stored in enumerate(entries):
        builder.add_entry(entry_id, stored)
    batches, metadata = builder.finish()
    written = write_temp(location, TOPIC_PATH, batches, metadata)
    return written


def read_bytes(url: str) -> bytes:
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as handle:
        return handle.read()


def write_bytes(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "wb") as handle:
        handle.write(data)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_written_files_read_back_verified_and_as_plain_arrow(location, compression):
    """Every entry rebuilds exactly from the file; plain pyarrow sees the schema and one
    row per message; the temporary name is gone after publish."""
    entries = archive_entries.mixed(60)
    written = write_slice(location, entries, compression=compression)
    assert not location.fs.exists(written.path)
    publish(location, written)
    assert not location.fs.exists(written.temp_path)
    metadata = verify_file(written.url, size_bytes=written.size_bytes, crc32c_expected=written.crc32c)
    assert metadata.compression == compression and len(metadata.batches) > 1
    rebuilt = []
    with ArchiveFile.open(written.url, size_bytes=written.size_bytes) as archive_file:
        for index, batch in archive_file.iter_batches():
            rebuilt.extend(entries_of_batch(batch, archive_file.url, index))
    assert [data for _entry_id, data in rebuilt] == entries
    fs, path = fsspec.core.url_to_fs(written.url)
    with fs.open(path, "rb") as handle, ipc.open_file(handle) as plain:
        assert plain.schema.equals(SCHEMA)
        table = plain.read_all()
    assert table.num_rows == metadata.row_count
    assert set(table.column("entry_id").to_pylist()) == set(range(60))


def test_each_write_gets_its_own_name(location):
    """Two writes of the same slice never share a final name (no write replaces a file
    a manifest may name)."""
    entries = archive_entries.mixed(5)
    first = write_slice(location, entries)
    second = write_slice(location, entries)
    assert first.path != second.path and first.temp_path != second.temp_path
    publish(location, first)
    publish(location, second)
    names = [info.name for info in location.list_directory(location.topic_directory(TOPIC_PATH))]
    assert sorted(names) == sorted([first.path.rsplit("/", 1)[1], second.path.rsplit("/", 1)[1]])


def test_a_flipped_byte_in_any_batch_names_the_file_and_the_batch(location):
    """A bit flipped in the middle of each record batch's payload: reading that batch
    raises ArchiveCorrupt with the file URL and batch index; the batches before it still
    read; no corrupt data is returned."""
    entries = [archive_entries.single(i, payload=bytes([i % 256]) * 500) for i in range(64)]
    written = write_slice(location, entries)
    publish(location, written)
    original = read_bytes(written.url)
    with ArchiveFile.open(written.url) as archive_file:
        batch_count = archive_file.batch_count
    assert batch_count >= 3
    for target in range(batch_count):
        first_entry = read_metadata(written.url).batches[target].first_entry_id
        needle = bytes([first_entry % 256]) * 500
        offset = original.index(needle, 200) + 250
        damaged = bytearray(original)
        damaged[offset] ^= 0x01
        write_bytes(written.url, bytes(damaged))
        with ArchiveFile.open(written.url) as archive_file:
            for index in range(target):
                archive_file.read_batch(index)
            with pytest.raises(ArchiveCorrupt) as raised:
                archive_file.read_batch(target)
        assert raised.value.url == written.url and raised.value.batch_index == target
        assert f"{written.url} record batch {target} is corrupt" in str(raised.value)
        with pytest.raises(ArchiveCorrupt):
            verify_file(written.url, size_bytes=written.size_bytes, crc32c_expected=written.crc32c)
    write_bytes(written.url, original)
    verify_file(written.url, size_bytes=written.size_bytes, crc32c_expected=written.crc32c)


@pytest.mark.parametrize("kept_fraction", [0.0, 0.3, 0.9, 0.999])
def test_a_truncated_file_names_the_file(location, kept_fraction):
    """Cut anywhere: with the manifest's size the truncation is found before reading;
    without it Arrow's footer is missing; either way ArchiveCorrupt names the file."""
    written = write_slice(location, archive_entries.mixed(40))
    publish(location, written)
    data = read_bytes(written.url)
    write_bytes(written.url, data[:int(len(data) * kept_fraction)])
    with pytest.raises(ArchiveCorrupt) as raised:
        ArchiveFile.open(written.url, size_bytes=written.size_bytes)
    assert written.url in str(raised.value) and "manifest" in str(raised.value)
    with pytest.raises(ArchiveCorrupt) as raised:
        verify_file(written.url)
    assert written.url in str(raised.value)


def test_a_flipped_byte_outside_the_batches_fails_the_whole_file_checksum(location):
    """A byte of the leading schema copy (which no batch read decodes) is still caught
    by verify_file's whole-file CRC32C from the manifest."""
    written = write_slice(location, archive_entries.mixed(10))
    publish(location, written)
    data = bytearray(read_bytes(written.url))
    data[12] ^= 0x80
    write_bytes(written.url, bytes(data))
    with pytest.raises(ArchiveCorrupt) as raised:
        verify_file(written.url, size_bytes=written.size_bytes, crc32c_expected=written.crc32c)
    assert "CRC32C" in str(raised.value) and written.url in str(raised.value)


def test_missing_files_and_bad_locations(location):
    """A missing file is ArchiveNotFound naming it; an empty location URL is a ConfigError."""
    url = location.url_of(location.topic_directory(TOPIC_PATH) + "/nothing.arrow")
    with pytest.raises(ArchiveNotFound):
        ArchiveFile.open(url, size_bytes=10)
    with pytest.raises(ArchiveNotFound):
        verify_file(url, size_bytes=10, crc32c_expected=0)
    assert not delete_file(url)
    with pytest.raises(ConfigError):
        ArchiveLocation("")


def test_a_failed_write_leaves_no_file(location):
    """If writing fails midway, the partial temporary file is removed."""
    def failing(handle) -> None:
        handle.write(b"partial")
        raise OSError("disk full")

    directory = location.topic_directory(TOPIC_PATH)
    with pytest.raises(Exception):
        location.write_temp(directory, ".x.arrow.tmp", failing)
    assert location.list_directory(directory) == []


def test_local_files_are_written_under_the_location(tmp_path):
    """The local layout: <location>/<persistent/tenant/ns/topic>/<ledger>-<entry>-<token>.arrow."""
    location = ArchiveLocation(str(tmp_path / "archive"))
    written = write_slice(location, archive_entries.mixed(3))
    publish(location, written)
    directory = tmp_path / "archive" / "persistent" / "public" / "default" / "orders"
    assert os.listdir(directory) == [written.path.rsplit("/", 1)[1]]
    assert written.url == f"file://{directory}/{os.listdir(directory)[0]}"
