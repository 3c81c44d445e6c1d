"""Deduplication state (broker/deduplication.py): a SEND at or below the stored
highest sequence id is a duplicate, one below an unsettled push is in flight, a failed
store lets the resend through; a snapshot restores the maps and replay of later
entries makes them exact; the producer map is bounded (least recently used go); a
quiet topic snapshots by time."""

from __future__ import annotations

import pytest

from broker.deduplication import Deduplication, Verdict
from common.errors import MalformedFrame
from common.position import Position


def test_verdicts_follow_pushed_and_persisted():
    dedup = Deduplication()
    assert dedup.check("p", 0, 0) is Verdict.NEW
    assert dedup.check("p", 0, 0) is Verdict.IN_FLIGHT          # not stored yet
    dedup.on_stored("p", 0, 0, Position(1, 0))
    assert dedup.check("p", 0, 0) is Verdict.DUPLICATE
    assert dedup.check("p", 1, 4) is Verdict.NEW                 # a batch of 1..4
    assert dedup.check("p", 3, 3) is Verdict.IN_FLIGHT
    dedup.on_store_failed("p")                                   # the batch failed
    assert dedup.check("p", 1, 4) is Verdict.NEW                 # its resend goes through
    dedup.on_stored("p", 1, 4, Position(1, 1))
    assert dedup.last_sequence_id("p") == 4
    assert dedup.check("q", 0, 0) is Verdict.NEW                 # producers are independent
    assert dedup.last_sequence_id("q") == -1


def test_snapshot_then_replay_restores_the_state():
    dedup = Deduplication()
    for i in range(5):
        dedup.check("p", i, i)
        dedup.on_stored("p", i, i, Position(3, i))
    snapshot = dedup.take_snapshot(Position(3, 4))
    restored = Deduplication()
    restored.restore(snapshot)
    assert restored.snapshot_position == Position(3, 4)
    restored.replay("p", 5, 7, Position(3, 5))
    restored.replay("r", 0, 0, Position(3, 6))
    assert restored.last_sequence_id("p") == 7 and restored.last_sequence_id("r") == 0
    assert restored.check("p", 6, 6) is Verdict.DUPLICATE
    assert restored.check("p", 8, 8) is Verdict.NEW


@pytest.mark.parametrize("bad", ["", "[]", '{"position": [1], "producers": {}}', '{"format_version": 99}'])
def test_bad_snapshots_raise_our_error(bad):
    with pytest.raises(MalformedFrame):
        Deduplication().restore(bad)


def test_producer_map_is_bounded_least_recently_used_first():
    dedup = Deduplication(producers_max=3)
    for index, name in enumerate(["a", "b", "c", "a", "d"]):
        dedup.check(name, index, index)
        dedup.on_stored(name, index, index, Position(1, index))
    assert set(dedup.persisted) == {"c", "a", "d"}
    assert dedup.last_sequence_id("b") == -1


def test_snapshot_is_due_every_interval():
    from broker.deduplication import SNAPSHOT_INTERVAL_ENTRIES

    dedup = Deduplication()
    for i in range(SNAPSHOT_INTERVAL_ENTRIES - 1):
        dedup.on_stored("p", i, i, Position(1, i))
    assert not dedup.snapshot_due()
    dedup.on_stored("p", SNAPSHOT_INTERVAL_ENTRIES, SNAPSHOT_INTERVAL_ENTRIES, Position(1, SNAPSHOT_INTERVAL_ENTRIES))
    assert dedup.snapshot_due()
    dedup.take_snapshot(Position(1, SNAPSHOT_INTERVAL_ENTRIES))
    assert not dedup.snapshot_due()


def test_a_quiet_topic_snapshots_by_time_and_a_snapshot_covers_the_last_entry_counted():
    from broker.deduplication import SNAPSHOT_INTERVAL_S

    dedup = Deduplication()
    assert dedup.last_stored == Position(-1, -1)
    assert not dedup.snapshot_stale(SNAPSHOT_INTERVAL_S * 10)      # nothing stored: nothing to cover
    dedup.on_stored("p", 0, 0, Position(4, 7))
    dedup.replay("q", 3, 3, Position(4, 8))
    assert dedup.last_stored == Position(4, 8)
    assert not dedup.snapshot_stale(SNAPSHOT_INTERVAL_S - 1)
    assert dedup.snapshot_stale(SNAPSHOT_INTERVAL_S)
    dedup.take_snapshot(dedup.last_stored)
    assert dedup.snapshot_position == Position(4, 8)
    assert not dedup.snapshot_stale(SNAPSHOT_INTERVAL_S * 10)
    restored = Deduplication()
    restored.restore(dedup.take_snapshot(dedup.last_stored))
    assert restored.last_stored == Position(4, 8)                 # a snapshot after restore covers as much


def test_a_snapshot_says_its_position_without_a_restore():
    from broker.deduplication import snapshot_position

    dedup = Deduplication()
    dedup.on_stored("p", 0, 0, Position(7, 41))
    assert snapshot_position(dedup.take_snapshot(dedup.last_stored)) == Position(7, 41)
    with pytest.raises(MalformedFrame):
        snapshot_position('{"position": "x", "producers": {}}')
