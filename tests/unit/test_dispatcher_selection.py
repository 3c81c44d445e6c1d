"""Which consumer gets which entry (subscriptions/dispatcher.py, dispatcher_shared.py).

What it proves:
- shared: entries go round-robin over the consumers that can take them, each entry to
  exactly one consumer; no consumer gets more than its permits or more than
  ``unacked_per_consumer_max`` unacknowledged; a departing consumer's unacknowledged
  entries, and negatively acknowledged ones, go out again (oldest first, redelivery
  count raised), acknowledged ones never do;
- key-shared: every key has exactly one owner on the hash ring, the same while
  membership is unchanged, keys spread reasonably, and a membership change moves only
  the keys it must (those of a leaving consumer, or those a joining one takes); in
  dispatch every entry of a key goes to its owner in order, a consumer that joined
  later gets nothing at or after its join point until the older entries are
  acknowledged, and a leaving consumer's entries are replayed to the new owners before
  newer entries of the same keys;
- failover / exclusive: the active consumer is the first by (priority level, name,
  consumer id) whatever the join order; clients are told who is active (failover only);
  partitions spread their active consumers over the top-priority consumers; only the
  active consumer receives messages, and a new active one starts at the first
  unacknowledged entry.

How: a real Subscription, ManagedCursor and dispatcher over FakeManagedLedger (the
managed-ledger edge, in memory) and FakeConsumers at the subscriptions package's
consumer port, which record each call the dispatcher makes. Each scenario runs under asyncio.run; the
dispatcher's task is let run by yielding to the loop a bounded number of times.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

import pytest

from protocol.codec import encode_stored
from common.position import Position
from protocol.proto import pulsar_api_pb2 as pb
from common.errors import ConsumerBusy
from subscriptions.cursor import CursorState, ManagedCursor
from subscriptions.dispatcher import SingleActiveDispatcher
from subscriptions.dispatcher_shared import KeySharedDispatcher, SharedDispatcher
from subscriptions.subscription import Subscription
from subscriptions.mode import SubscriptionMode
from subscriptions.ports import AckedMessage
from tests.unit.fake_consumer import FakeConsumer, Sent
from tests.unit.fake_managed_ledger import FakeManagedLedger

SHARED = SubscriptionMode.SHARED
KEY_SHARED = SubscriptionMode.KEY_SHARED
FAILOVER = SubscriptionMode.FAILOVER
EXCLUSIVE = SubscriptionMode.EXCLUSIVE


class Harness:
    def __init__(self, sub_type: SubscriptionMode, *, partition_index: int = -1, unacked_per_consumer_max: int = 50_000) -> None:
        self.sub_type = sub_type
        self.ledger = FakeManagedLedger()
        self.cursor = ManagedCursor("sub", self.ledger, CursorState(Position(-1, -1)), None)
        self.subscription = Subscription("sub", "persistent://tenant/ns/topic", self.ledger, self.cursor, sub_type,
                                         partition_index=partition_index,
                                         unacked_per_consumer_max=unacked_per_consumer_max)
        self._sequence_id = 0

    def publish(self, keys: list[str]) -> list[Position]:
        positions = []
        for key in keys:
            self._sequence_id += 1
            metadata = pb.MessageMetadata(producer_name="producer", sequence_id=self._sequence_id,
                                          publish_time=1_700_000_000_000, partition_key=key)
            positions.append(self.ledger.append(encode_stored(metadata, f"m{self._sequence_id}".encode())))
        return positions

    def consumer(self, name: str, consumer_id: int, *, permits: int = 1_000, priority_level: int = 0
                 ) -> FakeConsumer:
        return FakeConsumer(consumer_id, name, priority_level=priority_level, permits=permits)

    def add(self, *consumers: FakeConsumer) -> None:
        for consumer in consumers:
            self.subscription.add_consumer(consumer, self.sub_type)

    def ack(self, consumer: FakeConsumer, positions: list[Position], *, cumulative: bool = False) -> None:
        self.subscription.acknowledge(consumer, [AckedMessage(p) for p in positions], cumulative=cumulative)

    def nack(self, consumer: FakeConsumer, positions: list[Position]) -> None:
        self.subscription.redeliver(consumer, positions)

    @staticmethod
    async def settle() -> None:
        """Lets the dispatcher task run until it has nothing left to do (a round never
        suspends on the in-memory ledger, so a few loop turns are enough)."""
        for _ in range(50):
            await asyncio.sleep(0)

    async def close(self) -> None:
        await self.subscription.close()


def positions_of(consumer: FakeConsumer) -> list[Position]:
    return consumer.positions


def run(scenario) -> None:
    asyncio.run(scenario())


# --- shared: round robin, permits, limits ---------------------------------------------------------

def test_shared_round_robin_spreads_entries_evenly_and_once():
    """Three consumers with ample permits, 30 entries: 10 each, every entry once, and each
    run of three consecutive entries goes to three different consumers."""
    async def scenario() -> None:
        harness = Harness(SHARED)
        consumers = [harness.consumer(name, index) for index, name in enumerate(("a", "b", "c"))]
        harness.add(*consumers)
        await harness.settle()
        published = harness.publish(["k"] * 30)
        await harness.settle()
        owner = {p: c.name for c in consumers for p in positions_of(c)}
        assert sorted(owner) == published
        assert sum(len(positions_of(c)) for c in consumers) == 30          # nobody got one twice
        assert collections.Counter(owner.values()) == {"a": 10, "b": 10, "c": 10}
        for start in range(0, 30, 3):
            assert len({owner[p] for p in published[start:start + 3]}) == 3
        await harness.close()

    run(scenario)


def test_shared_never_exceeds_permits():
    """A has 2 permits, B none: A gets exactly 2; B's later flow gets the next 3."""
    async def scenario() -> None:
        harness = Harness(SHARED)
        a, b = harness.consumer("a", 1, permits=2), harness.consumer("b", 2, permits=0)
        harness.add(a, b)
        published = harness.publish(["k"] * 8)
        await harness.settle()
        assert positions_of(a) == published[:2]
        assert positions_of(b) == []
        assert a.permits == 0
        b.permits = 3
        harness.subscription.dispatcher.on_flow(b)
        await harness.settle()
        assert positions_of(b) == published[2:5]
        assert positions_of(a) == published[:2]
        await harness.close()

    run(scenario)


def test_shared_stops_at_the_unacked_limit_until_acks_arrive():
    """With unacked_per_consumer_max=3 a consumer holds at most 3; acking 2 lets 2 more
    through, and those had never been delivered (redelivery count 0)."""
    async def scenario() -> None:
        harness = Harness(SHARED, unacked_per_consumer_max=3)
        a = harness.consumer("a", 1)
        harness.add(a)
        published = harness.publish(["k"] * 10)
        await harness.settle()
        assert positions_of(a) == published[:3]
        harness.ack(a, published[:2])
        await harness.settle()
        assert positions_of(a) == published[:5]
        assert [s.redelivery_count for s in a.sent] == [0] * 5
        assert harness.subscription.dispatcher.unacked_messages(a) == 3
        await harness.close()

    run(scenario)


def test_shared_departing_consumer_entries_go_to_the_others_oldest_first():
    """A leaves holding unacknowledged entries: B receives exactly those (not the one A
    acknowledged), oldest first, with redelivery count 1."""
    async def scenario() -> None:
        harness = Harness(SHARED)
        a, b = harness.consumer("a", 1), harness.consumer("b", 2)
        harness.add(a, b)
        published = harness.publish(["k"] * 6)
        await harness.settle()
        held_by_a = positions_of(a)
        assert len(held_by_a) == 3 and not set(held_by_a) & set(positions_of(b))
        harness.ack(a, held_by_a[:1])
        before = len(b.sent)
        harness.subscription.remove_consumer(a)
        await harness.settle()
        replayed = b.sent[before:]
        assert [s.position for s in replayed] == held_by_a[1:]
        assert [s.redelivery_count for s in replayed] == [1, 1]
        assert sorted(positions_of(b)) == sorted(set(published) - {held_by_a[0]})
        await harness.close()

    run(scenario)


def test_shared_negative_ack_redelivers_with_a_rising_count():
    async def scenario() -> None:
        harness = Harness(SHARED)
        a = harness.consumer("a", 1)
        harness.add(a)
        published = harness.publish(["k"] * 3)
        await harness.settle()
        for expected_count in (1, 2):
            harness.nack(a, [published[1]])
            await harness.settle()
            assert a.sent[-1] == Sent(published[1], expected_count, "k")
        harness.nack(a, [published[0]])              # acked meanwhile: nothing to redeliver
        harness.ack(a, [published[0]])
        await harness.settle()
        assert len(a.sent) == 6 - 1       # 3 first deliveries, 2 redeliveries
        await harness.close()

    run(scenario)


@pytest.mark.parametrize("mode", [SHARED, KEY_SHARED, FAILOVER])
def test_entries_given_back_unused_go_out_again_without_a_rising_count(mode):
    """A redelivery with counted=False (Magnetar's magnetar_unused: read ahead, never
    handed to an application) sends the entries again with their counts unchanged; a
    counted one after it raises them."""
    async def scenario() -> None:
        harness = Harness(mode)
        a = harness.consumer("a", 10)
        harness.add(a)
        published = harness.publish(["k"] * 2)
        await harness.settle()
        harness.subscription.redeliver(a, published, counted=False)
        await harness.settle()
        assert [s.redelivery_count for s in a.sent] == [0, 0, 0, 0]
        harness.nack(a, published)
        await harness.settle()
        assert [s.redelivery_count for s in a.sent[4:]] == [1, 1]
        await harness.close()

    run(scenario)


def test_shared_ack_through_another_consumer_settles_the_entry_where_it_is_pending():
    """What the HTTP gateway relies on (an ack through another gateway instance): B, a
    consumer of the same subscription with no permits, acknowledges entries A holds.
    They stop counting against A, A's later redelivery of them changes nothing, and A
    leaving does not replay them; an entry A still holds is replayed, and one B nacks
    (not B's) is not taken from A."""
    async def scenario() -> None:
        harness = Harness(SHARED)
        a, b = harness.consumer("a", 1, permits=10), harness.consumer("b", 2, permits=0)
        harness.add(a, b)
        published = harness.publish(["k"] * 3)
        await harness.settle()
        assert positions_of(a) == published and positions_of(b) == []
        harness.ack(b, published[:2])
        assert harness.subscription.dispatcher.unacked_messages(a) == 1
        harness.nack(a, published[:2])
        harness.nack(b, published[2:])
        await harness.settle()
        assert len(a.sent) == 3 and b.sent == []
        b.permits = 10
        harness.subscription.remove_consumer(a)
        harness.subscription.dispatcher.on_flow(b)
        await harness.settle()
        assert [(s.position, s.redelivery_count) for s in b.sent] == [(published[2], 1)]
        await harness.close()

    run(scenario)


# --- key-shared: the hash ring ----------------------------------------------------------------------

KEYS = [f"key-{index}".encode() for index in range(20_000)]


def ring_with(harness: Harness, names: list[str]) -> tuple[KeySharedDispatcher, list[FakeConsumer]]:
    consumers = [harness.consumer(name, index + 1) for index, name in enumerate(names)]
    harness.add(*consumers)
    dispatcher = harness.subscription.dispatcher
    assert isinstance(dispatcher, KeySharedDispatcher)
    return dispatcher, consumers


def test_key_shared_every_key_has_one_stable_owner_and_keys_spread():
    """20,000 keys over 4 consumers: each key maps to one of them, the same on every
    lookup, and each consumer owns between 15% and 35% of the keys."""
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, consumers = ring_with(harness, ["c0", "c1", "c2", "c3"])
        owners = [dispatcher.owner_of(key) for key in KEYS]
        assert all(any(owner is c for c in consumers) for owner in owners)
        assert [dispatcher.owner_of(key) for key in KEYS[:2_000]] == owners[:2_000]
        shares = collections.Counter(owner.name for owner in owners)
        assert set(shares) == {"c0", "c1", "c2", "c3"}
        for name, count in shares.items():
            assert 0.15 * len(KEYS) <= count <= 0.35 * len(KEYS), (name, count)
        await harness.close()

    run(scenario)


def test_key_shared_leaving_consumer_moves_only_its_own_keys():
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, consumers = ring_with(harness, ["c0", "c1", "c2", "c3"])
        before = {key: dispatcher.owner_of(key) for key in KEYS}
        leaving = consumers[2]
        harness.subscription.remove_consumer(leaving)
        moved = 0
        for key in KEYS:
            after = dispatcher.owner_of(key)
            assert after is not leaving
            if before[key] is leaving:
                moved += 1
            else:
                assert after is before[key], key
        assert moved > 0
        await harness.close()

    run(scenario)


def test_key_shared_joining_consumer_takes_keys_only_for_itself():
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, consumers = ring_with(harness, ["c0", "c1", "c2"])
        before = {key: dispatcher.owner_of(key) for key in KEYS}
        joining = harness.consumer("c3", 99)
        harness.add(joining)
        taken = 0
        for key in KEYS:
            after = dispatcher.owner_of(key)
            if after is joining:
                taken += 1
            else:
                assert after is before[key], key
        assert 0.15 * len(KEYS) <= taken <= 0.35 * len(KEYS), taken
        await harness.close()

    run(scenario)


def test_key_shared_empty_ring_has_no_owner():
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, consumers = ring_with(harness, ["only"])
        assert dispatcher.owner_of(b"k") is consumers[0]
        harness.subscription.remove_consumer(consumers[0])
        assert dispatcher.owner_of(b"k") is None
        await harness.close()

    run(scenario)


# --- key-shared: dispatch ------------------------------------------------------------------------------

def test_key_shared_sends_each_key_to_its_owner_in_order():
    """60 entries over 12 keys, 3 consumers: each entry once, at the key's owner, and every
    consumer sees its entries in publication order."""
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, consumers = ring_with(harness, ["a", "b", "c"])
        await harness.settle()
        keys = [f"order-{index % 12}" for index in range(60)]
        published = harness.publish(keys)
        await harness.settle()
        key_of = dict(zip(published, keys))
        received = [p for c in consumers for p in positions_of(c)]
        assert sorted(received) == published
        for consumer in consumers:
            positions = positions_of(consumer)
            assert positions == sorted(positions)
            for position in positions:
                assert dispatcher.owner_of(key_of[position].encode()) is consumer
        assert sum(1 for c in consumers if positions_of(c)) >= 2      # the keys did spread
        await harness.close()

    run(scenario)


def test_key_shared_late_joiner_waits_for_older_entries_to_be_acknowledged():
    """A alone gets entries 0-19. B joins; of entries 20-39, those of keys B now owns are
    held until A acknowledges everything before B's join point, then B gets them in
    order; A keeps receiving its own keys meanwhile."""
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, (a,) = ring_with(harness, ["a"])
        keys = [f"late-{index % 20}" for index in range(40)]
        first = harness.publish(keys[:20])
        await harness.settle()
        assert positions_of(a) == first
        b = harness.consumer("b", 2)
        harness.add(b)
        b_keys = {key for key in keys if dispatcher.owner_of(key.encode()) is b}
        assert b_keys and len(b_keys) < 20           # B took some keys, not all
        second = harness.publish(keys[20:])
        await harness.settle()
        for_b = [p for p, key in zip(second, keys[20:]) if key in b_keys]
        for_a = [p for p, key in zip(second, keys[20:]) if key not in b_keys]
        assert positions_of(b) == []                 # older entries of its keys are unacknowledged
        assert positions_of(a) == first + for_a
        harness.ack(a, first[:-1])
        await harness.settle()
        assert positions_of(b) == []                 # one older entry is still unacknowledged
        harness.ack(a, first[-1:])
        await harness.settle()
        assert positions_of(b) == for_b
        await harness.close()

    run(scenario)


def test_key_shared_departing_consumer_entries_reach_new_owners_before_newer_ones():
    """B leaves with unacknowledged entries of its keys: the new owner A receives them
    (redelivery count 1) before any newer entry of those keys."""
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, (a, b) = ring_with(harness, ["a", "b"])
        await harness.settle()
        keys = [f"move-{index % 16}" for index in range(32)]
        first = harness.publish(keys)
        await harness.settle()
        held_by_b = positions_of(b)
        assert held_by_b, "some keys must belong to b"
        key_of = dict(zip(first, keys))
        harness.ack(a, positions_of(a))
        harness.subscription.remove_consumer(b)
        newer = harness.publish(keys[:16])
        await harness.settle()
        key_of.update(zip(newer, keys[:16]))
        after_leave = a.sent[len(first) - len(held_by_b):]
        replayed = [s for s in after_leave if s.position in set(held_by_b)]
        assert [s.position for s in replayed] == held_by_b
        assert all(s.redelivery_count == 1 for s in replayed)
        for key in {key_of[p] for p in held_by_b}:
            of_key = [s.position for s in after_leave if key_of[s.position] == key]
            assert of_key == sorted(of_key), key      # old (replayed) entries first
        assert sorted(s.position for s in after_leave) == sorted(held_by_b + newer)
        await harness.close()

    run(scenario)


def test_key_shared_replay_longer_than_one_pass_still_precedes_newer_entries():
    """B leaves holding 150 entries of one key, more than one replay pass sends (100): a
    newer entry of that key read meanwhile must wait behind them, so A sees the key's
    entries strictly in order."""
    async def scenario() -> None:
        harness = Harness(KEY_SHARED)
        dispatcher, (a, b) = ring_with(harness, ["a", "b"])
        await harness.settle()
        key = next(k for k in (f"long-{index}" for index in range(1_000)) if dispatcher.owner_of(k.encode()) is b)
        old = harness.publish([key] * 150)
        await harness.settle()
        assert positions_of(b) == old
        harness.subscription.remove_consumer(b)
        newer = harness.publish([key] * 5)
        await harness.settle()
        assert positions_of(a) == old + newer
        assert [s.redelivery_count for s in a.sent] == [1] * 150 + [0] * 5
        await harness.close()

    run(scenario)


# --- failover and exclusive -------------------------------------------------------------------------

@pytest.mark.parametrize("members, expected", [
    ([(0, "b", 1), (0, "a", 2)], "a"),                          # same priority: by name
    ([(1, "a", 1), (0, "z", 2)], "z"),                          # priority level first
    ([(0, "same", 5), (0, "same", 3), (2, "aa", 1)], 3),        # same name: by consumer id
    ([(3, "x", 1)], "x"),
])
def test_failover_active_consumer_is_first_by_priority_name_id(members, expected):
    """Whatever the join order, the same consumer is active, and every consumer's last
    ACTIVE_CONSUMER_CHANGE says whether it is the one."""
    orders = [members, list(reversed(members))]

    async def scenario() -> None:
        for order in orders:
            harness = Harness(FAILOVER)
            consumers = [harness.consumer(name, consumer_id, priority_level=priority)
                         for priority, name, consumer_id in order]
            harness.add(*consumers)
            dispatcher = harness.subscription.dispatcher
            assert isinstance(dispatcher, SingleActiveDispatcher)
            active = dispatcher.active
            assert active is not None
            assert (active.consumer_id if isinstance(expected, int) else active.name) == expected
            for consumer in consumers:
                assert consumer.last_active_flag() == (consumer is active)
            await harness.close()

    run(scenario)


def test_failover_only_the_active_consumer_receives_and_a_successor_resumes_unacked():
    """A (active) gets 0-4 and acks up to 1 cumulatively; B, standing by with permits,
    gets nothing. A leaves: B becomes active, is told so, and starts at entry 2."""
    async def scenario() -> None:
        harness = Harness(FAILOVER)
        a, b = harness.consumer("a", 1), harness.consumer("b", 2)
        harness.add(b, a)
        published = harness.publish(["k"] * 5)
        await harness.settle()
        assert positions_of(a) == published
        assert positions_of(b) == []
        harness.ack(a, [published[1]], cumulative=True)
        harness.subscription.remove_consumer(a)
        await harness.settle()
        assert b.last_active_flag() is True
        assert positions_of(b) == published[2:]
        more = harness.publish(["k"] * 2)
        await harness.settle()
        assert positions_of(b) == published[2:] + more
        await harness.close()

    run(scenario)


def test_failover_partitions_spread_active_consumers_over_top_priority():
    """Six partitions, three priority-0 consumers and one priority-1 consumer: each
    priority-0 consumer is active for exactly two partitions, the other for none."""
    async def scenario() -> None:
        active_for = collections.Counter()
        for partition_index in range(6):
            harness = Harness(FAILOVER, partition_index=partition_index)
            members = [("c", 3, 0), ("a", 1, 0), ("low", 4, 1), ("b", 2, 0)]
            harness.add(*(harness.consumer(name, cid, priority_level=p) for name, cid, p in members))
            active_for[harness.subscription.dispatcher.active.name] += 1
            await harness.close()
        assert active_for == {"a": 2, "b": 2, "c": 2}

    run(scenario)


def test_exclusive_takes_one_consumer_and_sends_no_active_changes():
    async def scenario() -> None:
        harness = Harness(EXCLUSIVE)
        only = harness.consumer("only", 1)
        harness.add(only)
        with pytest.raises(ConsumerBusy):
            harness.add(harness.consumer("second", 2))
        published = harness.publish(["k"] * 3)
        await harness.settle()
        assert positions_of(only) == published
        assert only.notifications == []
        await harness.close()

    run(scenario)


def test_single_active_never_exceeds_permits():
    async def scenario() -> None:
        harness = Harness(EXCLUSIVE)
        only = harness.consumer("only", 1, permits=2)
        harness.add(only)
        published = harness.publish(["k"] * 5)
        await harness.settle()
        assert positions_of(only) == published[:2]
        only.permits = 10
        harness.subscription.dispatcher.on_flow(only)
        await harness.settle()
        assert positions_of(only) == published
        await harness.close()

    run(scenario)


def test_shared_dispatcher_is_chosen_for_shared_mode():
    """The mode picks the dispatcher class (the selection rules above depend on it)."""
    assert type(Harness(SHARED).subscription.dispatcher) is SharedDispatcher
    assert type(Harness(KEY_SHARED).subscription.dispatcher) is KeySharedDispatcher
    assert Harness(FAILOVER).subscription.dispatcher.failover is True
    assert Harness(EXCLUSIVE).subscription.dispatcher.failover is False


# --- a mode change ---------------------------------------------------------------------------------

def test_a_mode_change_stops_the_old_dispatchers_loop():
    """A subscription used as exclusive, left, then joined in shared mode gets a new
    dispatcher; the old one's loop is cancelled and ends (the bug: it was dropped while
    pending, 'Task was destroyed but it is pending!' under the live fuzz, and could
    have gone on dispatching beside the new one). The new one delivers every entry."""
    async def scenario() -> None:
        harness = Harness(EXCLUSIVE)
        first = harness.consumer("first", 1)
        harness.add(first)
        harness.publish(["a", "b"])
        await harness.settle()
        old = harness.subscription.dispatcher
        old_loop = old._task
        assert old_loop is not None and not old_loop.done()
        harness.subscription.remove_consumer(first)
        shared = harness.consumer("shared", 2)
        harness.subscription.add_consumer(shared, SHARED)
        assert harness.subscription.dispatcher is not old
        await harness.settle()
        assert old_loop.done() and old_loop.cancelled()
        assert len(positions_of(shared)) == 2
        await harness.close()
        assert not harness.subscription._retired_loops

    run(scenario)


# --- seeks and cursor resets --------------------------------------------------------------------

def _held_by_two_consumers(harness: Harness) -> list[Position]:
    """Consumers a and b hold 250 entries between them (more than one replay pass
    takes: 100), none acknowledged; returns the entries."""
    a, b = harness.consumer("a", 1), harness.consumer("b", 2)
    harness.add(a, b)
    published = harness.publish([f"k{i % 3}" for i in range(250)])
    return published


def _assert_each_entry_once(harness: Harness, consumer: FakeConsumer, expected: list[Position]) -> None:
    assert sorted(positions_of(consumer)) == expected
    assert len(set(positions_of(consumer))) == len(positions_of(consumer))
    assert harness.subscription.dispatcher.round_failures == 0


@pytest.mark.parametrize("mode", [SHARED, KEY_SHARED], ids=["shared", "key-shared"])
@pytest.mark.parametrize("disconnect_first", [True, False], ids=["seek-order", "reset-then-disconnect"])
def test_reset_after_consumers_left_with_unacked_entries_sends_each_entry_once(mode, disconnect_first):
    """Consumers holding unacknowledged entries are disconnected and the cursor moves
    back to the start (a SEEK, or an admin reset-cursor, in either order): a new
    consumer receives every entry exactly once, from the reset position, nothing is
    left to replay, and the dispatcher's rounds never break."""
    async def scenario() -> None:
        harness = Harness(mode)
        published = _held_by_two_consumers(harness)
        await harness.settle()
        subscription = harness.subscription
        if disconnect_first:
            subscription.disconnect_consumers()
            subscription.reset_cursor(published[0])
        else:
            subscription.reset_cursor(published[0])
            subscription.disconnect_consumers()
        c = harness.consumer("c", 3)
        harness.add(c)
        await harness.settle()
        more = harness.publish(["k0", "k1"])
        await harness.settle()
        _assert_each_entry_once(harness, c, published + more)
        assert subscription.dispatcher.replay_size == 0
        await harness.close()

    run(scenario)


@pytest.mark.parametrize("mode", [SHARED, KEY_SHARED], ids=["shared", "key-shared"])
def test_a_seek_during_a_replay_pass_sends_each_entry_once(mode):
    """A replay pass is waiting for the ledger when a SEEK disconnects the consumers
    and moves the cursor back: the pass must not go on sending what the reset made
    obsolete, and a new consumer gets every entry exactly once (the live fuzz's
    failure: an entry both replayed and read afresh, then an assertion in every round)."""
    async def scenario() -> None:
        harness = Harness(mode)
        published = _held_by_two_consumers(harness)
        await harness.settle()
        gate = asyncio.Event()
        real_read = harness.ledger.read

        async def gated_read(start, count_max, bytes_max):
            if count_max == 1:                 # the replay pass reads one entry at a time
                await gate.wait()
            return await real_read(start, count_max, bytes_max)

        harness.ledger.read = gated_read
        subscription = harness.subscription
        a = next(c for c in subscription.consumers if c.name == "a")
        subscription.remove_consumer(a)        # a's entries wait for replay; a pass starts
        await harness.settle()
        subscription.disconnect_consumers()    # the SEEK: b's go to replay too, then reset
        subscription.reset_cursor(published[0])
        d = harness.consumer("d", 4)
        harness.add(d)
        gate.set()
        await harness.settle()
        _assert_each_entry_once(harness, d, published)
        await harness.close()

    run(scenario)
