"""Bundles beyond tests/unit/test_bundles.py: hash ranges and their names
(bundles/hashing.py), the records kept in etcd (bundles/records.py), and the
balancer's edge cases (bundles/balancer.py).

What it proves: the topic hash is CRC32C (every broker must place a topic in the same
bundle, so the function is pinned by its standard check value); ranges are half-open
with the last one holding 0xffffffff; default boundaries cover the space for any
allowed count; splitting halves a range at its middle (odd widths too), refuses ranges
too small and keeps the namespace's other boundaries; names round-trip through the
canonical "0x%08x_0x%08x" form and every malformed name raises InvalidArgument; bad
boundary sets are refused. Each record survives encode/decode, ignores unknown fields,
takes defaults for optional ones, and turns corrupt bytes into MalformedFrame only.
The balancer never picks an excluded or reportless broker, breaks ties on CPU then
id, declines moves at exactly the threshold, and never moves the only hot bundle
when that would just swap the imbalance.

How: tables and small hand-built clusters; the only loop runs over at most 1024 ranges.
"""

from __future__ import annotations

import json

import pytest

from bundles.balancer import IMPROVEMENT_MIN, Move, least_loaded, plan_shedding, scores
from bundles.hashing import (
    FULL_UPPER,
    HASH_MAX,
    RANGE_WIDTH_MIN,
    BundleRange,
    Bundles,
    default_boundaries,
    topic_hash,
)
from bundles.records import (
    OWNED,
    RELEASING,
    AssignmentRecord,
    BundlesRecord,
    LeaderRecord,
    LoadReport,
    OwnerRecord,
    TransferRecord,
)
from common.errors import InvalidArgument, MalformedFrame

# --- hashing ----------------------------------------------------------------------------------


def test_topic_hash_is_crc32c_of_the_utf8_name():
    """CRC32C's standard check value, and a non-ASCII name hashed as UTF-8."""
    assert topic_hash("123456789") == 0xE3069283
    assert topic_hash("é") == topic_hash("\u00e9")
    assert topic_hash("é") != topic_hash("e\u0301")     # no normalisation: names are bytes
    assert 0 <= topic_hash("persistent://public/default/t") <= HASH_MAX


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16, 1024])
def test_default_boundaries_cover_the_space_for_any_count(count: int):
    """count contiguous, non-empty ranges from 0 to 2**32, near-equal (the remainder of
    an uneven division goes to the last range)."""
    boundaries = default_boundaries(count)
    bundles = Bundles(tuple(boundaries))
    ranges = bundles.ranges
    assert len(ranges) == count
    assert ranges[0].lower == 0 and ranges[-1].upper == FULL_UPPER
    assert all(a.upper == b.lower for a, b in zip(ranges, ranges[1:]))
    widths = {r.upper - r.lower for r in ranges[:-1]}
    assert len(widths) <= 1
    step = FULL_UPPER // count
    assert ranges[-1].upper - ranges[-1].lower == FULL_UPPER - step * (count - 1)
    assert bundles.find(0) == ranges[0] and bundles.find(HASH_MAX) == ranges[-1]


@pytest.mark.parametrize("count", [0, -1, 1025])
def test_default_boundaries_refuse_bad_counts(count: int):
    """Fewer than 1 or more than 1024 bundles is InvalidArgument."""
    with pytest.raises(InvalidArgument):
        default_boundaries(count)


def test_one_bundle_holds_every_hash():
    """A single bundle is [0, 2**32), named with 0xffffffff, holding 0xffffffff."""
    (only,) = Bundles(tuple(default_boundaries(1))).ranges
    assert only == BundleRange(0, FULL_UPPER)
    assert only.name == "0x00000000_0xffffffff"
    assert only.contains(0) and only.contains(HASH_MAX)
    assert not only.contains(FULL_UPPER)


def test_ranges_are_half_open():
    """A boundary value belongs to the range it starts, not the one it ends."""
    bundles = Bundles((0, 100, 200, FULL_UPPER))
    assert bundles.find(99) == BundleRange(0, 100)
    assert bundles.find(100) == BundleRange(100, 200)
    assert bundles.find(199) == BundleRange(100, 200)
    assert bundles.find(200) == BundleRange(200, FULL_UPPER)
    assert not BundleRange(0, 100).contains(100)


@pytest.mark.parametrize("lower, upper, middle", [
    (0, FULL_UPPER, 0x80000000),
    (0x40000000, 0x80000000, 0x60000000),
    (10, 15, 12),                      # odd width: the lower half is the smaller
    (0, 2 * RANGE_WIDTH_MIN, RANGE_WIDTH_MIN),
])
def test_split_at_the_middle(lower: int, upper: int, middle: int):
    """The halves meet at lower + width // 2 and cover the range."""
    low, high = BundleRange(lower, upper).split()
    assert (low, high) == (BundleRange(lower, middle), BundleRange(middle, upper))


@pytest.mark.parametrize("width", [1, 2, 2 * RANGE_WIDTH_MIN - 1])
def test_ranges_too_small_are_not_split(width: int):
    """Ranges narrower than 2 * RANGE_WIDTH_MIN are refused."""
    with pytest.raises(InvalidArgument, match="too small"):
        BundleRange(1000, 1000 + width).split()


def test_repeated_splits_keep_every_other_boundary_and_names_round_trip():
    """Split the range holding one hash eight times: each split adds exactly one
    boundary, the others stay, the hash stays covered, and every name parses back."""
    bundles = Bundles(tuple(default_boundaries(4)))
    value = topic_hash("persistent://public/default/hot")
    for _ in range(8):
        before = set(bundles.boundaries)
        target = bundles.find(value)
        bundles = bundles.with_split(target)
        assert before < set(bundles.boundaries) and len(bundles.boundaries) == len(before) + 1
        assert bundles.find(value) in target.split()
    assert len(bundles.ranges) == 12
    for bundle in bundles.ranges:
        assert BundleRange.parse(bundle.name) == bundle
        assert bundles.find(bundle.lower) == bundle


def test_with_split_refuses_a_range_that_is_not_a_bundle():
    """Only one of the namespace's own ranges can be split."""
    bundles = Bundles(tuple(default_boundaries(4)))
    with pytest.raises(InvalidArgument, match="not a bundle"):
        bundles.with_split(BundleRange(0, 0x20000000))     # inside a bundle, not one


@pytest.mark.parametrize("name, expected", [
    ("0x00000000_0x40000000", BundleRange(0, 0x40000000)),
    ("0xc0000000_0xffffffff", BundleRange(0xC0000000, FULL_UPPER)),   # the last range's end
    ("0X0000000A_0X000000FF", BundleRange(10, 255)),                   # hex is case-blind
])
def test_bundle_names_parse(name: str, expected: BundleRange):
    """Names parse to their ranges and print back in canonical lower-case form."""
    parsed = BundleRange.parse(name)
    assert parsed == expected
    assert parsed.name == name.lower()


def test_non_canonical_names_parse_to_the_canonical_range():
    """A name written without zero padding parses; its ``name`` is the canonical form
    (the one keys are built from)."""
    assert BundleRange.parse("0x10_0x20").name == "0x00000010_0x00000020"


@pytest.mark.parametrize("name", [
    "", "_", "0x_0x", "0x10", "0x10_0x20_0x30", "0xzz_0x10", "0x20_0x10", "0x10_0x10",
    "0x00000000_0x100000001", "-0x1_0x10", "0x00000000 0x40000000", "bundle",
])
def test_malformed_bundle_names_raise_invalid_argument(name: str):
    """Malformed names, empty or inverted ranges: InvalidArgument only."""
    with pytest.raises(InvalidArgument):
        BundleRange.parse(name)


@pytest.mark.parametrize("boundaries", [
    (), (0,), (FULL_UPPER,), (1, FULL_UPPER), (0, HASH_MAX), (0, FULL_UPPER + 1),
    (0, 100, 100, FULL_UPPER), (0, 200, 100, FULL_UPPER),
])
def test_bad_boundary_sets_are_refused(boundaries: tuple[int, ...]):
    """Boundaries must start at 0, end at 2**32 and strictly increase."""
    with pytest.raises(InvalidArgument):
        Bundles(boundaries)


# --- records ----------------------------------------------------------------------------------

RECORDS = [
    BundlesRecord(default_boundaries(4)),
    OwnerRecord("b1", "pulsar://b1:6650", "http://b1:8080"),
    OwnerRecord("b1", "pulsar://b1:6650", "http://b1:8080", state=RELEASING, to="b2", acquired_ms=1_700_000_000_000),
    AssignmentRecord("b2", reason="new bundle", decided_by="b1", decided_ms=5),
    TransferRecord("b3", reason="shedding", decided_ms=6),
    LoadReport("b1", "pulsar://b1:6650", "http://b1:8080", cpu_fraction=0.25, msg_rate_in=10.5, msg_rate_out=3.0,
               connections=4, topics=2, bundles=["public/default/0x00000000_0x40000000"],
               bundle_msg_rates={"public/default/0x00000000_0x40000000": 13.5}, reported_ms=7, started_ms=1),
    LeaderRecord("b1", web_service_url="http://b1:8080", service_url="pulsar://b1:6650", elected_ms=9),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_round_trip(record):
    """decode(encode(r)) == r, and the bytes are canonical JSON with sorted keys."""
    data = record.encode()
    assert type(record).decode(data) == record
    assert type(record).decode(data).encode() == data          # canonical bytes
    assert list(json.loads(data)) == sorted(json.loads(data))


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_ignore_unknown_fields(record):
    """A field added by a newer broker does not stop an older one from decoding."""
    doc = json.loads(record.encode())
    doc["added_by_a_newer_broker"] = [1, 2]
    assert type(record).decode(json.dumps(doc).encode()) == record


def test_optional_fields_take_their_defaults():
    """Records that leave out optional fields decode with the documented defaults."""
    owner = OwnerRecord.decode(b'{"broker_id": "b1", "service_url": "s", "web_service_url": "w"}')
    assert (owner.state, owner.to, owner.acquired_ms) == (OWNED, "", 0)
    report = LoadReport.decode(b'{"broker_id": "b1", "service_url": "s", "web_service_url": "w"}')
    assert (report.bundles, report.bundle_msg_rates, report.cpu_fraction) == ([], {}, 0.0)
    assert LeaderRecord.decode(b'{"broker_id": "b9"}') == LeaderRecord("b9")


RECORD_TYPES = [BundlesRecord, OwnerRecord, AssignmentRecord, TransferRecord, LoadReport, LeaderRecord]


@pytest.mark.parametrize("record_type", RECORD_TYPES, ids=lambda t: t.__name__)
@pytest.mark.parametrize("data", [
    b"", b"{", b"{}", b"null", b"[]", b"7", b'"broker_id"', b"\xff\xfe", b'{"broker_id": }', b"[1, 2]",
])
def test_corrupt_records_raise_malformed_frame_only(record_type, data: bytes):
    """Truncated JSON, a non-object, a missing required field, bad UTF-8: all
    MalformedFrame, never a KeyError or TypeError escaping."""
    with pytest.raises(MalformedFrame):
        record_type.decode(data)


def test_truncated_records_are_refused_at_every_cut():
    """Every proper prefix of a real record is refused (none happens to be valid JSON
    of the right shape)."""
    data = RECORDS[1].encode()
    for cut in range(len(data)):
        with pytest.raises(MalformedFrame):
            OwnerRecord.decode(data[:cut])


def test_bundles_record_boundaries_rebuild_the_namespace_bundles():
    """What ownership and the leader do with the record: the boundaries decoded from etcd
    give back the same ranges, splits included."""
    bundles = Bundles(tuple(default_boundaries(4))).with_split(BundleRange(0, 0x40000000))
    record = BundlesRecord(list(bundles.boundaries))
    assert Bundles(tuple(BundlesRecord.decode(record.encode()).boundaries)) == bundles


# --- balancer ---------------------------------------------------------------------------------

def _report(broker: str, *, rate_in: float = 0.0, rate_out: float = 0.0, cpu: float = 0.0,
            rates: dict[str, float] | None = None) -> LoadReport:
    return LoadReport(broker, f"pulsar://{broker}", f"http://{broker}", cpu_fraction=cpu, msg_rate_in=rate_in,
                      msg_rate_out=rate_out, bundle_msg_rates=rates or {})


def test_scores_with_nothing_owned_and_no_traffic_are_zero():
    """An idle cluster scores every broker 0; no reports give no scores."""
    reports = {b: _report(b) for b in "abc"}
    assert scores(reports, {}) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert scores({}, {"ns/1": "a"}) == {}


def test_scores_add_bundle_share_and_traffic_share_in_and_out():
    """Score = bundle share + (in + out) traffic share."""
    reports = {"a": _report("a", rate_in=30.0, rate_out=10.0), "b": _report("b", rate_out=60.0)}
    owners = {"ns/1": "a", "ns/2": "a", "ns/3": "b", "ns/4": "b"}
    result = scores(reports, owners)
    assert result["a"] == pytest.approx(0.5 + 0.4)
    assert result["b"] == pytest.approx(0.5 + 0.6)


def test_bundles_of_a_broker_without_a_report_count_in_the_total_only():
    """A dead broker (its report gone) still holds bundles until its lease expires: they
    dilute everyone's share but it never gets a score, so it is never chosen."""
    reports = {"a": _report("a"), "b": _report("b")}
    owners = {"ns/1": "a", "ns/2": "dead", "ns/3": "dead", "ns/4": "dead"}
    assert scores(reports, owners) == {"a": 0.25, "b": 0.0}
    assert least_loaded(reports, owners) == "b"
    assert least_loaded(reports, owners, exclude={"b"}) == "a"


def test_least_loaded_with_no_candidates_is_none():
    """No reports, or every broker excluded: None, not an error."""
    reports = {"a": _report("a")}
    assert least_loaded({}, {}) is None
    assert least_loaded(reports, {}, exclude={"a"}) is None


def test_least_loaded_ties_break_on_cpu_then_broker_id():
    """Equal scores (up to float noise): less CPU wins; equal CPU: the smaller id, so
    every leader decides the same."""
    reports = {"b": _report("b", cpu=0.5), "c": _report("c", cpu=0.1), "a": _report("a", cpu=0.5)}
    assert least_loaded(reports, {}) == "c"
    reports["c"] = _report("c", cpu=0.5)
    assert least_loaded(reports, {}) == "a"
    # Three bundles over three brokers: shares of 1/3 computed separately still tie.
    owners = {"ns/1": "a", "ns/2": "b", "ns/3": "c"}
    assert least_loaded(reports, owners) == "a"


def test_shedding_needs_two_brokers():
    """With fewer than two reporting brokers there is nowhere to move a bundle."""
    owners = {f"ns/{i}": "a" for i in range(4)}
    assert plan_shedding({"a": _report("a")}, owners, threshold=0.01, cooling=set()) is None
    assert plan_shedding({}, owners, threshold=0.01, cooling=set()) is None


def test_shedding_declines_at_exactly_the_threshold():
    """Scores differ by exactly 0.5 (a: 3 of 4 bundles, b: 1): a threshold of 0.5
    holds (difference <= threshold), just below it moves one bundle from a to b."""
    reports = {"a": _report("a"), "b": _report("b")}
    owners = {"ns/1": "a", "ns/2": "a", "ns/3": "a", "ns/4": "b"}
    assert plan_shedding(reports, owners, threshold=0.5, cooling=set()) is None
    move = plan_shedding(reports, owners, threshold=0.49, cooling=set())
    assert move == Move("ns/1", "a", "b", move.reason)
    assert "a=" in move.reason and "b=" in move.reason


def test_shedding_never_moves_the_only_hot_bundle_to_swap_the_imbalance():
    """a owns one bundle carrying all the traffic, b one idle bundle: moving the hot
    bundle would only make b the hot broker, so nothing moves."""
    reports = {"a": _report("a", rate_in=1000.0, rates={"ns/hot": 1000.0}), "b": _report("b")}
    owners = {"ns/hot": "a", "ns/idle": "b"}
    assert plan_shedding(reports, owners, threshold=0.1, cooling=set()) is None


def test_shedding_requires_a_real_improvement():
    """A move that narrows the difference by less than IMPROVEMENT_MIN is not made."""
    reports = {"a": _report("a", rate_in=100.0, rates={"ns/1": 100.0}), "b": _report("b")}
    owners = {"ns/1": "a"}
    # a: 1.0 + 1.0 = 2.0, b: 0; moving ns/1 gives b 2.0 and a 0: no narrower.
    assert plan_shedding(reports, owners, threshold=0.1, cooling=set()) is None
    assert IMPROVEMENT_MIN > 0


def test_shedding_targets_the_lowest_and_takes_from_the_highest_by_id_on_ties():
    """Two equally empty brokers: the move goes to the smaller id; the bundle taken is the
    best improvement, ties going to the first bundle name."""
    reports = {"a": _report("a"), "c": _report("c"), "b": _report("b")}
    owners = {"ns/2": "a", "ns/1": "a", "ns/3": "a"}
    move = plan_shedding(reports, owners, threshold=0.1, cooling=set())
    assert (move.bundle, move.source, move.target) == ("ns/1", "a", "b")


def test_shedding_ignores_bundles_the_high_broker_does_not_own():
    """Bundle rates in the high broker's report for a bundle it no longer owns (reports
    lag ownership) are never chosen, even when moving that bundle would even things out
    perfectly; the best bundle it does own moves."""
    reports = {"a": _report("a", rate_in=1000.0, rates={"ns/gone": 500.0, "ns/1": 100.0, "ns/2": 400.0}),
               "b": _report("b")}
    owners = {"ns/1": "a", "ns/2": "a", "ns/3": "a", "ns/gone": "b"}
    # a: 3/4 + 1.0, b: 1/4. Shares: ns/gone 0.75 (would leave 0), ns/2 0.65 (leaves 0.2).
    move = plan_shedding(reports, owners, threshold=0.1, cooling=set())
    assert move is not None and (move.bundle, move.source, move.target) == ("ns/2", "a", "b")
