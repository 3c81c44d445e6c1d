"""The delayed-delivery tracker (subscriptions/delayed_delivery.py): entries come out
once due and never before, whatever their order of arrival; count_max and entries_max
bound what is released and held; and memory stays at about 24 bytes an entry plus a
bounded number of buckets."""

from __future__ import annotations

import random

import pytest

from subscriptions.delayed_delivery import DelayedDeliveryTracker

NOW = 1_800_000_000_000


def test_entries_come_out_when_due_never_before():
    tracker = DelayedDeliveryTracker(entries_max=1000)
    rng = random.Random(7)
    due = {}
    for entry_id in range(300):
        deliver_at = NOW + rng.choice([50, 999, 1001, 61_000, 3_700_000, 90_000_000]) + rng.randrange(5000)
        tracker.add(deliver_at, 1, entry_id, NOW)
        due[(1, entry_id)] = deliver_at
    assert len(tracker) == 300
    released = {}
    now = NOW
    while len(tracker):
        next_due = tracker.next_due_ms()
        assert next_due is not None
        assert next_due <= min(due[p] for p in due if p not in released)
        now = max(now + 1, next_due)
        for position in tracker.pop_due(now, 10_000):
            assert due[position] <= now, (position, due[position], now)
            released[position] = now
    assert set(released) == set(due)
    assert tracker.next_due_ms() is None


def test_count_max_leaves_the_rest_due():
    tracker = DelayedDeliveryTracker(entries_max=100)
    for entry_id in range(10):
        tracker.add(NOW + 10, 3, entry_id, NOW)
    first = tracker.pop_due(NOW + 20, 4)
    assert len(first) == 4 and len(tracker) == 6
    rest = tracker.pop_due(NOW + 20, 100)
    assert sorted(first + rest) == [(3, i) for i in range(10)]
    assert len(tracker) == 0


def test_full_at_entries_max_and_clear():
    tracker = DelayedDeliveryTracker(entries_max=3)
    for entry_id in range(3):
        tracker.add(NOW + 5000, 1, entry_id, NOW)
    assert tracker.full
    with pytest.raises(AssertionError):
        tracker.add(NOW + 5000, 1, 9, NOW)
    tracker.clear()
    assert not tracker.full and len(tracker) == 0 and tracker.pop_due(NOW + 10_000, 10) == []


def test_memory_per_entry_is_bounded():
    """200,000 entries due at random times over the next 24 hours: at most 24 bytes an
    entry plus bounded per-bucket overhead, so 1,000,000 stay under 32 MiB (measured
    with tracemalloc at that size by `make bench-delayed-delivery`)."""
    rng = random.Random(1)
    tracker = DelayedDeliveryTracker(entries_max=200_000)
    for entry_id in range(200_000):
        tracker.add(NOW + rng.randrange(86_400_000), entry_id // 50_000, entry_id % 50_000, NOW)
    assert tracker.full
    assert tracker.bucket_count <= 3_600 + 1_441
    per_bucket_bytes_max = 64 + 100 + 8
    assert tracker.memory_bytes() <= 200_000 * 24 * 1.2 + tracker.bucket_count * per_bucket_bytes_max
