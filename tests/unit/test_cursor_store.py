"""The durable cursor store (subscriptions/cursor_store.py): where a cursor's state
goes (inline in etcd, or the cursor ledger), what a failed pointer write leaves behind,
and what happens when another broker takes the cursor over.

What it proves:
- only a new subscription's starting position is inline in etcd; once anything is
  acknowledged the state goes to the cursor ledger, and etcd is written once per
  snapshot, not once per flush (the bug: cumulative acknowledgements without holes
  wrote etcd on every flush and never used a ledger);
- a snapshot whose etcd write failed is written again before any delta, so no delta
  lands in a ledger etcd does not point at (the bug: the retry appended the delta to
  the new ledger and a new owner, reading the old pointer, lost those acknowledgements);
  and the ledger etcd pointed at before is deleted once the pointer moves, even when
  that happens on a retry (the bug: only in the call that created the new ledger);
- the pointer is written by compare-and-set: once another broker wrote it, this store
  raises TopicFenced (so does a delta to a cursor ledger that the new owner's recovery
  fenced), the ManagedCursor stops saving, and delete() leaves the new owner's pointer
  alone; a write of ours whose reply was lost is recognised as ours, not as a takeover;
- a cursor ledger whose handle failed is replaced at the next save.

How: a real LedgerCursorStore on the in-memory metadata store (wrapped to fail chosen
transactions, optionally after applying them) and an in-memory ledger client whose
recovery fences the writer, as bookies do.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from common.position import Position
from common.errors import LedgerFenced, MetadataUnavailable, NoSuchLedger, TopicFenced
from metadata.memory_store import MemoryStore
from subscriptions import cursor_store
from subscriptions.ack_set import AckSet
from subscriptions.cursor import CursorState, ManagedCursor
from subscriptions.cursor_store import LedgerCursorStore
from tests.unit.fake_managed_ledger import FakeManagedLedger

KEY = "/cursors/persistent/public/default/t/sub"


def P(ledger_id: int, entry_id: int) -> Position:
    return Position(ledger_id, entry_id)


# --- the ledger edge ---------------------------------------------------------------------------------

@dataclass
class _Ledger:
    entries: list[bytes] = field(default_factory=list)
    fenced: bool = False
    closed: bool = False


@dataclass
class _Entry:
    entry_id: int
    payload: bytes


class _Metadata:
    def __init__(self, last_entry_id: int) -> None:
        self.last_entry_id = last_entry_id


class FakeHandle:
    def __init__(self, ledgers: dict[int, _Ledger], ledger_id: int) -> None:
        self._ledgers = ledgers
        self.ledger_id = ledger_id
        self.failure: Exception | None = None
        # No ledger metadata lives in the metadata store here: the pointer write's
        # guard on the ledger's key compares "absent" (0).
        self.metadata_version = 0

    @property
    def last_add_confirmed(self) -> int:
        return len(self._ledgers[self.ledger_id].entries) - 1

    async def add(self, payload: bytes) -> int:
        ledger = self._ledgers[self.ledger_id]
        if ledger.fenced:
            self.failure = LedgerFenced(self.ledger_id)
            raise self.failure
        assert not ledger.closed
        ledger.entries.append(bytes(payload))
        await asyncio.sleep(0)
        return len(ledger.entries) - 1

    async def close(self) -> None:
        if self._ledgers[self.ledger_id].fenced:
            raise LedgerFenced(self.ledger_id)
        self._ledgers[self.ledger_id].closed = True


class FakeReader:
    def __init__(self, ledger: _Ledger) -> None:
        self._ledger = ledger
        self.metadata = _Metadata(len(ledger.entries) - 1)

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[_Entry]:
        return [_Entry(i, self._ledger.entries[i]) for i in range(first_entry_id, last_entry_id + 1)]


class FakeLedgerClient:
    """Ledgers in a dict; opening with recovery fences the ledger's writer."""

    def __init__(self) -> None:
        self.ledgers: dict[int, _Ledger] = {}
        self._next_id = 100

    async def create_ledger(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                            custom: dict[str, str] | None = None) -> FakeHandle:
        self._next_id += 1
        self.ledgers[self._next_id] = _Ledger()
        return FakeHandle(self.ledgers, self._next_id)

    async def open_ledger(self, ledger_id: int, *, recovery: bool) -> FakeReader:
        if ledger_id not in self.ledgers:
            raise NoSuchLedger(ledger_id)
        if recovery:
            self.ledgers[ledger_id].fenced = True
        return FakeReader(self.ledgers[ledger_id])

    async def delete_ledger(self, ledger_id: int) -> None:
        if self.ledgers.pop(ledger_id, None) is None:
            raise NoSuchLedger(ledger_id)


# --- the metadata edge ----------------------------------------------------------------------------------

class FailingStore(MemoryStore):
    """Fails the next ``failures`` transactions touching ``KEY`` with MetadataUnavailable;
    with ``apply_first`` the write is applied before failing (a reply lost on the way)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.apply_first = False
        self.pointer_writes = 0

    async def transaction(self, compares, operations):
        if any(op.key == KEY for op in operations):
            if self.failures:
                self.failures -= 1
                if self.apply_first:
                    await super().transaction(compares, operations)
                raise MetadataUnavailable("etcd call failed: timeout")
            result = await super().transaction(compares, operations)
            if result is not None:
                self.pointer_writes += 1
            return result
        return await super().transaction(compares, operations)


def _store(store: FailingStore, ledgers: FakeLedgerClient, owner: str = "a") -> LedgerCursorStore:
    return LedgerCursorStore(store, KEY, ledgers, quorums=(1, 1, 1), owner=owner)


async def _pointer(store: MemoryStore) -> dict:
    record = await store.get(KEY)
    assert record is not None
    return json.loads(record.value)


def _acked(*entry_ids: int, ledger_id: int = 10) -> AckSet:
    acked = AckSet()
    for entry_id in entry_ids:
        acked.add(ledger_id, entry_id)
    return acked


# --- inline only for the starting position ---------------------------------------------------------------

async def test_only_the_starting_position_is_inline_then_the_ledger_takes_over():
    """save_now writes inline; five cumulative-ack flushes (no holes) then cost one
    etcd write (the snapshot pointer) and four ledger deltas, and a new owner reads the
    latest mark-delete position back."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    ledger = FakeManagedLedger(10)
    ledger.append_many(20)
    cursor = ManagedCursor("t/sub", ledger, CursorState(P(10, -1)), _store(metadata, ledgers))
    await cursor.save_now()
    assert (await _pointer(metadata))["inline"] is not None
    assert metadata.pointer_writes == 1
    for entry_id in range(5):
        cursor.ack_cumulative(P(10, entry_id))
        await cursor.flush()
    pointer = await _pointer(metadata)
    assert pointer["inline"] is None and pointer["cursor_ledger"] in ledgers.ledgers
    assert metadata.pointer_writes == 2
    assert len(ledgers.ledgers[pointer["cursor_ledger"]].entries) == 5      # a snapshot and four deltas
    await cursor.close()
    restored = await _store(metadata, ledgers, owner="b").load()
    assert restored is not None and restored.mark_delete == P(10, 4)


async def test_a_cursor_loaded_inline_goes_to_the_ledger_at_its_first_save():
    """A subscription that had never acknowledged anything (inline) writes its first
    acknowledgement to a new cursor ledger, not inline again."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    first = _store(metadata, ledgers)
    await first.save(CursorState(P(10, -1)), None)
    second = _store(metadata, ledgers, owner="b")
    state = await second.load()
    assert state is not None
    state.mark_delete = P(10, 3)
    await second.save(state, AckSet())
    assert (await _pointer(metadata))["cursor_ledger"] in ledgers.ledgers


# --- a failed pointer write ------------------------------------------------------------------------------

async def test_a_delta_never_follows_a_snapshot_whose_pointer_write_failed():
    """The first ledger save creates the ledger and its snapshot, but etcd refuses the
    pointer. The retried flush (a delta as far as the cursor knows) must write a snapshot
    to that ledger and point etcd at it, so a new owner sees every acknowledgement."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    ledger = FakeManagedLedger(10)
    ledger.append_many(20)
    cursor = ManagedCursor("t/sub", ledger, CursorState(P(10, -1)), _store(metadata, ledgers))
    await cursor.save_now()
    cursor.ack(P(10, 3))
    metadata.failures = 1
    await cursor.flush()
    assert cursor.flush_errors == 1
    cursor.ack(P(10, 5))
    await cursor.flush()
    await cursor.close()
    restored = await _store(metadata, ledgers, owner="b").load()
    assert restored is not None
    assert restored.acked.contains(10, 3) and restored.acked.contains(10, 5)


async def test_the_previous_ledger_is_deleted_when_the_pointer_moves_on_a_retry(monkeypatch):
    """A rollover whose pointer write fails, then succeeds on the next save: the ledger
    etcd pointed at before is deleted then (it was only deleted by the call that
    created the new ledger)."""
    monkeypatch.setattr(cursor_store, "LEDGER_ENTRIES_MAX", 3)
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    store = _store(metadata, ledgers)
    state = CursorState(P(10, -1))
    state.acked.add(10, 5)
    await store.save(state, None)                     # snapshot: ledger 1, entry 0
    first_ledger = store.ledger_id
    await store.save(state, _acked(6))                # delta, entry 1
    await store.save(state, _acked(7))                # delta, entry 2: the ledger is full
    metadata.failures = 1
    with pytest.raises(MetadataUnavailable):
        await store.save(state, _acked(8))            # rollover: new ledger, pointer write fails
    assert store.ledger_id == first_ledger and first_ledger in ledgers.ledgers
    await store.save(state, _acked(8))
    assert store.ledger_id != first_ledger
    assert first_ledger not in ledgers.ledgers
    assert sorted(ledgers.ledgers) == [store.ledger_id]


async def test_a_ledger_etcd_never_pointed_at_is_deleted_when_replaced(monkeypatch):
    """A new ledger whose snapshot pointer never got written, and which fills up before
    it does, is deleted when it is replaced (nothing else would ever delete it)."""
    monkeypatch.setattr(cursor_store, "LEDGER_ENTRIES_MAX", 2)
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    store = _store(metadata, ledgers)
    state = CursorState(P(10, -1))
    state.acked.add(10, 5)
    metadata.failures = 2
    for _ in range(2):
        with pytest.raises(MetadataUnavailable):
            await store.save(state, None)             # two snapshots to one unpointed ledger: full
    orphan = next(iter(ledgers.ledgers))
    await store.save(state, None)
    assert orphan not in ledgers.ledgers
    assert sorted(ledgers.ledgers) == [store.ledger_id]


# --- another broker takes the cursor over ------------------------------------------------------------------

async def test_a_pointer_written_by_another_broker_is_not_overwritten():
    """Broker b loads the cursor and saves; broker a's next pointer write loses the
    compare-and-set and raises TopicFenced. b's pointer is intact."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    a = _store(metadata, ledgers, owner="a")
    await a.save(CursorState(P(10, -1)), None)                 # inline
    b = _store(metadata, ledgers, owner="b")
    state = await b.load()
    assert state is not None
    state.mark_delete = P(10, 7)
    await b.save(state, None)
    taken = await _pointer(metadata)
    with pytest.raises(TopicFenced):
        await a.save(CursorState(P(10, 2), _acked(4)), None)
    assert await _pointer(metadata) == taken


async def test_a_delta_to_a_ledger_fenced_by_the_new_owner_raises_topic_fenced():
    """The new owner's load recovers (fences) a's cursor ledger: a's next delta raises
    TopicFenced, and the ManagedCursor above it stops saving and reports it."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    ledger = FakeManagedLedger(10)
    ledger.append_many(20)
    told: list[Exception] = []
    cursor = ManagedCursor("t/sub", ledger, CursorState(P(10, -1)), _store(metadata, ledgers, owner="a"),
                           on_fenced=told.append)
    cursor.ack(P(10, 3))
    await cursor.flush()                                        # snapshot to a's ledger
    restored = await _store(metadata, ledgers, owner="b").load()
    assert restored is not None
    cursor.ack(P(10, 6))
    await cursor.flush()                                        # a delta: fenced
    assert isinstance(cursor.fenced_error, TopicFenced)
    assert len(told) == 1
    assert cursor.flush_errors == 0
    await cursor.close()


async def test_delete_leaves_a_new_owners_pointer_alone():
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    a = _store(metadata, ledgers, owner="a")
    await a.save(CursorState(P(10, -1)), None)
    b = _store(metadata, ledgers, owner="b")
    assert await b.load() is not None
    await b.save(CursorState(P(10, 1)), AckSet())
    with pytest.raises(TopicFenced):
        await a.delete()
    assert (await _pointer(metadata))["owner"] == "b"


async def test_delete_removes_our_pointer_and_ledger():
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    store = _store(metadata, ledgers)
    state = CursorState(P(10, -1), _acked(3))
    await store.save(state, None)
    assert ledgers.ledgers
    await store.delete()
    assert await metadata.get(KEY) is None
    assert ledgers.ledgers == {}


@pytest.mark.parametrize("kind", ["inline", "snapshot"])
async def test_a_write_of_ours_whose_reply_was_lost_is_not_a_takeover(kind: str):
    """etcd applied the pointer write but the reply was lost (MetadataUnavailable): the
    next write's compare-and-set fails, yet the pointer carries our own session, so the
    store carries on instead of raising TopicFenced, and a new owner reads the latest."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    store = _store(metadata, ledgers)
    first = CursorState(P(10, -1)) if kind == "inline" else CursorState(P(10, -1), _acked(3))
    metadata.failures, metadata.apply_first = 1, True
    with pytest.raises(MetadataUnavailable):
        await store.save(first, None)
    latest = CursorState(P(10, 4), _acked(6))
    await store.save(latest, None)
    restored = await _store(metadata, ledgers, owner="b").load()
    assert restored is not None
    assert restored.mark_delete == P(10, 4) and restored.acked.contains(10, 6)


async def test_a_failed_cursor_ledger_is_replaced_by_a_new_one():
    """A handle that failed (bookies gone) never takes another entry: the next save
    starts a new ledger with a snapshot, points etcd at it and deletes the old one
    (before, every later save failed on the dead handle)."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    store = _store(metadata, ledgers)
    state = CursorState(P(10, -1), _acked(3))
    await store.save(state, None)
    failed_ledger = store.ledger_id
    store._handle.failure = MetadataUnavailable("bookies unavailable")
    state.acked.add(10, 5)
    await store.save(state, _acked(5))
    assert store.ledger_id != failed_ledger
    assert sorted(ledgers.ledgers) == [store.ledger_id]
    restored = await _store(metadata, ledgers, owner="b").load()
    assert restored is not None and restored.acked.contains(10, 3) and restored.acked.contains(10, 5)


async def test_a_pointer_never_names_a_ledger_whose_metadata_is_gone():
    """The pointer write compares the cursor ledger's metadata (as the handle knows it)
    in the same transaction: when the ledger collector deleted it, or it changed, the
    pointer is not written, the save fails (its changes kept for the next) and the next
    save starts a new ledger, which the pointer then names (managed_ledger/ledger_gc.py)."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    ledger = FakeManagedLedger(10)
    ledger.append_many(20)
    store = _store(metadata, ledgers)
    cursor = ManagedCursor("t/sub", ledger, CursorState(P(10, -1)), store)
    await cursor.save_now()
    cursor.ack(P(10, 3))
    # The ledger the save is about to create gets metadata of another version in etcd
    # (the fake handle knows it as absent): its guard fails.
    await metadata.put(f"/ledgers/{ledgers._next_id + 1:020d}", b"{}")
    await cursor.flush()
    assert cursor.flush_errors == 1
    assert (await _pointer(metadata))["cursor_ledger"] == -1      # still the inline start
    cursor.ack(P(10, 5))
    await cursor.flush()
    pointer = await _pointer(metadata)
    assert pointer["cursor_ledger"] == ledgers._next_id != 101
    await cursor.close()
    restored = await _store(metadata, ledgers, owner="b").load()
    assert restored is not None
    assert restored.acked.contains(10, 3) and restored.acked.contains(10, 5)


async def test_an_inline_pointer_loads_without_awaiting_and_a_ledger_one_is_left_to_load():
    """``load_inline`` (a topic's load, from the pointer its prefix read brought): an
    inline pointer gives the state at once, and the store then writes over that
    pointer's version (a save is not a conflict); a pointer naming a cursor ledger gives
    None, and ``load`` recovers the state from the ledger."""
    metadata, ledgers = FailingStore(), FakeLedgerClient()
    first = _store(metadata, ledgers)
    await first.save(CursorState(P(10, -1)), None)
    second = _store(metadata, ledgers, owner="b")
    state = second.load_inline(await metadata.get(KEY))
    assert state is not None and state.mark_delete == P(10, -1)
    state.mark_delete = P(10, 3)
    await second.save(state, AckSet())                  # moves the state to a cursor ledger
    third = _store(metadata, ledgers, owner="c")
    record = await metadata.get(KEY)
    assert third.load_inline(record) is None
    restored = await third.load(record)
    assert restored is not None and restored.mark_delete == P(10, 3)
