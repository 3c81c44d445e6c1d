"""The journal (bookie/journal.py) on real files in a temp directory, driven by asyncio.

What it proves:
- an append's future resolves only after the group holding it was written and
  fdatasynced, and on_durable sees the tokens before the future resolves;
- concurrent appends share groups (fewer groups than records) and on_durable receives
  the tokens in exactly the order of the append calls;
- files rotate once they reach file_bytes_max and every file starts with a valid header;
- replay_journal from a checkpoint position yields exactly the records after it, a torn
  (truncated) last record is not replayed, zero fill and a CRC mismatch stop replay;
- trim() deletes only files wholly before the position and never the current file;
- an IO error fails the pending and all later appends with BookieStorageError, a closed
  journal refuses appends, and wait_for_room applies back-pressure.

How: a small harness runs Journal.run() as a task and records on_durable calls. Where a
test needs to hold a group "inside" its fsync, os.fdatasync is replaced by a stub that
waits on a threading.Event (always released, with a timeout, so nothing hangs).
Everything else uses fsync_enabled=False to stay fast; durability itself is not what
these tests measure.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from bookie.config import JournalConfig
from bookie.format import (
    FILE_HEADER_SIZE,
    JOURNAL_MAGIC,
    RECORD_ADD,
    RECORD_FENCE,
    JournalPosition,
    decode_file_header,
    encode_file_header,
    journal_add_record,
    journal_fence_record,
    journal_file_name,
)
from bookie.journal import Journal, list_journal_ids, replay_journal
from common.entry import encode_entry, entry_ids
from common.errors import BookieStorageError, MalformedFrame, ShuttingDown

KIB = 1024
MIB = 1024 * KIB


def _entry(ledger_id: int, entry_id: int, payload_size: int = 16) -> bytes:
    payload = bytes((ledger_id * 31 + entry_id + i) % 251 for i in range(payload_size))
    return encode_entry(ledger_id, entry_id, entry_id - 1, 10**9, payload)


class Harness:
    """One Journal with its writer task running, recording what on_durable got."""

    def __init__(self, journal_dir: str, first_journal_id: int = 1, **overrides) -> None:
        overrides.setdefault("fsync_enabled", False)
        self.config = JournalConfig(journal_dir=journal_dir, **overrides)
        self.groups: list[list[object]] = []
        self.hook = None
        self.journal = Journal(self.config, on_durable=self._on_durable, first_journal_id=first_journal_id)
        self.journal.open()
        self.task = asyncio.get_running_loop().create_task(self.journal.run())
        self.stopped = False

    def _on_durable(self, tokens: list[object]) -> None:
        self.groups.append(list(tokens))
        if self.hook is not None:
            self.hook(tokens)

    @property
    def tokens(self) -> list[object]:
        return [token for group in self.groups for token in group]

    def add(self, ledger_id: int, entry_id: int, payload_size: int = 16) -> asyncio.Future[None]:
        entry = _entry(ledger_id, entry_id, payload_size)
        return self.journal.append(journal_add_record(entry), len(entry), [(ledger_id, entry_id)])

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if not self.task.done():
            await self.journal.close()
            await asyncio.wait_for(self.task, 5)
        self.journal.close_file()


@pytest.fixture
async def harnesses():
    """Starts journals on demand and always stops them, even when a test fails."""
    started: list[Harness] = []

    def start(journal_dir, **kwargs) -> Harness:
        harness = Harness(str(journal_dir), **kwargs)
        started.append(harness)
        return harness

    yield start
    for harness in started:
        await harness.stop()


@pytest.fixture
def fsync_gate(monkeypatch):
    """Replaces os.fdatasync with a stub that blocks until the test opens the gate, and
    records the file size it saw (what the fsync covered). ``entered`` is set once the
    writer is inside the stub."""
    gate = threading.Event()
    entered = threading.Event()
    synced_sizes: list[int] = []

    def fake_fdatasync(fd: int) -> None:
        entered.set()
        gate.wait(5)
        synced_sizes.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fdatasync", fake_fdatasync)
    yield gate, synced_sizes, entered
    gate.set()


def _replayed(journal_dir, start=None) -> list[tuple[int, int]]:
    """(ledger_id, entry_id) of every ADD record replay yields, in order."""
    found = []
    for _journal_id, record in replay_journal(str(journal_dir), start):
        assert record.record_type == RECORD_ADD
        found.append(entry_ids(record.entry))
    return found


# --- acknowledgement after fsync ------------------------------------------------------------

async def test_append_resolves_only_after_its_group_is_fsynced(tmp_path, harnesses, fsync_gate):
    """While the group's fdatasync has not returned, the future is pending and
    on_durable has not run; afterwards both happened, in that order, and the fsync
    covered the record (the file's size tells what was written: no space allocated
    ahead here)."""
    gate, synced_sizes, _entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True, preallocate_bytes=0)
    states_at_durable: list[bool] = []
    future = harness.add(1, 0)
    harness.hook = lambda tokens: states_at_durable.append(future.done())
    await asyncio.sleep(0.05)
    assert not future.done()
    assert harness.groups == []
    gate.set()
    await asyncio.wait_for(future, 5)
    assert harness.tokens == [(1, 0)]
    assert states_at_durable == [False], "on_durable must run before the ack"
    file_size = os.path.getsize(tmp_path / journal_file_name(1))
    assert synced_sizes == [file_size]
    assert file_size == FILE_HEADER_SIZE + len(b"".join(journal_add_record(_entry(1, 0))))


async def test_appends_during_an_fsync_wait_for_the_next_group(tmp_path, harnesses, fsync_gate):
    """Records appended while a group is in its fsync form the next group and resolve
    only with it."""
    gate, _synced, entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True)
    first = harness.add(1, 0)
    assert await asyncio.to_thread(entered.wait, 5)     # the first group is in its fsync
    later = [harness.add(1, entry_id) for entry_id in range(1, 6)]
    await asyncio.sleep(0.02)
    assert not first.done() and not any(f.done() for f in later)
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 5)
    assert harness.groups == [[(1, 0)], [(1, e) for e in range(1, 6)]]
    assert harness.journal.stats.groups_written == 2


async def test_the_written_file_holds_exactly_the_acknowledged_records(tmp_path, harnesses):
    """After the futures resolve, replaying the file gives back every record in order."""
    harness = harnesses(tmp_path)
    futures = [harness.add(ledger_id, entry_id) for entry_id in range(5) for ledger_id in (1, 2)]
    await asyncio.gather(*futures)
    assert _replayed(tmp_path) == [(l, e) for e in range(5) for l in (1, 2)]


# --- group commit and ordering ---------------------------------------------------------------

async def test_a_burst_of_appends_is_one_group(tmp_path, harnesses):
    """Appends made without yielding to the loop all land in one group and one write."""
    harness = harnesses(tmp_path)
    futures = [harness.add(1, entry_id) for entry_id in range(500)]
    await asyncio.gather(*futures)
    stats = harness.journal.stats
    assert stats.records_written == 500
    assert stats.groups_written == 1
    assert harness.tokens == [(1, e) for e in range(500)]


async def test_concurrent_producers_share_groups_and_tokens_keep_append_order(tmp_path, harnesses):
    """20 producers each appending 25 records and awaiting each ack: fewer groups than
    records, and on_durable gets the tokens in the global order of the append calls."""
    harness = harnesses(tmp_path)
    append_order: list[tuple[int, int]] = []

    async def producer(ledger_id: int) -> None:
        for entry_id in range(25):
            append_order.append((ledger_id, entry_id))
            await harness.add(ledger_id, entry_id)

    await asyncio.gather(*(producer(ledger_id) for ledger_id in range(20)))
    stats = harness.journal.stats
    assert stats.records_written == 500
    assert stats.groups_written < stats.records_written
    assert stats.groups_written == len(harness.groups)
    assert harness.tokens == append_order
    assert _replayed(tmp_path) == append_order


async def test_a_batch_shares_one_future_and_keeps_its_tokens(tmp_path, harnesses):
    """One append of several records (one stream message) resolves once, and each
    record's token reaches on_durable; FENCE records go through the same path."""
    harness = harnesses(tmp_path)
    buffers, tokens, size = [], [], 0
    for entry_id in range(3):
        entry = _entry(4, entry_id)
        buffers.extend(journal_add_record(entry))
        tokens.append(("add", entry_id))
        size += len(entry)
    fence = journal_fence_record(4)
    buffers.append(fence)
    tokens.append(("fence", 4))
    await harness.journal.append(buffers, size + len(fence), tokens)
    assert harness.tokens == tokens
    records = [record for _, record in replay_journal(str(tmp_path), None)]
    assert [r.record_type for r in records] == [RECORD_ADD] * 3 + [RECORD_FENCE]
    assert records[-1].ledger_id == 4


async def test_applied_position_follows_the_file_end(tmp_path, harnesses):
    """After each acknowledged group, applied_position is the end of the written data
    in the current file, and it only moves forward (the file's size is that end when
    no space is allocated ahead)."""
    harness = harnesses(tmp_path, preallocate_bytes=0)
    assert harness.journal.applied_position == JournalPosition(1, FILE_HEADER_SIZE)
    previous = harness.journal.applied_position
    for entry_id in range(10):
        await harness.add(1, entry_id, payload_size=100 * entry_id)
        position = harness.journal.applied_position
        assert position == JournalPosition(1, os.path.getsize(tmp_path / journal_file_name(1)))
        assert position > previous
        previous = position


# --- rotation ----------------------------------------------------------------------------------

ROTATING = dict(file_bytes_max=1 * MIB, group_bytes_max=64 * KIB, queue_bytes_max=4 * MIB)
CHUNK_RECORDS = 8
PAYLOAD_BYTES = 30 * KIB


async def _write_chunks(harness: Harness, chunks: int, first_entry_id: int = 0) -> list[tuple[int, int]]:
    """Appends ``chunks`` bursts of CHUNK_RECORDS records (awaiting each burst)."""
    written = []
    entry_id = first_entry_id
    for _ in range(chunks):
        futures = []
        for _ in range(CHUNK_RECORDS):
            futures.append(harness.add(9, entry_id, PAYLOAD_BYTES))
            written.append((9, entry_id))
            entry_id += 1
        await asyncio.gather(*futures)
    return written


async def test_files_rotate_at_file_bytes_max(tmp_path, harnesses):
    """About 3 MiB through a 1 MiB journal: several files, each but the last at least
    file_bytes_max and past it by less than one group, each with its own header, and
    replay reads them all in order."""
    harness = harnesses(tmp_path, **ROTATING)
    written = await _write_chunks(harness, 13)
    await harness.stop()
    ids = list_journal_ids(str(tmp_path))
    assert ids == list(range(1, len(ids) + 1))
    assert len(ids) >= 3
    assert harness.journal.current_journal_id == ids[-1]
    group_bytes_most = CHUNK_RECORDS * (PAYLOAD_BYTES + 64 + 9)
    for journal_id in ids:
        path = tmp_path / journal_file_name(journal_id)
        assert decode_file_header(path.read_bytes()[:FILE_HEADER_SIZE], JOURNAL_MAGIC) == journal_id
        if journal_id != ids[-1]:
            size = path.stat().st_size
            assert ROTATING["file_bytes_max"] <= size < ROTATING["file_bytes_max"] + group_bytes_most
    assert _replayed(tmp_path) == written


# --- replay from a checkpoint -----------------------------------------------------------------

@pytest.mark.parametrize("overrides, chunks", [({}, 3), (ROTATING, 10)], ids=["one-file", "rotating"])
async def test_replay_from_a_checkpoint_yields_exactly_the_later_records(tmp_path, harnesses, overrides, chunks):
    """Take applied_position after some acknowledged records (as a checkpoint does),
    write more, then replay from that position: exactly the later records come back
    (across file rotation too); replay from None gives everything."""
    harness = harnesses(tmp_path, **overrides)
    before = await _write_chunks(harness, chunks)
    checkpoint = harness.journal.applied_position
    after = await _write_chunks(harness, chunks, first_entry_id=len(before))
    end = harness.journal.applied_position
    await harness.stop()
    assert _replayed(tmp_path, checkpoint) == after
    assert _replayed(tmp_path, None) == before + after
    assert _replayed(tmp_path, end) == []
    if overrides:
        assert end.journal_id > checkpoint.journal_id


async def test_replay_after_trimmed_files_starts_at_the_checkpoint_file(tmp_path, harnesses):
    """Files before the checkpoint's file are ignored even if still present."""
    harness = harnesses(tmp_path, **ROTATING)
    await _write_chunks(harness, 10)
    await harness.stop()
    ids = list_journal_ids(str(tmp_path))
    start = JournalPosition(ids[-1], FILE_HEADER_SIZE)
    last_file_records = [entry_ids(record.entry) for journal_id, record in replay_journal(str(tmp_path), None)
                         if journal_id == ids[-1]]
    assert _replayed(tmp_path, start) == last_file_records


# --- torn tails and damage --------------------------------------------------------------------

async def _journal_with_records(tmp_path, harnesses, count: int = 6) -> tuple[str, list[int]]:
    """Writes ``count`` acknowledged records into journal 1; returns its path and the
    end offset of each record."""
    harness = harnesses(tmp_path)
    ends = []
    for entry_id in range(count):
        await harness.add(1, entry_id, payload_size=200)
        ends.append(harness.journal.applied_position.offset)
    await harness.stop()
    return str(tmp_path / journal_file_name(1)), ends


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 60, 150, "all-but-head"])
async def test_a_torn_last_record_is_not_replayed(tmp_path, harnesses, cut):
    """Truncating the file inside its last record (a crash mid-write) drops exactly
    that record; the ones before it replay intact."""
    path, ends = await _journal_with_records(tmp_path, harnesses)
    record_size = ends[-1] - ends[-2]
    keep = ends[-2] + (8 if cut == "all-but-head" else record_size - cut)
    os.truncate(path, keep)
    assert _replayed(tmp_path) == [(1, e) for e in range(5)]


async def test_zero_fill_after_the_last_record_is_ignored(tmp_path, harnesses):
    """Zeroed space after the written data (an extended file) ends replay quietly."""
    path, _ends = await _journal_with_records(tmp_path, harnesses)
    with open(path, "ab") as handle:
        handle.write(b"\x00" * 8192)
    assert _replayed(tmp_path) == [(1, e) for e in range(6)]


@pytest.mark.parametrize("damaged_record", [0, 2, 5])
async def test_a_crc_mismatch_stops_replay_of_that_file(tmp_path, harnesses, damaged_record):
    """A flipped byte inside record k: replay yields records 0..k-1 and nothing after."""
    path, ends = await _journal_with_records(tmp_path, harnesses)
    start = FILE_HEADER_SIZE if damaged_record == 0 else ends[damaged_record - 1]
    with open(path, "r+b") as handle:
        handle.seek(start + 100)
        byte = handle.read(1)
        handle.seek(start + 100)
        handle.write(bytes([byte[0] ^ 0x40]))
    assert _replayed(tmp_path) == [(1, e) for e in range(damaged_record)]


async def test_replay_continues_in_the_next_journal_after_a_torn_file(tmp_path, harnesses):
    """A crash leaves journal 1 torn; the restarted bookie writes journal 2. Replay
    yields the intact records of 1, then all of 2."""
    path, ends = await _journal_with_records(tmp_path, harnesses)
    os.truncate(path, ends[-1] - 3)
    restarted = harnesses(tmp_path, first_journal_id=2)
    await asyncio.gather(*(restarted.add(2, e) for e in range(3)))
    await restarted.stop()
    assert _replayed(tmp_path) == [(1, e) for e in range(5)] + [(2, e) for e in range(3)]


async def test_replay_skips_a_file_shorter_than_its_header(tmp_path):
    """A journal file created but not even headed (crash at creation) is skipped."""
    (tmp_path / journal_file_name(1)).write_bytes(encode_file_header(JOURNAL_MAGIC, 1)[:10])
    (tmp_path / journal_file_name(2)).write_bytes(encode_file_header(JOURNAL_MAGIC, 2)
                                                  + b"".join(journal_add_record(_entry(3, 0))))
    assert _replayed(tmp_path) == [(3, 0)]


async def test_replay_refuses_a_file_whose_header_names_another_id(tmp_path):
    """A file whose header disagrees with its name is not silently replayed."""
    (tmp_path / journal_file_name(1)).write_bytes(encode_file_header(JOURNAL_MAGIC, 7))
    with pytest.raises(MalformedFrame):
        _replayed(tmp_path)


async def test_replay_of_an_empty_directory_yields_nothing(tmp_path):
    """A fresh bookie has nothing to replay."""
    assert _replayed(tmp_path) == []
    assert _replayed(tmp_path, JournalPosition(5, 100)) == []


# --- trim -----------------------------------------------------------------------------------------

async def test_trim_removes_only_files_wholly_before_the_position(tmp_path, harnesses):
    """Files with a smaller id than the position's go; the position's own file (partly
    after the position) and later ones stay."""
    harness = harnesses(tmp_path, **ROTATING)
    await _write_chunks(harness, 18)
    ids = list_journal_ids(str(tmp_path))
    assert len(ids) >= 4
    assert harness.journal.trim(JournalPosition(ids[0], 10**9)) == 0
    assert list_journal_ids(str(tmp_path)) == ids
    assert harness.journal.trim(JournalPosition(ids[2], FILE_HEADER_SIZE + 1)) == 2
    assert list_journal_ids(str(tmp_path)) == ids[2:]
    assert harness.journal.trim(JournalPosition(ids[2], FILE_HEADER_SIZE + 1)) == 0


async def test_trim_never_removes_the_current_file(tmp_path, harnesses):
    """Even a position past the current file leaves the file being written."""
    harness = harnesses(tmp_path, **ROTATING)
    await _write_chunks(harness, 6)
    current = harness.journal.current_journal_id
    harness.journal.trim(JournalPosition(current + 5, 0))
    assert list_journal_ids(str(tmp_path)) == [current]
    await harness.add(9, 10_000)
    await harness.stop()
    assert _replayed(tmp_path)[-1] == (9, 10_000)


# --- shut-down, failure, back-pressure ---------------------------------------------------------

async def test_close_writes_pending_records_then_refuses_appends(tmp_path, harnesses):
    """Records appended before close are written and acknowledged; later appends
    raise ShuttingDown."""
    harness = harnesses(tmp_path)
    futures = [harness.add(1, e) for e in range(3)]
    await harness.journal.close()
    with pytest.raises(ShuttingDown):
        harness.add(1, 3)
    await asyncio.wait_for(harness.task, 5)
    assert all(f.done() and f.exception() is None for f in futures)
    await harness.stop()
    assert _replayed(tmp_path) == [(1, 0), (1, 1), (1, 2)]


async def test_write_error_fails_pending_and_later_appends(tmp_path, harnesses, monkeypatch):
    """An OSError from the write fails the group's futures with BookieStorageError,
    stops the writer, and every later append raises the same error."""
    def failing_pwritev(fd, buffers, offset, flags=0):
        raise OSError(28, "No space left on device")

    harness = harnesses(tmp_path)
    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    future = harness.add(1, 0)
    with pytest.raises(BookieStorageError):
        await asyncio.wait_for(future, 5)
    await asyncio.wait_for(harness.task, 5)
    assert isinstance(harness.journal.failed, BookieStorageError)
    assert harness.groups == []
    with pytest.raises(BookieStorageError):
        harness.add(1, 1)


async def test_wait_for_room_blocks_while_the_queue_is_full(tmp_path, harnesses, fsync_gate):
    """With queue_bytes_max queued and not yet written, wait_for_room times out; once
    the group is written it returns. An empty queue admits any size."""
    gate, _synced, _entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True, group_bytes_max=64 * KIB, queue_bytes_max=64 * KIB)
    await harness.journal.wait_for_room(10 * MIB, timeout_s=0.5)      # empty queue
    future = harness.add(1, 0, payload_size=64 * KIB)
    with pytest.raises(TimeoutError):
        await harness.journal.wait_for_room(1, timeout_s=0.05)
    gate.set()
    await asyncio.wait_for(future, 5)
    await harness.journal.wait_for_room(1, timeout_s=0.5)


# --- start_now: a writer told that what arrived together is queued ---------------------------

async def test_start_now_hands_the_queued_appends_to_the_io_thread_at_once(tmp_path, harnesses, fsync_gate):
    """On an idle writer, start_now takes what is queued as one group before returning
    (no loop turn): an append made after it in the same turn forms the next group, while
    without start_now the same three appends are one group (the burst test above)."""
    gate, _synced, entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True)
    await asyncio.sleep(0)      # the writer task reaches its idle wait
    first = [harness.add(1, 0), harness.add(1, 1)]
    harness.journal.start_now()
    later = harness.add(1, 2)
    assert await asyncio.to_thread(entered.wait, 5)     # the first group is in its fsync
    gate.set()
    await asyncio.wait_for(asyncio.gather(*first, later), 5)
    assert harness.groups == [[(1, 0), (1, 1)], [(1, 2)]]
    assert _replayed(tmp_path) == [(1, 0), (1, 1), (1, 2)]


async def test_start_now_leaves_a_busy_writer_and_a_linger_alone(tmp_path, harnesses, fsync_gate):
    """While a group is in its fsync, start_now starts nothing (the appends queued then
    form the next group as before); with group_wait_ms_max set it never starts one."""
    gate, _synced, entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True)
    first = harness.add(1, 0)
    assert await asyncio.to_thread(entered.wait, 5)
    queued = [harness.add(1, entry_id) for entry_id in (1, 2)]
    harness.journal.start_now()
    harness.journal.start_now()
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), 5)
    assert harness.groups == [[(1, 0)], [(1, 1), (1, 2)]]

    lingering = harnesses(tmp_path / "linger", group_wait_ms_max=50)
    await asyncio.sleep(0)
    one = lingering.add(2, 0)
    lingering.journal.start_now()
    await asyncio.sleep(0.01)
    two = lingering.add(2, 1)       # within the linger: joins the first group
    await asyncio.wait_for(asyncio.gather(one, two), 5)
    assert lingering.groups == [[(2, 0), (2, 1)]]


async def test_a_group_started_by_start_now_is_cancelled_with_the_writer(tmp_path, harnesses, fsync_gate):
    """Cancelling the writer while a start_now group is in its fsync acknowledges nothing
    more, as when the writer loop started the group itself."""
    gate, _synced, entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True)
    await asyncio.sleep(0)
    future = harness.add(1, 0)
    harness.journal.start_now()
    assert await asyncio.to_thread(entered.wait, 5)
    harness.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await harness.task
    gate.set()
    await asyncio.sleep(0.05)
    assert not future.done()
    assert harness.groups == []


class _CountingEvent(asyncio.Event):
    """An asyncio.Event that counts the waits begun on it (the writer loop's idle waits)."""

    waits = 0

    async def wait(self) -> bool:
        self.waits += 1
        return await super().wait()


async def test_held_appends_wait_for_start_now_and_an_idle_writer_is_never_woken(tmp_path, harnesses):
    """Under hold_start an append does not wake the writer loop: turns pass and nothing
    is written until start_now. A group start_now starts on an idle writer is
    acknowledged by its completion alone: over three such rounds the writer loop begins
    one idle wait and is never woken out of it (each round used to cost it two turns),
    and every add is durable and replayed in order."""
    harness = harnesses(tmp_path, fsync_enabled=True)
    journal = harness.journal
    event = journal._pending_event = _CountingEvent()
    await asyncio.sleep(0)      # the writer task reaches its idle wait
    assert event.waits == 1
    for round_index in range(3):
        assert journal.hold_start() is True
        assert journal.hold_start() is False
        futures = [harness.add(1, 2 * round_index), harness.add(1, 2 * round_index + 1)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(harness.groups) == round_index and not any(f.done() for f in futures)
        journal.start_now()
        await asyncio.wait_for(asyncio.gather(*futures), 5)
        await asyncio.sleep(0)
        assert journal._in_flight is None and journal._idle
    assert event.waits == 1
    assert harness.groups == [[(1, 0), (1, 1)], [(1, 2), (1, 3)], [(1, 4), (1, 5)]]
    assert _replayed(tmp_path) == [(1, entry_id) for entry_id in range(6)]


async def test_start_now_under_a_hold_on_a_busy_writer_wakes_it_for_the_next_group(tmp_path, harnesses, fsync_gate):
    """A hold ended by start_now while a group is in its fsync starts nothing: the held
    appends wake the writer loop then (as their appends would have), and form the next
    group once the first is durable."""
    gate, _synced, entered = fsync_gate
    harness = harnesses(tmp_path, fsync_enabled=True)
    first = harness.add(1, 0)
    assert await asyncio.to_thread(entered.wait, 5)
    harness.journal.hold_start()
    queued = [harness.add(1, 1), harness.add(1, 2)]
    harness.journal.start_now()
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), 5)
    assert harness.groups == [[(1, 0)], [(1, 1), (1, 2)]]


async def test_a_failed_group_started_on_an_idle_writer_stops_the_writer(tmp_path, harnesses, monkeypatch):
    """An fdatasync failure in a group start_now started while the writer loop waited
    idle wakes the loop, which fails the journal and ends, as when it started the group
    itself: nothing is acknowledged, later appends are refused."""
    harness = harnesses(tmp_path, fsync_enabled=True)
    await asyncio.sleep(0)

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    harness.journal.hold_start()
    future = harness.add(1, 0)
    harness.journal.start_now()
    with pytest.raises(BookieStorageError):
        await asyncio.wait_for(future, 5)
    await asyncio.wait_for(harness.task, 5)
    assert isinstance(harness.journal.failed, BookieStorageError)
    assert harness.groups == []
    with pytest.raises(BookieStorageError):
        harness.add(1, 1)


# --- space allocated ahead of the writes ------------------------------------------------------

async def test_space_is_allocated_ahead_in_steps_and_replay_stops_at_the_zeros(tmp_path, harnesses, caplog):
    """With preallocate_bytes, the file is allocated a step at a time ahead of the
    writes (a group larger than a step gets enough whole steps), the fdatasync of the
    groups is not what grows it, applied_position stays the end of the written records,
    and replay yields exactly the records and says nothing about the zeros after them."""
    step = 1 * MIB
    harness = harnesses(tmp_path, fsync_enabled=True, preallocate_bytes=step, file_bytes_max=64 * MIB)
    path = tmp_path / journal_file_name(1)
    await harness.add(1, 0)
    assert os.path.getsize(path) == FILE_HEADER_SIZE + step
    written_end = harness.journal.applied_position.offset
    assert written_end == FILE_HEADER_SIZE + len(b"".join(journal_add_record(_entry(1, 0))))
    await asyncio.gather(*(harness.add(1, entry_id, payload_size=200 * KIB) for entry_id in range(1, 9)))
    assert os.path.getsize(path) == FILE_HEADER_SIZE + 2 * step        # 1.6 MiB written: two steps
    big = harness.add(1, 9, payload_size=3 * MIB)
    await big
    end = harness.journal.applied_position.offset
    assert 3 * MIB < end - FILE_HEADER_SIZE <= 5 * MIB
    assert os.path.getsize(path) == FILE_HEADER_SIZE + 5 * step        # whole steps past the end
    assert harness.journal.stats.preallocation_failures == 0
    await harness.stop()
    caplog.clear()
    with caplog.at_level("INFO", logger="bookie.journal"):
        assert _replayed(tmp_path) == [(1, e) for e in range(10)]
    assert "stopped before file end" not in caplog.text


async def test_a_torn_record_in_allocated_space_ends_replay_and_is_reported(tmp_path, harnesses, caplog):
    """Garbage after the last whole record inside allocated space (a torn write) stops
    replay there, and that one is reported, unlike plain zeros."""
    harness = harnesses(tmp_path, preallocate_bytes=1 * MIB)
    await asyncio.gather(*(harness.add(1, entry_id) for entry_id in range(3)))
    end = harness.journal.applied_position.offset
    await harness.stop()
    with open(tmp_path / journal_file_name(1), "r+b") as handle:
        handle.seek(end)
        handle.write(b"\x00\x00\x00\x40" + b"\xff" * 20)     # a record head whose body never made it
    with caplog.at_level("INFO", logger="bookie.journal"):
        assert _replayed(tmp_path) == [(1, 0), (1, 1), (1, 2)]
    assert "stopped before file end" in caplog.text


async def test_a_failed_allocation_leaves_the_file_growing_with_its_writes(tmp_path, harnesses, monkeypatch):
    """posix_fallocate failing (a full disk, a file system without it) is not a journal
    failure: it is counted, the file then grows with its writes, and the next file
    tries again."""
    calls: list[int] = []

    def refusing_fallocate(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", refusing_fallocate)
    harness = harnesses(tmp_path, preallocate_bytes=1 * MIB, file_bytes_max=1 * MIB, group_bytes_max=512 * KIB)
    await asyncio.gather(*(harness.add(1, entry_id) for entry_id in range(3)))
    await harness.add(1, 3, payload_size=200 * KIB)
    assert len(calls) == 1 and harness.journal.stats.preallocation_failures == 1
    assert os.path.getsize(tmp_path / journal_file_name(1)) == harness.journal.applied_position.offset
    # Past file_bytes_max: the next file allocates again (and fails again, counted).
    await asyncio.gather(*(harness.add(1, entry_id, payload_size=300 * KIB) for entry_id in range(4, 9)))
    assert harness.journal.current_journal_id > 1
    assert len(calls) >= 2 and harness.journal.stats.preallocation_failures == len(calls)
    await harness.stop()
    assert _replayed(tmp_path) == [(1, e) for e in range(9)]


async def test_a_failed_fsync_of_an_allocation_fails_the_journal(tmp_path, harnesses, monkeypatch):
    """Unlike a failed allocation, a failed fsync of one is the journal's failure (after
    a failed fsync nothing says what the file holds): the group fails with
    BookieStorageError, nothing is acknowledged, later appends are refused."""
    harness = harnesses(tmp_path, fsync_enabled=True, preallocate_bytes=1 * MIB)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if fd == harness.journal._fd:
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    future = harness.add(1, 0)
    with pytest.raises(BookieStorageError):
        await asyncio.wait_for(future, 5)
    await asyncio.wait_for(harness.task, 5)
    assert harness.groups == []
    with pytest.raises(BookieStorageError):
        harness.add(1, 1)
