"""Bundles, pure parts: hash ranges, splits, names, and the balancer's decisions."""

from __future__ import annotations

import pytest

from bundles.balancer import least_loaded, plan_shedding, scores
from bundles.hashing import FULL_UPPER, BundleRange, Bundles, default_boundaries, topic_hash
from bundles.records import LoadReport, OwnerRecord
from common.errors import InvalidArgument, MalformedFrame


def test_default_bundles_cover_the_space_and_find_every_hash():
    """Four equal ranges; every hash (edges included) falls in exactly one."""
    bundles = Bundles(tuple(default_boundaries(4)))
    assert [r.name for r in bundles.ranges] == ["0x00000000_0x40000000", "0x40000000_0x80000000",
                                                "0x80000000_0xc0000000", "0xc0000000_0xffffffff"]
    for value in (0, 1, 0x3FFFFFFF, 0x40000000, 0xBFFFFFFF, 0xC0000000, 0xFFFFFFFF):
        found = bundles.find(value)
        assert found.contains(value)
        assert sum(r.contains(value) for r in bundles.ranges) == 1


def test_names_round_trip_and_bad_names_are_refused():
    for bundle in Bundles(tuple(default_boundaries(8))).ranges:
        assert BundleRange.parse(bundle.name) == bundle
    for bad in ("nope", "0x10_", "0x50000000_0x40000000", "0x00000000-0x40000000"):
        with pytest.raises(InvalidArgument):
            BundleRange.parse(bad)


def test_split_halves_a_range_and_keeps_other_ranges():
    bundles = Bundles(tuple(default_boundaries(4)))
    target = bundles.ranges[3]
    split = bundles.with_split(target)
    assert len(split.ranges) == 5
    low, high = target.split()
    assert low in split.ranges and high in split.ranges
    assert high.upper == FULL_UPPER and split.find(0xFFFFFFFF) == high
    with pytest.raises(InvalidArgument):
        split.with_split(target)  # no longer a bundle


def test_topics_spread_over_bundles():
    """Partitions of one topic hash on their own names, so they spread."""
    bundles = Bundles(tuple(default_boundaries(4)))
    seen = {bundles.for_topic(f"persistent://public/default/t-partition-{i}") for i in range(40)}
    assert len(seen) == 4
    assert topic_hash("a") != topic_hash("b")


def report(broker: str, rate: float = 0.0, cpu: float = 0.0, rates=None) -> LoadReport:
    return LoadReport(broker, f"pulsar://{broker}", f"http://{broker}", cpu_fraction=cpu, msg_rate_in=rate,
                      bundle_msg_rates=rates or {})


def test_least_loaded_prefers_fewer_bundles_and_less_traffic():
    reports = {"a": report("a"), "b": report("b"), "c": report("c", rate=1000)}
    owners = {"ns/1": "a", "ns/2": "a", "ns/3": "b"}
    assert least_loaded(reports, owners) == "b"  # c has no bundle but all the traffic
    assert least_loaded(reports, owners, exclude={"b"}) == "a"  # 2 of 3 bundles < all traffic
    assert scores(reports, owners)["a"] > scores(reports, owners)["b"]


def test_shedding_moves_from_the_busiest_and_stops_when_even():
    """All four bundles on one broker: moves go to the empty brokers until 2-1-1, and
    then nothing moves (a move would not make things more even)."""
    reports = {b: report(b) for b in ("a", "b", "c")}
    owners = {f"ns/{i}": "a" for i in range(4)}
    moves = 0
    while (move := plan_shedding(reports, owners, threshold=0.2, cooling=set())) is not None:
        assert move.source != move.target
        owners[move.bundle] = move.target
        moves += 1
        assert moves < 10
    assert sorted(list(owners.values()).count(b) for b in "abc") == [1, 1, 2]


def test_shedding_respects_threshold_and_cooling():
    reports = {"a": report("a"), "b": report("b")}
    owners = {"ns/1": "a", "ns/2": "a"}
    assert plan_shedding(reports, owners, threshold=2.0, cooling=set()) is None
    assert plan_shedding(reports, owners, threshold=0.1, cooling={"ns/1", "ns/2"}) is None
    move = plan_shedding(reports, owners, threshold=0.1, cooling={"ns/1"})
    assert move is not None and move.bundle == "ns/2"


def test_shedding_moves_a_hot_bundle_by_traffic():
    """Equal bundle counts but one broker carries the traffic of a hot bundle: with a
    cold bundle to give, that is what moves (moving the hot one would just swap)."""
    reports = {"a": report("a", rate=900, rates={"ns/hot": 800, "ns/cold": 100}), "b": report("b", rate=0)}
    owners = {"ns/hot": "a", "ns/cold": "a", "ns/b1": "b", "ns/b2": "b"}
    move = plan_shedding(reports, owners, threshold=0.2, cooling=set())
    assert move is not None and move.bundle == "ns/cold" and move.target == "b"


def test_records_reject_garbage():
    with pytest.raises(MalformedFrame):
        OwnerRecord.decode(b"{not json")
    owner = OwnerRecord("b1", "pulsar://x", "http://x")
    assert OwnerRecord.decode(owner.encode()) == owner


def test_cpu_noise_never_makes_bundles_swap():
    """2-1-1 on three brokers with a little CPU difference: no move (it would only swap)."""
    reports = {"a": report("a", cpu=0.03), "b": report("b", cpu=0.0), "c": report("c", cpu=0.01)}
    owners = {"ns/1": "a", "ns/2": "a", "ns/3": "b", "ns/4": "c"}
    assert plan_shedding(reports, owners, threshold=0.2, cooling=set()) is None
