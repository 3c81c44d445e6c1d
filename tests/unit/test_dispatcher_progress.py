"""No subscription stalls with backlog and permits (issue 14's fan-out stall).

What it proves:
- a dispatch round that raises something other than a MagnetarError (a timeout from a
  read, say) does not end the dispatcher: it retries by itself and delivers the whole
  backlog with no further event (no FLOW, no new entry). Before the fix the task died
  and the subscription stayed stalled until the next event, which a consumer that got
  everything it was sent and a prefilled topic never produce;
- reads are sized to permits in messages, not entries: a consumer granting 1,000
  permits on a topic of 100-message batches gets about 1,000 messages (at most one
  batch more), not 100 entries (10,000 messages);
- a read that comes back empty while entries were confirmed meanwhile does not leave
  the dispatcher waiting for an append that never comes;
- the invariant (``DispatchWatch``): a dispatcher with a consumer with permits and
  backlog that starts no read for longer than the bound is a stall, counted once per
  episode, and the check wakes it, which delivers; one that progresses, or has nothing
  to do, never counts.

How: a real Subscription, cursor and SingleActiveDispatcher over FakeManagedLedger and
FakeConsumer (tests/unit/test_dispatcher_selection.py's fakes); ``DispatchWatch`` is fed
explicit times.
"""

from __future__ import annotations

import asyncio

from common.position import Position
from protocol.codec import encode_stored
from protocol.proto import pulsar_api_pb2 as pb
from subscriptions import dispatcher as dispatcher_module
from subscriptions.cursor import CursorState, ManagedCursor
from subscriptions.dispatch_watch import DispatchWatch
from subscriptions.mode import SubscriptionMode
from subscriptions.subscription import Subscription
from tests.unit.fake_consumer import FakeConsumer
from tests.unit.fake_managed_ledger import FakeManagedLedger


def batch_entry(messages: int, sequence_id: int) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1_700_000_000_000,
                                  num_messages_in_batch=messages)
    return encode_stored(metadata, b"x" * messages)


def append_messages(ledger: FakeManagedLedger, count: int) -> list[Position]:
    return [ledger.append(batch_entry(1, index)) for index in range(count)]


def make_subscription(ledger: FakeManagedLedger) -> Subscription:
    cursor = ManagedCursor("sub", ledger, CursorState(Position(-1, -1)), None)
    return Subscription("sub", "persistent://t/ns/topic", ledger, cursor, SubscriptionMode.EXCLUSIVE)


async def settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def test_a_round_raising_a_non_magnetar_error_is_retried_without_any_event(monkeypatch):
    monkeypatch.setattr(dispatcher_module, "RETRY_DELAY_S", 0.01, raising=False)

    async def scenario() -> None:
        ledger = FakeManagedLedger()
        append_messages(ledger, 20)
        real_read = ledger.read
        failures = []

        async def flaky_read(start, count_max, bytes_max):
            if not failures:
                failures.append(start)
                raise TimeoutError("bookie read timed out")
            return await real_read(start, count_max, bytes_max)

        ledger.read = flaky_read
        subscription = make_subscription(ledger)
        consumer = FakeConsumer(1, "c", permits=1_000)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        # No event after the failure: the dispatcher must come back on its own.
        async with asyncio.timeout(5):
            while len(consumer.sent) < 20:
                await asyncio.sleep(0.01)
        assert failures, "the read never failed: the test proves nothing"
        assert subscription.dispatcher.round_failures == 1
        assert [s.position.entry_id for s in consumer.sent] == list(range(20))
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_reads_are_sized_to_permits_in_messages_not_entries():
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        for index in range(300):
            ledger.append(batch_entry(100, index))
        subscription = make_subscription(ledger)
        consumer = FakeConsumer(1, "c", permits=1_000)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        # The first read knows no batch size yet (one entry), later ones do: the consumer
        # gets its permits and at most one batch more.
        sent = len(consumer.sent) * 100
        assert 1_000 <= sent <= 1_100, sent
        assert consumer.permits > -100, consumer.permits
        # Granting more (as the client does, half its queue at a time) keeps it so.
        for _ in range(10):
            consumer.permits += 500
            subscription.dispatcher.on_flow(consumer)
            await settle()
            assert consumer.permits > -100, consumer.permits
        assert len(consumer.sent) * 100 >= 6_000
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_an_empty_read_while_entries_arrive_does_not_wait_for_the_next_append():
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        real_read = ledger.read
        appended = []

        async def read_then_append(start, count_max, bytes_max):
            entries = await real_read(start, count_max, bytes_max)
            if not entries and not appended:
                # Confirmed while this (empty) read was in flight, before the dispatcher
                # asks to be told of new entries; nothing is appended after this.
                appended.extend(append_messages(ledger, 3))
                ledger.read = real_read
            return entries

        ledger.read = read_then_append
        subscription = make_subscription(ledger)
        consumer = FakeConsumer(1, "c", permits=1_000)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        assert appended
        assert consumer.positions == appended
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_the_watch_wakes_a_dispatcher_that_missed_its_wake_up():
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        append_messages(ledger, 5)
        subscription = make_subscription(ledger)
        consumer = FakeConsumer(1, "c", permits=0)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle()
        dispatcher = subscription.dispatcher
        assert consumer.sent == []
        assert not dispatcher.check_progress(100.0)   # nothing to do: no permits
        # Permits arrive without the FLOW event reaching the dispatcher (a lost wake-up).
        consumer.permits = 1_000
        await settle()
        assert consumer.sent == []
        assert not dispatcher.check_progress(101.0)   # the wait starts
        assert not dispatcher.check_progress(101.5)   # within the bound
        assert dispatcher.check_progress(102.5)       # past it: a stall, and a wake
        assert dispatcher.watch.stalls == 1
        await settle()
        assert len(consumer.sent) == 5
        assert not dispatcher.check_progress(103.0)   # it read: the episode is over
        assert dispatcher.watch.stalls == 1
        assert dispatcher.watch.wait_s_max == 1.5
        await dispatcher.close()

    asyncio.run(scenario())


def test_watch_counts_one_stall_per_episode_and_none_while_reading_or_progressing():
    watch = DispatchWatch(bound_s=1.0)
    # Progressing: a new read between every sample, however long the work lasts.
    for step in range(10):
        assert not watch.observe(float(step), has_work=True, reading=False, reads_started=step)
    assert watch.stalls == 0
    # A read in progress is not a wait, however long.
    for step in range(10, 20):
        assert not watch.observe(float(step), has_work=True, reading=True, reads_started=10)
    # Nothing to do is not a wait.
    for step in range(20, 30):
        assert not watch.observe(float(step), has_work=False, reading=False, reads_started=10)
    assert watch.stalls == 0
    assert watch.wait_s_max == 0.0
    # Work and no read: a stall once past the bound, counted once for the episode.
    assert not watch.observe(30.0, has_work=True, reading=False, reads_started=10)
    assert not watch.observe(31.0, has_work=True, reading=False, reads_started=10)
    assert watch.observe(31.5, has_work=True, reading=False, reads_started=10)
    assert not watch.observe(35.0, has_work=True, reading=False, reads_started=10)
    assert watch.stalls == 1
    assert watch.wait_s_max == 5.0
    # A read ends the episode; a later one counts again.
    assert not watch.observe(36.0, has_work=True, reading=False, reads_started=11)
    assert watch.observe(38.0, has_work=True, reading=False, reads_started=11)
    assert watch.stalls == 2


def test_an_empty_read_with_nothing_newly_confirmed_waits_and_the_watch_reports_it():
    """A read that comes back empty although entries are there (a ledger the broker
    cannot read now, say) and nothing was confirmed meanwhile: the dispatcher waits for
    new entries rather than reading again in a loop, and the watch reports the stall
    (and wakes it, which reads once more)."""
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        append_messages(ledger, 3)
        reads = []

        async def empty_read(start, count_max, bytes_max):
            reads.append(start)
            return []

        ledger.read = empty_read
        subscription = make_subscription(ledger)
        consumer = FakeConsumer(1, "c", permits=1_000)
        subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
        await settle(200)
        assert len(reads) == 1, len(reads)                 # no spin
        dispatcher = subscription.dispatcher
        assert not dispatcher.check_progress(10.0)
        assert dispatcher.check_progress(11.5)
        await settle()
        assert len(reads) == 2
        assert dispatcher.watch.stalls == 1
        await dispatcher.close()

    asyncio.run(scenario())


# --- the tail sent in the callback (docs/performance.md, step 16) ---------------------------

async def caught_up(ledger: FakeManagedLedger) -> tuple[Subscription, FakeConsumer]:
    """An exclusive subscription whose one consumer (1,000 permits) has read everything:
    its dispatcher waits for entries."""
    subscription = make_subscription(ledger)
    consumer = FakeConsumer(1, "c", permits=1_000)
    subscription.add_consumer(consumer, SubscriptionMode.EXCLUSIVE)
    await settle()
    return subscription, consumer


def test_a_caught_up_consumer_gets_new_entries_in_the_callback_without_a_round():
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        subscription, consumer = await caught_up(ledger)
        rounds = ledger.reads
        positions = append_messages(ledger, 1)
        await asyncio.sleep(0)               # the waiter's callback: one turn
        assert consumer.positions == positions
        assert ledger.reads == rounds and ledger.cached_reads == 1
        # And again: the callback armed the next wait itself.
        positions += append_messages(ledger, 2)
        await asyncio.sleep(0)
        assert consumer.positions == positions and ledger.reads == rounds
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_entries_not_in_memory_are_read_by_the_task():
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        ledger.cached = False
        subscription, consumer = await caught_up(ledger)
        rounds = ledger.reads
        positions = append_messages(ledger, 3)
        await settle()
        assert consumer.positions == positions and ledger.reads > rounds
        await subscription.dispatcher.close()

    asyncio.run(scenario())


def test_a_tail_larger_than_one_read_is_finished_by_the_task_and_permits_still_bound_it():
    async def scenario() -> None:
        ledger = FakeManagedLedger()
        subscription, consumer = await caught_up(ledger)
        dispatcher = subscription.dispatcher
        # More entries than one read takes arrive before the callback runs.
        positions = [ledger.append(batch_entry(1, index)) for index in range(dispatcher._entries_max + 5)]
        await settle()
        assert consumer.positions == positions
        # Out of permits: nothing more goes until a FLOW, then the rest does.
        consumer.permits = 0
        more = append_messages(ledger, 4)
        await settle()
        assert consumer.positions == positions
        consumer.permits = 1_000
        dispatcher.on_flow(consumer)
        await settle()
        assert consumer.positions == positions + more
        await dispatcher.close()

    asyncio.run(scenario())


def test_a_resting_watch_may_skip_samples_without_making_up_a_stall():
    """The broker skips the samples of a subscription with no consumer while its watch
    rests (broker/topic_upkeep.py check_dispatchers: 100,000 idle subscriptions). A watch
    rests only with no wait under way; after samples were skipped for a long time, the
    first sample with work starts a wait afresh instead of counting the skipped time."""
    watch = DispatchWatch(bound_s=1.0)
    assert watch.resting
    assert not watch.observe(0.0, has_work=True, reading=False, reads_started=3)
    assert not watch.resting                      # a wait is under way: sampled, not skipped
    assert not watch.observe(0.5, has_work=False, reading=False, reads_started=3)
    assert watch.resting
    # ... 100 s of skipped samples (no consumer), then a consumer with permits:
    assert not watch.observe(100.0, has_work=True, reading=False, reads_started=3)
    assert not watch.observe(100.9, has_work=True, reading=False, reads_started=3)
    assert watch.observe(101.5, has_work=True, reading=False, reads_started=3)   # a real wait
    assert not watch.resting and watch.stalls == 1
