"""Bundles, pure parts: hash ranges, splits, names, and the balancer's decisions."""

from __future__ import annotations

import pytest

from bundles.balancer import PendingMove, least_loaded, plan_shedding, scores, settled, with_moves
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


def _shed_until_even(reports: dict[str, LoadReport], owners: dict[str, str], corrected: bool) -> int:
    """Plans moves on reports that never change (they lag every move), as the leader
    does between two reports; returns how many moves it makes before it stops."""
    moves: list[PendingMove] = []
    while True:
        planned_on = with_moves(reports, moves) if corrected else reports
        move = plan_shedding(planned_on, owners, threshold=0.25, cooling={m.bundle for m in moves})
        if move is None:
            return len(moves)
        rate = planned_on[move.source].bundle_msg_rates.get(move.bundle, 0.0)
        moves.append(PendingMove(move.bundle, move.source, move.target, rate, ordered_ms=0))
        owners[move.bundle] = move.target
        assert len(moves) <= len(owners)


def test_shedding_on_lagging_reports_moves_only_what_evens_the_load():
    """A second broker joins one that carries eight busy bundles. Until the reports
    show a move, the raw ones still put all the traffic on the first broker: planned on
    them, shedding goes on past even (6-2, which the next reports turn into shedding
    back). Corrected by the moves ordered, it stops at 4-4."""
    rates = {f"ns/{i}": 100.0 for i in range(8)}
    reports = {"a": report("a", rate=800, rates=rates), "b": report("b")}
    assert _shed_until_even(reports, {bundle: "a" for bundle in rates}, corrected=True) == 4
    assert _shed_until_even(reports, {bundle: "a" for bundle in rates}, corrected=False) > 4


def test_corrected_reports_move_traffic_once():
    move = PendingMove("ns/1", "a", "b", rate=300.0, ordered_ms=0)
    # Neither report shows the move yet: the traffic goes from a to b.
    before = {"a": report("a", rate=500, rates={"ns/1": 300, "ns/2": 200}), "b": report("b", rate=50)}
    adjusted = with_moves(before, [move])
    assert adjusted["a"].msg_rate_in == 200 and adjusted["a"].bundle_msg_rates == {"ns/2": 200}
    assert adjusted["b"].msg_rate_in == 350 and adjusted["b"].bundle_msg_rates == {"ns/1": 300}
    assert before["a"].msg_rate_in == 500, "the reports themselves are left as they were"
    # Both show it (a no longer counts the bundle, b counts all of it): nothing to add.
    after = {"a": report("a", rate=200, rates={"ns/2": 200}), "b": report("b", rate=350, rates={"ns/1": 300})}
    assert with_moves(after, [move]) == after
    # b's first report after taking the bundle counts part of its traffic: topped up.
    partly = {"a": report("a", rate=200, rates={"ns/2": 200}), "b": report("b", rate=120, rates={"ns/1": 70})}
    assert with_moves(partly, [move])["b"].msg_rate_in == 350
    # A report lower than the move (traffic fell meanwhile) never goes below zero.
    fell = {"a": report("a", rate=100, rates={"ns/1": 100}), "b": report("b")}
    assert with_moves(fell, [move])["a"].msg_rate_in == 0
    # An end that no longer reports (gone) is skipped.
    assert set(with_moves({"b": report("b")}, [move])) == {"b"}


def test_a_move_settles_once_both_ends_report_an_interval_after_it():
    move = PendingMove("ns/1", "a", "b", rate=1.0, ordered_ms=10_000)
    interval_ms, settle_ms = 1_000, 2_000

    def at(a_ms: int, b_ms: int | None) -> dict[str, LoadReport]:
        reports = {"a": LoadReport("a", "pulsar://a", "http://a", reported_ms=a_ms)}
        if b_ms is not None:
            reports["b"] = LoadReport("b", "pulsar://b", "http://b", reported_ms=b_ms)
        return reports

    assert not settled(move, at(12_999, 13_500), interval_ms, settle_ms)   # a's interval began at 11.999 s
    assert not settled(move, at(13_500, 12_999), interval_ms, settle_ms)
    assert settled(move, at(13_000, 13_000), interval_ms, settle_ms)
    assert settled(move, at(13_000, None), interval_ms, settle_ms)        # b gone: nothing to wait for
