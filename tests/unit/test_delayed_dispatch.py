"""Delayed delivery in the shared dispatcher (subscriptions/dispatcher_shared.py) with a
fake clock: an entry whose deliver_at_time is ahead is held and sent once the clock
passes it (woken as the timer would), undelayed entries behind it go at once; a full
tracker stops reading further (even undelayed entries wait) until entries come due;
a cursor reset drops what the tracker held (it is read again from the new position).

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


def test_full_tracker_stops_reading_until_entries_come_due():
    async def scenario() -> None:
        ledger, subscription, clock, consumer = _setup(delayed_entries_max=2)
        late = [_publish(ledger, f"late{i}", NOW + 1000) for i in range(3)]
        after = _publish(ledger, "after")
        await _settle()
        assert consumer.positions == []                          # the third delayed one blocks the read
        assert len(subscription.dispatcher.delayed) == 2
        clock.now_ms = NOW + 1000
        subscription.dispatcher.wake()
        await _settle()
        assert sorted(consumer.positions) == sorted(late + [after])
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
