"""Compaction (managed_ledger/compaction.py, managed_ledger/compacted_ledger.py,
managed_ledger/compaction_keys.py) over an in-memory topic and in-memory side ledgers: the
latest value of each key survives, a tombstone (null value or empty payload) drops its
key, keyless messages stay, a partly surviving batch keeps the bits of its survivors;
a second compaction reads the previous compacted ledger, so keys whose topic entries
were trimmed survive, a later tombstone still drops one, and the old ledger is
deleted; reads from any position find the first compacted entry at or after it (binary
search) and a reader going on is served in order; compressed batches and messages (each
codec) are read for their keys and copied as stored, and one that does not decompress
fails the run; the entry layout and the record round-trip, and bad ones raise our
error."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from managed_ledger.compacted_ledger import CompactionRecord, decode_entry, encode_entry
from managed_ledger import compaction_keys
from managed_ledger.compaction import COMPACTION_PROPERTY, TopicCompaction, compact
from common.errors import MalformedFrame, NoSuchLedger
from common.position import ManagedEntry, Position
from protocol.batch import encode_batch
from protocol.codec import encode_stored
from protocol.proto import pulsar_api_pb2 as pb
from protocol.proto.pulsar_api_pb2 import MessageMetadata, SingleMessageMetadata


def _single(key: str | None, payload: bytes, *, null: bool = False) -> bytes:
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    if key is not None:
        metadata.partition_key = key
    if null:
        metadata.null_value = True
    return encode_stored(metadata, payload)


def _batch(messages: list[tuple[str | None, bytes]]) -> bytes:
    singles = []
    for key, payload in messages:
        single = SingleMessageMetadata(payload_size=len(payload))
        if key is not None:
            single.partition_key = key
        singles.append((single, payload))
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                               num_messages_in_batch=len(messages))
    return encode_stored(metadata, encode_batch(singles))


class _SideLedger:
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.entries: list[bytes] = []
        self.closed = False

    def submit_nowait(self, payload: bytes) -> asyncio.Future[int]:
        assert not self.closed
        self.entries.append(bytes(payload))
        future = asyncio.get_running_loop().create_future()
        future.set_result(len(self.entries) - 1)
        return future

    async def close(self) -> None:
        self.closed = True

    async def read(self, first: int, last: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(payload=memoryview(self.entries[i])) for i in range(first, last + 1)]


class _Ledger:
    """A topic of one ledger (id 7) whose entries below ``trimmed_below`` are gone."""

    name = "persistent://t/n/topic"

    def __init__(self, payloads: list[bytes]) -> None:
        self.entries = [ManagedEntry(Position(7, i), data) for i, data in enumerate(payloads)]
        self.trimmed_below = 0
        self.side: dict[int, _SideLedger] = {}
        self.properties: dict[str, str] = {}
        self._next_side_id = 100

    def append(self, payload: bytes) -> None:
        self.entries.append(ManagedEntry(Position(7, len(self.entries)), payload))

    @property
    def last_confirmed(self) -> Position:
        return Position(7, len(self.entries) - 1)

    @property
    def first_position(self) -> Position:
        return Position(7, self.trimmed_below)

    def next_position(self, position: Position) -> Position:
        return Position(7, max(position.entry_id + 1, self.trimmed_below))

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        first = max(start.entry_id, self.trimmed_below)
        return self.entries[first:first + count_max]

    async def create_side_ledger(self, purpose: str) -> _SideLedger:
        assert purpose == "compacted"
        self._next_side_id += 1
        self.side[self._next_side_id] = _SideLedger(self._next_side_id)
        return self.side[self._next_side_id]

    async def open_side_ledger(self, ledger_id: int) -> _SideLedger:
        if ledger_id not in self.side:
            raise NoSuchLedger(ledger_id)
        return self.side[ledger_id]

    async def delete_side_ledger(self, ledger_id: int) -> None:
        self.side.pop(ledger_id, None)

    async def set_properties(self, updates: dict[str, str], *, recording=()) -> None:
        assert all(ledger_id in self.side for ledger_id in recording), recording
        self.properties.update(updates)


def _values(side: _SideLedger) -> list[tuple[Position, int, int]]:
    return [(e.position, e.batch_size, e.keep_bits) for e in map(decode_entry, side.entries)]


async def test_latest_per_key_tombstones_keyless_and_batches():
    ledger = _Ledger([
        _single("a", b"a1"),
        _single("b", b"b1"),
        _single("a", b"a2"),
        _single("b", b"", null=True),
        _batch([("d", b"d1"), ("d", b"d2"), (None, b"keyless")]),
        _single("c", b""),                           # an empty payload is a tombstone too
    ])
    record = await compact(ledger, None)
    assert record.horizon == Position(7, 5)
    assert record.entries == 2
    side = ledger.side[record.ledger_id]
    assert side.closed
    assert _values(side) == [(Position(7, 2), 0, 0), (Position(7, 4), 3, 0b110)]
    assert bytes(decode_entry(side.entries[0]).stored) == ledger.entries[2].data   # stored unchanged


async def test_a_second_compaction_builds_on_the_first_after_trimming():
    ledger = _Ledger([_single(f"k{i}", f"v{i}".encode()) for i in range(10)])
    compaction = TopicCompaction(ledger)
    await compaction.run()
    assert compaction.status == "SUCCESS"
    first = compaction.record
    assert first is not None and first.entries == 10
    ledger.trimmed_below = 10                        # retention deleted every topic entry
    ledger.append(_single("k3", b"v3-new"))
    ledger.append(_single("k5", b"", null=True))
    ledger.append(_batch([("k0", b"v0-new"), ("k11", b"v11")]))
    await compaction.run()
    second = compaction.record
    assert second.horizon == Position(7, 12)
    assert first.ledger_id not in ledger.side        # the old compacted ledger is gone
    assert CompactionRecord.decode(ledger.properties[COMPACTION_PROPERTY]) == second
    survivors = [(p.entry_id, size, bits) for p, size, bits in _values(ledger.side[second.ledger_id])]
    assert survivors == [(1, 0, 0), (2, 0, 0), (4, 0, 0), (6, 0, 0), (7, 0, 0), (8, 0, 0), (9, 0, 0),
                         (10, 0, 0), (12, 0, 0)]
    # Nothing new: the record stays as it is.
    await compaction.run()
    assert compaction.record is second


async def test_reads_find_their_place_and_go_on():
    ledger = _Ledger([_single(f"k{i % 50}", f"v{i}".encode()) for i in range(200)])
    compaction = TopicCompaction(ledger)
    await compaction.run()
    assert compaction.record.entries == 50           # entries 150..199
    assert await compaction.read_compacted(Position(7, 0), 3) == \
        await compaction.read_compacted(Position(7, 150), 3)
    for start in (0, 149, 150, 151, 173, 199):
        got = await compaction.read_compacted(Position(7, start), 2)
        assert [e.position.entry_id for e in got] == [max(start, 150), max(start, 150) + 1][:200 - max(start, 150)]
    assert await compaction.read_compacted(Position(7, 200), 5) == []
    position, seen = Position(7, 0), []
    while chunk := await compaction.read_compacted(position, 7):
        seen.extend(e.position.entry_id for e in chunk)
        position = Position(7, chunk[-1].position.entry_id + 1)
    assert seen == list(range(150, 200))


def _compressed(stored: bytes, codec: int) -> bytes:
    """``stored`` (one of _single / _batch) with its payload compressed by ``codec`` in
    the form the official clients write."""
    import zlib

    import cramjam

    from protocol.codec import decode_stored, stored_metadata

    compress = {pb.LZ4: lambda data: cramjam.lz4.compress_block(data, store_size=False),
                pb.ZSTD: cramjam.zstd.compress, pb.SNAPPY: cramjam.snappy.compress_raw, pb.ZLIB: zlib.compress}[codec]
    metadata = stored_metadata(stored)
    payload = bytes(decode_stored(stored).payload)
    metadata.compression = codec
    metadata.uncompressed_size = len(payload)
    return encode_stored(metadata, bytes(compress(payload)))


@pytest.mark.parametrize("codec", [pb.LZ4, pb.ZSTD, pb.SNAPPY, pb.ZLIB])
async def test_compressed_batches_and_messages_are_read_for_their_keys(codec):
    """A compressed batch of a1, b1 and c1, a compressed a2, a compressed empty b
    (a tombstone: its uncompressed size is 0, not its compressed bytes'): the batch
    survives with c1 only, then a2; the copies are the stored (compressed) bytes."""
    ledger = _Ledger([
        _compressed(_batch([("a", b"a1"), ("b", b"b1"), ("c", b"c1")]), codec),
        _compressed(_single("a", b"a2"), codec),
        _compressed(_single("b", b""), codec),
    ])
    record = await compact(ledger, None)
    side = ledger.side[record.ledger_id]
    assert _values(side) == [(Position(7, 0), 3, 0b100), (Position(7, 1), 0, 0)]
    assert bytes(decode_entry(side.entries[0]).stored) == ledger.entries[0].data


async def test_a_batch_that_does_not_decompress_fails_the_run_and_keeps_the_previous():
    ledger = _Ledger([_single("a", b"a1")])
    compaction = TopicCompaction(ledger)
    await compaction.run()
    previous = compaction.record
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=2,
                               compression=pb.LZ4, uncompressed_size=64)
    ledger.append(encode_stored(metadata, b"not lz4 at all"))
    await compaction.run()
    assert compaction.status == "ERROR" and compaction.last_error
    assert compaction.record is previous
    assert sorted(ledger.side) == [previous.ledger_id]   # the partial ledger was deleted


def test_entry_layout_and_record_round_trip():
    data = encode_entry(Position(3, 5), 10, 0b1000000101, b"stored")
    entry = decode_entry(data)
    assert (entry.position, entry.batch_size, entry.keep_bits, bytes(entry.stored)) == \
        (Position(3, 5), 10, 0b1000000101, b"stored")
    record = CompactionRecord(12, Position(3, 9), 4)
    assert CompactionRecord.decode(record.encode()) == record
    assert CompactionRecord.decode('{"format_version": 1, "horizon": [1, 2], "entries": []}') is None


@pytest.mark.parametrize("bad", [b"", b"\x0c\x0e\x01" + bytes(19), b"\x00\x00" + bytes(30),
                                 b"\x0c\x0e\x09" + bytes(30), encode_entry(Position(1, 1), 64, 0, b"")[:30]])
def test_bad_entries_raise_our_error(bad):
    with pytest.raises(MalformedFrame):
        decode_entry(bad)


@pytest.mark.parametrize("bad", ["", "{}", '{"format_version": 3}', '{"format_version": 2, "ledger_id": -1, '
                                 '"horizon": [1, 2], "entries": 0}'])
def test_bad_records_raise_our_error(bad):
    with pytest.raises(MalformedFrame):
        CompactionRecord.decode(bad)


def test_latest_keys_leave_no_file_behind_and_spill_past_their_cache(tmp_path, monkeypatch):
    """The table's file has no name once open (so a broker killed mid-compaction leaves
    nothing in the temporary directory), yet SQLite goes on using it past its page
    cache: 4,000 keys of ~100 bytes (400 KB) against a 32 KiB cache."""
    monkeypatch.setattr(compaction_keys, "CACHE_BYTES", 32 * 1024)
    table = compaction_keys.LatestKeys(str(tmp_path))
    try:
        assert list(tmp_path.iterdir()) == []
        keys = [f"key-{i:06d}-".encode() + b"k" * 88 for i in range(4_000)]
        table.note([(key, False, Position(7, i // 10), i % 10) for i, key in enumerate(keys)])
        table.note([(key, True, Position(7, 5_000), -1) for key in keys[:500]])   # tombstones
        table.index_positions()
        assert table.count() == 3_500
        survivors = table.survivors(Position(7, 0), Position(7, 60))
        assert Position(7, 49) not in survivors and survivors[Position(7, 50)] == set(range(10))
        assert list(tmp_path.iterdir()) == []
    finally:
        table.close()
