"""The gateway's lease table (gateway/leases.py).

What it proves: messages handed out are leased only once their response is written
(and READY again if it is not); a lease that ends gives its entry back once no other
message of the entry is leased, never while one is (no duplicate of a sibling), and the
entry is forgotten so nothing is re-handed from the gateway; extension moves the
deadline (only for the current attempt); nack returns now or after a delay; acked
messages are never given back; READY messages nobody pulls go back after the hold time;
deliver-at messages wait; the leases limit is never exceeded; a lost connection clears
everything. How: a virtual clock (plain floats) and hand-made entries.
"""

from __future__ import annotations

import pytest

from client.messages import MessageId, ReceivedEntry, ReceivedMessage
from gateway.leases import LeaseTable, State


def entry(entry_id: int, count: int = 1, *, redelivery_count: int = 0, deliver_at_ms: int | None = None
          ) -> ReceivedEntry:
    batched = count > 1
    messages = tuple(
        ReceivedMessage(MessageId(1, entry_id, -1, i if batched else -1, count if batched else 0),
                        f"m{entry_id}.{i}".encode(), None, None, {}, 0, 0, "p", i, deliver_at_ms=deliver_at_ms)
        for i in range(count))
    return ReceivedEntry(1, entry_id, -1, redelivery_count, count if batched else 0, messages)


def table(leases_max: int = 100, ready_hold_s: float = 2.0) -> LeaseTable:
    return LeaseTable(leases_max, ready_hold_s, deferral_s_max=3600)


def test_lease_starts_when_written_and_expires_to_a_redelivery():
    """take → WRITING (no deadline yet); written at t=10 with 5 s → expires at 15, not
    before; the entry is given back and forgotten."""
    leases = table()
    leases.add(entry(0), now_s=0, now_unix_ms=0)
    (slot,) = leases.take(5)
    assert slot.state == State.WRITING and slot.attempt == 1
    assert leases.expire(now_s=100) == []      # no lease runs while writing
    leases.written([slot], lease_s=5, now_s=10)
    assert leases.expire(now_s=14.9) == []
    assert leases.expire(now_s=15) == [(1, 0)]
    assert (1, 0) not in leases and leases.active == 0


def test_unwritten_messages_are_ready_again_for_the_next_pull():
    leases = table()
    leases.add(entry(0, 3), now_s=0, now_unix_ms=0)
    taken = leases.take(3)
    leases.unwritten(taken, now_s=1)
    assert leases.ready == 3 and leases.active == 0
    assert [s.message.message_id.batch_index for s in leases.take(2)] == [0, 1]


def test_a_batch_goes_back_only_when_no_sibling_is_leased():
    """Batch of 3: message 0 expires while 1 is leased longer: nothing goes back
    (message 1 would be delivered twice); when 1 expires too, the entry goes back; the
    acked message 2 is not counted as pending."""
    leases = table()
    leases.add(entry(0, 3), now_s=0, now_unix_ms=0)
    first, second, third = leases.take(3)
    leases.written([first], lease_s=1, now_s=0)
    leases.written([second], lease_s=10, now_s=0)
    leases.written([third], lease_s=10, now_s=0)
    assert leases.ack((1, 0), 2)
    assert leases.expire(now_s=5) == []
    assert first.state == State.RETURNING
    assert leases.expire(now_s=10) == [(1, 0)]


def test_fully_acked_entries_are_forgotten_and_never_given_back():
    leases = table()
    leases.add(entry(0, 2), now_s=0, now_unix_ms=0)
    slots = leases.take(2)
    leases.written(slots, lease_s=1, now_s=0)
    assert leases.ack((1, 0), 0) and leases.ack((1, 0), 1)
    assert (1, 0) not in leases
    assert leases.expire(now_s=100) == []
    assert not leases.ack((1, 0), 0)     # acked twice: nothing held any more


def test_extension_moves_the_deadline_for_the_current_attempt_only():
    leases = table()
    leases.add(entry(0, redelivery_count=2), now_s=0, now_unix_ms=0)
    (slot,) = leases.take(1)
    assert slot.attempt == 3
    leases.written([slot], lease_s=5, now_s=0)
    assert leases.extend((1, 0), -1, attempt=2, lease_s=100, now_s=1) is None   # a stale receipt
    assert leases.extend((1, 0), -1, attempt=3, lease_s=10, now_s=4) is slot
    assert leases.expire(now_s=13) == []
    assert leases.expire(now_s=14) == [(1, 0)]
    assert leases.extend((1, 0), -1, attempt=3, lease_s=10, now_s=15) is None    # over


def test_nack_returns_now_or_after_a_delay():
    leases = table()
    leases.add(entry(0), now_s=0, now_unix_ms=0)
    leases.add(entry(1), now_s=0, now_unix_ms=0)
    first, second = leases.take(2)
    leases.written([first, second], lease_s=60, now_s=0)
    assert leases.nack((1, 0), -1, attempt=1, delay_s=0, now_s=1)
    assert leases.nack((1, 1), -1, attempt=1, delay_s=5, now_s=1)
    assert leases.expire(now_s=1) == [(1, 0)]
    assert leases.expire(now_s=5.9) == []
    assert leases.expire(now_s=6) == [(1, 1)]
    assert not leases.nack((1, 1), -1, attempt=1, delay_s=0, now_s=7)


def test_ready_messages_nobody_pulls_go_back_after_the_hold():
    """A batch's remainder not pulled within the hold goes back; an entry with a leased
    sibling waits for it."""
    leases = table(ready_hold_s=2)
    leases.add(entry(0, 3), now_s=0, now_unix_ms=0)
    leases.add(entry(1, 1), now_s=0, now_unix_ms=0)
    slots = leases.take(1)              # one of entry 0; entry 1 untouched
    leases.written(slots, lease_s=30, now_s=0)
    assert leases.expire(now_s=1.9) == []
    assert leases.expire(now_s=2) == [(1, 1)]
    assert (1, 0) in leases
    assert leases.next_deadline_s() is not None


def test_what_nobody_got_goes_back_as_unused_and_failed_leases_as_delivered():
    """expire_split: an entry none of whose messages reached anyone (read ahead, or made
    READY again after an unwritten response) is given back as unused - the broker does
    not count that as a delivery - while one with a lease that ended is a delivery,
    even when it goes back by the ready-hold rule with a sibling never taken."""
    leases = table(ready_hold_s=2)
    leases.add(entry(0, 3), now_s=0, now_unix_ms=0)     # one lease ends, one acked, one left
    leases.add(entry(1, 1), now_s=0, now_unix_ms=0)     # taken, response not written
    leases.add(entry(2, 1), now_s=0, now_unix_ms=0)     # never taken
    ending = leases.take(1)
    leases.written(ending, lease_s=1, now_s=0)
    acked = leases.take(1)
    leases.written(acked, lease_s=5, now_s=0)
    unwritten = leases.take(1)
    assert unwritten[0].held.position == (1, 0)          # entry 0's third message
    leases.unwritten(unwritten, now_s=0)
    assert leases.expire_split(now_s=1) == ([], [])     # entry 0 still has a lease running
    assert leases.ack((1, 0), 1)
    assert leases.expire_split(now_s=1.5) == ([], [])
    leases.add(entry(3, 1), now_s=1.5, now_unix_ms=0)
    (taken,) = leases.take(1)
    assert taken.held.position == (1, 0)                 # READY again, first in line
    leases.unwritten([taken], now_s=1.5)
    assert leases.expire_split(now_s=2) == ([], [(1, 1), (1, 2)])
    assert leases.expire_split(now_s=3.5) == ([(1, 0)], [(1, 3)])   # its hold began again at 1.5


def test_deliver_at_defers_without_counting_a_delivery():
    leases = table()
    leases.add(entry(0, deliver_at_ms=5_000), now_s=0, now_unix_ms=1_000)
    assert leases.take(1) == []
    assert leases.count(State.DEFERRED) == 1 and leases.active == 1
    assert leases.expire(now_s=3.9) == []
    assert leases.expire(now_s=4.0) == []           # due: READY here, not given back
    (slot,) = leases.take(1)
    assert slot.attempt == 1


def test_the_leases_limit_is_never_exceeded():
    leases = table(leases_max=3)
    for entry_id in range(5):
        leases.add(entry(entry_id), now_s=0, now_unix_ms=0)
    taken = leases.take(10)
    assert len(taken) == 3 and leases.room == 0
    assert leases.take(1) == []
    leases.written(taken, lease_s=1, now_s=0)
    leases.ack(taken[0].message.message_id.position, -1)
    assert len(leases.take(10)) == 1


def test_clear_forgets_everything_and_marks_slots_gone():
    leases = table()
    leases.add(entry(0, 2), now_s=0, now_unix_ms=0)
    slots = leases.take(2)
    leases.written(slots, lease_s=10, now_s=0)
    assert leases.clear() == 2
    assert leases.entries == 0 and leases.active == 0 and leases.ready == 0
    assert all(slot.state == State.RETURNING for slot in slots)
    assert leases.expire(now_s=100) == []


def test_an_entry_sent_again_replaces_the_old_one():
    leases = table()
    leases.add(entry(0), now_s=0, now_unix_ms=0)
    (old,) = leases.take(1)
    leases.written([old], lease_s=10, now_s=0)
    leases.add(entry(0, redelivery_count=1), now_s=1, now_unix_ms=0)
    assert leases.active == 0 and leases.ready == 1
    (new,) = leases.take(1)
    assert new.attempt == 2


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_keep_the_counts_consistent(seed):
    """Random adds, takes, writes, acks, nacks, extensions and expiries: the per-state
    counts always equal what the slots say, and active never exceeds the limit."""
    import random

    rng = random.Random(seed)
    leases = table(leases_max=20, ready_hold_s=3)
    now = 0.0
    next_entry = 0
    handed = []
    for _ in range(500):
        now += rng.random()
        action = rng.random()
        if action < 0.3:
            leases.add(entry(next_entry, rng.randint(1, 4)), now_s=now, now_unix_ms=int(now * 1000))
            next_entry += 1
        elif action < 0.5:
            taken = leases.take(rng.randint(1, 5))
            if rng.random() < 0.9:
                leases.written(taken, lease_s=rng.uniform(0.5, 5), now_s=now)
                handed += taken
            else:
                leases.unwritten(taken, now_s=now)
        elif action < 0.65 and handed:
            slot = rng.choice(handed)
            leases.ack(slot.message.message_id.position, slot.batch_index)
        elif action < 0.75 and handed:
            slot = rng.choice(handed)
            leases.nack(slot.message.message_id.position, slot.batch_index, slot.attempt, rng.choice([0, 1]), now)
        elif action < 0.85 and handed:
            slot = rng.choice(handed)
            leases.extend(slot.message.message_id.position, slot.batch_index, slot.attempt, 2, now)
        else:
            leases.expire(now)
        assert leases.active <= leases.leases_max
        live = [slot for held in leases._held.values() for slot in held.slots]   # noqa: SLF001
        for state in State:
            assert leases.count(state) == sum(1 for slot in live if slot.state == state), state


def test_ordered_take_hands_out_no_later_message_of_a_leased_key():
    """Ordering keys (Pub/Sub's rule): an ordered take gives at most one message per key
    and none of a key while one of it is leased; keyless messages are not held back;
    once the key's message is acked the next one of that key comes; an unordered take
    ignores keys."""
    leases = table()
    keys = ["a", "a", "b", None, "a", "b"]
    messages = tuple(
        ReceivedMessage(MessageId(1, 0, -1, i, len(keys)), f"m{i}".encode(), key, None, {}, 0, 0, "p", i)
        for i, key in enumerate(keys))
    leases.add(ReceivedEntry(1, 0, -1, 0, len(keys), messages), now_s=0, now_unix_ms=0)
    first = leases.take(10, ordered=True)
    assert [slot.message.payload for slot in first] == [b"m0", b"m2", b"m3"]
    leases.written(first, lease_s=30, now_s=0)
    assert leases.take(10, ordered=True) == []          # a and b are leased
    assert leases.ack((1, 0), 0)                        # the first "a" is done
    (second,) = leases.take(10, ordered=True)
    assert second.message.payload == b"m1"
    leases.written([second], lease_s=30, now_s=0)
    assert leases.ack((1, 0), 2)                        # the first "b" is done
    assert [slot.message.payload for slot in leases.take(10, ordered=True)] == [b"m5"]
    assert [slot.message.payload for slot in leases.take(10)] == [b"m4"]   # unordered: keys ignored
