"""The managed ledger (managed_ledger/managed_ledger.py) and its record
(managed_ledger/managed_ledger_info.py): termination, refused entries, failed ledger closes,
close times, cache-miss reads, and the end position.

What it proves: appends that arrive while a termination waits for pending appends are
refused with TopicTerminated, so nothing is acknowledged past the terminated position,
which a reload finds again; an entry the ledger client refuses as too large fails only
its own append, in append order, without creating ledgers, while a handle that
failed and repeats that error to every entry is rolled over; appends in flight on a
ledger that fails are stored in the next one, in order, before later appends, and fail
together in order only after several ledgers failed in a row; a rolled-over ledger whose
close fails is recorded with what its handle confirmed and no longer counts as open
(trimming can delete it); a closed ledger's close time is recorded and survives the
record's encoding, and records written before it existed read a closed ledger's
creation time instead; a run of cache misses reads about the byte budget from the
bookies, not a fixed 500 entries (from a closed ledger's known sizes, and from the
mean of entries seen for an open one); ``end_position`` is where a reader starting at
the end reads next; confirmed appends wake the waiting readers before their receipts
settle (in append order).

How: a real ManagedLedger over the in-memory metadata store (metadata/memory_store.py,
the etcd edge) and FakeLedgerClient (the ledger-client edge), driven with
asyncio under a timeout.
"""

from __future__ import annotations

import asyncio

import pytest

import managed_ledger.managed_ledger as managed_ledger_module
from managed_ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from managed_ledger.managed_ledger_info import LedgerInfo, ManagedLedgerInfo
from runtime.eager_future import call_when_done
from common.position import Position
from common.topic_name import TopicName
from common.entry_cache import EntryCache
from common.errors import EntryTooLarge, LedgerError, PersistenceError, TopicTerminated
from metadata.memory_store import MemoryStore
from tests.unit.fake_ledger_client import FakeLedgerClient

KIB = 1024
MIB = 1024 * KIB
TOPIC = TopicName.parse("persistent://public/default/managed")
TIMEOUT_S = 5.0


def config(**overrides) -> ManagedLedgerConfig:
    return ManagedLedgerConfig(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, **overrides)


async def opened(store: MemoryStore, client: FakeLedgerClient, *, cache_bytes: int = 64 * MIB,
                 **overrides) -> ManagedLedger:
    ledger = ManagedLedger(TOPIC, store, client, EntryCache(cache_bytes), config(**overrides))
    await ledger.open(create_if_missing=True)
    return ledger


async def until(condition, what: str) -> None:
    """Lets the loop run until ``condition()`` holds (failing after TIMEOUT_S)."""
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():
            await asyncio.sleep(0.001)
    assert condition(), what


async def test_appends_during_termination_are_refused_and_reload_keeps_the_position():
    """An append accepted before terminate() completes first and is the terminated
    position; one arriving while terminate() waits for it is refused with
    TopicTerminated (before the fix it was accepted and acknowledged past the recorded
    position). A reload finds the same last position and the topic terminated."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    client.hold_adds = True
    before = ledger.append(b"before")
    terminating = asyncio.get_running_loop().create_task(ledger.terminate())
    await asyncio.sleep(0)   # terminate() is now waiting for "before"
    assert not terminating.done()
    during = ledger.append(b"during")
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        terminated_at = await terminating
        first = await before
    with pytest.raises(TopicTerminated):
        await during
    assert first == terminated_at
    assert ledger.last_confirmed == terminated_at
    with pytest.raises(TopicTerminated):
        await ledger.append(b"after")
    assert await ledger.terminate() == terminated_at   # again: same answer
    await ledger.close()

    reloaded = await opened(store, client)
    assert reloaded.terminated
    assert reloaded.last_confirmed == terminated_at
    entries = await reloaded.read(Position(-1, 0), 10, MIB)
    assert [bytes(e.data) for e in entries] == [b"before"]
    await reloaded.close()


async def test_concurrent_terminations_share_one():
    """Two terminate() calls while an append is pending return the same position and
    write the record once."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    client.hold_adds = True
    pending = ledger.append(b"x")
    first = asyncio.get_running_loop().create_task(ledger.terminate())
    second = asyncio.get_running_loop().create_task(ledger.terminate())
    await asyncio.sleep(0)
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        results = await asyncio.gather(first, second)
    assert results[0] == results[1] == await pending
    await ledger.close()


async def test_oversized_entry_fails_only_its_append_without_rolling_over():
    """EntryTooLarge from submit_nowait fails that append alone: no new ledger is
    created (before the fix the managed ledger rolled over and retried forever), the
    current ledger keeps taking appends, and the failure comes in append order: after
    the receipt of the append before it."""
    store, client = MemoryStore(), FakeLedgerClient()
    client.config.entry_bytes_max = 64 * KIB
    ledger = await opened(store, client)
    assert client.created == 1
    ledger_id = ledger.current_ledger_id
    client.hold_adds = True
    small = ledger.append(b"small")
    big = ledger.append(b"x" * (64 * KIB))
    await asyncio.sleep(0.01)
    assert not small.done()
    assert not big.done(), "the refusal waits for the append before it"
    order: list[str] = []
    small.add_done_callback(lambda _f: order.append("small"))
    big.add_done_callback(lambda _f: order.append("big"))
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        assert await small == Position(ledger_id, 0)
        with pytest.raises(EntryTooLarge):
            await big
        after = await ledger.append(b"after")
    assert order == ["small", "big"]
    assert after == Position(ledger_id, 1)
    assert client.created == 1
    assert ledger.current_ledger_id == ledger_id
    await ledger.close()


async def test_a_handle_failed_by_a_refused_entry_still_rolls_over():
    """A handle that failed because a bookie refused an entry repeats EntryTooLarge to
    every later submit; that is a failed ledger, not an invalid entry: the next small
    append is stored in a new ledger rather than refused."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    old_id = ledger.current_ledger_id
    client.handles[old_id].fail(EntryTooLarge(10 * MIB, 5 * MIB))
    async with asyncio.timeout(TIMEOUT_S):
        position = await ledger.append(b"small")
    assert position.ledger_id != old_id
    assert position.entry_id == 0
    assert client.created == 2
    await ledger.close()


async def test_appends_in_flight_on_a_failed_ledger_go_first_to_the_next():
    """A ledger that fails (a bookie gone, no ensemble change possible) with appends in
    flight: they are stored in the next ledger, in append order, before the appends
    that came after the failure (the bug: they failed, the later ones went on to the
    next ledger, and the producer's client sent the failed one again after them — a
    failover consumer got message n+1 before n; found by the hosts harness)."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    old_id = ledger.current_ledger_id
    client.hold_adds = True
    first, second = ledger.append(b"first"), ledger.append(b"second")
    await asyncio.sleep(0)
    client.handles[old_id].fail(LedgerError("bookie unavailable"))
    third = ledger.append(b"third")
    client.hold_adds = False
    async with asyncio.timeout(TIMEOUT_S):
        positions = [await first, await second, await third]
    new_id = ledger.current_ledger_id
    assert positions == [Position(new_id, 0), Position(new_id, 1), Position(new_id, 2)]
    await ledger.close()


async def test_appends_failing_on_every_ledger_fail_together_in_order():
    """Past WRITE_ATTEMPTS_MAX ledgers failing in a row, an append fails, and every
    append behind it with it, in append order: none is stored after one that failed."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    client.hold_adds = True
    appends = [ledger.append(f"m{i}".encode()) for i in range(3)]
    order: list[int] = []
    for index, future in enumerate(appends):
        call_when_done(future, lambda _f, index=index: order.append(index))
    failed: set[int] = set()
    async with asyncio.timeout(TIMEOUT_S):
        while not all(future.done() for future in appends):
            current = ledger.current_ledger_id
            if current != -1 and current not in failed and client.handles[current]._pending:
                failed.add(current)
                client.handles[current].fail(LedgerError("bookie unavailable"))
            await asyncio.sleep(0.001)
    assert len(failed) == managed_ledger_module.WRITE_ATTEMPTS_MAX
    assert order == [0, 1, 2]
    for future in appends:
        assert isinstance(future.exception(), PersistenceError), future.exception()
    await ledger.close()


async def test_failed_close_records_what_the_handle_confirmed():
    """A rolled-over ledger whose close fails leaves the set of open handles with the
    entry count and size its handle confirmed, so trimming can delete it and stats see
    a finished ledger (before the fix it stayed "closing" forever)."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client, ledger_entries_max=2)
    old_id = ledger.current_ledger_id
    client.close_error = LedgerError("ledger metadata unavailable")
    async with asyncio.timeout(TIMEOUT_S):
        await ledger.append(b"a" * 10)
        await ledger.append(b"b" * 10)
    await until(lambda: ledger.current_ledger_id != old_id, "rolled over")
    await until(lambda: not ledger._closing_handles, "the old ledger's close ran")
    info = next(i for i in ledger.ledger_infos() if i.ledger_id == old_id)
    assert info.entries == 2
    assert info.size_bytes == 20
    assert info.closed_ms > 0
    assert old_id not in ledger._open_handles
    assert ledger.number_of_entries() == 2
    assert await ledger.delete_ledgers_before(ledger.current_ledger_id) == [old_id]
    client.close_error = None
    await ledger.close()


async def test_close_time_is_recorded_and_survives_the_record():
    """A closed ledger gets closed_ms (at or after its creation) and the record keeps
    it; the current ledger has none."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client, ledger_entries_max=1)
    first_id = ledger.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        await ledger.append(b"a")
    await until(lambda: ledger.current_ledger_id not in (-1, first_id), "rolled over")
    await until(lambda: not ledger._closing_handles, "closed")
    infos = {i.ledger_id: i for i in ledger.ledger_infos()}
    assert infos[first_id].closed_ms >= infos[first_id].created_ms > 0
    assert infos[ledger.current_ledger_id].closed_ms == 0
    decoded = {i.ledger_id: i for i in ManagedLedgerInfo.decode(ledger._info.encode()).ledgers}
    assert decoded[first_id].closed_ms == infos[first_id].closed_ms
    assert decoded[ledger.current_ledger_id].closed_ms == 0
    await ledger.close()


def test_records_without_close_times_read_creation_times():
    """A record written before closed_ms existed (four-element ledger rows, no
    closed_ms object) decodes with each closed ledger's close time taken to be its
    creation time, and an open ledger's left at 0; records written now still have the
    four-element rows older brokers read."""
    old = (b'{"created_ms": 5, "format_version": 1, "ledgers": [[3, 10, 100, 1000], [4, -1, -1, 2000]], '
           b'"properties": {}, "terminated_position": null}')
    info = ManagedLedgerInfo.decode(old)
    assert [(i.ledger_id, i.created_ms, i.closed_ms) for i in info.ledgers] == [(3, 1000, 1000), (4, 2000, 0)]
    encoded = ManagedLedgerInfo([LedgerInfo(3, 10, 100, 1000, closed_ms=1500)]).encode()
    assert b"[3, 10, 100, 1000]" in encoded
    assert ManagedLedgerInfo.decode(encoded).ledgers[0].closed_ms == 1500


async def test_cache_miss_run_of_a_closed_ledger_stops_at_the_byte_budget():
    """Reading a closed ledger of 64 KiB entries with a 200 KiB budget asks the bookies
    for about 200 KiB (3 entries, then 1 to pass the budget), not the whole ledger
    (before the fix: one run of up to 500 entries)."""
    store, client = MemoryStore(), FakeLedgerClient()
    writer = await opened(store, client, ledger_entries_max=10)
    first_id = writer.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        for index in range(10):
            await writer.append(bytes([index]) * (64 * KIB))
        await writer.close()
    reader = await opened(store, client)   # a fresh entry cache: every read misses
    client.reads.clear()
    async with asyncio.timeout(TIMEOUT_S):
        entries = await reader.read(Position(first_id, 0), 100, 200 * KIB)
    assert [e.position for e in entries] == [Position(first_id, i) for i in range(4)]
    assert client.reads == [(first_id, 0, 2), (first_id, 3, 3)]
    await reader.close()


async def test_cache_miss_run_of_an_open_ledger_uses_the_mean_of_entries_seen():
    """In the current ledger (no size recorded yet) with nothing cached, the first
    miss reads one entry, and later runs are sized by the mean of those seen."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client, cache_bytes=0)
    ledger_id = ledger.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        for index in range(10):
            await ledger.append(bytes([index]) * (64 * KIB))
        client.reads.clear()
        entries = await ledger.read(Position(ledger_id, 0), 100, 200 * KIB)
    assert len(entries) == 4
    assert client.reads == [(ledger_id, 0, 0), (ledger_id, 1, 2), (ledger_id, 3, 3)]
    assert sum(last - first + 1 for _, first, last in client.reads) == 4
    await ledger.close()


async def test_read_cached_answers_what_read_does_from_memory_and_nothing_on_a_miss():
    """``read_cached`` gives what ``read`` gives when the cache holds it all, across a
    rollover and within the byte budget, with no bookie read; one entry missing (a
    fresh cache) makes it None, and ``read`` then goes to the bookies."""
    store, client = MemoryStore(), FakeLedgerClient()
    writer = await opened(store, client, ledger_entries_max=3)
    async with asyncio.timeout(TIMEOUT_S):
        positions = [await writer.append(bytes([index]) * KIB) for index in range(5)]
        client.reads.clear()
        start = positions[0]
        for count_max, bytes_max in ((100, MIB), (4, MIB), (100, 2 * KIB + 1)):
            cached = writer.read_cached(start, count_max, bytes_max)
            assert cached is not None
            assert [(e.position, bytes(e.data)) for e in cached] == \
                [(e.position, bytes(e.data)) for e in await writer.read(start, count_max, bytes_max)]
        assert [e.position for e in writer.read_cached(start, 100, MIB)] == positions
        assert writer.read_cached(writer.end_position, 100, MIB) == []
        assert client.reads == []
        await writer.close()
        reader = await opened(store, client)   # a fresh entry cache
        assert reader.read_cached(start, 100, MIB) is None
        assert [e.position for e in await reader.read(start, 100, MIB)] == positions
        assert client.reads
        await reader.close()


async def test_end_position():
    """An empty topic's end is its first position; after entries, the one after the
    last; after a rollover, entry 0 of the new ledger."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client, ledger_entries_max=2)
    first_id = ledger.current_ledger_id
    assert ledger.end_position == ledger.first_position == Position(first_id, 0)
    async with asyncio.timeout(TIMEOUT_S):
        await ledger.append(b"a")
    assert ledger.end_position == Position(first_id, 1)
    async with asyncio.timeout(TIMEOUT_S):
        await ledger.append(b"b")
    await until(lambda: ledger.current_ledger_id not in (-1, first_id), "rolled over")
    await until(lambda: not ledger._closing_handles, "closed")
    assert ledger.end_position == Position(ledger.current_ledger_id, 0)
    assert ledger.entries_between(Position(-1, -1), ledger.last_confirmed) == 2
    await ledger.close()


async def test_appends_during_close_are_refused_and_close_waits_for_every_caller():
    """close() refuses appends from its call on, and a second close() returns only
    once the first has finished."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    client.hold_adds = True
    pending = ledger.append(b"x")
    first = asyncio.get_running_loop().create_task(ledger.close())
    await asyncio.sleep(0)
    refused = ledger.append(b"y")
    assert refused.done() and refused.exception() is not None
    second = asyncio.get_running_loop().create_task(ledger.close())
    await asyncio.sleep(0.01)
    assert not second.done(), "a second close returned before the first finished"
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(first, second)
    assert ledger.closed
    assert (await pending).entry_id == 0



async def test_a_rollover_that_cannot_create_a_ledger_is_deferred_and_appends_go_on():
    """etcd away: a full ledger's rollover cannot create the next ledger. The appends
    waiting for it, and later ones, go to the current ledger (it is healthy) instead of
    failing; the rollover is tried again after ROLL_RETRY_S (not on every append), and
    once a ledger can be created again the topic rolls over. Receipts stay in order."""
    from managed_ledger import managed_ledger as managed_ledger_module
    from common.errors import MetadataUnavailable

    now = [0.0]
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = ManagedLedger(TOPIC, store, client, EntryCache(64 * MIB), config(ledger_entries_max=3),
                           clock=lambda: now[0])
    await ledger.open(create_if_missing=True)
    first_ledger = ledger.current_ledger_id
    real_create = client.create_ledger
    tries = []

    async def unavailable(*args, **kwargs):
        tries.append(now[0])
        raise MetadataUnavailable("etcd call failed: UNAVAILABLE")

    client.create_ledger = unavailable
    async with asyncio.timeout(TIMEOUT_S):
        positions = [await ledger.append(f"m{index}".encode()) for index in range(8)]
    assert [p.ledger_id for p in positions] == [first_ledger] * 8
    assert [p.entry_id for p in positions] == list(range(8))
    assert len(tries) == 1, tries                      # not one try per append
    assert ledger.rollovers_deferred == 1
    now[0] += managed_ledger_module.ROLL_RETRY_S + 0.1
    async with asyncio.timeout(TIMEOUT_S):
        more = await ledger.append(b"m8")             # the retry is due: it fails again
        assert more == Position(first_ledger, 8)
    assert len(tries) == 2
    client.create_ledger = real_create                 # etcd is back
    now[0] += managed_ledger_module.ROLL_RETRY_S_MAX + 0.1
    async with asyncio.timeout(TIMEOUT_S):
        await ledger.append(b"m9")
        later = await ledger.append(b"m10")
    await until(lambda: ledger.current_ledger_id != first_ledger, "a rollover once etcd answers")
    async with asyncio.timeout(TIMEOUT_S):
        last = await ledger.append(b"m11")
    assert later.ledger_id in (first_ledger, ledger.current_ledger_id)
    assert last.ledger_id == ledger.current_ledger_id != first_ledger
    await ledger.close()


class _LosesOneReply:
    """The metadata store edge: the next compare_and_set is applied, but its caller
    gets MetadataUnavailable (a reply lost to a timeout)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.lose_next = False

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def compare_and_set(self, key, value, *, expected_version, lease=None):
        version = await self._store.compare_and_set(key, value, expected_version=expected_version, lease=lease)
        if self.lose_next:
            self.lose_next = False
            from common.errors import MetadataUnavailable
            raise MetadataUnavailable("etcd call timed out")
        return version


async def test_a_record_write_whose_reply_was_lost_is_not_a_take_over():
    """A property write reaches etcd but its reply is lost (the caller sees
    MetadataUnavailable); the next write finds a newer version than it knew. The
    record holds what the unanswered write wrote, so the ledger adopts its version and
    the write goes on (the bug: the topic fenced itself as 'taken over' and closed,
    under a live fuzz that kept etcd slow). A write by another owner still fences."""
    from common.errors import MetadataUnavailable, TopicFenced

    memory, client = MemoryStore(), FakeLedgerClient()
    store = _LosesOneReply(memory)
    ledger = ManagedLedger(TOPIC, store, client, EntryCache(MIB), config())
    await ledger.open(create_if_missing=True)
    store.lose_next = True
    with pytest.raises(MetadataUnavailable):
        await ledger.set_properties({"a": "1"})
    assert ledger.properties == {}                      # the caller was told it failed
    await ledger.set_properties({"b": "2"})             # not fenced: the version is adopted
    assert ledger.properties == {"b": "2"}
    reopened = ManagedLedger(TOPIC, memory, client, EntryCache(MIB), config())
    await reopened.open(create_if_missing=False)
    assert reopened.properties == {"b": "2"}
    # Another owner writes the record: this one is taken over.
    await reopened.set_properties({"c": "3"})
    with pytest.raises(TopicFenced):
        await ledger.set_properties({"d": "4"})


async def test_a_record_write_cancelled_on_the_way_is_not_a_take_over():
    """The caller of a property write is cancelled after etcd applied the write (a
    client hung up while its exclusive producer was being registered): the next write
    adopts the record's version (the bug: the topic fenced itself, under the live fuzz)."""
    memory, client = MemoryStore(), FakeLedgerClient()
    applied = asyncio.Event()

    class AppliesThenHangs(_LosesOneReply):
        async def compare_and_set(self, key, value, *, expected_version, lease=None):
            version = await self._store.compare_and_set(key, value, expected_version=expected_version, lease=lease)
            if self.lose_next:
                self.lose_next = False
                applied.set()
                await asyncio.Event().wait()          # the reply never comes
            return version

    store = AppliesThenHangs(memory)
    ledger = ManagedLedger(TOPIC, store, client, EntryCache(MIB), config())
    await ledger.open(create_if_missing=True)
    store.lose_next = True
    writing = asyncio.get_running_loop().create_task(ledger.set_properties({"epoch": "1"}))
    await applied.wait()
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    await ledger.set_properties({"epoch": "2"})
    assert ledger.properties == {"epoch": "2"}


async def test_two_record_writes_left_unanswered_in_a_row_are_not_a_take_over():
    """The first of two writes is applied and its caller cancelled; the second (sent
    with the same, now stale, version) is refused by etcd but its reply is lost too. The
    record holds the first one's bytes: still ours, so the third write adopts its
    version (the bug: only the last unanswered write was remembered, and the topic
    fenced itself as 'taken over' under the live fuzz)."""
    from common.errors import MetadataUnavailable, TopicFenced

    memory, client = MemoryStore(), FakeLedgerClient()

    class LosesReplies(_LosesOneReply):
        lose = 0

        async def compare_and_set(self, key, value, *, expected_version, lease=None):
            try:
                return await self._store.compare_and_set(key, value, expected_version=expected_version, lease=lease)
            finally:
                if self.lose:
                    self.lose -= 1
                    raise MetadataUnavailable("etcd call timed out")

    store = LosesReplies(memory)
    ledger = ManagedLedger(TOPIC, store, client, EntryCache(MIB), config())
    await ledger.open(create_if_missing=True)
    store.lose = 1
    with pytest.raises(MetadataUnavailable):
        await ledger.set_properties({"epoch": "1"})     # applied, reply lost
    store.lose = 1                                       # refused (stale version), reply lost
    with pytest.raises(MetadataUnavailable):
        await ledger.set_properties({"epoch": "2"})
    await ledger.set_properties({"epoch": "3"})          # not fenced
    reopened = ManagedLedger(TOPIC, memory, client, EntryCache(MIB), config())
    await reopened.open(create_if_missing=False)
    assert reopened.properties == {"epoch": "3"}
    await reopened.set_properties({"other": "owner"})
    with pytest.raises(TopicFenced):
        await ledger.set_properties({"epoch": "4"})


async def test_confirmed_appends_wake_readers_before_their_receipts_in_append_order():
    """A confirmed append wakes the readers waiting for entries before it settles the
    appends' receipts: their callbacks run in that order in the next turn, so a
    subscription's dispatch does not wait behind the receipts; receipts keep append order."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    ledger_id = ledger.current_ledger_id
    order: list[str] = []
    waiter = ledger.wait_for_entries()
    waiter.add_done_callback(lambda _f: order.append("reader"))
    client.hold_adds = True
    first = ledger.append(b"one")
    second = ledger.append(b"two")
    first.add_done_callback(lambda _f: order.append("receipt one"))
    second.add_done_callback(lambda _f: order.append("receipt two"))
    await asyncio.sleep(0.01)
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        assert await first == Position(ledger_id, 0)
        assert await second == Position(ledger_id, 1)
    await asyncio.sleep(0)          # the callbacks scheduled with the awaiting task's wake-up
    assert order[0] == "reader"
    assert order[1:] == ["receipt one", "receipt two"]
    await ledger.close()


async def test_eager_callbacks_dispatch_then_receipt_inside_the_settling():
    """The waiter and the appends are EagerFutures (runtime/eager_future.py): callbacks
    registered with call_when_done run inside the settling, the reader's before the
    receipts (in append order), and before any ordinary done-callback of the same
    futures, which waits for the next turn."""
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client)
    order: list[str] = []
    call_when_done(ledger.wait_for_entries(), lambda _f: order.append("reader"))
    client.hold_adds = True
    first = ledger.append(b"one")
    second = ledger.append(b"two")
    first.add_done_callback(lambda _f: order.append("ordinary callback"))
    call_when_done(first, lambda _f: order.append("receipt one"))
    call_when_done(second, lambda _f: order.append("receipt two"))
    await asyncio.sleep(0.01)
    client.release_adds()
    await until(lambda: len(order) == 4, "every callback")
    assert order == ["reader", "receipt one", "receipt two", "ordinary callback"]
    await ledger.close()


# --- reading ahead of a catch-up reader -----------------------------------------------------

async def closed_backlog(store: MemoryStore, client: FakeLedgerClient, entries: int = 12,
                         **overrides) -> tuple[ManagedLedger, int]:
    """A ledger of ``entries`` 1 KiB entries written and closed, then reopened with an
    empty entry cache (so every read of it misses): (the reader's managed ledger, ledger id)."""
    writer = await opened(store, client, ledger_entries_max=100)
    ledger_id = writer.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        for index in range(entries):
            await writer.append(bytes([index]) * KIB)
        await writer.close()
    reader = await opened(store, client, **overrides)
    client.reads.clear()
    return reader, ledger_id


async def test_a_catch_up_read_reads_the_next_run_ahead_and_the_next_round_finds_it_cached():
    """A read that missed the cache starts reading the next run (as many entries as it
    returned) into the cache; the reader's next read makes no bookie read of its own and
    starts the run after, up to the last entry; the reads never overlap."""
    store, client = MemoryStore(), FakeLedgerClient()
    reader, ledger_id = await closed_backlog(store, client)
    async with asyncio.timeout(TIMEOUT_S):
        first = await reader.read(Position(ledger_id, 0), 4, MIB)
        assert [e.position.entry_id for e in first] == [0, 1, 2, 3]
        await until(lambda: not reader._read_aheads, "the read ahead finished")
        assert client.reads == [(ledger_id, 0, 3), (ledger_id, 4, 7)]
        second = await reader.read(Position(ledger_id, 4), 4, MIB)
        assert [bytes(e.data) for e in second] == [bytes([i]) * KIB for i in range(4, 8)]
        await until(lambda: not reader._read_aheads, "the second read ahead finished")
        third = await reader.read(Position(ledger_id, 8), 10, MIB)
        await until(lambda: not reader._read_aheads, "nothing left to read ahead")
    assert [e.position.entry_id for e in third] == [8, 9, 10, 11]
    assert client.reads == [(ledger_id, 0, 3), (ledger_id, 4, 7), (ledger_id, 8, 11)]
    assert reader.read_ahead_entries == 8
    await reader.close()


async def test_a_reader_waits_for_the_read_ahead_under_way_instead_of_reading_twice():
    """While the run ahead is still being read, a reader asking for it waits for that
    read (one bookie read of those entries, not two) and gets the entries."""
    store, client = MemoryStore(), FakeLedgerClient()
    reader, ledger_id = await closed_backlog(store, client)
    async with asyncio.timeout(TIMEOUT_S):
        await reader.read(Position(ledger_id, 0), 4, MIB)
        client.read_gate = asyncio.Event()
        await until(lambda: (ledger_id, 4, 7) in client.reads, "the read ahead asked the bookies")
        waiting = asyncio.get_running_loop().create_task(reader.read(Position(ledger_id, 4), 4, MIB))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        client.read_gate.set()
        second = await waiting
    assert [e.position.entry_id for e in second] == [4, 5, 6, 7]
    assert client.reads.count((ledger_id, 4, 7)) == 1
    assert not any(first <= 5 <= last for _, first, last in client.reads[2:])
    await reader.close()


async def test_tailing_and_cached_reads_start_nothing_and_read_aheads_are_bounded():
    """A reader at the tail (nothing confirmed past its read) and one served by the
    cache start no read ahead; with read_aheads_max 0 a catch-up read starts none, and
    with 1 a second reader elsewhere in the backlog waits for a slot."""
    store, client = MemoryStore(), FakeLedgerClient()
    tailing = await opened(store, client)
    ledger_id = tailing.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        for index in range(4):
            await tailing.append(bytes([index]) * KIB)
        client.reads.clear()
        assert len(await tailing.read(Position(ledger_id, 0), 10, MIB)) == 4   # all cached: tailing
        await asyncio.sleep(0.01)
    assert client.reads == [] and tailing._read_aheads == []
    await tailing.close()

    store, client = MemoryStore(), FakeLedgerClient()
    off, off_id = await closed_backlog(store, client, read_aheads_max=0)
    async with asyncio.timeout(TIMEOUT_S):
        await off.read(Position(off_id, 0), 4, MIB)
        await asyncio.sleep(0.01)
    assert client.reads == [(off_id, 0, 3)]
    await off.close()

    store, client = MemoryStore(), FakeLedgerClient()
    one, one_id = await closed_backlog(store, client, read_aheads_max=1)
    async with asyncio.timeout(TIMEOUT_S):
        client.read_gate = asyncio.Event()
        first = asyncio.get_running_loop().create_task(one.read(Position(one_id, 0), 2, MIB))
        other = asyncio.get_running_loop().create_task(one.read(Position(one_id, 6), 2, MIB))
        client.read_gate.set()
        await asyncio.gather(first, other)
        assert len(one._read_aheads) == 1          # the second reader found no free slot
        await until(lambda: not one._read_aheads, "the read ahead finished")
    assert len(client.reads) == 3
    await one.close()


async def test_a_failed_read_ahead_leaves_the_reader_to_read_and_close_cancels_one_under_way():
    """A read ahead that fails is dropped: the reader's next read reads those entries
    itself. A read ahead still waiting for the bookies at close is cancelled."""
    store, client = MemoryStore(), FakeLedgerClient()
    reader, ledger_id = await closed_backlog(store, client)
    async with asyncio.timeout(TIMEOUT_S):
        client.read_error = LedgerError("injected")
        with pytest.raises(LedgerError):
            await reader.read(Position(ledger_id, 0), 4, MIB)   # the reader's own read fails
        client.read_error = None
        await reader.read(Position(ledger_id, 0), 4, MIB)
        client.read_error = LedgerError("injected")
        await until(lambda: not reader._read_aheads, "the read ahead failed")
        client.read_error = None
        second = await reader.read(Position(ledger_id, 4), 4, MIB)
        assert [e.position.entry_id for e in second] == [4, 5, 6, 7]
        assert client.reads.count((ledger_id, 4, 7)) == 2   # the failed one, then the reader's
        client.read_gate = asyncio.Event()
        await until(lambda: (ledger_id, 8, 11) in client.reads, "the next read ahead waits")
        task = reader._read_aheads[0].task
        await reader.close()
    assert task.cancelled() and reader._read_aheads == []


async def test_a_read_ahead_takes_at_most_an_eighth_of_the_cache():
    """With a 16 KiB entry cache and 1 KiB entries, a read of 4 entries reads 2 ahead
    (2 KiB: an eighth of the cache), not 4; with a cache smaller than eight entries
    nothing is read ahead."""
    store, client = MemoryStore(), FakeLedgerClient()
    reader, ledger_id = await closed_backlog(store, client, cache_bytes=16 * KIB)
    async with asyncio.timeout(TIMEOUT_S):
        await reader.read(Position(ledger_id, 0), 4, MIB)
        await until(lambda: not reader._read_aheads, "the read ahead finished")
    assert client.reads[-1][1:] == (4, 5)
    await reader.close()

    store, client = MemoryStore(), FakeLedgerClient()
    tiny, tiny_id = await closed_backlog(store, client, cache_bytes=4 * KIB)
    async with asyncio.timeout(TIMEOUT_S):
        await tiny.read(Position(tiny_id, 0), 4, MIB)
        await asyncio.sleep(0.01)
    assert client.reads == [(tiny_id, 0, 3)]
    await tiny.close()


async def test_lazy_ledgers_create_none_until_the_first_append_and_still_fence_the_previous_owner():
    """With ``ledger_on_open`` False (broker flag --lazy-ledgers) opening a topic creates
    no ledger; the first append creates one and is stored in it, and appends made while
    it is being created follow in order. A second owner opening the idle topic claims
    the record (a write under its version) although it has no ledger to recover, so the
    first owner's first append — which must record a new ledger — fails fenced rather
    than writing to a topic it no longer owns. Reopened, the topic has its entries."""
    from common.errors import TopicFenced

    store, client = MemoryStore(), FakeLedgerClient()
    first = await opened(store, client, ledger_on_open=False)
    assert client.created == 0 and first.ledger_ids() == []
    assert first.end_position == first.first_position
    positions = await asyncio.wait_for(asyncio.gather(first.append(b"a"), first.append(b"b")), TIMEOUT_S)
    assert client.created == 1 and [p.entry_id for p in positions] == [0, 1]
    assert first.last_confirmed == positions[1]

    idle = ManagedLedger(TOPIC_IDLE, store, client, EntryCache(MIB), config(ledger_on_open=False))
    await idle.open(create_if_missing=True)
    second = ManagedLedger(TOPIC_IDLE, store, client, EntryCache(MIB), config(ledger_on_open=False))
    version_before = (await store.get(idle._key)).version
    await second.open(create_if_missing=False)
    assert (await store.get(idle._key)).version > version_before, "the new owner claims the record"
    assert client.created == 1, "neither owner of the idle topic made a ledger"
    with pytest.raises(TopicFenced):
        await asyncio.wait_for(idle.append(b"late"), TIMEOUT_S)
    stored = await asyncio.wait_for(second.append(b"kept"), TIMEOUT_S)
    assert stored.entry_id == 0

    await first.close()
    reopened = await opened(store, client, ledger_on_open=False)
    assert reopened.last_confirmed == positions[1]
    entries = await reopened.read(reopened.first_position, 10, MIB)
    assert [e.data for e in entries] == [b"a", b"b"]


TOPIC_IDLE = TopicName.parse("persistent://public/default/managed-idle")
