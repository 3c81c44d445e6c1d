"""Bundle ownership on one broker (bundles/ownership.py), the leader's bookkeeping
(bundles/leader.py) and finding a topic's bundle among many (bundles/hashing.py,
BundleIndex), over the in-memory metadata store.

What it proves:
- self-fencing takes every bundle out of service before it closes any topic, then
  closes all bundles' topics concurrently (the bug: one bundle after another, each
  waiting for topic closes that flush to a failing etcd, the rest still served);
- release() finishes even when etcd fails its last transaction: retried, then the
  owner key is deleted without the hand-over so the leader reassigns the bundle (the
  bug: the error escaped and the key stayed RELEASING under our live lease, with
  nobody serving the bundle); a reply lost after etcd applied it is not an error;
- a lookup or ensure_serving that waits for an unowned bundle re-reads the
  namespace's boundaries at most once per call, and concurrent callers share reads
  (the bug: one etcd read per wake-up of every waiting caller);
- BundleIndex finds the same bundle as checking every range, parses each bundle name
  once per load report rather than once per topic and bundle, and finds a stopped
  bundle's topics by its own range even when the cached boundaries moved on;
- the leader, given the ownership mirrors, reads no owners or assignments from etcd
  and still assigns every unowned bundle; it forgets assignment times of bundles now
  owned or gone, and move times past the cooldown;
- owner_records / handover_target answer from the watched mirror and skip
  unreadable load reports;
- a transfer record is acted on only by the owner it names as its source: the
  destination, which can see the record after it took the bundle (two watch streams),
  leaves it alone, and a release to the owner itself is refused; the source acts even
  when its own owner mirror lags, and a source that no longer owns the bundle refuses
  and clears the record (the bug: the new
  owner released the bundle to itself, dropped its own assignment while busy, and
  nobody served the bundle until the leader's assignment timeout, 15 s);
- the leader clears a transfer record older than the assignment timeout that nobody
  acted on, which otherwise blocks every later move of that bundle.

How: real OwnershipManager / Leader / LoadReporter objects on MemoryStore (wrapped at
the store edge to count or fail chosen calls); topics are names only, closed through a
recording callback.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from common.topic_name import NamespaceName, TopicName
from bundles import hashing, ownership as ownership_module
from bundles.config import BundlesConfig
from bundles.hashing import BundleIndex, BundleRange, Bundles, default_boundaries, topic_hash
from bundles.leader import Leader
from bundles.load import LoadReporter
from bundles.ownership import BrokerIdentity, OwnershipManager
from bundles.records import AssignmentRecord, BundlesRecord, LoadReport, OwnerRecord, TransferRecord
from common.errors import MetadataUnavailable, PreconditionFailed, ServiceNotReady
from metadata import keys
from metadata.memory_store import MemoryStore
from metadata.prefix_cache import PrefixCache
from metadata.store import Delete, Put

NAMESPACE = NamespaceName("public", "default")
YIELDS_MAX = 2000


async def _until(condition, what: str = "condition") -> None:
    for _ in range(YIELDS_MAX):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what} not met")


def _identity(name: str) -> BrokerIdentity:
    return BrokerIdentity(name, f"pulsar://{name}:6650", f"http://{name}:8080")


def _topics_one_per_bundle(bundles: Bundles) -> list[TopicName]:
    """A topic name falling in each of the namespace's bundles."""
    found: dict[BundleRange, TopicName] = {}
    index = 0
    while len(found) < len(bundles.ranges):
        topic = TopicName.parse(f"persistent://public/default/t-{index}")
        found.setdefault(bundles.for_topic(str(topic)), topic)
        index += 1
    return [found[bundle] for bundle in bundles.ranges]


async def _namespace(store: MemoryStore, bundles_count: int = 4) -> Bundles:
    await store.put(keys.namespace_policies("public", "default"), b"{}")
    boundaries = default_boundaries(bundles_count)
    await store.put(keys.namespace_bundles("public", "default"), BundlesRecord(boundaries).encode())
    return Bundles(tuple(boundaries))


async def _assign_all(store: MemoryStore, manager: OwnershipManager, bundles: Bundles) -> None:
    for bundle in bundles.ranges:
        await store.put(keys.bundle_assignment(str(NAMESPACE), bundle.name),
                        AssignmentRecord(manager.identity.broker_id).encode())
    await _until(lambda: len(manager.serving()) == len(bundles.ranges), "all bundles served")


# --- self-fencing ---------------------------------------------------------------------------------

async def test_fencing_stops_serving_every_bundle_first_then_closes_them_concurrently():
    """Four served bundles, one loaded topic in each; topic closes block (etcd is away).
    When the lease goes stale, the broker is told (on_fence: it resets its client
    connections) once, before any close; the first close starts with nothing served
    any more, and all four bundles' closes are under way at once."""
    store = MemoryStore()
    bundles = await _namespace(store)
    topics = _topics_one_per_bundle(bundles)
    release = asyncio.Event()
    served_at_first_close: list[list[str]] = []
    in_flight = [0]
    in_flight_max = [0]
    closed: list[list[TopicName]] = []

    async def close_topics(names: list[TopicName], _reason: str, _destination=None) -> None:
        if not served_at_first_close:
            served_at_first_close.append(manager.serving())
        in_flight[0] += 1
        in_flight_max[0] = max(in_flight_max[0], in_flight[0])
        try:
            await release.wait()
        finally:
            in_flight[0] -= 1
        closed.append(names)

    fence_calls: list[int] = []      # closes begun when on_fence was called
    manager = OwnershipManager(store, BundlesConfig(lease_ttl_s=2), _identity("a"),
                               loaded_topics=lambda: list(topics), close_topics=close_topics,
                               on_fence=lambda: fence_calls.append(in_flight[0] + len(closed)))
    await manager.start()
    try:
        await _assign_all(store, manager, bundles)
        assert manager.lease is not None
        manager.lease.refreshed_at = time.monotonic() - 60        # no confirmation for a minute
        await asyncio.wait_for(_wait_for(lambda: in_flight[0] == len(topics)), 2.0)
        assert served_at_first_close == [[]]
        assert manager.fenced
        assert fence_calls == [0]
        assert [await manager.is_serving(topic) for topic in topics] == [False] * len(topics)
        # Its lookups no longer name itself (its record may be stale by now).
        with pytest.raises(ServiceNotReady, match="fenced"):
            await manager.owner_of(topics[0], lambda _broker: None)
        release.set()
        await _until(lambda: len(closed) == len(topics), "every bundle's topics closed")
        assert sorted(str(t) for names in closed for t in names) == sorted(str(t) for t in topics)
        assert in_flight_max[0] == len(topics)
    finally:
        release.set()
        await manager.close()


async def _wait_for(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_a_retired_broker_takes_no_new_lease_and_no_bundle():
    """A broker leaving (release_all, then retire): its lease is revoked and stays so
    (the bug: the lease guard saw the revoked lease as lost, logged an error and granted
    a new one, so a broker that had handed everything over could take bundles again
    just before it exited); a bundle assigned to it afterwards is not taken."""
    store = MemoryStore()
    bundles = await _namespace(store)
    fence_calls: list[bool] = []
    manager = OwnershipManager(store, BundlesConfig(lease_ttl_s=2), _identity("a"),
                               loaded_topics=lambda: [], close_topics=_no_topics,
                               on_fence=lambda: fence_calls.append(True))
    await manager.start()
    try:
        await _assign_all(store, manager, bundles)
        await manager.release_all(lambda _bundle: None)
        revoked = manager.lease
        await manager.retire()
        assert revoked is not None and revoked.is_lost
        await asyncio.sleep(0.5)        # several rounds of the guard (every ttl / 20 = 0.1 s)
        assert manager.lease is revoked and manager.fenced
        assert fence_calls == [], "a broker leaving has handed its bundles over: its clients are not reset"
        await store.put(keys.bundle_assignment(str(NAMESPACE), bundles.ranges[0].name),
                        AssignmentRecord("a").encode())
        await asyncio.sleep(0.2)
        assert manager.serving() == []
        assert await store.get(keys.bundle_owner(str(NAMESPACE), bundles.ranges[0].name)) is None
    finally:
        await manager.close()


async def test_a_broker_that_lost_its_lease_revokes_it_once_it_has_a_new_one():
    """A broker that saw its lease lost (unconfirmed for a TTL) fences itself, gets a
    new lease and revokes the old one, so its old owner keys go at once and the leader
    can hand those bundles out (the bug: the old lease, still alive in etcd after an
    etcd leader change, kept the keys for up to a TTL more with nobody serving them —
    the hosts harness measured 11 s more of stall after an etcd majority loss)."""
    store = MemoryStore()
    bundles = await _namespace(store)
    manager = OwnershipManager(store, BundlesConfig(lease_ttl_s=2), _identity("a"),
                               loaded_topics=lambda: [], close_topics=_no_topics)
    await manager.start()
    try:
        await _assign_all(store, manager, bundles)
        old = manager.lease
        owner_key = keys.bundle_owner(str(NAMESPACE), bundles.ranges[0].name)
        assert (await store.get(owner_key)).lease_id == old.lease_id
        old.lost.set()                   # the store's keep-alive gave up; etcd still has it
        await asyncio.wait_for(_wait_for(lambda: manager.lease is not old and not manager.fenced), 3.0)
        await asyncio.wait_for(_wait_for(lambda: old.lease_id not in store._leases), 3.0)
        assert await store.get(owner_key) is None, "the old lease's owner key outlived the new lease"
    finally:
        await manager.close()


async def _no_topics(_names: list[TopicName], _reason: str, _destination: str | None = None) -> None:
    return None


async def test_fencing_bounds_how_many_bundles_close_at_once(monkeypatch):
    """With more bundles than the bound, no more than the bound close at a time."""
    monkeypatch.setattr(ownership_module, "FENCE_CLOSES_CONCURRENT_MAX", 3)
    store = MemoryStore()
    bundles = await _namespace(store, 8)
    topics = _topics_one_per_bundle(bundles)
    in_flight = [0]
    in_flight_max = [0]
    done = [0]

    async def close_topics(_names, _reason, _destination=None) -> None:
        in_flight[0] += 1
        in_flight_max[0] = max(in_flight_max[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        done[0] += 1

    manager = OwnershipManager(store, BundlesConfig(lease_ttl_s=2), _identity("a"),
                               loaded_topics=lambda: list(topics), close_topics=close_topics)
    await manager.start()
    try:
        await _assign_all(store, manager, bundles)
        manager.lease.refreshed_at = time.monotonic() - 60
        await asyncio.wait_for(_wait_for(lambda: done[0] == len(topics)), 3.0)
        assert in_flight_max[0] == 3
        assert manager.serving() == []
    finally:
        await manager.close()


# --- release when etcd fails the last step -----------------------------------------------------------

class FinalStepFailingStore(MemoryStore):
    """Fails transactions that delete an owner key (a release's last step) while
    ``failures`` lasts; ``only_with_put`` spares the delete-only fallback; with
    ``apply_first`` the transaction is applied before the error (a lost reply)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.only_with_put = False
        self.apply_first = False

    async def transaction(self, compares, operations):
        final = any(isinstance(op, Delete) and op.key.startswith(keys.BUNDLE_OWNERS) for op in operations)
        if final and self.failures and (not self.only_with_put or any(isinstance(op, Put) for op in operations)):
            self.failures -= 1
            if self.apply_first:
                await super().transaction(compares, operations)
            raise MetadataUnavailable("etcd call failed: UNAVAILABLE")
        return await super().transaction(compares, operations)


async def _served_manager(store: MemoryStore) -> tuple[OwnershipManager, str]:
    await _namespace(store, 1)

    async def close_topics(_names, _reason, _destination=None) -> None:
        return None

    manager = OwnershipManager(store, BundlesConfig(), _identity("a"), loaded_topics=list,
                               close_topics=close_topics)
    await manager.start()
    whole = BundleRange.parse("0x00000000_0xffffffff").name
    await store.put(keys.bundle_assignment(str(NAMESPACE), whole), AssignmentRecord("a").encode())
    await _until(lambda: manager.serving() == [f"{NAMESPACE}/{whole}"] and manager.owners(), "bundle served")
    return manager, whole


@pytest.fixture
def quick_release_retries(monkeypatch):
    monkeypatch.setattr(ownership_module, "RELEASE_RETRY_S", 0.001)


async def test_release_retries_its_last_step(quick_release_retries):
    """Two failures, then success: the bundle is handed to b as asked."""
    store = FinalStepFailingStore()
    manager, bundle = await _served_manager(store)
    try:
        store.failures = 2
        await manager.release(str(NAMESPACE), bundle, to="b", reason="test")
        assert await store.get(keys.bundle_owner(str(NAMESPACE), bundle)) is None
        assignment = await store.get(keys.bundle_assignment(str(NAMESPACE), bundle))
        assert assignment is not None and AssignmentRecord.decode(assignment.value).broker_id == "b"
        assert manager.serving() == []
    finally:
        await manager.close()


async def test_the_upper_half_of_a_split_is_released_at_once():
    """split then release of the upper half, with nothing in between (what
    ``…/split?unload=true`` does): the release must not depend on the watched mirror
    having seen the halves' owner keys yet. It failed with "not owned by this broker"
    when the watch lagged, as it does on a loaded machine."""
    store = MemoryStore()
    manager, whole = await _served_manager(store)
    try:
        low, high = await manager.split(NAMESPACE, whole)
        await manager.release(str(NAMESPACE), high, to="b", reason="split")
        assert await store.get(keys.bundle_owner(str(NAMESPACE), high)) is None
        assignment = await store.get(keys.bundle_assignment(str(NAMESPACE), high))
        assert assignment is not None and AssignmentRecord.decode(assignment.value).broker_id == "b"
        assert manager.serving() == [f"{NAMESPACE}/{low}"]
    finally:
        await manager.close()


async def test_release_that_cannot_hand_over_frees_the_owner_key(quick_release_retries, caplog):
    """The hand-over transaction keeps failing: after the bounded attempts the owner key
    is deleted on its own (logged as an error), so the leader can reassign the bundle
    instead of it staying RELEASING under our lease."""
    store = FinalStepFailingStore()
    manager, bundle = await _served_manager(store)
    try:
        store.failures, store.only_with_put = 100, True
        with caplog.at_level(logging.ERROR, logger="bundles.ownership"):
            await manager.release(str(NAMESPACE), bundle, to="b", reason="test")
        assert await store.get(keys.bundle_owner(str(NAMESPACE), bundle)) is None
        assert any(r.levelno == logging.ERROR and "deleting its owner key" in r.getMessage()
                   for r in caplog.records)
        assert manager.serving() == []
    finally:
        await manager.close()


async def test_release_whose_last_reply_was_lost_is_done(quick_release_retries):
    """etcd applied the hand-over but the reply was lost: the retry's compare fails
    because the key is gone, and release() returns normally with the hand-over in place."""
    store = FinalStepFailingStore()
    manager, bundle = await _served_manager(store)
    try:
        store.failures, store.apply_first = 1, True
        await manager.release(str(NAMESPACE), bundle, to="b", reason="test")
        assert await store.get(keys.bundle_owner(str(NAMESPACE), bundle)) is None
        assert await store.get(keys.bundle_assignment(str(NAMESPACE), bundle)) is not None
    finally:
        await manager.close()


# --- re-reading boundaries while waiting for an owner --------------------------------------------------

class CountingStore(MemoryStore):
    """Counts reads of the namespace's boundaries, each taking a little while (as an
    etcd round trip does), so concurrent callers' reads overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.bundle_reads = 0

    async def get(self, key: str):
        if key == keys.namespace_bundles("public", "default"):
            self.bundle_reads += 1
            await asyncio.sleep(0.01)
        return await super().get(key)


async def _nudge(store: MemoryStore, count: int) -> None:
    """Changes that wake every waiting caller (assignments to a broker that is not us)."""
    for index in range(count):
        await store.put(f"{keys.BUNDLE_ASSIGNMENTS}other/ns/0x00000000_0x0000000{index}",
                        AssignmentRecord("nobody").encode())
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("callers, reads_max", [(1, 2), (10, 4)])
@pytest.mark.parametrize("call", ["owner_of", "ensure_serving"])
async def test_waiting_for_an_unowned_bundle_rereads_boundaries_once_per_call(call: str, callers: int,
                                                                              reads_max: int):
    """Callers wait for a bundle nobody owns while twenty unrelated changes wake them:
    one caller reads the boundaries twice (the first load and one refresh); ten
    concurrent callers a handful of times in all (each read shared by the callers whose
    need it came after), not once per caller per wake-up."""
    from common.errors import ServiceNotReady

    store = CountingStore()
    await _namespace(store, 1)

    async def close_topics(_names, _reason, _destination=None) -> None:
        return None

    manager = OwnershipManager(store, BundlesConfig(ownership_wait_s=0.5), _identity("a"), loaded_topics=list,
                               close_topics=close_topics)
    await manager.start()
    try:
        topic = TopicName.parse("persistent://public/default/waiting")

        async def wait_once() -> None:
            with pytest.raises(ServiceNotReady):
                if call == "owner_of":
                    await manager.owner_of(topic, lambda _b: None)
                else:
                    await manager.ensure_serving(topic)

        waiting = [asyncio.create_task(wait_once()) for _ in range(callers)]
        await _nudge(store, 20)
        await asyncio.gather(*waiting)
        assert store.bundle_reads <= reads_max, store.bundle_reads
    finally:
        await manager.close()


# --- BundleIndex ------------------------------------------------------------------------------------------

def _split_bundles() -> Bundles:
    bundles = Bundles(tuple(default_boundaries(8)))
    for _ in range(3):
        bundles = bundles.with_split(bundles.ranges[1])
    return bundles


def test_bundle_index_agrees_with_checking_every_range():
    """Every topic maps to the bundle that contains its hash, among unevenly split
    ranges; a topic of another namespace or outside the given bundles maps to None."""
    bundles = _split_bundles()
    served = [f"public/default/{r.name}" for r in bundles.ranges if r.lower % 3 != 1]
    index = BundleIndex(served)
    for i in range(2000):
        name = f"persistent://public/default/topic-{i}"
        value = topic_hash(name)
        expected = next((key for key in served if BundleRange.parse(key.rpartition("/")[2]).contains(value)),
                        None)
        assert index.find(name) == expected
    assert index.find("persistent://public/other/topic-1") is None
    assert BundleIndex([]).find("persistent://public/default/x") is None


def test_bundle_index_finds_a_stopped_bundles_topics_by_its_own_range():
    """A bundle being stopped that has since been split elsewhere (the cache holds the
    halves) still finds all of its topics: the index uses the key's own range."""
    whole = f"public/default/{BundleRange(0, hashing.FULL_UPPER).name}"
    index = BundleIndex([whole])
    assert all(index.find(f"persistent://public/default/t-{i}") == whole for i in range(100))


def test_load_report_parses_each_bundle_name_once(monkeypatch):
    """10,000 topics over 128 served bundles: a report parses the 128 names once each
    (it parsed one name per topic and bundle: over a million parses on the event loop),
    and attributes each topic's traffic to its bundle."""
    bundles = Bundles(tuple(default_boundaries(128)))
    served = [f"public/default/{r.name}" for r in bundles.ranges]
    names = [f"persistent://public/default/t-{i}" for i in range(10_000)]
    counts = {"in": 0}

    class FakeOwnership:
        identity = _identity("a")

        def serving(self) -> list[str]:
            return served

    def counters():
        counts["in"] += 10
        return {name: (counts["in"], 0) for name in names}, 0

    reporter = LoadReporter(MemoryStore(), BundlesConfig(), FakeOwnership(), counters)
    reporter.build()
    parses = [0]
    original = BundleRange.parse.__func__

    def counting_parse(cls, name):
        parses[0] += 1
        return original(cls, name)

    monkeypatch.setattr(BundleRange, "parse", classmethod(counting_parse))
    report = reporter.build()
    assert parses[0] == len(served)
    assert set(report.bundle_msg_rates) <= set(served)
    expected: dict[str, int] = {}
    for name in names:
        key = f"public/default/{bundles.for_topic(name).name}"
        expected[key] = expected.get(key, 0) + 1
    assert set(report.bundle_msg_rates) == set(expected)


# --- the leader ------------------------------------------------------------------------------------------

class PrefixCountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.prefix_reads: list[str] = []

    async def get_prefix(self, prefix: str, *, limit: int = 0, keys_only: bool = False):
        self.prefix_reads.append(prefix)
        return await super().get_prefix(prefix, limit=limit, keys_only=keys_only)


async def _leader_setup(store: MemoryStore, with_ownership: bool):
    bundles = await _namespace(store, 4)

    async def close_topics(_names, _reason, _destination=None) -> None:
        return None

    manager = OwnershipManager(store, BundlesConfig(), _identity("a"), loaded_topics=list,
                               close_topics=close_topics)
    await manager.start()
    await store.put(keys.broker("a"), LoadReport("a", "pulsar://a:6650", "http://a:8080").encode(),
                    lease=manager.lease)
    brokers = PrefixCache(store, keys.BROKERS)
    await brokers.start()
    leader = Leader(store, BundlesConfig(), _identity("a"), lambda: manager.lease, brokers,
                    ownership=manager if with_ownership else None)
    leader.is_leader = True
    return bundles, manager, brokers, leader


@pytest.mark.parametrize("with_ownership", [True, False])
async def test_leader_assigns_every_unowned_bundle(with_ownership: bool):
    """With the ownership mirrors the leader reads no owners or assignments from etcd;
    either way every bundle ends up owned, and the assignment times are then pruned."""
    store = PrefixCountingStore()
    bundles, manager, brokers, leader = await _leader_setup(store, with_ownership)
    try:
        store.prefix_reads.clear()
        await leader._decide()
        await _until(lambda: len(manager.serving()) == len(bundles.ranges) == len(manager.owners()),
                     "every bundle taken")
        await leader._decide()
        owner_reads = [p for p in store.prefix_reads if p in (keys.BUNDLE_OWNERS, keys.BUNDLE_ASSIGNMENTS)]
        assert (owner_reads == []) == with_ownership
        assert leader._assigned_at == {}
    finally:
        await brokers.close()
        await manager.close()


async def test_leader_forgets_moves_past_the_cooldown_and_bundles_that_are_gone():
    store = MemoryStore()
    bundles, manager, brokers, leader = await _leader_setup(store, True)
    try:
        now = time.monotonic()
        live = f"{NAMESPACE}/{bundles.ranges[0].name}"
        leader._moved_at = {live: now, f"{NAMESPACE}/{bundles.ranges[1].name}": now - 3600,
                            f"{NAMESPACE}/0x00000000_0x00000010": now}
        leader._assigned_at = {f"{NAMESPACE}/0x00000000_0x00000010": now}
        await leader._decide()
        # The old move and the gone bundle's are forgotten. Every bundle was unowned,
        # so this round assigned each, and an assignment starts a cooldown too: each
        # range has this round's time (range 1's hour-old move is replaced by it).
        assert set(leader._moved_at) == {f"{NAMESPACE}/{r.name}" for r in bundles.ranges}
        assert all(at >= now for at in leader._moved_at.values()), leader._moved_at
        assert live in leader._moved_at
        assert f"{NAMESPACE}/0x00000000_0x00000010" not in leader._assigned_at
    finally:
        await brokers.close()
        await manager.close()


async def test_leader_corrects_reports_by_its_moves_until_they_show():
    """A shed move is remembered with the bundle's rate from its source's report; it
    is forgotten once both ends report an interval that began after it had time to
    complete, or when it grows older than the expiry even if they never do."""
    store = MemoryStore()
    bundles, manager, brokers, leader = await _leader_setup(store, True)
    try:
        await leader._decide()
        await _until(lambda: len(manager.serving()) == len(bundles.ranges) == len(manager.owners()), "all owned")
        leader._moved_at.clear()   # as if the cooldown that the assignments began had passed
        rates = {f"{NAMESPACE}/{b.name}": 5.0 * (i + 1) for i, b in enumerate(bundles.ranges)}
        now_ms = int(time.time() * 1000)

        async def reports(at_ms: int) -> None:
            await store.put(keys.broker("a"), LoadReport("a", "pulsar://a:6650", "http://a:8080",
                                                         msg_rate_in=sum(rates.values()), bundle_msg_rates=rates,
                                                         reported_ms=at_ms).encode())
            await store.put(keys.broker("b"), LoadReport("b", "pulsar://b:6650", "http://b:8080",
                                                         reported_ms=at_ms).encode())
            await _until(lambda: all(LoadReport.decode(r.value).reported_ms == at_ms
                                     for r in brokers.records.values()) and len(brokers.records) == 2, "reports")

        await reports(now_ms)
        await leader._decide()
        assert leader.moves == 1
        [(bundle, move)] = leader._unsettled.items()
        assert (move.source, move.target, move.rate) == ("a", "b", rates[bundle])
        await leader._decide()
        assert bundle in leader._unsettled, "the reports were written before the move"
        settle_ms = int((leader.config.report_interval_s + leader.config.move_settle_s) * 1000)
        await reports(move.ordered_ms + settle_ms)
        await leader._decide()
        assert bundle not in leader._unsettled
        leader._unsettled[bundle] = move.__class__(bundle, "a", "b", 1.0,
                                                   now_ms - int(leader._move_expiry_s * 1000) - 1000)
        await reports(now_ms)     # reports from before the move: only the expiry forgets it
        await leader._decide()
        assert bundle not in leader._unsettled
    finally:
        await brokers.close()
        await manager.close()


# --- watched owner records and the hand-over target ------------------------------------------------------

async def test_owner_records_and_handover_target_come_from_the_mirrors():
    """owner_records mirrors the owner keys (an unreadable one is skipped); the
    hand-over target is the least loaded other broker, ignoring an unreadable report."""
    store = MemoryStore()
    await _namespace(store, 4)

    async def close_topics(_names, _reason, _destination=None) -> None:
        return None

    manager = OwnershipManager(store, BundlesConfig(), _identity("a"), loaded_topics=list,
                               close_topics=close_topics)
    await manager.start()
    brokers = PrefixCache(store, keys.BROKERS)
    await brokers.start()
    try:
        ranges = Bundles(tuple(default_boundaries(4))).ranges
        await store.put(keys.bundle_owner(str(NAMESPACE), ranges[0].name),
                        OwnerRecord("b", "pulsar://b:6650", "http://b:8080").encode())
        await store.put(keys.bundle_owner(str(NAMESPACE), ranges[1].name), b"not json")
        for name in ("a", "b", "c"):
            await store.put(keys.broker(name), LoadReport(name, f"pulsar://{name}", f"http://{name}").encode())
        await store.put(keys.broker("broken"), b"{")
        await _until(lambda: len(brokers.records) == 4 and len(manager._owners.records) == 2, "mirrors")
        records = manager.owner_records()
        assert list(records) == [f"{NAMESPACE}/{ranges[0].name}"]
        assert records[f"{NAMESPACE}/{ranges[0].name}"].broker_id == "b"
        assert manager.handover_target(brokers) == "c"          # b owns a bundle, c none
    finally:
        await brokers.close()
        await manager.close()


async def test_an_unconfirmed_lease_that_cannot_have_expired_keeps_every_bundle_served():
    """Metadata outages (issue 14): with a 10 s TTL, a lease unconfirmed for 5 s makes
    the broker metadata-degraded (it refuses to load topics, retriably) but it keeps
    serving every bundle and closes nothing; at 9.5 s (past fence_fraction, 0.9) it
    fences; confirmed again, it serves again and is no longer degraded."""
    from common.errors import ServiceNotReady

    store = MemoryStore()
    bundles = await _namespace(store)
    topics = _topics_one_per_bundle(bundles)
    closed: list[TopicName] = []

    async def close_topics(names: list[TopicName], _reason: str, _destination=None) -> None:
        closed.extend(names)

    manager = OwnershipManager(store, BundlesConfig(lease_ttl_s=10, ownership_wait_s=0.5), _identity("a"),
                               loaded_topics=lambda: list(topics), close_topics=close_topics)
    await manager.start()
    try:
        await _assign_all(store, manager, bundles)
        assert manager.lease is not None
        manager.lease.refreshed_at = time.monotonic() - 5.0
        await asyncio.wait_for(_wait_for(lambda: manager.metadata_degraded), 2.0)
        await asyncio.sleep(0.6)                                  # two more looks of the guard
        assert not manager.fenced
        assert len(manager.serving()) == len(bundles.ranges)
        assert [await manager.is_serving(topic) for topic in topics] == [True] * len(topics)
        assert closed == []
        # A request for a topic waits for etcd (at most ownership_wait_s), then is refused...
        with pytest.raises(ServiceNotReady, match="metadata store is unavailable"):
            await manager.ensure_serving(topics[0])
        # ...and one that etcd answers in time is served, not refused.
        waiting = asyncio.get_running_loop().create_task(manager.ensure_serving(topics[0]))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        manager.lease.refreshed_at = time.monotonic()
        await asyncio.wait_for(waiting, 2.0)
        manager.lease.refreshed_at = time.monotonic() - 5.0
        await asyncio.wait_for(_wait_for(lambda: manager.metadata_degraded), 2.0)
        assert manager.outages == 2
        manager.lease.refreshed_at = time.monotonic() - 9.5
        await asyncio.wait_for(_wait_for(lambda: manager.fenced), 2.0)
        await _until(lambda: len(closed) == len(topics), "every bundle's topics closed")
        assert manager.serving() == []
        manager.lease.refreshed_at = time.monotonic()
        await asyncio.wait_for(_wait_for(lambda: not manager.fenced and not manager.metadata_degraded), 2.0)
        assert len(manager.serving()) == len(bundles.ranges)
        await manager.ensure_serving(topics[0])
        assert manager.outages == 2
    finally:
        await manager.close()


def test_the_fence_comes_at_least_a_second_before_the_lease_could_expire():
    """fence_after_s: 0.9 of a 10 s TTL (9 s); with a 4 s TTL not 3.6 s but 3 s (a
    second before the end); never below a fifth of the TTL."""
    assert BundlesConfig(lease_ttl_s=10).fence_after_s == 9.0
    assert BundlesConfig(lease_ttl_s=4).fence_after_s == 3.0
    assert BundlesConfig(lease_ttl_s=2).fence_after_s == 1.0
    assert BundlesConfig(lease_ttl_s=30).fence_after_s == 27.0
    assert BundlesConfig(lease_ttl_s=10, fence_fraction=0.5).fence_after_s == 5.0


# --- transfers: only the source acts -----------------------------------------------------------------------

async def _settle() -> None:
    for _ in range(200):
        await asyncio.sleep(0)


async def _handed_over_to_c(store: MemoryStore, manager: OwnershipManager, bundle: str) -> None:
    """Waits until a has released ``bundle`` to c: not served, c's assignment written,
    the transfer record gone."""
    await _until(lambda: manager.serving() == [], "released")
    transfer_key = keys.bundle_transfer(str(NAMESPACE), bundle)
    assignment_key = keys.bundle_assignment(str(NAMESPACE), bundle)
    for _ in range(YIELDS_MAX):
        if await store.get(transfer_key) is None and await store.get(assignment_key) is not None:
            break
        await asyncio.sleep(0)
    assignment = await store.get(assignment_key)
    assert assignment is not None and AssignmentRecord.decode(assignment.value).broker_id == "c"
    assert await store.get(transfer_key) is None


async def _assert_served_and_owned_by_a(store: MemoryStore, manager: OwnershipManager, bundle: str) -> None:
    assert manager.serving() == [f"{NAMESPACE}/{bundle}"]
    owner = await store.get(keys.bundle_owner(str(NAMESPACE), bundle))
    assert owner is not None and OwnerRecord.decode(owner.value).broker_id == "a"


@pytest.fixture
async def served_by_a():
    """(store, manager "a" serving the namespace's one bundle, that bundle's name)."""
    store = MemoryStore()
    manager, bundle = await _served_manager(store)
    try:
        yield store, manager, bundle
    finally:
        await manager.close()


@pytest.mark.parametrize("transfer", [
    TransferRecord("a", reason="load", source="z"),    # a took it from z; z's watch was faster
    TransferRecord("a", reason="load"),                # written before records named a source
    TransferRecord("c", reason="load", source="z"),    # a move planned for another owner
], ids=["destination", "legacy-to-self", "other-source"])
async def test_a_transfer_not_meant_for_this_owner_is_left_alone(served_by_a, transfer: TransferRecord):
    store, manager, bundle = served_by_a
    transfer_key = keys.bundle_transfer(str(NAMESPACE), bundle)
    await store.put(transfer_key, transfer.encode())
    await _settle()
    await _assert_served_and_owned_by_a(store, manager, bundle)
    assert await store.get(transfer_key) is not None, "another broker's record is not ours to delete"


async def test_a_transfer_naming_this_owner_hands_the_bundle_over(served_by_a):
    store, manager, bundle = served_by_a
    transfer_key = keys.bundle_transfer(str(NAMESPACE), bundle)
    await store.put(transfer_key, TransferRecord("c", reason="load", source="a").encode())
    await _handed_over_to_c(store, manager, bundle)


async def test_a_transfer_naming_this_owner_is_acted_on_while_the_owner_mirror_lags(served_by_a):
    """The reverse of the destination's race: the owner's watch of the owner keys is
    behind its watch of the transfers (here: its mirror has not got the key). The record
    names it, so it hands the bundle over all the same (release reads etcd)."""
    store, manager, bundle = served_by_a
    manager._owners.records.pop(keys.bundle_owner(str(NAMESPACE), bundle))
    assert manager.owner_record(str(NAMESPACE), bundle) is None
    transfer_key = keys.bundle_transfer(str(NAMESPACE), bundle)
    await store.put(transfer_key, TransferRecord("c", reason="load", source="a").encode())
    await _handed_over_to_c(store, manager, bundle)


async def test_a_transfer_naming_a_broker_that_no_longer_owns_the_bundle_is_refused_and_cleared(served_by_a):
    """A record addressed to a broker whose ownership ended (the key is someone else's
    now): it acts, release() finds the key is not its own and refuses, and the record
    goes so the leader can plan again."""
    store, manager, bundle = served_by_a
    await store.put(keys.bundle_owner(str(NAMESPACE), bundle), OwnerRecord("b", "pulsar://b", "http://b").encode())
    transfer_key = keys.bundle_transfer(str(NAMESPACE), bundle)
    await store.put(transfer_key, TransferRecord("c", reason="load", source="a").encode())
    for _ in range(YIELDS_MAX):
        if await store.get(transfer_key) is None:
            break
        await asyncio.sleep(0)
    assert await store.get(transfer_key) is None
    owner = await store.get(keys.bundle_owner(str(NAMESPACE), bundle))
    assert owner is not None and OwnerRecord.decode(owner.value).broker_id == "b"
    assert await store.get(keys.bundle_assignment(str(NAMESPACE), bundle)) is None


async def test_a_hand_over_names_the_loaded_topics_and_the_destination_preloads_them():
    """a serves two bundles with topics loaded in both and hands one to b: a closes
    that bundle's topics naming b (for their clients), b's assignment names the loaded
    topics of that bundle only, and b, once it has taken the bundle, hands exactly
    those to its preload hook. An assignment from the leader
    (no topics) or with a garbled list preloads nothing."""
    store = MemoryStore()
    bundles = await _namespace(store, 2)
    first, second = bundles.ranges
    topics = {bundle: [t for t in (TopicName.parse(f"persistent://public/default/p-{i}") for i in range(40))
                       if bundles.for_topic(str(t)) == bundle] for bundle in bundles.ranges}
    assert topics[first] and topics[second]

    async def close_topics(_names, _reason, _destination=None) -> None:
        return None

    preloaded: list[list[str]] = []
    closed: list[tuple[list[TopicName], str | None]] = []

    async def close_and_record(names, _reason, destination=None) -> None:
        closed.append((names, destination))

    a = OwnershipManager(store, BundlesConfig(), _identity("a"),
                         loaded_topics=lambda: [*topics[first], *topics[second]], close_topics=close_and_record)
    b = OwnershipManager(store, BundlesConfig(), _identity("b"), loaded_topics=list, close_topics=close_topics,
                         preload_topics=preloaded.append)
    await a.start()
    await b.start()
    try:
        await _assign_all(store, a, bundles)
        await store.put(keys.broker("b"), LoadReport("b", "pulsar://b:6650", "http://b:8080").encode())
        await a.release(str(NAMESPACE), first.name, to="b", reason="test")
        await _until(lambda: b.serving() == [f"{NAMESPACE}/{first.name}"], "b serves the bundle")
        assert closed == [(topics[first], "b")], "a closes the bundle's topics naming where they go"
        assert preloaded == [[str(t) for t in topics[first]]]
        await b.release(str(NAMESPACE), first.name, to=None, reason="test")
        for assignment in (AssignmentRecord("b"), AssignmentRecord("b", topics=[5, None])):   # type: ignore[list-item]
            await store.put(keys.bundle_assignment(str(NAMESPACE), first.name), assignment.encode())
            await _until(lambda: b.serving() == [f"{NAMESPACE}/{first.name}"], "b serves the bundle again")
            await b.release(str(NAMESPACE), first.name, to=None, reason="test")
        assert len(preloaded) == 1
    finally:
        await b.close()
        await a.close()


async def test_a_release_to_the_owner_itself_is_refused(served_by_a):
    store, manager, bundle = served_by_a
    with pytest.raises(PreconditionFailed):
        await manager.release(str(NAMESPACE), bundle, to="a", reason="test")
    await _assert_served_and_owned_by_a(store, manager, bundle)


@pytest.mark.parametrize("stale", [True, False], ids=["stale", "fresh"])
async def test_leader_clears_a_transfer_nobody_acted_on(stale: bool):
    """Every bundle owned by a, b idle: the leader plans one move. A transfer record
    left by a source that never acted (here: named "gone") blocks it; once older than
    the assignment timeout it is cleared and the next round moves the bundle."""
    store = MemoryStore()
    bundles, manager, brokers, leader = await _leader_setup(store, True)
    try:
        await leader._decide()
        await _until(lambda: len(manager.serving()) == len(bundles.ranges) == len(manager.owners()), "all owned")
        leader._moved_at.clear()   # as if the cooldown that the assignments began had passed
        await store.put(keys.broker("b"), LoadReport("b", "pulsar://b:6650", "http://b:8080").encode())
        await _until(lambda: len(brokers.records) == 2, "b's report")
        decided_ms = int(time.time() * 1000) - (int(BundlesConfig().assignment_timeout_s * 1000) + 1000 if stale else 0)
        left = TransferRecord("x", reason="load", decided_ms=decided_ms, source="gone")
        for bundle in bundles.ranges:
            await store.put(keys.bundle_transfer(str(NAMESPACE), bundle.name), left.encode())
        await leader._decide()
        await leader._decide()
        records = [await store.get(keys.bundle_transfer(str(NAMESPACE), b.name)) for b in bundles.ranges]
        sources = sorted(TransferRecord.decode(r.value).source for r in records if r is not None)
        if stale:
            assert leader.moves == 1
            assert sources.count("gone") == len(bundles.ranges) - 1   # only the planned bundle's was cleared
        else:
            assert leader.moves == 0
            assert sources == ["gone"] * len(bundles.ranges)
    finally:
        await brokers.close()
        await manager.close()


class _OwnersWatchLagging:
    """The store as one broker sees it, with its watch of the owner keys held back while
    ``gate`` is clear (its events are delivered later, in order): etcd's watches are
    streams of their own, and one may deliver a change after the broker has already
    heard the reply to a later transaction on its main connection."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.gate = asyncio.Event()
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self._store, name)

    def watch_prefix(self, prefix: str, *, start_version: int = 0):
        inner = self._store.watch_prefix(prefix, start_version=start_version)
        if prefix != keys.BUNDLE_OWNERS:
            return inner
        gate = self.gate

        class Gated:
            def __aiter__(self):
                return self._events()

            async def _events(self):
                async for event in inner:
                    await gate.wait()
                    yield event

            async def close(self) -> None:
                await inner.close()

        return Gated()


async def test_a_late_event_from_before_the_take_does_not_stop_the_new_owner():
    """a hands the namespace's bundle to b. b's watch of the owner keys lags: it hears
    of a's RELEASING record and of its deletion only after b has taken the bundle (its
    take's transaction answered on the main connection). Those events describe the
    bundle before b owned it: b goes on serving, and a request for a topic of the
    bundle is served (the bug: b took the old events for its own key vanishing, stopped
    serving "owner key lost" while its key lived on under its lease, and answered "not
    served here yet" until the client gave up: the hand-over test's 30 s timeout). A
    deletion after the take still stops b."""
    store = MemoryStore()
    await _namespace(store, 1)
    lagging = _OwnersWatchLagging(store)

    async def close_topics(_names, _reason, _destination=None) -> None:
        return None

    a = OwnershipManager(store, BundlesConfig(), _identity("a"), loaded_topics=list, close_topics=close_topics)
    b = OwnershipManager(lagging, BundlesConfig(ownership_wait_s=0.5), _identity("b"), loaded_topics=list,
                         close_topics=close_topics)
    await a.start()
    await b.start()
    try:
        whole = BundleRange.parse("0x00000000_0xffffffff").name
        bkey = f"{NAMESPACE}/{whole}"
        await store.put(keys.bundle_assignment(str(NAMESPACE), whole), AssignmentRecord("a").encode())
        await _until(lambda: a.serving() == [bkey] and b.owner_record(str(NAMESPACE), whole) is not None,
                     "a serves the bundle and b knows it")
        lagging.gate.clear()
        await a.release(str(NAMESPACE), whole, to="b", reason="test")
        await _until(lambda: b.serving() == [bkey], "b takes the bundle")
        lagging.gate.set()
        await _until(lambda: (record := b.owner_record(str(NAMESPACE), whole)) is not None
                     and record.broker_id == "b", "b's mirror shows its own key")
        await _settle()
        assert b.serving() == [bkey], "b stopped serving a bundle it owns"
        await asyncio.wait_for(b.ensure_serving(TopicName.parse("persistent://public/default/t")), 2.0)
        owner = await store.get(keys.bundle_owner(str(NAMESPACE), whole))
        assert owner is not None and OwnerRecord.decode(owner.value).broker_id == "b"
        # A change after the take still counts: the key deleted (an operator, or the
        # lease expired) stops b at once.
        await store.delete(keys.bundle_owner(str(NAMESPACE), whole))
        await _until(lambda: b.serving() == [], "b stops serving once its key is gone")
    finally:
        await b.close()
        await a.close()
