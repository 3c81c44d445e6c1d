"""The auditor (ledger/auditor.py) over the in-memory store with a fake clock.

Proves: one candidate is elected, a second is not; a bookie unregistered for less than
the grace period is not gone, past it the closed ledgers naming it are recorded (the
fragments that name it, not others) and open ones are left out; a bookie that
registers again is forgiven; a decommissioning mark records at once; records of
ledgers healed or deleted are removed; a GC round on a bookie keeps a ledger under
re-replication and drops a closed one that no longer names it.
"""

from __future__ import annotations

from bookie.config import GcConfig
from bookie.gc import collect_once
from ledger.auditor import Auditor
from ledger.config import AutoRecoveryConfig
from ledger.metadata import Fragment, LedgerMetadata, LedgerState
from ledger.under_replication import UnderReplicatedRecord
from metadata import keys
from metadata.memory_store import MemoryStore


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ledger(ledger_id: int, fragments: list[tuple[int, tuple[str, ...]]], *, closed: bool = True,
            last_entry_id: int = 99) -> LedgerMetadata:
    return LedgerMetadata(ledger_id, 3, 2, 2, LedgerState.CLOSED if closed else LedgerState.OPEN,
                          tuple(Fragment(first, bookies) for first, bookies in fragments),
                          last_entry_id=last_entry_id if closed else -1)


async def _setup(store: MemoryStore, registered: list[str], ledgers: list[LedgerMetadata]) -> None:
    for bookie_id in registered:
        await store.put(keys.bookie(bookie_id), b"{}")
    for metadata in ledgers:
        await store.put(keys.ledger(metadata.ledger_id), metadata.encode())


async def _records(store: MemoryStore) -> dict[int, UnderReplicatedRecord]:
    return {keys.under_replicated_ledger_id(r.key): UnderReplicatedRecord.decode(r.value)
            for r in await store.get_prefix(keys.UNDER_REPLICATED)}


async def test_election_grace_period_and_records():
    store = MemoryStore()
    clock = _Clock()
    config = AutoRecoveryConfig(grace_period_s=10.0)
    await _setup(store, ["a", "b", "c"], [
        _ledger(1, [(0, ("a", "b", "d")), (50, ("a", "b", "c"))]),
        _ledger(2, [(0, ("a", "b", "c"))]),
        _ledger(3, [(0, ("a", "b", "d"))], closed=False),
    ])
    first, second = Auditor(store, config, "one", clock), Auditor(store, config, "two", clock)
    assert await first.campaign() and not await second.campaign()

    result = await first.audit_once()
    assert result.gone_bookies == () and await _records(store) == {}
    clock.now += 9.9
    assert (await first.audit_once()).gone_bookies == ()
    clock.now += 0.2
    result = await first.audit_once()
    assert result.gone_bookies == ("d",)
    assert (result.under_replicated_ledgers, result.under_replicated_fragments) == (1, 1)
    assert result.open_ledgers_on_missing == 1
    records = await _records(store)
    assert list(records) == [1] and records[1].fragment_indices == [0] and records[1].missing_bookies == ["d"]

    # A decommissioning mark counts at once, for every fragment naming the bookie.
    await store.put(keys.decommissioned("c"), b"{}")
    result = await first.audit_once()
    records = await _records(store)
    assert sorted(records) == [1, 2]
    assert records[1].fragment_indices == [0, 1] and records[1].missing_bookies == ["c", "d"]

    # Healed (the ensemble swapped away from c and d) and deleted ledgers lose their records.
    await store.delete(keys.decommissioned("c"))
    await store.put(keys.ledger(1), _ledger(1, [(0, ("a", "b", "e")), (50, ("a", "b", "c"))]).encode())
    await store.delete(keys.ledger(2))
    await first.audit_once()
    assert await _records(store) == {}

    # "d" comes back before anything names it again: forgotten, a new grace period later.
    await store.put(keys.bookie("d"), b"{}")
    await first.audit_once()
    assert "d" not in first._missing_since
    await first.close()
    assert await second.campaign()


class _Storage:
    """The two methods collect_once uses besides compaction."""

    def __init__(self, ledger_ids: set[int]) -> None:
        self.ids = set(ledger_ids)

    def ledger_ids(self) -> set[int]:
        return set(self.ids)

    async def delete_ledgers(self, ledger_ids: list[int]) -> None:
        self.ids -= set(ledger_ids)

    async def compact(self, _ratio: float, _bytes_max: int) -> tuple[int, int]:
        return 0, 0


async def test_gc_drops_moved_ledgers_but_not_those_being_copied():
    store = MemoryStore()
    await _setup(store, [], [
        _ledger(1, [(0, ("a", "b", "c"))]),                 # names "me": kept
        _ledger(2, [(0, ("a", "b", "c"))]),                 # moved away: dropped
        _ledger(3, [(0, ("a", "b", "c"))]),                 # being copied to "me": kept
        _ledger(4, [(0, ("a", "b", "c"))], closed=False),   # open: its writer's, kept
    ])
    await store.put(keys.ledger(1), _ledger(1, [(0, ("a", "me", "c"))]).encode())
    await store.put(keys.under_replicated(3), UnderReplicatedRecord(3, [0], ["c"]).encode())
    storage = _Storage({1, 2, 3, 4, 5})    # 5: deleted from metadata
    result = await collect_once(store, storage, GcConfig(), "me")   # type: ignore[arg-type]
    assert storage.ids == {1, 3, 4}
    assert (result["ledgers_deleted"], result["ledgers_moved"]) == (1, 1)
