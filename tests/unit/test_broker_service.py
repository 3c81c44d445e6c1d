"""Loading and closing topics in the broker service (broker/service.py, broker/topic.py).

What it proves: concurrent first uses of a topic share one load (one managed ledger,
one ledger created), also while ownership is still being confirmed; a caller that goes
away (cancelled, as when its client disconnects) does not fail the load for the others;
a second close() returns only when the topic is closed; a topic that is closing is
loaded again only after its close finished (never two managed ledgers of one topic at
once); shutting the service down stops a load in progress and tells its callers;
create_topic creates the record once; no subscription is created on a topic whose
close has begun (the close waits only for creations already under way, so a later one
would write its cursor after the close); a ledger's retention age counts from its close,
not its creation; subscriptions are loaded from a keys-only listing; stats report the
cursor ledger; the broker refuses a max_message_size whose entries the ledger client
could not store.

How: a real BrokerService over the in-memory metadata store (the etcd edge) and
FakeLedgerClient (the ledger-client edge); a gate in a fake ownership manager or in the
fake ledger client holds a load or a close where the test wants it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from common.entry import ENTRY_BYTES_MAX_DEFAULT
from broker.config import BrokerConfig
from managed_ledger.managed_ledger import ManagedLedgerConfig
from broker.service import BrokerService
from broker.stats import internal_stats
from common.topic_name import TopicName
from common.errors import AlreadyExists, ConfigError, ServiceNotReady, TopicFenced, TopicNotFound
from metadata import keys
from metadata.memory_store import MemoryStore
from tests.unit.fake_ledger_client import FakeLedgerClient

MIB = 1024 * 1024
TOPIC = TopicName.parse("persistent://public/default/loaded")
TIMEOUT_S = 5.0


class GatedOwnership:
    """The bundles layer's ownership manager, as far as the service uses it: this
    broker serves everything, once ``gate`` is open."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def ensure_serving(self, topic: TopicName) -> None:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1

    async def is_serving(self, topic: TopicName) -> bool:
        return True


def broker_config(**overrides) -> BrokerConfig:
    return BrokerConfig(metadata_url="memory://", managed_ledger=ManagedLedgerConfig(1, 1, 1),
                        retention_check_interval_s=3600, **overrides)


async def started(client: FakeLedgerClient | None = None) -> BrokerService:
    service = BrokerService(broker_config(), MemoryStore(), client or FakeLedgerClient(),
                            topic_ownership=GatedOwnership())
    await service.start()
    return service


async def until(condition, what: str) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():
            await asyncio.sleep(0.001)
    assert condition(), what


def spawn(coroutine) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(coroutine)


async def test_concurrent_first_uses_share_one_load():
    """Two get_topic calls while ownership is being confirmed get the same topic, and
    only one managed ledger opened it (before the fix both passed the in-progress
    check before awaiting ensure_serving, and each loaded the topic)."""
    client = FakeLedgerClient()
    service = await started(client)
    service.topic_ownership.gate.clear()
    first = spawn(service.get_topic(TOPIC, create=True))
    second = spawn(service.get_topic(TOPIC, create=True))
    await until(lambda: service.topic_ownership.waiting >= 1, "a load waits for ownership")
    await asyncio.sleep(0.01)
    service.topic_ownership.gate.set()
    async with asyncio.timeout(TIMEOUT_S):
        topics = await asyncio.gather(first, second)
    assert topics[0] is topics[1]
    assert client.created == 1
    await service.close()


async def test_a_use_that_may_create_is_not_refused_by_a_lookup_that_may_not():
    """An admin stats call (may not create) starts the load of a topic that does not
    exist; a producer (may create) joins it while it runs: the producer gets the topic,
    created, and the stats call its TopicNotFound (before the fix both got the first
    caller's TopicNotFound, and the official client's producer failed for good)."""
    service = await started()
    service.topic_ownership.gate.clear()
    looking = spawn(service.get_topic(TOPIC, create=False))
    await until(lambda: service.topic_ownership.waiting >= 1, "the lookup's load waits for ownership")
    producing = spawn(service.get_topic(TOPIC, create=True))
    await asyncio.sleep(0.01)
    service.topic_ownership.gate.set()
    async with asyncio.timeout(TIMEOUT_S):
        results = await asyncio.gather(looking, producing, return_exceptions=True)
    assert isinstance(results[0], TopicNotFound), results
    assert not results[1].closing and service.loaded_topic(TOPIC) is results[1]
    await service.close()


async def test_a_cancelled_caller_does_not_fail_the_load_for_others():
    """The first caller is cancelled while the load it started is opening the managed
    ledger; a second caller waiting on the same load still gets the topic (before the
    fix the load ran in the first caller's task and its cancellation failed it for
    everyone)."""
    client = FakeLedgerClient()
    service = await started(client)
    client.create_gate = asyncio.Event()
    first = spawn(service.get_topic(TOPIC, create=True))
    await until(lambda: client.creating == 1, "the load is creating its ledger")
    second = spawn(service.get_topic(TOPIC, create=True))
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0.01)
    client.create_gate.set()
    async with asyncio.timeout(TIMEOUT_S):
        topic = await second
    assert not topic.closing
    assert service.loaded_topic(TOPIC) is topic
    assert first.cancelled()
    assert client.created == 1
    await service.close()


async def test_a_second_close_waits_for_the_first():
    """close() called while a close is in progress returns only once the topic is
    closed (before the fix it returned at once)."""
    client = FakeLedgerClient()
    service = await started(client)
    topic = await service.get_topic(TOPIC, create=True)
    client.close_gate = asyncio.Event()
    first = spawn(topic.close())
    await asyncio.sleep(0.01)
    second = spawn(topic.close())
    await asyncio.sleep(0.01)
    assert topic.closing and not topic.closed
    assert not second.done(), "a second close returned while the topic was still closing"
    client.close_gate.set()
    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(first, second)
    assert topic.closed
    await service.close()


async def test_a_closing_topic_is_loaded_again_only_after_its_close():
    """get_topic for a topic whose close is in progress waits for the close before it
    opens the managed ledger again (before the fix the new load fenced the ledger the
    closing topic was still closing)."""
    client = FakeLedgerClient()
    service = await started(client)
    old = await service.get_topic(TOPIC, create=True)
    created = client.created
    client.close_gate = asyncio.Event()
    closing = spawn(service.unload_topic(TOPIC))
    await until(lambda: old.closing, "the unload began")
    reloading = spawn(service.get_topic(TOPIC, create=True))
    concurrent = spawn(service.get_topic(TOPIC, create=True))
    await asyncio.sleep(0.02)
    assert not reloading.done()
    assert client.created == created, "a managed ledger was opened while the old one was closing"
    client.close_gate.set()
    async with asyncio.timeout(TIMEOUT_S):
        new = await reloading
        assert await concurrent is new
        assert await closing
    assert old.closed
    assert new is not old and not new.closing
    assert client.created == created + 1
    await service.close()


async def test_no_subscription_is_created_once_the_topic_began_closing():
    """An admin subscription creation arriving while the topic's close is in progress
    (held in the managed ledger's close) is refused with TopicFenced, and leaves no
    subscription and no cursor record behind (before the fix it was created after the
    close had dealt with the subscriptions, its cursor written by a topic that was
    going away, possibly over the next owner's)."""
    client = FakeLedgerClient()
    service = await started(client)
    topic = await service.get_topic(TOPIC, create=True)
    client.close_gate = asyncio.Event()
    closing = spawn(topic.close())
    await until(lambda: topic.closing, "the close began")
    await asyncio.sleep(0.01)                     # the close now waits in the ledger's close
    with pytest.raises(TopicFenced):
        await topic.create_subscription("late", None)
    assert "late" not in topic.subscriptions
    assert await service.store.get(keys.cursor(TOPIC.key_path, "late")) is None
    client.close_gate.set()
    async with asyncio.timeout(TIMEOUT_S):
        await closing
    assert topic.closed
    await service.close()


async def test_a_close_tells_every_consumer_before_any_subscription_closes():
    """A topic closing (a broker fencing itself while etcd is unreachable) sends
    CLOSE_CONSUMER to the consumers of every subscription before it waits for any
    subscription's close (which persists the cursor, and so may hang on etcd). Before
    the fix the consumers of the subscriptions after a hanging one were never told:
    they stayed attached to a topic that no longer served them and never resumed (the
    hosts harness found it, tests/hosts/: shared and key-shared consumers silent after
    an etcd majority loss while the failover ones, first in order, moved on)."""
    from broker.consumer import Consumer
    from subscriptions.mode import SubscriptionMode
    from tests.unit.test_broker_consumer import RecordingConnection

    service = await started()
    topic = await service.get_topic(TOPIC, create=True)
    connection = RecordingConnection()
    consumers = []
    for index, (name, mode) in enumerate([("a-failover", SubscriptionMode.FAILOVER),
                                          ("b-shared", SubscriptionMode.SHARED),
                                          ("c-key-shared", SubscriptionMode.KEY_SHARED)]):
        consumer = Consumer(index, f"consumer-{index}", name, str(TOPIC), mode, connection, permits=10)
        await topic.subscribe(consumer, durable=True, initial_position=0, start_message_id=None)
        consumers.append(consumer)
    hang = asyncio.Event()
    first = topic.subscriptions["a-failover"]
    original_close = first.close

    async def hanging_close() -> None:
        await hang.wait()
        await original_close()

    first.close = hanging_close
    closing = spawn(topic.close())
    await until(lambda: all(consumer.closed for consumer in consumers), "every consumer told")
    closes = [frame for frame in connection.frames if frame.command.type == frame.command.CLOSE_CONSUMER]
    assert sorted(frame.command.close_consumer.consumer_id for frame in closes) == [0, 1, 2]
    assert not closing.done()
    hang.set()
    async with asyncio.timeout(TIMEOUT_S):
        await closing
    assert topic.closed
    await service.close()


async def test_service_close_stops_a_load_in_progress():
    """Closing the service cancels and awaits a load waiting for ownership; its caller
    is told ServiceNotReady."""
    service = await started()
    service.topic_ownership.gate.clear()
    caller = spawn(service.get_topic(TOPIC, create=True))
    await until(lambda: service.topic_ownership.waiting == 1, "the load waits for ownership")
    async with asyncio.timeout(TIMEOUT_S):
        await service.close()
        with pytest.raises(ServiceNotReady):
            await caller
    assert not service.topic_loader._loads


async def test_create_topic_creates_the_record_once():
    """create_topic writes the managed-ledger record through ManagedLedger and loads
    the topic; a second create_topic is AlreadyExists."""
    service = await started()
    topic = await service.create_topic(TOPIC)
    assert topic.full_name == str(TOPIC)
    assert await service.store.get(keys.managed_ledger(TOPIC.key_path)) is not None
    with pytest.raises(AlreadyExists):
        await service.create_topic(TOPIC)
    await service.close()


async def test_retention_age_counts_from_the_close():
    """A consumed ledger created long ago but closed a minute ago is kept by a
    ten-minute retention, and deleted once its close is older than that (before the
    fix its creation time decided, and it was deleted at once)."""
    service = await started()
    topic = await service.get_topic(TOPIC, create=True)
    ledger = topic.ledger
    old_id = ledger.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        await ledger.append(b"x")
        await ledger.terminate()   # closes the ledger: it is consumed and not current
    info = next(i for i in ledger.ledger_infos() if i.ledger_id == old_id)
    now_ms = int(time.time() * 1000)
    info.created_ms = now_ms - 3_600_000
    info.closed_ms = now_ms - 60_000
    assert await topic.trim_ledgers(10, -1) == []
    info.closed_ms = now_ms - 11 * 60_000
    assert await topic.trim_ledgers(10, -1) == [old_id]
    await service.close()


async def test_subscriptions_load_from_one_listing_of_their_records():
    """A durable subscription saved by one topic object is found by the next one, from
    one prefix read that brings every cursor's record (not a read per subscription),
    and its cursor ledger is in the stats."""
    service = await started()
    topic = await service.get_topic(TOPIC, create=True)
    await topic.create_subscription("sub", None)
    assert internal_stats(topic)["cursors"]["sub"]["cursorLedger"] == -1   # state inline in etcd
    calls: list[dict] = []
    get_prefix = service.store.get_prefix

    async def recording_get_prefix(prefix: str, **options):
        calls.append(dict(options, prefix=prefix))
        return await get_prefix(prefix, **options)

    service.store.get_prefix = recording_get_prefix
    await service.unload_topic(TOPIC)
    reloaded = await service.get_topic(TOPIC, create=False)
    assert list(reloaded.subscriptions) == ["sub"]
    cursor_listings = [c for c in calls if c["prefix"] == keys.cursors_of_topic(TOPIC.key_path)]
    assert len(cursor_listings) == 1 and not cursor_listings[0].get("keys_only")
    await service.close()


def test_entries_must_fit_the_ledger_client():
    """The broker's largest frame plus the entry header must fit the ledger client's
    entry limit: the defaults do; a max_message_size the bookies' default limit cannot
    store is a ConfigError naming it."""
    broker_config().check_entries_fit(ENTRY_BYTES_MAX_DEFAULT)
    with pytest.raises(ConfigError, match="max_message_size"):
        broker_config(max_message_size=8 * MIB).check_entries_fit(ENTRY_BYTES_MAX_DEFAULT)
    client = FakeLedgerClient()
    client.config.entry_bytes_max = 1 * MIB
    with pytest.raises(ConfigError, match="entry_bytes_max"):
        BrokerService(broker_config(), MemoryStore(), client)


def test_effective_broker_id():
    """The configured broker id, or host:port without one."""
    assert broker_config(host="h", port=1).effective_broker_id == "h:1"
    assert broker_config(host="h", port=1, broker_id="b").effective_broker_id == "b"
