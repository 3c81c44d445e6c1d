"""Delayed delivery in the shared dispatcher (subscriptions/dispatcher_shared.py) with a
fake clock: an entry whose deliver_at_time is ahead is held and sent once the clock
passes it (woken as the timer would), undelayed entries behind it go at once; a full
tracker overflows to the topic (a range of positions read again later, whatever its
size) while undelayed entries keep flowing, and every delayed entry still arrives
once, never early; the overflow drains into the tracker as it empties; a cursor reset
drops what the tracker and the overflow held (it is read again from the new position).

How: the harness of test_dispatcher_selection (a real Subscription, ManagedCursor and
dispatcher over the in-memory managed ledger, recording fake consumers)."""

from __future__ import annotations

import asyncio

from common.position import Position
from protocol.codec import encode_stored
from protocol.proto import pulsar_api_pb2 as pb
from subscriptions.cursor import CursorState, ManagedCursor
from subscriptions.mode import SubscriptionMode
from subscriptions.subscription import Subscription
from tests.unit.fake_consumer import FakeConsumer
from tests.unit.fake_managed_ledger import FakeManagedLedger

NOW = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now_ms = NOW

    def __call__(self) -> int:
        return self.now_ms


def _setup(delayed_entries_max: int = 1000):
    ledger = FakeManagedLedger()
    cursor = ManagedCursor("sub", ledger, CursorState(Position(-1, -1)), None)
    subscription = Subscription("sub", "persistent://t/n/topic", ledger, cursor, SubscriptionMode.SHARED,
                                delayed_entries_max=delayed_entries_max)
    clock = Clock()
    subscription.dispatcher._clock_ms = clock
    consumer = FakeConsumer(1, "c", permits=1000)
    subscription.add_consumer(consumer, SubscriptionMode.SHARED)
    return ledger, subscription, clock, consumer


def _publish(ledger: FakeManagedLedger, payload: str, deliver_at: int | None = None) -> Position:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=NOW)
    if deliver_at is not None:
        metadata.deliver_at_time = deliver_at
    return ledger.append(encode_stored(metadata, payload.encode()))


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_held_until_due_and_undelayed_go_first():
    async def scenario() -> None:
        ledger, subscription, clock, consumer = _setup()
        late = [_publish(ledger, f"late{i}", NOW + 5000) for i in range(3)]
        now = [_publish(ledger, f"now{i}") for i in range(2)]
        await _settle()
        assert consumer.positions == now
        assert len(subscription.dispatcher.delayed) == 3
        clock.now_ms = NOW + 4999
        subscription.dispatcher.wake()
        await _settle()
        assert consumer.positions == now                         # never before its time
        clock.now_ms = NOW + 5000
        subscription.dispatcher.wake()
        await _settle()
        assert sorted(consumer.positions) == sorted(now + late)
        assert len(subscription.dispatcher.delayed) == 0
        await subscription.close()

    asyncio.run(scenario())


def test_full_tracker_overflows_to_the_topic_and_undelayed_entries_flow():
    async def scenario() -> None:
        ledger, subscription, clock, consumer = _setup(delayed_entries_max=10)
        dispatcher = subscription.dispatcher
        late = [_publish(ledger, f"late{i}", NOW + 1000 + i) for i in range(900)]
        after = _publish(ledger, "after")
        await _settle()
        assert consumer.positions == [after]                     # not held up by the delayed ones
        assert len(dispatcher.delayed) == 10                     # the memory stays bounded
        assert dispatcher.delayed_overflow is not None
        assert dispatcher.delayed_overflow.start == late[10] and dispatcher.delayed_overflow.end == late[-1]
        assert dispatcher.delayed_overflow.entries == 890
        clock.now_ms = NOW + 999
        dispatcher.wake()
        await _settle()
        assert consumer.positions == [after]                     # never before its time
        clock.now_ms = NOW + 2000
        for _ in range(20):
            dispatcher.wake()
            await _settle()
        assert len(consumer.positions) == len(set(consumer.positions))   # each once
        assert sorted(consumer.positions) == sorted(late + [after])
        assert dispatcher.delayed_overflow is None and len(dispatcher.delayed) == 0
        await subscription.close()

    asyncio.run(scenario())


def test_overflow_is_drained_into_the_tracker_as_it_empties():
    """Four due at +1 s fill the tracker, four due at +2 s overflow; at +1 s the first
    four go and the overflow moves into the tracker, none sent before +2 s; a delayed
    entry read while the overflow is open joins it even if it is due already."""
    async def scenario() -> None:
        ledger, subscription, clock, consumer = _setup(delayed_entries_max=4)
        dispatcher = subscription.dispatcher
        early = [_publish(ledger, f"early{i}", NOW + 1000) for i in range(4)]
        later = [_publish(ledger, f"later{i}", NOW + 2000) for i in range(4)]
        overdue = _publish(ledger, "overdue", NOW - 1)
        await _settle()
        assert consumer.positions == [] and dispatcher.delayed_overflow is not None
        assert dispatcher.delayed_overflow.end == overdue
        clock.now_ms = NOW + 1000
        dispatcher.wake()
        await _settle()
        assert sorted(consumer.positions) == early + [overdue]
        assert dispatcher.delayed_overflow is None and len(dispatcher.delayed) == 4
        clock.now_ms = NOW + 1999
        dispatcher.wake()
        await _settle()
        assert sorted(consumer.positions) == early + [overdue]
        clock.now_ms = NOW + 2000
        dispatcher.wake()
        await _settle()
        assert sorted(consumer.positions) == sorted(early + later + [overdue])
        await subscription.close()

    asyncio.run(scenario())


def test_cursor_reset_drops_the_overflow_too():
    async def scenario() -> None:
        ledger, subscription, clock, consumer = _setup(delayed_entries_max=1)
        first = _publish(ledger, "late0", NOW + 1000)
        second = _publish(ledger, "late1", NOW + 1000)
        await _settle()
        assert subscription.dispatcher.delayed_overflow is not None
        subscription.reset_cursor(first)
        await _settle()
        overflow = subscription.dispatcher.delayed_overflow
        assert overflow is not None and overflow.start == second and overflow.entries == 1   # read anew
        clock.now_ms = NOW + 1000
        for _ in range(5):
            subscription.dispatcher.wake()
            await _settle()
        assert sorted(consumer.positions) == [first, second]
        await subscription.close()

    asyncio.run(scenario())


def test_cursor_reset_drops_the_tracker_and_reads_again():
    async def scenario() -> None:
        ledger, subscription, clock, consumer = _setup()
        first = _publish(ledger, "late", NOW + 1000)
        await _settle()
        assert len(subscription.dispatcher.delayed) == 1
        subscription.reset_cursor(first)
        await _settle()
        assert len(subscription.dispatcher.delayed) == 1         # read again and tracked again
        clock.now_ms = NOW + 1000
        subscription.dispatcher.wake()
        await _settle()
        assert consumer.positions == [first]
        await subscription.close()

    asyncio.run(scenario())
