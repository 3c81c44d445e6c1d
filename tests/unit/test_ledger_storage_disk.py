"""DiskLedgerStorage (bookie/ledger_storage_disk.py) on real temp directories.

What it proves:
- an entry put is readable at once (from memory), and after flush + close it is read
  back from disk, byte for byte, by a fresh storage on the same directories (which has
  empty read caches, so the bytes really come from the entry logs);
- range reads answer in the requested order, stop once the returned entries pass
  bytes_max but always return at least one, and report NoSuchEntry for missing ids;
- ledgers are spread over several ledger dirs by ledger_id, and entry logs rotate at
  entry_log_bytes_max;
- a byte flipped in an entry log on disk gives a DigestMismatch outcome, never data;
- delete_ledgers + compact reclaim disk space while every entry of the other ledgers
  stays readable and correct, before and after a restart;
- ledger states (fenced, last_add_confirmed, last_entry_id) survive close/reopen.

How: small sizes (64 KiB entry logs, 8 KiB entries) so a few hundred entries exercise
rotation and compaction; fsync disabled for speed (crash durability is the business of
the integration and simulation tests). Entries are built with common.entry.encode_entry
and inspected on disk with bookie.format's entry log reader.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest

from bookie.config import LedgerStorageConfig
from bookie.entry_log import EntryLogger
from bookie.format import ENTRY_LOG_MAGIC, FILE_HEADER_SIZE, decode_file_header, iter_entry_log_records
from bookie.ledger_storage import LedgerState
from bookie.ledger_storage_disk import DiskLedgerStorage
from common.entry import ENTRY_HEADER_SIZE, encode_entry, entry_ids, verify_entry
from common.errors import DigestMismatch, NoSuchEntry, Overloaded

KIB = 1024
MIB = 1024 * KIB
ENTRY_LOG_BYTES_MAX = 64 * KIB
BIG = 10**9


def _entry(ledger_id: int, entry_id: int, size: int = 1000) -> bytes:
    """An encoded entry of exactly ``size`` bytes whose payload depends on its ids."""
    payload_size = size - ENTRY_HEADER_SIZE
    seed = (ledger_id * 7919 + entry_id * 104729) % 251
    payload = bytes((seed + i) % 251 for i in range(payload_size))
    return encode_entry(ledger_id, entry_id, entry_id - 1, BIG, payload)


def _config(dirs, **overrides) -> LedgerStorageConfig:
    settings = dict(
        ledger_dirs=tuple(str(d) for d in dirs),
        write_cache_bytes_max=1 * MIB,
        read_cache_bytes_max=256 * KIB,
        entry_bytes_max=8 * KIB,
        entry_log_bytes_max=ENTRY_LOG_BYTES_MAX,
        write_cache_wait_s_max=0.2,
    )
    settings.update(overrides)
    return LedgerStorageConfig(**settings)


class Storages:
    """Opens storages and guarantees each is closed once, even if a test fails."""

    def __init__(self) -> None:
        self._open: list[DiskLedgerStorage] = []

    def open(self, config: LedgerStorageConfig) -> DiskLedgerStorage:
        storage = DiskLedgerStorage(config, read_threads=2, fsync_enabled=False)
        storage.open()
        self._open.append(storage)
        return storage

    async def close(self, storage: DiskLedgerStorage) -> None:
        self._open.remove(storage)
        await storage.close()

    async def reopen(self, storage: DiskLedgerStorage) -> DiskLedgerStorage:
        """Closes ``storage`` and opens a fresh one on the same directories."""
        await self.close(storage)
        return self.open(storage.config)

    async def close_all(self) -> None:
        while self._open:
            await self.close(self._open[-1])


@pytest.fixture
async def storages():
    manager = Storages()
    yield manager
    await manager.close_all()


@pytest.fixture
def flush_gate(monkeypatch):
    """Holds every entry log append (on the flush thread) until released, so a test can
    act while a flush is in the middle of writing. Always released at the end."""
    started = threading.Event()
    release = threading.Event()
    original = EntryLogger.append_batch

    def gated_append_batch(self, entries):
        started.set()
        release.wait(5)
        return original(self, entries)

    monkeypatch.setattr(EntryLogger, "append_batch", gated_append_batch)
    yield started, release
    release.set()


async def _flush_in_progress(storage, started: threading.Event) -> asyncio.Future[None]:
    """Starts a flush and returns once its flush thread is writing."""
    flush = asyncio.ensure_future(storage.flush())
    assert await asyncio.to_thread(started.wait, 5)
    return flush


def _put(storage, ledger_id: int, entry_id_list, size: int = 1000) -> dict[int, bytes]:
    written = {}
    for entry_id in entry_id_list:
        entry = _entry(ledger_id, entry_id, size)
        storage.put_entry(ledger_id, entry_id, entry_id - 1, entry)
        written[entry_id] = entry
    return written


def _assert_entries(outcomes, expected: dict[int, bytes], wanted: list[int]) -> None:
    assert [o.entry_id for o in outcomes] == wanted
    for outcome in outcomes:
        assert outcome.error is None, outcome
        assert outcome.entry == expected[outcome.entry_id]


def _log_files(directory) -> list[str]:
    log_dir = os.path.join(str(directory), "entrylogs")
    return sorted(os.path.join(log_dir, name) for name in os.listdir(log_dir))


def _log_bytes(directory) -> int:
    return sum(os.path.getsize(path) for path in _log_files(directory))


def _entries_on_disk(directory) -> list[tuple[str, int, int, int]]:
    """(path, offset, ledger_id, entry_id) of every record in every entry log."""
    found = []
    for path in _log_files(directory):
        with open(path, "rb") as handle:
            data = handle.read()
        decode_file_header(data[:FILE_HEADER_SIZE], ENTRY_LOG_MAGIC)
        for offset, entry in iter_entry_log_records(data):
            found.append((path, offset, *entry_ids(entry)))
    return found


# --- writes and reads ---------------------------------------------------------------------------

async def test_put_is_readable_from_memory_at_once(tmp_path, storages):
    """Entries put are readable before any flush, and update the ledger state."""
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 1, range(10))
    outcomes = await storage.read_entries(1, list(range(10)), BIG)
    _assert_entries(outcomes, written, list(range(10)))
    assert storage.stats().flushes == 0
    assert storage.ledger_state(1) == LedgerState(fenced=False, last_add_confirmed=8, last_entry_id=9)
    assert storage.ledger_ids() == {1}
    assert storage.ledger_state(2) is None


async def test_flushed_entries_are_read_back_from_disk(tmp_path, storages):
    """After flush and close, a fresh storage (empty caches) reads every entry from the
    entry logs, byte for byte; a second read is served from its read cache."""
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 1, range(20))
    await storage.flush()
    assert storage.stats().flushes == 1
    assert storage.stats().write_cache_bytes == 0
    fresh = await storages.reopen(storage)
    assert fresh.stats().read_cache_bytes == 0
    outcomes = await fresh.read_entries(1, list(range(20)), BIG)
    _assert_entries(outcomes, written, list(range(20)))
    stats = fresh.stats()
    assert stats.read_cache_hits == 0 and stats.read_cache_misses == 20
    again = await fresh.read_entries(1, list(range(20)), BIG)
    _assert_entries(again, written, list(range(20)))
    assert fresh.stats().read_cache_hits == 20


async def test_entries_stay_readable_through_a_flush(tmp_path, storages, flush_gate):
    """Reads issued while a flush is writing still find every entry (active, flushing,
    read cache or disk), and entries put during the flush are readable too."""
    started, release = flush_gate
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 1, range(50))
    flush = await _flush_in_progress(storage, started)
    written.update(_put(storage, 1, range(50, 60)))
    outcomes = await storage.read_entries(1, list(range(60)), BIG)
    release.set()
    await flush
    _assert_entries(outcomes, written, list(range(60)))
    after = await storage.read_entries(1, list(range(60)), BIG)
    _assert_entries(after, written, list(range(60)))


ORDERS = {
    "ascending": list(range(12)),
    "descending": list(range(11, -1, -1)),
    "shuffled": random.Random(3).sample(range(12), 12),
    "sparse": [11, 0, 5, 3],
}


@pytest.mark.parametrize("where", ["memory", "disk"])
@pytest.mark.parametrize("order", list(ORDERS), ids=list(ORDERS))
async def test_range_reads_answer_in_the_requested_order(tmp_path, storages, where, order):
    """Outcomes come in the order the ids were asked for, from memory and from disk."""
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 2, range(12))
    if where == "disk":
        await storage.flush()
        storage = await storages.reopen(storage)
    wanted = ORDERS[order]
    _assert_entries(await storage.read_entries(2, wanted, BIG), written, wanted)


@pytest.mark.parametrize("where", ["memory", "disk", "mixed"])
@pytest.mark.parametrize("bytes_max, count", [(0, 1), (1, 1), (999, 1), (1000, 1), (1001, 2), (2500, 3),
                                              (5000, 5), (19_999, 20), (BIG, 20)])
async def test_range_reads_stop_at_bytes_max_but_return_at_least_one(tmp_path, storages, where, bytes_max, count):
    """With 1000-byte entries, a read returns the shortest prefix whose size reaches
    bytes_max (so at least one entry), whether the entries are in memory, on disk, or
    half and half."""
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 3, range(10))
    if where in ("disk", "mixed"):
        await storage.flush()
        storage = await storages.reopen(storage)
    written.update(_put(storage, 3, range(10, 20)))
    if where == "disk":
        await storage.flush()
        storage = await storages.reopen(storage)
    outcomes = await storage.read_entries(3, list(range(20)), bytes_max)
    _assert_entries(outcomes, written, list(range(count)))


@pytest.mark.parametrize("where", ["memory", "disk"])
async def test_missing_entries_are_no_such_entry(tmp_path, storages, where):
    """An id never written gets a NoSuchEntry outcome naming it, in its place in the
    answer; other ledgers' and unknown ledgers' ids are not confused."""
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 1, range(5))
    _put(storage, 2, range(10))
    if where == "disk":
        await storage.flush()
        storage = await storages.reopen(storage)
    outcomes = await storage.read_entries(1, [0, 7, 1, 99], BIG)
    assert [o.entry_id for o in outcomes] == [0, 7, 1, 99]
    assert outcomes[0].entry == written[0] and outcomes[2].entry == written[1]
    for outcome in (outcomes[1], outcomes[3]):
        assert outcome.entry is None
        assert isinstance(outcome.error, NoSuchEntry)
        assert (outcome.error.ledger_id, outcome.error.entry_id) == (1, outcome.entry_id)
    unknown = await storage.read_entries(77, [0], BIG)
    assert unknown[0].entry is None and isinstance(unknown[0].error, NoSuchEntry)


async def test_an_overwritten_entry_reads_as_the_last_version(tmp_path, storages):
    """The same entry put twice (a recovery re-add) reads as the last bytes, in memory
    and after flush and restart."""
    storage = storages.open(_config([tmp_path]))
    storage.put_entry(1, 0, -1, _entry(1, 0, 500))
    await storage.flush()
    replacement = encode_entry(1, 0, -1, BIG, b"second version")
    storage.put_entry(1, 0, -1, replacement)
    assert (await storage.read_entries(1, [0], BIG))[0].entry == replacement
    await storage.flush()
    assert (await storage.read_entries(1, [0], BIG))[0].entry == replacement
    storage = await storages.reopen(storage)
    assert (await storage.read_entries(1, [0], BIG))[0].entry == replacement


# --- directories and entry logs -------------------------------------------------------------------

async def test_ledgers_are_spread_over_several_ledger_dirs(tmp_path, storages):
    """Ledger L lives in dir L % 3: its entries are physically in that dir's entry logs,
    and everything reads back after a restart."""
    dirs = [tmp_path / f"disk{i}" for i in range(3)]
    storage = storages.open(_config(dirs))
    assert storage.directories() == [str(d) for d in dirs]
    written = {ledger_id: _put(storage, ledger_id, range(6)) for ledger_id in range(9)}
    await storage.flush()
    storage = await storages.reopen(storage)
    for index, directory in enumerate(dirs):
        assert (directory / "index.sqlite").exists()
        on_disk = _entries_on_disk(directory)
        assert {ledger_id for _, _, ledger_id, _ in on_disk} == {l for l in range(9) if l % 3 == index}
        assert len(on_disk) == 3 * 6
    assert storage.ledger_ids() == set(range(9))
    assert storage.stats().ledger_count == 9
    for ledger_id, entries in written.items():
        _assert_entries(await storage.read_entries(ledger_id, list(range(6)), BIG), entries, list(range(6)))


async def test_entry_logs_rotate_at_their_size_limit(tmp_path, storages):
    """About 300 KiB through 64 KiB entry logs: several logs, none over the limit, and
    every entry intact after a restart."""
    storage = storages.open(_config([tmp_path]))
    written = {}
    for round_index in range(5):
        written.update(_put(storage, 4, range(round_index * 30, (round_index + 1) * 30), size=2000))
        await storage.flush()
    storage = await storages.reopen(storage)
    files = _log_files(tmp_path)
    assert len(files) >= 5
    assert all(os.path.getsize(path) <= ENTRY_LOG_BYTES_MAX for path in files)
    assert sorted(e for _, _, _, e in _entries_on_disk(tmp_path)) == list(range(150))
    _assert_entries(await storage.read_entries(4, list(range(150)), BIG), written, list(range(150)))


# --- corruption on disk -------------------------------------------------------------------------

@pytest.mark.parametrize("position", [0, 2, 3, 5, 13, 21, 29, 37, 41, 44, 500, -1],
                         ids=["magic", "version", "flags", "ledger_id", "entry_id", "lac", "length",
                              "payload_size", "digest", "payload_start", "payload_mid", "last_byte"])
async def test_a_flipped_byte_on_disk_is_a_digest_mismatch(tmp_path, storages, position):
    """Flip one byte of entry 5 in its entry log: reading 4..6 from a fresh storage
    gives DigestMismatch for 5 (no bytes) and intact neighbours, every time."""
    storage = storages.open(_config([tmp_path]))
    written = _put(storage, 1, range(10))
    await storage.flush()
    await storages.close(storage)
    (path, offset, _, _), = [r for r in _entries_on_disk(tmp_path) if r[2:] == (1, 5)]
    target = offset + (position if position >= 0 else 1000 + position)
    with open(path, "r+b") as handle:
        handle.seek(target)
        original = handle.read(1)
        handle.seek(target)
        handle.write(bytes([original[0] ^ 0x01]))
    storage = storages.open(_config([tmp_path]))
    for _attempt in range(2):
        outcomes = await storage.read_entries(1, [4, 5, 6], BIG)
        assert [o.entry_id for o in outcomes] == [4, 5, 6]
        assert outcomes[0].entry == written[4] and outcomes[2].entry == written[6]
        assert outcomes[1].entry is None
        assert isinstance(outcomes[1].error, DigestMismatch)
        assert (outcomes[1].error.ledger_id, outcomes[1].error.entry_id) == (1, 5)


async def test_every_entry_returned_from_disk_verifies(tmp_path, storages):
    """Whatever a range read returns as data passes verify_entry and has the asked ids
    (the index never points a reader at another entry's bytes)."""
    storage = storages.open(_config([tmp_path]))
    for ledger_id in (1, 2, 3):
        _put(storage, ledger_id, range(40), size=1500)
        await storage.flush()
    storage = await storages.reopen(storage)
    for ledger_id in (1, 2, 3):
        for outcome in await storage.read_entries(ledger_id, list(range(40)), BIG):
            header = verify_entry(outcome.entry)
            assert (header.ledger_id, header.entry_id) == (ledger_id, outcome.entry_id)


# --- deletion and compaction ----------------------------------------------------------------------

async def _mixed_logs(storage, rounds: int = 8) -> dict[int, dict[int, bytes]]:
    """Ledgers 1 and 2 (same directory) written in several flushes so that every entry
    log holds entries of both."""
    written: dict[int, dict[int, bytes]] = {1: {}, 2: {}}
    for round_index in range(rounds):
        ids = range(round_index * 8, (round_index + 1) * 8)
        written[1].update(_put(storage, 1, ids, size=2000))
        written[2].update(_put(storage, 2, ids, size=2000))
        await storage.flush()
    return written


async def test_delete_and_compact_reclaim_space_and_keep_other_ledgers(tmp_path, storages):
    """Deleting ledger 1 and compacting shrinks the entry logs by about ledger 1's
    bytes; ledger 1 is gone, every entry of ledger 2 reads back identical, before and
    after a restart."""
    storage = storages.open(_config([tmp_path]))
    written = await _mixed_logs(storage)
    before = _log_bytes(tmp_path)
    ledger_1_bytes = sum(len(e) for e in written[1].values())
    await storage.delete_ledgers([1])
    assert storage.ledger_ids() == {2}
    assert storage.ledger_state(1) is None
    logs, reclaimed = await storage.compact(live_ratio_min=0.75, bytes_max=BIG)
    assert logs >= 1
    assert reclaimed > 0
    after = _log_bytes(tmp_path)
    assert after < before
    assert before - after >= ledger_1_bytes * 0.8
    assert storage.stats().compacted_logs == logs
    ids = list(range(64))
    _assert_entries(await storage.read_entries(2, ids, BIG), written[2], ids)
    assert all(isinstance(o.error, NoSuchEntry) for o in await storage.read_entries(1, [0, 30, 63], BIG))
    storage = await storages.reopen(storage)
    _assert_entries(await storage.read_entries(2, ids, BIG), written[2], ids)
    assert {ledger_id for _, _, ledger_id, _ in _entries_on_disk(tmp_path)} == {2}
    assert storage.ledger_ids() == {2}


async def test_compaction_leaves_fully_live_logs_alone(tmp_path, storages):
    """With nothing deleted, compaction moves nothing and every entry stays put."""
    storage = storages.open(_config([tmp_path]))
    written = await _mixed_logs(storage, rounds=4)
    before = _entries_on_disk(tmp_path)
    assert await storage.compact(live_ratio_min=0.5, bytes_max=BIG) == (0, 0)
    assert _entries_on_disk(tmp_path) == before
    for ledger_id in (1, 2):
        _assert_entries(await storage.read_entries(ledger_id, list(range(32)), BIG), written[ledger_id],
                        list(range(32)))


async def test_compaction_respects_its_byte_budget(tmp_path, storages):
    """A round stops once it reclaimed bytes_max; the next round continues."""
    storage = storages.open(_config([tmp_path]))
    written = await _mixed_logs(storage)
    await storage.delete_ledgers([1])
    first_logs, first_bytes = await storage.compact(live_ratio_min=0.75, bytes_max=1)
    assert first_logs == 1 and first_bytes > 0
    more_logs, _more_bytes = await storage.compact(live_ratio_min=0.75, bytes_max=BIG)
    assert more_logs >= 1
    _assert_entries(await storage.read_entries(2, list(range(64)), BIG), written[2], list(range(64)))


async def test_deleting_every_ledger_and_compacting_empties_the_logs(tmp_path, storages):
    """With all ledgers deleted, compaction leaves no entry on disk."""
    storage = storages.open(_config([tmp_path]))
    await _mixed_logs(storage, rounds=4)
    await storage.delete_ledgers([1, 2])
    await storage.compact(live_ratio_min=0.5, bytes_max=BIG)
    assert _entries_on_disk(tmp_path) == []
    assert storage.ledger_ids() == set()


async def test_copies_replaced_by_a_re_add_count_as_dead_space(tmp_path, storages):
    """A recovery re-adds 30 entries the bookie already flushed; the new copies land in
    a second log and the index points there. The first log now holds only dead copies,
    so compaction must reclaim it, and every entry must still read back."""
    storage = storages.open(_config([tmp_path]))
    _put(storage, 1, range(30), size=2000)
    await storage.flush()
    written = _put(storage, 1, range(30), size=2000)
    await storage.flush()
    before = _log_bytes(tmp_path)
    logs, reclaimed = await storage.compact(live_ratio_min=0.5, bytes_max=BIG)
    assert logs >= 1 and reclaimed > 0
    assert _log_bytes(tmp_path) < before * 0.6
    storage = await storages.reopen(storage)
    _assert_entries(await storage.read_entries(1, list(range(30)), BIG), written, list(range(30)))


async def test_compaction_never_drops_a_live_entry_it_cannot_scan(tmp_path, storages):
    """Damage the 4-byte record head (not the entry) in front of a live entry of
    ledger 2. Reads use the index and still return it intact. After ledger 1 is
    deleted and the logs compacted, every entry of ledger 2 must still read back
    identical from a fresh storage: compaction must not delete a log while the index
    still points live entries into it."""
    storage = storages.open(_config([tmp_path]))
    written = await _mixed_logs(storage)
    await storages.close(storage)
    path, offset, _, _ = [r for r in _entries_on_disk(tmp_path) if r[2:] == (2, 2)][0]
    with open(path, "r+b") as handle:
        handle.seek(offset - 4)
        handle.write(b"\x7f\xff\xff\xff")
    storage = storages.open(_config([tmp_path]))
    ids = list(range(64))
    _assert_entries(await storage.read_entries(2, ids, BIG), written[2], ids)
    await storage.delete_ledgers([1])
    await storage.compact(live_ratio_min=0.75, bytes_max=BIG)
    storage = await storages.reopen(storage)
    _assert_entries(await storage.read_entries(2, ids, BIG), written[2], ids)


async def test_a_ledger_deleted_during_a_flush_stays_deleted(tmp_path, storages, flush_gate):
    """delete_ledgers called while a flush of that ledger's entries is writing:
    afterwards none of its entries is readable (from disk or from any cache)."""
    started, release = flush_gate
    storage = storages.open(_config([tmp_path]))
    _put(storage, 1, range(10))
    kept = _put(storage, 2, range(10))
    flush = await _flush_in_progress(storage, started)
    delete = asyncio.ensure_future(storage.delete_ledgers([1]))
    await asyncio.sleep(0.01)                   # delete has dropped the caches, waits for the flush
    release.set()
    await asyncio.gather(flush, delete)
    outcomes = await storage.read_entries(1, list(range(10)), BIG)
    assert [type(o.error) for o in outcomes] == [NoSuchEntry] * 10
    assert all(o.entry is None for o in outcomes)
    _assert_entries(await storage.read_entries(2, list(range(10)), BIG), kept, list(range(10)))


# --- ledger states -------------------------------------------------------------------------------

async def test_ledger_states_survive_close_and_reopen(tmp_path, storages):
    """fenced, last_add_confirmed and last_entry_id are durable: a fenced ledger with no
    entries, a ledger with entries then fenced, one fenced after a flush, and one never
    fenced all come back as they were (in two directories)."""
    storage = storages.open(_config([tmp_path / "a", tmp_path / "b"]))
    storage.fence(3)
    _put(storage, 4, range(7))
    storage.put_entry(4, 2, 5, _entry(4, 2))     # a late re-add with a higher piggybacked LAC
    storage.fence(4)
    _put(storage, 5, range(3))
    await storage.flush()
    storage.fence(5)                              # dirty state only, no new entry
    _put(storage, 6, range(2))
    expected = {
        3: LedgerState(fenced=True, last_add_confirmed=-1, last_entry_id=-1),
        4: LedgerState(fenced=True, last_add_confirmed=5, last_entry_id=6),
        5: LedgerState(fenced=True, last_add_confirmed=1, last_entry_id=2),
        6: LedgerState(fenced=False, last_add_confirmed=0, last_entry_id=1),
    }
    assert {l: storage.ledger_state(l) for l in expected} == expected
    storage = await storages.reopen(storage)
    assert {l: storage.ledger_state(l) for l in expected} == expected
    assert storage.ledger_ids() == set(expected)
    storage = await storages.reopen(storage)
    assert {l: storage.ledger_state(l) for l in expected} == expected


async def test_fence_returns_the_live_state(tmp_path, storages):
    """fence() marks the ledger and returns its state, creating it if unknown."""
    storage = storages.open(_config([tmp_path]))
    _put(storage, 1, range(3))
    state = storage.fence(1)
    assert state == LedgerState(fenced=True, last_add_confirmed=1, last_entry_id=2)
    assert storage.fence(9) == LedgerState(fenced=True)


# --- back-pressure --------------------------------------------------------------------------------

async def test_write_cache_back_pressure(tmp_path, storages):
    """needs_flush turns on at half the write cache; wait_for_room raises Overloaded
    when the cache stays full for write_cache_wait_s_max, and a flush makes room."""
    storage = storages.open(_config([tmp_path], write_cache_bytes_max=64 * KIB, write_cache_wait_s_max=0.05))
    _put(storage, 1, range(31))
    assert not storage.needs_flush()
    _put(storage, 1, range(31, 33))
    assert storage.needs_flush()
    _put(storage, 1, range(33, 64))
    await storage.wait_for_room(1, 1000)          # 64 000 + 1000 <= 65 536
    with pytest.raises(Overloaded):
        await storage.wait_for_room(1, 2000)
    waiter = asyncio.ensure_future(storage.wait_for_room(1, 2000))
    await asyncio.sleep(0)
    await storage.flush()
    await asyncio.wait_for(waiter, 1)
    assert not storage.needs_flush()


# --- restarts --------------------------------------------------------------------------------------

async def test_restarts_without_writes_do_not_pile_up_entry_logs(tmp_path, storages):
    """Each start opens a new active log; restarts with nothing written must not leave
    an ever-growing number of empty entry log files that compaction never removes."""
    storage = storages.open(_config([tmp_path]))
    _put(storage, 1, range(5))
    await storage.flush()
    for _ in range(6):
        storage = await storages.reopen(storage)
        await storage.compact(live_ratio_min=0.5, bytes_max=BIG)
    assert len(_log_files(tmp_path)) <= 3
