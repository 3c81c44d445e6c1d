"""Quorum arithmetic (ledger/quorum.py): striping, the recovery coverage rule and the
in-order acknowledgement tracker.

What it proves: write sets stripe entries evenly over the ensemble; covers_write_set
and covers_every_write_set agree with the rule "no Qa bookies of any write set are
outside the responders" for every responder subset of small ensembles; AckTracker
completes entries strictly in entry order, only once Qa of the write set acknowledged,
honours unack and limit_entry_id, and never moves last_add_confirmed backwards.

How: tables for the small cases, exhaustive subsets for E <= 6, and a seeded random
acknowledgement schedule checked against a reference model written independently of
the tracker.
"""

from __future__ import annotations

import itertools
import random

import pytest

from ledger.quorum import AckTracker, covers_every_write_set, covers_write_set, write_set

QUORUM_SHAPES = [(1, 1, 1), (2, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 2, 1),
                 (5, 3, 2), (5, 5, 3), (6, 3, 2), (6, 4, 3)]


# --- write sets ---------------------------------------------------------------------------------

@pytest.mark.parametrize("entry_id, ensemble_size, write_quorum_size, expected", [
    (0, 1, 1, [0]),
    (7, 1, 1, [0]),
    (0, 3, 2, [0, 1]),
    (1, 3, 2, [1, 2]),
    (2, 3, 2, [2, 0]),
    (3, 3, 2, [0, 1]),
    (4, 5, 5, [4, 0, 1, 2, 3]),
    (5, 5, 3, [0, 1, 2]),
    (9, 5, 3, [4, 0, 1]),
    (10**12 + 1, 4, 2, [1, 2]),
])
def test_write_set_table(entry_id, ensemble_size, write_quorum_size, expected):
    """Entry n goes to Qw consecutive ensemble indices starting at n mod E."""
    assert write_set(entry_id, ensemble_size, write_quorum_size) == expected


@pytest.mark.parametrize("ensemble_size, write_quorum_size, _ack", QUORUM_SHAPES)
def test_write_sets_stripe_evenly(ensemble_size, write_quorum_size, _ack):
    """Every write set has Qw distinct in-range indices, consecutive entries rotate by
    one, and over any E consecutive entries each bookie holds exactly Qw of them."""
    for first in (0, 1, 17):
        counts = [0] * ensemble_size
        for entry_id in range(first, first + ensemble_size):
            members = write_set(entry_id, ensemble_size, write_quorum_size)
            assert len(set(members)) == write_quorum_size
            assert all(0 <= index < ensemble_size for index in members)
            following = write_set(entry_id + 1, ensemble_size, write_quorum_size)
            assert following == [(index + 1) % ensemble_size for index in members]
            for index in members:
                counts[index] += 1
        assert counts == [write_quorum_size] * ensemble_size


def test_write_set_rejects_impossible_shapes():
    """Qw > E or Qw < 1 are programmer errors (metadata validation prevents them)."""
    with pytest.raises(AssertionError):
        write_set(0, 2, 3)
    with pytest.raises(AssertionError):
        write_set(0, 2, 0)


# --- coverage ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("responded, members, qw, qa, expected", [
    (set(), [0, 1], 2, 2, False),
    ({0}, [0, 1], 2, 2, True),          # Qw - Qa + 1 = 1
    ({0}, [0, 1, 2], 3, 2, False),      # needs 2
    ({0, 2}, [0, 1, 2], 3, 2, True),
    ({5, 6}, [0, 1, 2], 3, 2, False),   # responders outside the write set do not count
    ({0, 1}, [0, 1, 2], 3, 1, False),   # Qa = 1 needs all three
    ({0, 1, 2}, [0, 1, 2], 3, 1, True),
    ({1}, [1], 1, 1, True),
])
def test_covers_write_set_table(responded, members, qw, qa, expected):
    """A write set is covered when at least Qw - Qa + 1 of its members responded."""
    assert covers_write_set(responded, members, qw, qa) is expected


def _could_still_complete(responded: set[int], ensemble_size: int, qw: int, qa: int) -> bool:
    """Reference rule, stated from the other side: some entry could still gather Qa
    acknowledgements from bookies that did not respond (were not fenced)."""
    silent = set(range(ensemble_size)) - responded
    for start in range(ensemble_size):
        members = [(start + i) % ensemble_size for i in range(qw)]
        if sum(1 for index in members if index in silent) >= qa:
            return True
    return False


@pytest.mark.parametrize("ensemble_size, qw, qa", QUORUM_SHAPES)
def test_covers_every_write_set_matches_the_safety_rule_for_every_subset(ensemble_size, qw, qa):
    """For every subset of the ensemble, covers_every_write_set is True exactly when no
    write set can still be acknowledged by Qa bookies outside the subset."""
    for size in range(ensemble_size + 1):
        for subset in itertools.combinations(range(ensemble_size), size):
            responded = set(subset)
            expected = not _could_still_complete(responded, ensemble_size, qw, qa)
            assert covers_every_write_set(responded, ensemble_size, qw, qa) is expected, responded


@pytest.mark.parametrize("responded, shape, expected", [
    ({0}, (3, 2, 2), False),
    ({0, 1}, (3, 2, 2), True),
    ({0, 1}, (3, 3, 2), True),
    ({0}, (3, 3, 2), False),
    ({0, 2, 4}, (5, 3, 2), False),
    ({0, 1, 2, 3}, (5, 3, 2), True),
    (set(), (1, 1, 1), False),
    ({0}, (1, 1, 1), True),
    ({0}, (3, 3, 3), True),
])
def test_covers_every_write_set_table(responded, shape, expected):
    """Hand-checked cases of the recovery rule."""
    assert covers_every_write_set(responded, *shape) is expected


# --- AckTracker -----------------------------------------------------------------------------------

def test_entries_complete_in_order_only():
    """A later entry with its quorum waits for every earlier one to complete."""
    tracker = AckTracker(3, 2, 2)
    for entry_id in range(3):
        tracker.add(entry_id)
    tracker.ack(1, 1)
    tracker.ack(1, 2)
    assert tracker.complete() == []
    assert tracker.last_add_confirmed == -1
    tracker.ack(0, 0)
    assert tracker.complete() == []          # one of two
    tracker.ack(0, 1)
    assert tracker.complete() == [0, 1]
    assert tracker.last_add_confirmed == 1
    assert tracker.pending_ids() == [2]
    tracker.ack(2, 2)
    tracker.ack(2, 0)
    assert tracker.complete() == [2]
    assert len(tracker) == 0


def test_duplicate_acks_from_one_bookie_count_once():
    """The same bookie acknowledging twice is still one of Qa."""
    tracker = AckTracker(3, 3, 2)
    tracker.add(0)
    tracker.ack(0, 1)
    tracker.ack(0, 1)
    assert tracker.acked_by(0) == {1}
    assert tracker.complete() == []


def test_late_ack_after_completion_is_ignored():
    """An acknowledgement for an entry that already completed changes nothing."""
    tracker = AckTracker(2, 2, 1)
    tracker.add(0)
    tracker.ack(0, 0)
    assert tracker.complete() == [0]
    tracker.ack(0, 1)
    assert tracker.complete() == []
    assert tracker.acked_by(0) == set()
    assert tracker.last_add_confirmed == 0


def test_ack_from_outside_the_write_set_is_a_programmer_error():
    """Entry 0 with E=3, Qw=2 goes to {0, 1}; an ack from index 2 is impossible."""
    tracker = AckTracker(3, 2, 2)
    tracker.add(0)
    with pytest.raises(AssertionError):
        tracker.ack(0, 2)


def test_unack_removes_an_acknowledgement():
    """A bookie replaced in an ensemble change loses its acknowledgements."""
    tracker = AckTracker(3, 3, 2)
    tracker.add(0)
    tracker.ack(0, 0)
    tracker.ack(0, 1)
    tracker.unack(0, 1)
    assert tracker.acked_by(0) == {0}
    assert tracker.complete() == []
    tracker.unack(0, 2)          # never acked: no effect
    tracker.unack(5, 0)          # unknown entry: no effect
    tracker.ack(0, 2)
    assert tracker.complete() == [0]


def test_limit_entry_id_holds_back_entries_at_and_past_it():
    """While an ensemble change from entry 2 is being recorded, 2 and later wait."""
    tracker = AckTracker(2, 2, 1)
    for entry_id in range(4):
        tracker.add(entry_id)
        tracker.ack(entry_id, entry_id % 2)
    assert tracker.complete(limit_entry_id=2) == [0, 1]
    assert tracker.complete(limit_entry_id=2) == []
    assert tracker.complete(limit_entry_id=0) == []
    assert tracker.last_add_confirmed == 1
    assert tracker.complete() == [2, 3]


def test_tracker_starts_after_a_given_last_add_confirmed():
    """A tracker resumed at last_add_confirmed=9 expects entry 10 next."""
    tracker = AckTracker(3, 2, 1, last_add_confirmed=9)
    with pytest.raises(AssertionError):
        tracker.add(9)
    tracker.add(10)
    with pytest.raises(AssertionError):
        tracker.add(12)          # ids must be contiguous
    tracker.ack(10, 1)
    assert tracker.complete() == [10]
    assert tracker.write_set(10) == [1, 2]


def test_acked_by_returns_a_copy():
    """Callers cannot change the tracker's state through acked_by."""
    tracker = AckTracker(3, 2, 2)
    tracker.add(0)
    tracker.ack(0, 0)
    tracker.acked_by(0).add(1)
    assert tracker.acked_by(0) == {0}


@pytest.mark.parametrize("ensemble_size, qw, qa", QUORUM_SHAPES)
def test_random_ack_schedules_complete_in_order(ensemble_size, qw, qa):
    """Seeded random acks, unacks and complete() calls (with and without a limit): the
    completed ids are exactly 0, 1, 2, ... in order, last_add_confirmed never moves
    back, and an entry completes exactly when the reference model says it may."""
    rng = random.Random(ensemble_size * 100 + qw * 10 + qa)
    tracker = AckTracker(ensemble_size, qw, qa)
    entry_count = 60
    acked: dict[int, set[int]] = {}
    confirmed = -1
    completed: list[int] = []
    next_add = 0
    for _step in range(2000):
        action = rng.random()
        if action < 0.15 and next_add < entry_count:
            tracker.add(next_add)
            acked[next_add] = set()
            next_add += 1
        elif action < 0.75 and next_add > confirmed + 1:
            entry_id = rng.randrange(confirmed + 1, next_add)
            index = rng.choice(write_set(entry_id, ensemble_size, qw))
            tracker.ack(entry_id, index)
            acked[entry_id].add(index)
        elif action < 0.82 and next_add > confirmed + 1:
            entry_id = rng.randrange(confirmed + 1, next_add)
            index = rng.randrange(ensemble_size)
            tracker.unack(entry_id, index)
            acked[entry_id].discard(index)
        else:
            limit = rng.choice([None, None, rng.randrange(0, entry_count + 1)])
            expected = []
            candidate = confirmed + 1
            while (candidate < next_add and (limit is None or candidate < limit)
                   and len(acked[candidate]) >= qa):
                expected.append(candidate)
                candidate += 1
            done = tracker.complete(limit)
            assert done == expected
            if done:
                assert done[0] == confirmed + 1
                confirmed = done[-1]
            completed.extend(done)
            assert tracker.last_add_confirmed == confirmed
    assert completed == list(range(len(completed)))
