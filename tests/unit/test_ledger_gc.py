"""The ledger collector (managed_ledger/ledger_gc.py) and its reference sources
(managed_ledger/ledger_references.py).

Proves: the pure decision — untagged, unknown purpose, unknown owner, no creation
time, young, referenced, unreadable owner, deleted topic, unreferenced — and, over an
in-memory metadata store, that a pass deletes exactly the orphans (every reference
source keeps its ledger: the ledger list, the compaction property, a cursor pointer,
an archive record), that a ledger recorded between the check and the delete survives
(whether the record lands before the re-read or between the re-read and the delete
transaction), that a pass is bounded and resumes, and that the managed ledger refuses
to record a ledger whose metadata is gone (the other half of the race).
"""

from __future__ import annotations

import json

import pytest

from managed_ledger.compacted_ledger import CompactionRecord
from managed_ledger.compaction import COMPACTION_PROPERTY
from managed_ledger.ledger_gc import (
    Candidate,
    LedgerCollector,
    LedgerGcConfig,
    Verdict,
    judge_metadata,
    judge_references,
)
from managed_ledger.ledger_references import GUARDS_MAX, References, read_references
from managed_ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from managed_ledger.managed_ledger_info import (
    PURPOSE_COMPACTED,
    PURPOSE_CURSOR,
    PURPOSE_LEDGER,
    LedgerInfo,
    ManagedLedgerInfo,
    ownership_tags,
)
from common.entry_cache import EntryCache
from common.errors import MetadataUnavailable, NoSuchLedger
from common.position import Position
from common.topic_name import TopicName
from ledger.client import LedgerClient
from ledger.metadata import Fragment, LedgerMetadata, LedgerState
from metadata import keys
from metadata.memory_store import MemoryStore
from metadata.store import Compare
from tests.unit.fake_ledger_client import FakeLedgerClient

TOPIC = TopicName.parse("persistent://public/default/gc-topic")
OTHER = TopicName.parse("persistent://public/default/gc-other")
GONE = TopicName.parse("persistent://public/default/gc-deleted")
NOW_MS = 10_000_000_000
HOUR_MS = 3600 * 1000
OLD_MS = NOW_MS - 2 * HOUR_MS


def _metadata(ledger_id: int, custom: dict[str, str], created_ms: int = OLD_MS) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=1, write_quorum_size=1, ack_quorum_size=1,
                          state=LedgerState.CLOSED, fragments=(Fragment(0, ("bookie-1",)),), last_entry_id=9,
                          length_bytes=100, created_ms=created_ms, custom=custom)


# --- the pure decision --------------------------------------------------------------------------

@pytest.mark.parametrize("custom, created_ms, expected", [
    ({}, OLD_MS, Verdict.UNTAGGED),
    ({"cursor": "/cursors/x"}, OLD_MS, Verdict.UNTAGGED),                     # an older cursor ledger
    ({"managed-ledger": str(TOPIC)}, OLD_MS, Verdict.UNTAGGED),               # an older topic ledger
    ({"managed-ledger": str(TOPIC), "purpose": "schema-index"}, OLD_MS, Verdict.UNKNOWN_PURPOSE),
    ({"managed-ledger": "not a topic://x", "purpose": PURPOSE_LEDGER}, OLD_MS, Verdict.UNKNOWN_OWNER),
    ({"managed-ledger": "gc-topic", "purpose": PURPOSE_LEDGER}, OLD_MS, Verdict.UNKNOWN_OWNER),   # not canonical
    (ownership_tags(str(TOPIC), PURPOSE_LEDGER), 0, Verdict.NO_CTIME),
    (ownership_tags(str(TOPIC), PURPOSE_LEDGER), NOW_MS - HOUR_MS + 1000, Verdict.YOUNG),
    (ownership_tags(str(TOPIC), PURPOSE_LEDGER), NOW_MS + HOUR_MS, Verdict.YOUNG),   # a clock ahead
])
def test_metadata_alone_keeps(custom, created_ms, expected):
    assert judge_metadata(_metadata(5, custom, created_ms), NOW_MS, 3600.0) == expected


def test_a_tagged_ledger_past_its_grace_is_a_candidate():
    judged = judge_metadata(_metadata(5, ownership_tags(str(TOPIC), PURPOSE_COMPACTED)), NOW_MS, 3600.0)
    assert judged == Candidate(5, TOPIC, PURPOSE_COMPACTED, 7200.0)


def _references(ids, *, exists=True, guards=1) -> References:
    return References(str(TOPIC), exists, frozenset(ids),
                      tuple(Compare(f"/k{i}", 1) for i in range(guards)))


@pytest.mark.parametrize("references, expected", [
    (None, Verdict.OWNER_UNREADABLE),
    (_references({4, 5}), Verdict.REFERENCED),
    (_references({5}, exists=False), Verdict.REFERENCED),
    (_references({4}), Verdict.COLLECT),
    (_references(set(), exists=False), Verdict.COLLECT_OWNER_DELETED),
    (_references({4}, guards=GUARDS_MAX), Verdict.TOO_MANY_GUARDS),
])
def test_references_decide(references, expected):
    candidate = Candidate(5, TOPIC, PURPOSE_LEDGER, 7200.0)
    verdict = judge_references(candidate, references)
    assert verdict == expected
    assert verdict.collects == (expected in (Verdict.COLLECT, Verdict.COLLECT_OWNER_DELETED))


def test_config_refuses_a_grace_below_a_second():
    from common.errors import ConfigError

    with pytest.raises(ConfigError):
        LedgerGcConfig(grace_s=0)


# --- passes over a metadata store ---------------------------------------------------------------------

async def _put_ledger(store: MemoryStore, ledger_id: int, custom: dict[str, str], created_ms: int = OLD_MS) -> None:
    await store.put(keys.ledger(ledger_id), _metadata(ledger_id, custom, created_ms).encode())


async def _put_topic(store: MemoryStore, topic: TopicName, ledger_ids: list[int], compacted: int | None = None) -> None:
    properties = {}
    if compacted is not None:
        properties[COMPACTION_PROPERTY] = CompactionRecord(compacted, Position(ledger_ids[-1], 9), 3).encode()
    info = ManagedLedgerInfo(ledgers=[LedgerInfo(i, 10, 100, OLD_MS) for i in ledger_ids], properties=properties)
    await store.put(keys.managed_ledger(topic.key_path), info.encode())


async def _existing(store: MemoryStore) -> set[int]:
    return {keys.ledger_id_from_key(r.key) for r in await store.get_prefix(keys.LEDGERS, keys_only=True)}


def _collector(store, **config) -> LedgerCollector:
    return LedgerCollector(store, LedgerClient(store), LedgerGcConfig(**{"grace_s": 3600.0, **config}),
                           wall_clock_ms=lambda: NOW_MS)


async def _populate(store: MemoryStore) -> None:
    topic, gone = str(TOPIC), str(GONE)
    await _put_topic(store, TOPIC, [1, 2], compacted=3)
    await store.put(keys.cursor(TOPIC.key_path, "sub"), json.dumps({"cursor_ledger": 4}).encode())
    await store.put(keys.cursor(TOPIC.key_path, "inline"), json.dumps({"cursor_ledger": -1}).encode())
    await store.put(keys.archive_ledger(TOPIC.key_path, 5), b"{}")
    await _put_ledger(store, 1, ownership_tags(topic, PURPOSE_LEDGER))
    await _put_ledger(store, 2, ownership_tags(topic, PURPOSE_LEDGER))
    await _put_ledger(store, 3, ownership_tags(topic, PURPOSE_COMPACTED))
    await _put_ledger(store, 4, ownership_tags(topic, PURPOSE_CURSOR))
    await _put_ledger(store, 5, ownership_tags(topic, PURPOSE_LEDGER))        # archived
    await _put_ledger(store, 6, ownership_tags(topic, PURPOSE_COMPACTED))     # a dead run's partial ledger
    await _put_ledger(store, 7, ownership_tags(topic, PURPOSE_COMPACTED), created_ms=NOW_MS - 1000)   # young
    await _put_ledger(store, 8, {"managed-ledger": topic})                    # untagged purpose (older)
    await _put_ledger(store, 9, {})                                           # another client's
    await _put_ledger(store, 10, ownership_tags(gone, PURPOSE_LEDGER))        # its topic was deleted
    await _put_ledger(store, 11, ownership_tags(gone, PURPOSE_CURSOR))
    await _put_ledger(store, 12, ownership_tags(topic, PURPOSE_CURSOR))       # a pointer never written


async def test_a_pass_deletes_exactly_the_orphans():
    store = MemoryStore()
    await _populate(store)
    collector = _collector(store)
    assert sorted(await collector.collect_once()) == [6, 10, 11, 12]
    assert await _existing(store) == {1, 2, 3, 4, 5, 7, 8, 9}
    stats = collector.stats
    assert (stats.ledgers_examined, stats.ledgers_collected, stats.deletes_refused) == (12, 4, 0)
    assert stats.verdicts == {"referenced": 5, "young": 1, "untagged": 2, "collect": 2,
                              "collect-owner-deleted": 2}
    assert await collector.collect_once() == []        # nothing left to collect


async def test_an_unreadable_owner_keeps_its_ledgers():
    """A malformed managed-ledger record, a malformed cursor pointer, an etcd error
    while reading: each keeps every ledger of that owner."""
    store = MemoryStore()
    await _put_ledger(store, 1, ownership_tags(str(TOPIC), PURPOSE_COMPACTED))
    await _put_ledger(store, 2, ownership_tags(str(OTHER), PURPOSE_COMPACTED))
    await store.put(keys.managed_ledger(TOPIC.key_path), b"{not json")
    await _put_topic(store, OTHER, [])
    await store.put(keys.cursor(OTHER.key_path, "sub"), b"[1, 2]")
    collector = _collector(store)
    assert await collector.collect_once() == []
    assert await _existing(store) == {1, 2}
    assert collector.stats.verdicts == {"owner-unreadable": 2}

    class Failing(MemoryStore):
        async def get_prefix(self, prefix, *, limit=0, keys_only=False):
            if prefix.startswith(keys.CURSORS):
                raise MetadataUnavailable("etcd away")
            return await super().get_prefix(prefix, limit=limit, keys_only=keys_only)

    failing = Failing()
    await _put_ledger(failing, 3, ownership_tags(str(GONE), PURPOSE_LEDGER))
    assert await _collector(failing).collect_once() == []
    assert await _existing(failing) == {3}


async def test_a_ledger_recorded_before_the_second_look_is_kept():
    """The owner records the ledger after the pass read its references once: the
    fresh read right before deleting sees it."""
    store = MemoryStore()
    await _put_topic(store, TOPIC, [1])
    await _put_ledger(store, 1, ownership_tags(str(TOPIC), PURPOSE_LEDGER))
    await _put_ledger(store, 2, ownership_tags(str(TOPIC), PURPOSE_LEDGER))
    calls = 0
    real = read_references

    async def recording_meanwhile(s, topic, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 2:
            await _put_topic(store, TOPIC, [1, 2])
        return await real(s, topic, **kwargs)

    import managed_ledger.ledger_gc as ledger_gc
    original, ledger_gc.read_references = ledger_gc.read_references, recording_meanwhile
    try:
        collector = _collector(store)
        assert await collector.collect_once() == []
    finally:
        ledger_gc.read_references = original
    assert await _existing(store) == {1, 2}
    assert collector.stats.verdicts == {"referenced": 2}


class _RecordsBeforeTransaction(MemoryStore):
    """Runs ``before`` once, just before the next transaction that deletes a ledger:
    the owner's write landing between the collector's last read and its delete."""

    def __init__(self) -> None:
        super().__init__()
        self.before = None

    async def transaction(self, compares, operations):
        if self.before is not None and any(keys.LEDGERS in getattr(op, "key", "") for op in operations) \
                and not any(hasattr(op, "value") for op in operations):
            before, self.before = self.before, None
            await before()
        return await super().transaction(compares, operations)


@pytest.mark.parametrize("where", ["ledger list", "compaction", "new cursor ledger", "archive", "topic created"])
async def test_a_ledger_recorded_between_the_check_and_the_delete_is_kept(where):
    store = _RecordsBeforeTransaction()
    owner = GONE if where == "topic created" else TOPIC
    if where != "topic created":
        await _put_topic(store, TOPIC, [1])
        await store.put(keys.cursor(TOPIC.key_path, "sub"), json.dumps({"cursor_ledger": 1}).encode())
    await _put_ledger(store, 2, ownership_tags(str(owner), PURPOSE_COMPACTED))

    async def record() -> None:
        if where == "ledger list":
            await _put_topic(store, TOPIC, [1, 2])
        elif where == "compaction":
            await _put_topic(store, TOPIC, [1], compacted=2)
        elif where == "new cursor ledger":
            await store.put(keys.cursor(TOPIC.key_path, "sub"), json.dumps({"cursor_ledger": 2}).encode())
        elif where == "archive":
            await store.put(keys.archive_ledger(TOPIC.key_path, 2), b"{}")
        else:
            await _put_topic(store, GONE, [2])

    store.before = record
    collector = _collector(store)
    assert await collector.collect_once() == []
    assert await _existing(store) == {2}
    assert collector.stats.deletes_refused == 1
    # The next pass sees the reference and keeps it for good.
    assert await collector.collect_once() == []
    assert await _existing(store) == {2}
    assert collector.stats.verdicts["referenced"] == 1


async def test_a_pass_is_bounded_and_resumes_where_the_last_one_stopped():
    store = MemoryStore()
    for ledger_id in range(1, 6):
        await _put_ledger(store, ledger_id, ownership_tags(str(GONE), PURPOSE_LEDGER))
    collector = _collector(store, ledgers_per_pass_max=2)
    assert await collector.collect_once() == [1, 2]
    assert await collector.collect_once() == [3, 4]
    assert await collector.collect_once() == [5]
    assert await collector.collect_once() == []
    assert collector.stats.ledgers_examined == 5


async def test_a_pass_stops_when_the_election_is_lost():
    store = MemoryStore()
    for ledger_id in range(1, 4):
        await _put_ledger(store, ledger_id, ownership_tags(str(GONE), PURPOSE_LEDGER))
    answers = iter([True, False])
    assert await _collector(store).collect_once(lambda: next(answers, False)) == [1]
    assert await _existing(store) == {2, 3}


# --- the recorder's half of the race ---------------------------------------------------------------------

async def test_the_managed_ledger_never_records_a_collected_ledger():
    """A compaction commit names its ledger with ``recording``: when the collector
    deleted the metadata first, the commit fails (NoSuchLedger) and the topic is not
    fenced; when the metadata is there, the record is written."""
    store = MemoryStore()
    ledger = ManagedLedger(TOPIC, store, FakeLedgerClient(first_ledger_id=100), EntryCache(1 << 20),
                           ManagedLedgerConfig(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1))
    await ledger.open(create_if_missing=True)
    with pytest.raises(NoSuchLedger):
        await ledger.set_properties({COMPACTION_PROPERTY: "x"}, recording=(42,))
    assert COMPACTION_PROPERTY not in ledger.properties
    await _put_ledger(store, 42, ownership_tags(str(TOPIC), PURPOSE_COMPACTED))
    await ledger.set_properties({COMPACTION_PROPERTY: "y"}, recording=(42,))
    assert ledger.properties[COMPACTION_PROPERTY] == "y"
    assert ledger.fenced_error is None
    await ledger.close()


def test_the_collector_flags_from_the_command_line_and_the_environment():
    """``magnetar autorecovery`` builds LedgerGcConfig from its --ledger-gc-* flags, and
    from MAGNETAR_<FLAG> like every option; a flag on the command line wins."""
    from runtime.config_options import config_overrides
    from magnetar.autorecovery import OPTIONS
    from magnetar.cli import parse_command_line

    def config(argv, environ=None) -> LedgerGcConfig:
        args = parse_command_line(["autorecovery", "--metadata", "etcd://127.0.0.1:2379", *argv], environ or {})
        return LedgerGcConfig(**config_overrides(args, OPTIONS, LedgerGcConfig))

    assert config([]) == LedgerGcConfig()
    assert config(["--ledger-gc-grace-s", "5", "--ledger-gc-interval-s", "0.5", "--ledger-gc-ledgers-per-pass-max",
                   "10", "--ledger-gc-call-timeout-s", "2"]) == LedgerGcConfig(
        grace_s=5, interval_s=0.5, ledgers_per_pass_max=10, call_timeout_s=2)
    assert config(["--no-ledger-gc"]).enabled is False
    environ = {"MAGNETAR_NO_LEDGER_GC": "true", "MAGNETAR_LEDGER_GC_GRACE_S": "7200"}
    assert config([], environ) == LedgerGcConfig(enabled=False, grace_s=7200)
    assert config(["--ledger-gc-grace-s", "60"], environ).grace_s == 60


async def test_a_rollover_never_records_a_ledger_whose_metadata_changed():
    """The new ledger of an open (or rollover) is recorded in one transaction with a
    compare on its metadata as created. When that compare fails (here the store holds
    a value at the ledger's key where the fake ledger client knows none: the same
    failure a collected ledger causes), the ledger is not recorded but deleted, and
    the managed ledger is not fenced: the next attempt records a fresh ledger."""
    from common.errors import MetadataVersionConflict

    store, client = MemoryStore(), FakeLedgerClient(first_ledger_id=100)
    config = ManagedLedgerConfig(ensemble_size=1, write_quorum_size=1, ack_quorum_size=1)
    await store.put(keys.ledger(100), b"changed meanwhile")
    ledger = ManagedLedger(TOPIC, store, client, EntryCache(1 << 20), config)
    with pytest.raises(MetadataVersionConflict):
        await ledger.open(create_if_missing=True)
    assert ledger.fenced_error is None
    info = ManagedLedgerInfo.decode((await store.get(keys.managed_ledger(TOPIC.key_path))).value)
    assert info.ledgers == []
    assert 100 not in client.ledgers                    # deleted, not leaked
    reopened = ManagedLedger(TOPIC, store, client, EntryCache(1 << 20), config)
    await reopened.open(create_if_missing=False)
    assert reopened.current_ledger_id == 101
    assert (await reopened.append(b"m")) == Position(101, 0)
    await reopened.close()


async def test_run_is_off_by_flag_idle_unless_elected_and_stops_on_a_broken_invariant():
    """``--no-ledger-gc``: run returns at once. Not elected: no pass. A non-catalogue
    error (a broken invariant): the collector stops for good instead of going on."""
    import asyncio

    store = MemoryStore()
    await _put_ledger(store, 1, ownership_tags(str(GONE), PURPOSE_LEDGER))
    off = LedgerCollector(store, LedgerClient(store), LedgerGcConfig(enabled=False))
    async with asyncio.timeout(5):
        await off.run(lambda: True)
    idle = _collector(store, interval_s=0.01)
    task = asyncio.get_running_loop().create_task(idle.run(lambda: False))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert idle.stats.passes == 0 and await _existing(store) == {1}

    class Broken(MemoryStore):
        async def get_prefix(self, prefix, *, limit=0, keys_only=False):
            raise RuntimeError("a bug")

    broken = LedgerCollector(Broken(), LedgerClient(store), LedgerGcConfig(interval_s=0.01))
    async with asyncio.timeout(5):
        await broken.run(lambda: True)
    assert broken.stats.passes == 0


async def test_an_etcd_call_that_hangs_keeps_the_ledger():
    """A reference read that does not answer within call_timeout_s: the owner is
    unreadable, its ledger kept, and the pass goes on."""
    import asyncio

    class Hangs(MemoryStore):
        async def get(self, key):
            if key.startswith(keys.MANAGED_LEDGERS):
                await asyncio.Event().wait()
            return await super().get(key)

    store = Hangs()
    await _put_ledger(store, 1, ownership_tags(str(GONE), PURPOSE_LEDGER))
    collector = _collector(store, call_timeout_s=0.05)
    assert await collector.collect_once() == []
    assert await _existing(store) == {1}
    assert collector.stats.verdicts == {"owner-unreadable": 1}


async def test_an_owner_with_more_records_than_a_transaction_compares_keeps_its_ledgers():
    store = MemoryStore()
    await _put_topic(store, TOPIC, [1])
    for index in range(GUARDS_MAX):
        await store.put(keys.cursor(TOPIC.key_path, f"sub-{index}"), json.dumps({"cursor_ledger": -1}).encode())
    await _put_ledger(store, 2, ownership_tags(str(TOPIC), PURPOSE_COMPACTED))
    collector = _collector(store)
    assert await collector.collect_once() == []
    assert await _existing(store) == {2}
    assert collector.stats.verdicts == {"too-many-guards": 1}
