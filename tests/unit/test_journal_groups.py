"""Journal group commit (bookie/journal.py): the bound on a group, the optional linger,
and the measurement of how long adds wait in the queue.

What it proves:
- ``group_bytes_max`` is a real bound: adds that queue while a group is in its fsync
  form the next groups, each at most ``group_bytes_max`` bytes of records (the old
  journal let them all join one group, up to ``queue_bytes_max``), in append order;
- one append larger than the bound is written alone, never merged with others;
- BookieNode cuts an add batch larger than a group into appends that fit, so a stream
  message of many entries never makes an oversized group, and the batch's future
  resolves only once every entry is durable (readable from storage);
- BookieConfig refuses a group_bytes_max that cannot hold the largest entry's record;
- ``group_wait_ms_max`` is a real timer: with it, an idle writer lingers for more adds
  (two adds 20 ms apart share a group), stops lingering as soon as a full group is
  queued, and with the default (0) nothing lingers;
- each record's wait in the queue (append → its group's write began) is recorded in
  ``stats.queue_wait``, weighted by records, and /metrics shows it as the histogram
  ``magnetar_bookie_journal_queue_wait_seconds`` with the largest group as a gauge.

How: real files in a temp directory, fsync off except where os.fdatasync is replaced by
a gate the test opens (so a group is held "inside" its fsync). Waits are measured with a
fake clock injected into the Journal (a dependency it takes), so the numbers are exact.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bookie.config import BookieConfig, JournalConfig, LedgerStorageConfig
from bookie.format import journal_add_record, journal_add_record_bytes
from bookie.journal import Journal
from bookie.ledger_storage_disk import DiskLedgerStorage
from bookie.metrics import BookieMetrics
from bookie.node import AddItem, BookieNode
from common.entry import encode_entry
from common.errors import ConfigError

KIB = 1024
MIB = 1024 * KIB


def _entry(ledger_id: int, entry_id: int, payload_size: int = 16) -> bytes:
    payload = bytes((ledger_id * 7 + entry_id + i) % 251 for i in range(payload_size))
    return encode_entry(ledger_id, entry_id, entry_id - 1, 10**9, payload)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Writer:
    """A journal with its writer task, recording each group (records, bytes)."""

    def __init__(self, journal_dir, clock=time.monotonic, **overrides) -> None:
        overrides.setdefault("fsync_enabled", False)
        self.groups: list[list[object]] = []
        self.group_bytes: list[int] = []
        self.journal = Journal(JournalConfig(journal_dir=str(journal_dir), **overrides),
                               on_durable=lambda tokens: self.groups.append(list(tokens)),
                               first_journal_id=1, clock=clock,
                               on_group_written=lambda _s, _records, size: self.group_bytes.append(size))
        self.journal.open()
        self.task = asyncio.get_running_loop().create_task(self.journal.run())

    def add(self, ledger_id: int, entry_id: int, payload_size: int = 16) -> asyncio.Future[None]:
        entry = _entry(ledger_id, entry_id, payload_size)
        return self.journal.append(journal_add_record(entry), len(entry), [(ledger_id, entry_id)])

    def add_batch(self, ledger_id: int, entry_ids: range, payload_size: int = 16) -> asyncio.Future[None]:
        buffers: list[bytes] = []
        size = 0
        for entry_id in entry_ids:
            entry = _entry(ledger_id, entry_id, payload_size)
            buffers.extend(journal_add_record(entry))
            size += len(entry)
        return self.journal.append(buffers, size, [(ledger_id, e) for e in entry_ids])

    async def stop(self) -> None:
        if not self.task.done():
            await self.journal.close()
        await asyncio.wait_for(asyncio.gather(self.task, return_exceptions=True), 5)
        self.journal.close_file()


@pytest.fixture
async def writers():
    started: list[Writer] = []

    def start(journal_dir, **kwargs) -> Writer:
        started.append(Writer(journal_dir, **kwargs))
        return started[-1]

    yield start
    for writer in started:
        await writer.stop()


@pytest.fixture
def fsync_gate(monkeypatch):
    """os.fdatasync blocks until the test sets ``gate``; ``entered`` is set (and must
    be cleared by the test to see the next one) when the writer is inside it."""
    gate = threading.Event()
    entered = threading.Event()

    def fake_fdatasync(fd: int) -> None:
        entered.set()
        gate.wait(5)

    monkeypatch.setattr(os, "fdatasync", fake_fdatasync)
    yield gate, entered
    gate.set()


# --- the bound on a group ---------------------------------------------------------------------

async def test_adds_queued_during_an_fsync_form_groups_within_the_bound(tmp_path, writers, fsync_gate):
    """64 KiB groups; while the first group is held in its fsync, 40 adds of 4 KiB
    (about 160 KiB) queue. After the fsync they are written as several groups, each at
    most 64 KiB of records and as full as the next add allows, in append order."""
    gate, entered = fsync_gate
    group_bytes_max = 64 * KIB
    writer = writers(tmp_path, fsync_enabled=True, group_bytes_max=group_bytes_max, queue_bytes_max=MIB)
    first = writer.add(1, 0)
    assert await asyncio.to_thread(entered.wait, 5)
    later = [writer.add(1, entry_id, payload_size=4 * KIB) for entry_id in range(1, 41)]
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 5)
    record_bytes = journal_add_record_bytes(len(_entry(1, 1, 4 * KIB)))
    per_group = group_bytes_max // record_bytes
    assert writer.groups[0] == [(1, 0)]
    assert [len(group) for group in writer.groups[1:]] == [per_group] * (40 // per_group) + (
        [40 % per_group] if 40 % per_group else [])
    assert max(writer.group_bytes) <= group_bytes_max
    assert writer.journal.stats.group_bytes_largest == max(writer.group_bytes) == per_group * record_bytes
    assert [token for group in writer.groups for token in group] == [(1, e) for e in range(41)]


async def test_a_burst_larger_than_a_group_is_cut_at_the_bound(tmp_path, writers):
    """300 adds of 1 KiB appended without yielding (one burst) with 64 KiB groups: the
    writer takes them in groups within the bound, not as one 300 KiB write."""
    writer = writers(tmp_path, group_bytes_max=64 * KIB, queue_bytes_max=MIB)
    futures = [writer.add(2, entry_id, payload_size=KIB) for entry_id in range(300)]
    await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert len(writer.groups) >= 300 * KIB // (64 * KIB)
    assert max(writer.group_bytes) <= 64 * KIB
    assert writer.journal.stats.records_written == 300
    assert writer.journal.stats.bytes_written == sum(writer.group_bytes)


async def test_an_append_larger_than_the_bound_is_written_alone(tmp_path, writers, fsync_gate):
    """A 100 KiB batch between small adds, with 64 KiB groups: the batch is a group of
    its own (an append is never split: its records share one future), and the small
    adds around it are not merged into it."""
    gate, entered = fsync_gate
    writer = writers(tmp_path, fsync_enabled=True, group_bytes_max=64 * KIB, queue_bytes_max=MIB)
    first = writer.add(3, 0)
    assert await asyncio.to_thread(entered.wait, 5)
    before = writer.add(3, 1)
    batch = writer.add_batch(3, range(2, 12), payload_size=10 * KIB)
    after = writer.add(3, 12)
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, before, batch, after), 5)
    assert writer.groups == [[(3, 0)], [(3, 1)], [(3, e) for e in range(2, 12)], [(3, 12)]]
    assert writer.group_bytes[2] > 64 * KIB
    assert all(size <= 64 * KIB for index, size in enumerate(writer.group_bytes) if index != 2)


async def test_the_node_cuts_a_large_add_batch_into_groups_that_fit(tmp_path):
    """BookieNode.submit_adds with 20 entries of 6 KiB and 32 KiB groups: every group
    is within the bound, and when the batch's one future resolves all 20 entries are
    readable (durable) from ledger storage."""
    config = BookieConfig(
        metadata_url="memory://",
        journal=JournalConfig(journal_dir=str(tmp_path / "journal"), fsync_enabled=False,
                              group_bytes_max=32 * KIB, queue_bytes_max=MIB),
        storage=LedgerStorageConfig(ledger_dirs=(str(tmp_path / "ledgers"),), write_cache_bytes_max=MIB,
                                    entry_bytes_max=8 * KIB, entry_log_bytes_max=MIB),
    )
    storage = DiskLedgerStorage(config.storage, read_threads=1, fsync_enabled=False)
    node = BookieNode(config, storage, "bookie-1")
    node.open()
    assert node.journal is not None
    group_bytes: list[int] = []
    node.journal.on_group_written = lambda _s, _records, size: group_bytes.append(size)
    writer = asyncio.get_running_loop().create_task(node.journal.run())
    try:
        items = [AddItem(5, entry_id, _entry(5, entry_id, 6 * KIB)) for entry_id in range(20)]
        await node.admit(items)
        outcomes, future = node.submit_adds(items)
        assert outcomes == [None] * 20
        assert future is not None
        await asyncio.wait_for(future, 5)
        readable = await storage.read_entries(5, list(range(20)), 4 * MIB)
        assert [outcome.entry for outcome in readable] == [item.entry for item in items]
        assert len(group_bytes) >= 4
        assert max(group_bytes) <= 32 * KIB
    finally:
        await node.close()
        await asyncio.wait_for(asyncio.gather(writer, return_exceptions=True), 5)
        node.journal.close_file()
        await storage.close()


def test_the_config_refuses_a_group_smaller_than_the_largest_entry():
    """A group must hold the record of an entry of entry_bytes_max, else the largest
    add would exceed the bound; the default group (8 MiB) holds the default entry."""
    storage = LedgerStorageConfig(ledger_dirs=("/d",), entry_bytes_max=64 * KIB)
    with pytest.raises(ConfigError, match="group_bytes_max"):
        BookieConfig(metadata_url="memory://", journal=JournalConfig(journal_dir="/j", group_bytes_max=64 * KIB),
                     storage=storage)
    BookieConfig(metadata_url="memory://", storage=storage,
                 journal=JournalConfig(journal_dir="/j", group_bytes_max=journal_add_record_bytes(64 * KIB)))
    BookieConfig(metadata_url="memory://", journal=JournalConfig(journal_dir="/j"),
                 storage=LedgerStorageConfig(ledger_dirs=("/d",)))


# --- the linger timer ---------------------------------------------------------------------------

async def test_group_wait_ms_max_lingers_for_more_adds(tmp_path, writers):
    """With a 1 s linger, an add 20 ms after the first joins its group: one group,
    and the first add is not acknowledged before the second arrived."""
    writer = writers(tmp_path, group_wait_ms_max=1000)
    first = writer.add(6, 0)
    await asyncio.sleep(0.02)
    assert not first.done()
    second = writer.add(6, 1)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert writer.groups == [[(6, 0), (6, 1)]]


async def test_the_linger_ends_once_a_full_group_is_queued(tmp_path, writers):
    """With a 1 s linger (the longest allowed) and groups of exactly four 4 KiB adds,
    four adds are written as soon as the fourth arrives: the linger never holds a full group. The first add
    alone would wait out the linger; it completes together with the fourth, so the
    group was written at the fourth's arrival, not at the timer."""
    record_bytes = journal_add_record_bytes(len(_entry(7, 0, 4 * KIB)))
    writer = writers(tmp_path, group_wait_ms_max=1000, group_bytes_max=4 * record_bytes, queue_bytes_max=MIB)
    first = writer.add(7, 0, payload_size=4 * KIB)
    await asyncio.sleep(0.01)
    rest = [writer.add(7, entry_id, payload_size=4 * KIB) for entry_id in range(1, 4)]
    full_at = time.monotonic()
    await asyncio.wait_for(asyncio.gather(first, *rest), 20)
    assert time.monotonic() - full_at < 0.9   # the linger would have held it about 1 s
    assert writer.group_bytes == [4 * record_bytes]


async def test_without_a_linger_an_idle_writer_writes_at_once(tmp_path, writers):
    """The default group_wait_ms_max is 0: a lone add is acknowledged without waiting
    for company (well within the 1 s linger of the test above), so an add made after it
    is another group."""
    writer = writers(tmp_path)
    assert writer.journal.config.group_wait_ms_max == 0
    started = time.monotonic()
    await asyncio.wait_for(writer.add(8, 0), 20)
    assert time.monotonic() - started < 5.0
    await asyncio.wait_for(writer.add(8, 1), 5)
    assert writer.groups == [[(8, 0)], [(8, 1)]]


# --- queue waits ------------------------------------------------------------------------------

async def test_each_record_s_queue_wait_is_recorded(tmp_path, writers, fsync_gate):
    """Fake clock: an add at t=0 is written at once (waited 0); while it is in its
    fsync a batch of 3 records arrives at t=0.5 and one add at t=0.75; after the fsync
    (still t=0.75) they are written together: the batch's 3 records waited 0.25 s,
    the add 0. The histogram counts records (5), sums 0.75 s, and its maximum is 0.25."""
    gate, entered = fsync_gate
    clock = FakeClock(1000.0)
    writer = writers(tmp_path, clock=clock, fsync_enabled=True)
    first = writer.add(9, 0)
    assert await asyncio.to_thread(entered.wait, 5)
    clock.now = 1000.5
    batch = writer.add_batch(9, range(1, 4))
    clock.now = 1000.75
    last = writer.add(9, 4)
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, batch, last), 5)
    assert writer.groups == [[(9, 0)], [(9, 1), (9, 2), (9, 3), (9, 4)]]
    queue_wait = writer.journal.stats.queue_wait
    assert queue_wait.count == 5
    assert queue_wait.sum == pytest.approx(0.75)
    assert queue_wait.max == pytest.approx(0.25)
    cumulative = dict(queue_wait.cumulative())
    assert cumulative["0.00025"] == 2
    assert cumulative["0.1"] == 2
    assert cumulative["0.25"] == 5
    assert cumulative["+Inf"] == 5


async def test_metrics_show_the_queue_wait_histogram_and_the_largest_group(tmp_path, writers, fsync_gate):
    """/metrics exposes the journal's queue waits as a histogram (buckets, count, sum)
    and the largest group written as a gauge."""
    gate, entered = fsync_gate
    clock = FakeClock(50.0)
    writer = writers(tmp_path, clock=clock, fsync_enabled=True)
    first = writer.add(10, 0)
    assert await asyncio.to_thread(entered.wait, 5)
    second = writer.add(10, 1)
    clock.now = 50.004
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)

    class _Node:
        journal = writer.journal
        read_only = False
        disk_usage = None

        class storage:
            @staticmethod
            def stats():
                from bookie.ledger_storage import StorageStats
                return StorageStats(*[0] * 10)

    registry = CollectorRegistry()
    BookieMetrics(_Node(), registry)      # type: ignore[arg-type]
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("le"))] = sample.value
    assert samples[("magnetar_bookie_journal_queue_wait_seconds_count", None)] == 2
    assert samples[("magnetar_bookie_journal_queue_wait_seconds_sum", None)] == pytest.approx(0.004)
    assert samples[("magnetar_bookie_journal_queue_wait_seconds_bucket", "0.003")] == 1
    assert samples[("magnetar_bookie_journal_queue_wait_seconds_bucket", "0.005")] == 2
    assert samples[("magnetar_bookie_journal_group_bytes_largest", None)] == max(writer.group_bytes)
    assert samples[("magnetar_bookie_journal_queue_wait_seconds_max", None)] == pytest.approx(0.004)
