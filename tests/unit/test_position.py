"""Positions in a managed ledger (broker/position.py).

What it proves: positions order by ledger id first and entry id second (a later
ledger's first entry is after an earlier ledger's last, whatever the entry ids);
EARLIEST sorts before every real position; equal positions are equal and hash alike;
the "ledger:entry" text form round-trips, negative ids included, and garbage never
parses into a position; ``entries_between`` counts exactly the stored entries of an
interval (checked against counting positions one by one).

How: a shuffled list sorted against its known order, plus tables.
"""

from __future__ import annotations

import random

import pytest

from common.position import EARLIEST, Position
from common.errors import InvalidArgument


def test_order_is_ledger_then_entry():
    """A seeded shuffle of a known sequence sorts back to it."""
    expected = [EARLIEST, Position(0, 0), Position(0, 1), Position(0, 10), Position(0, 2**40),
                Position(1, -1), Position(1, 0), Position(2, 5), Position(10, 0), Position(2**63 - 1, 2**63 - 1)]
    shuffled = list(expected)
    random.Random(7).shuffle(shuffled)
    assert sorted(shuffled) == expected
    assert max(shuffled) == expected[-1]
    assert min(shuffled) == EARLIEST


@pytest.mark.parametrize("lower, higher", [
    (Position(1, 999_999), Position(2, 0)),      # ledger id dominates
    (Position(5, 3), Position(5, 4)),
    (Position(9, 10), Position(10, 9)),          # numeric, not text, order
    (Position(0, 9), Position(0, 10)),
])
def test_comparisons(lower: Position, higher: Position):
    """Each pair orders one way only, and their text forms differ."""
    assert lower < higher and higher > lower
    assert lower <= higher and not higher <= lower
    assert lower != higher
    assert str(lower) != str(higher)


def test_earliest_is_before_every_real_position():
    """EARLIEST is (-1, -1) and sorts before the first entry of any ledger."""
    for position in (Position(0, 0), Position(0, -1), Position(1, 0), Position(123, 456)):
        assert EARLIEST < position
    assert EARLIEST == Position(-1, -1)


def test_equal_positions_are_one_dict_key():
    """Positions built separately from equal ids count as one key."""
    counts: dict[Position, int] = {}
    for position in (Position(3, 4), Position(3, 4), Position(4, 3)):
        counts[position] = counts.get(position, 0) + 1
    assert counts == {Position(3, 4): 2, Position(4, 3): 1}


@pytest.mark.parametrize("position, text", [
    (Position(0, 0), "0:0"),
    (Position(12, 345), "12:345"),
    (EARLIEST, "-1:-1"),
    (Position(2**63 - 1, 2**63 - 1), f"{2**63 - 1}:{2**63 - 1}"),
])
def test_text_form_round_trips(position: Position, text: str):
    """str() gives "ledger:entry" and parse reads it back, negative and 64-bit ids included."""
    assert str(position) == text
    assert Position.parse(text) == position
    assert Position.parse(str(position)) == position


@pytest.mark.parametrize("text", ["", "1", "1:", ":1", "a:b", "1:2:3", "1.5:2", "1;2"])
def test_garbage_is_refused(text: str):
    """Garbage never becomes a position. The error type is not pinned: today it is
    ValueError, while the style guide asks for InvalidArgument; nothing parses user
    text with Position.parse yet."""
    with pytest.raises((ValueError, InvalidArgument)):
        Position.parse(text)


# --- normalize: the rule ManagedLedger (and the subscription tests' fake) apply ---------

def _normalize(position, ledgers: dict[int, int], current: int | None):
    """``ledgers``: ledger id -> last entry id (-1: empty)."""
    from common.position import normalize

    return normalize(position, ledgers, lambda l: ledgers.get(l, -1), lambda l: l == current)


def test_normalize_leaves_written_positions_and_the_current_ledger_alone():
    ledgers = {3: 9, 5: 4}
    assert _normalize(Position(3, 7), ledgers, current=5) == Position(3, 7)
    assert _normalize(Position(5, 100), ledgers, current=5) == Position(5, 100)   # not written yet


def test_normalize_moves_past_ends_and_over_deleted_and_empty_ledgers():
    ledgers = {3: 9, 4: -1, 6: 2}
    assert _normalize(Position(3, 10), ledgers, current=None) == Position(6, 0)   # 4 is empty
    assert _normalize(Position(1, 0), ledgers, current=None) == Position(3, 0)    # 1 was deleted
    assert _normalize(Position(-1, 0), ledgers, current=None) == Position(3, 0)   # the first position
    assert _normalize(Position(6, 3), ledgers, current=None) == Position(6, 3)    # past the last: as is
    assert _normalize(Position(3, 10), {3: 9, 4: -1}, current=4) == Position(4, 0)


# --- entries_between: backlogs, shared by PersistentTopic and the subscription tests' fake ---

def _between(after: Position, upto: Position, ledgers: dict[int, int]) -> int:
    """``ledgers``: ledger id -> last entry id (-1: empty)."""
    from common.position import entries_between

    return entries_between(ledgers, lambda l: ledgers.get(l, -1), after, upto)


@pytest.mark.parametrize("after, upto, expected", [
    (EARLIEST, Position(6, 2), 10 + 3),            # everything: ledger 4 is empty, 5 was deleted
    (Position(3, 9), Position(6, 2), 3),           # after a ledger's last entry: the next ledger's
    (Position(3, 4), Position(3, 6), 2),           # within one ledger: (4, 6]
    (Position(3, 4), Position(3, 4), 0),           # an empty interval
    (Position(3, 6), Position(3, 4), 0),           # a reversed one counts nothing, never negative
    (Position(3, -1), Position(3, 9), 10),         # "nothing within ledger 3" is before its entry 0
    (Position(3, 4), Position(6, 100), 5 + 3),     # past the last entry: only what is stored
    (Position(5, 0), Position(6, 0), 1),           # from a deleted ledger
    (Position(6, 2), Position(9, 0), 0),           # past the end
    (Position(1, 0), Position(2, 5), 0),           # before the first ledger
])
def test_entries_between_counts_stored_entries_in_the_interval(after, upto, expected):
    """(after, upto] counts only entries that are stored: empty and deleted ledgers add
    nothing, nor do positions past a ledger's last entry."""
    assert _between(after, upto, {3: 9, 4: -1, 6: 2}) == expected


def test_entries_between_agrees_with_counting_positions_one_by_one():
    """For every pair of positions of a small topic, the count equals the stored
    positions p with after < p <= upto."""
    ledgers = {2: 3, 3: -1, 5: 0, 7: 4}
    stored = [Position(l, e) for l, last in ledgers.items() for e in range(last + 1)]
    probes = [EARLIEST, Position(2, -1), Position(4, 0), Position(5, 1), Position(8, 0)] + stored
    for after in probes:
        for upto in probes:
            expected = sum(1 for p in stored if after < p <= upto)
            assert _between(after, upto, ledgers) == expected, (after, upto)
