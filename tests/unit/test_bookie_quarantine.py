"""The ledger client's quarantine of bookies that failed lately (ledger/quarantine.py)
and how placement uses it (ledger/placement.py, ``avoid``).

Proves: a bookie is a member for ``hold_s`` after its last failure, then forgotten; a
hold of 0 keeps nobody; the set is bounded (oldest failures forgotten first); an
avoided bookie is never chosen while the others are enough, and when they are not,
only as many avoided ones as are missing are taken (a quarantine orders, never
refuses); choose_replacement falls back to an avoided bookie when nothing else is left.
"""

from __future__ import annotations

import random

import pytest

from common.errors import ConfigError, NotEnoughBookies
from ledger import quarantine as quarantine_module
from ledger.config import LedgerClientConfig
from ledger.placement import choose_ensemble, choose_replacement
from ledger.quarantine import BookieQuarantine
from metadata.bookie_record import BookieRecord

GIB = 1024**3


def _bookie(name: str) -> BookieRecord:
    return BookieRecord(bookie_id=name, address=f"{name}:3181", http_address=f"{name}:8000", read_only=False,
                        free_bytes=100 * GIB, total_bytes=200 * GIB, disk_usage_ratio=0.5, version="test",
                        started_at_ms=0)


FOUR = [_bookie(f"b{i}") for i in range(4)]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_members_expire_after_the_hold():
    clock = _Clock()
    quarantine = BookieQuarantine(60.0, clock)
    quarantine.add("b1")
    clock.now += 30
    quarantine.add("b2")
    assert quarantine.members() == {"b1", "b2"}
    clock.now += 30.5
    assert quarantine.members() == {"b2"}
    quarantine.add("b2")        # a new failure restarts its hold
    clock.now += 59
    assert quarantine.members() == {"b2"}
    clock.now += 2
    assert quarantine.members() == set()


def test_a_hold_of_zero_keeps_nobody():
    quarantine = BookieQuarantine(0.0)
    quarantine.add("b1")
    assert quarantine.members() == set()


def test_bounded(monkeypatch):
    monkeypatch.setattr(quarantine_module, "SIZE_MAX", 3)
    clock = _Clock()
    quarantine = BookieQuarantine(60.0, clock)
    for index in range(5):
        clock.now += 1
        quarantine.add(f"b{index}")
    assert quarantine.members() == {"b2", "b3", "b4"}


def test_config_bounds():
    assert LedgerClientConfig().bookie_quarantine_s == 60.0
    with pytest.raises(ConfigError):
        LedgerClientConfig(bookie_quarantine_s=-1)
    with pytest.raises(ConfigError):
        LedgerClientConfig(bookie_quarantine_s=3601)


def test_avoided_bookies_are_not_chosen_while_others_are_enough():
    for seed in range(200):
        assert "b1" not in choose_ensemble(FOUR, 3, random.Random(seed), avoid={"b1"})
        assert choose_replacement(FOUR, ("b0", "b2"), random.Random(seed), avoid={"b1"}) == "b3"


def test_only_as_many_avoided_as_are_missing():
    for seed in range(200):
        ensemble = choose_ensemble(FOUR, 3, random.Random(seed), avoid={"b0", "b1", "b2"})
        assert len(set(ensemble)) == 3 and "b3" in ensemble
        assert len(set(ensemble) & {"b0", "b1", "b2"}) == 2
    # Nothing else left: the avoided bookie is still chosen.
    assert choose_replacement(FOUR, ("b0", "b2", "b3"), random.Random(0), avoid={"b1"}) == "b1"
    # Excluded is another matter: never chosen.
    with pytest.raises(NotEnoughBookies):
        choose_replacement(FOUR, ("b0", "b2", "b3"), random.Random(0), exclude={"b1"}, avoid={"b1"})
