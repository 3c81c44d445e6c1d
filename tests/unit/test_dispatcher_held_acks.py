"""Entries held acknowledged by an open transaction (subscriptions/ports.HeldAcks, the
dispatcher's one question) are never sent — not on a first read, not from the replay
set, not after a rewind — until released (delivered again, redelivery count raised) or
acknowledged (never again).

How: a real Subscription, ManagedCursor and dispatcher over the in-memory managed
ledger and FakeConsumers (tests/unit/test_dispatcher_selection.py's harness); the
holder is a plain set of positions standing in for the broker's pending
acknowledgements.
"""

from __future__ import annotations

from common.position import Position
from protocol.codec import encode_stored
from protocol.proto import pulsar_api_pb2 as pb
from subscriptions.ports import AckedMessage
from tests.unit.test_dispatcher_selection import EXCLUSIVE, KEY_SHARED, SHARED, Harness, positions_of, run


class Held:
    def __init__(self) -> None:
        self.positions: set[Position] = set()
        self.in_part: dict[Position, int] = {}   # batch entries held in part: bits not held

    def holds(self, position: Position) -> bool:
        return position in self.positions

    def unheld_bits(self, position: Position) -> int | None:
        return self.in_part.get(position)


def held_on(harness: Harness) -> Held:
    held = Held()
    harness.subscription.held_acks = held
    return held


def test_shared_held_entries_are_not_redelivered_until_released():
    async def scenario() -> None:
        harness = Harness(SHARED)
        held = held_on(harness)
        a, b = harness.consumer("a", 1), harness.consumer("b", 2, permits=0)
        harness.add(a, b)
        published = harness.publish(["k"] * 4)
        await harness.settle()
        assert positions_of(a) == published
        # a acknowledges the first two in a transaction: held, and no longer
        # unacknowledged at a (its count drops).
        held.positions.update(published[:2])
        harness.subscription.hold(published[:2])
        assert harness.subscription.dispatcher.unacked_messages(a) == 2
        # A redelivery request and a's departure send only the other two to b.
        harness.nack(a, [])
        await harness.settle()
        assert positions_of(a)[4:] == published[2:]
        b.permits = 100
        harness.subscription.remove_consumer(a)
        await harness.settle()
        assert positions_of(b) == published[2:]
        # Released (the abort): b gets them, their redelivery count raised.
        held.positions.clear()
        harness.subscription.release_held(published[:2])
        await harness.settle()
        assert positions_of(b)[2:] == published[:2]
        assert [s.redelivery_count for s in b.sent[2:]] == [1, 1]
        await harness.close()

    run(scenario)


def test_shared_held_entries_are_skipped_on_a_first_read_and_released_once():
    """As after a restart: held before any read. A release of an entry the cursor
    acknowledged meanwhile (the commit) sends nothing."""
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        held = held_on(harness)
        published = harness.publish(["k1", "k2", "k1", "k2"])
        held.positions.update(published[:2])
        a = harness.consumer("a", 1)
        harness.add(a)
        await harness.settle()
        assert positions_of(a) == published[2:]
        harness.ack(a, published[2:])
        # The first is acknowledged for good (a commit), the second released (an abort).
        harness.ack(a, published[:1])
        held.positions.clear()
        harness.subscription.release_held(published[:2])
        await harness.settle()
        assert positions_of(a)[2:] == [published[1]]
        await harness.close()

    run(scenario)


def test_shared_a_hold_taken_back_leaves_what_a_consumer_still_holds():
    async def scenario() -> None:
        harness = Harness(SHARED)
        a = harness.consumer("a", 1)
        harness.add(a)
        published = harness.publish(["k"] * 2)
        await harness.settle()
        # The hold's write failed before it took effect: a keeps both, nothing is sent twice.
        harness.subscription.release_held(published, leave_sent=True)
        await harness.settle()
        assert positions_of(a) == published
        assert harness.subscription.dispatcher.unacked_messages(a) == 2
        await harness.close()

    run(scenario)


def test_exclusive_held_entries_are_skipped_after_a_rewind_and_come_back_in_order_on_release():
    async def scenario() -> None:
        harness = Harness(EXCLUSIVE)
        held = held_on(harness)
        a = harness.consumer("a", 1)
        harness.add(a)
        published = harness.publish(["k"] * 5)
        await harness.settle()
        assert positions_of(a) == published
        held.positions.update(published[:3])          # a cumulative acknowledgement up to the third
        harness.nack(a, [])                            # a rewind
        await harness.settle()
        assert positions_of(a)[5:] == published[3:]
        held.positions.clear()
        harness.subscription.release_held([], through=published[2])
        await harness.settle()
        assert positions_of(a)[7:] == published
        # Counted by the rewind (every entry in flight then) and again by the release.
        assert [s.redelivery_count for s in a.sent[7:10]] == [2, 2, 2]
        await harness.close()

    run(scenario)


def test_a_batch_held_in_part_is_sent_without_its_held_messages():
    """A batch of 3: message 0 held by a transaction, message 1 acknowledged plainly
    (batch index): a redelivery sends the entry with only message 2 left in its ack
    set; once message 2 is held too, nothing is sent."""
    async def scenario() -> None:
        harness = Harness(SHARED)
        held = held_on(harness)
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1_700_000_000_000,
                                      num_messages_in_batch=3)
        batch = harness.ledger.append(encode_stored(metadata, b"batch"))
        a, b = harness.consumer("a", 1), harness.consumer("b", 2, permits=0)
        harness.add(a, b)
        await harness.settle()
        assert positions_of(a) == [batch] and a.ack_sets == [None]
        held.in_part[batch] = 0b110
        harness.subscription.acknowledge(a, [AckedMessage(batch, (0b101,), 3)], cumulative=False)
        b.permits = 100
        harness.subscription.remove_consumer(a)
        await harness.settle()
        assert positions_of(b) == [batch] and b.ack_sets == [(0b100,)]
        held.in_part[batch] = 0b010                   # message 2 held now as well
        harness.nack(b, [])
        await harness.settle()
        assert positions_of(b) == [batch]
        await harness.close()

    run(scenario)
