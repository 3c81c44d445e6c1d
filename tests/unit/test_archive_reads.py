"""Reads of archived ledgers as the broker serves them (managed_ledger/archive_reads.py), from
files on fsspec's in-memory filesystem, decoded in a worker thread.

Proves: any entry range of an archived ledger (across record batches and files) comes
back as the exact stored entries at their positions; a read stops at its byte budget
but always returns at least one entry; after a read the next batches, also those of
the next file and of the next archived ledger, are decoded ahead; a corrupt batch is
an ArchiveCorrupt error, never data; forgetting a topic's files empties the cache.
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from archive.format import FORMAT_VERSION
from archive.location import ArchiveLocation
from archive.manifest import FileRecord, LedgerRecord
from archive.writer import SliceBuilder, WriterConfig, publish, write_temp
from managed_ledger.archive_reads import ArchiveReads
from common.errors import ArchiveCorrupt
from tests.unit import archive_entries

TOPIC = "persistent://public/default/reads"
TOPIC_PATH = "persistent/public/default/reads"


def archive_ledger(location: ArchiveLocation, ledger_id: int, entries: list[bytes], *, per_file: int,
                   batch_rows_max: int = 8) -> LedgerRecord:
    files = []
    for start in range(0, len(entries), per_file):
        builder = SliceBuilder(WriterConfig(batch_rows_max=batch_rows_max), TOPIC, -1, ledger_id)
        for entry_id in range(start, min(start + per_file, len(entries))):
            builder.add_entry(entry_id, entries[entry_id])
        batches, metadata = builder.finish()
        written = write_temp(location, TOPIC_PATH, batches, metadata)
        publish(location, written)
        files.append(FileRecord(written.url, metadata.first_entry_id, metadata.last_entry_id, metadata.row_count,
                                written.size_bytes, written.crc32c, metadata.publish_time_ms_min,
                                metadata.publish_time_ms_max, FORMAT_VERSION))
    return LedgerRecord(TOPIC, ledger_id, len(entries), tuple(files), archived_ms=1, bookie_deleted_ms=2)


@pytest.fixture
def setup():
    location = ArchiveLocation(f"memory://reads-{uuid.uuid4().hex[:8]}")
    first_entries = archive_entries.mixed(50)
    second_entries = [archive_entries.single(i, payload=b"second-%d" % i) for i in range(20)]
    first = archive_ledger(location, 3, first_entries, per_file=30)
    second = archive_ledger(location, 8, second_entries, per_file=100)
    executor = ThreadPoolExecutor(max_workers=2)
    reads = ArchiveReads(executor, cache_bytes_max=64 * 1024 * 1024, read_ahead_batches=3)
    yield reads, (first, first_entries), (second, second_entries)
    reads.close()
    executor.shutdown()


async def test_any_range_reads_back_exactly(setup):
    """Ranges inside a batch, across batches and across files."""
    reads, (first, first_entries), (second, _) = setup
    for start, end in [(0, 0), (5, 12), (25, 40), (0, 49), (49, 49)]:
        entries = await reads.read(first, start, end, bytes_max=10**9)
        assert [e.position for e in entries] == [(3, i) for i in range(start, end + 1)]
        assert [bytes(e.data) for e in entries] == first_entries[start:end + 1]


async def test_a_read_stops_at_its_byte_budget_but_returns_one_entry(setup):
    reads, (first, first_entries), _ = setup
    entries = await reads.read(first, 10, 49, bytes_max=1)
    assert len(entries) == 1 and bytes(entries[0].data) == first_entries[10]
    budget = sum(len(e) for e in first_entries[10:14])
    entries = await reads.read(first, 10, 49, bytes_max=budget)
    assert [e.position.entry_id for e in entries] == [10, 11, 12, 13]


async def test_the_next_batches_are_decoded_ahead(setup):
    """After reading the last batch of the first ledger, the next ledger's batches are
    decoding (or decoded), so a sequential reader finds them ready."""
    reads, (first, _), (second, second_entries) = setup
    await reads.read(first, 45, 49, bytes_max=10**9, following=lambda ledger_id: second if ledger_id == 3 else None)
    for _ in range(100):
        if any(key[0] == second.files[0].url for key in reads._cache):
            break
        await asyncio.sleep(0.02)
    decoded_before = reads.batches_decoded
    entries = await reads.read(second, 0, 3, bytes_max=10**9)
    assert [bytes(e.data) for e in entries] == second_entries[:4]
    assert reads.batches_decoded == decoded_before       # it was already there


async def test_a_corrupt_batch_is_an_error_never_data(setup):
    """A file whose bytes changed after it was recorded fails the read, naming it."""
    reads, (first, _), _ = setup
    import fsspec

    url = first.files[1].url
    fs, path = fsspec.core.url_to_fs(url)
    data = bytearray(fs.cat_file(path))
    needle = b"m33-1|"                     # a batched message of entry 33 (second file)
    offset = data.index(needle)
    data[offset] ^= 0x20
    fs.pipe_file(path, bytes(data))
    with pytest.raises(ArchiveCorrupt) as raised:
        await reads.read(first, 30, 35, bytes_max=10**9)
    assert url in str(raised.value)


async def test_forgetting_files_drops_their_cache(setup):
    reads, (first, _), _ = setup
    await reads.read(first, 0, 49, bytes_max=10**9)
    assert reads._cache
    reads.forget({f.url for f in first.files})
    assert not [key for key in reads._cache if key[0] in {f.url for f in first.files}]
