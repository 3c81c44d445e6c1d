"""Ensemble placement (ledger/placement.py) over BookieRecords (metadata/bookie_record.py).

What it proves: choose_ensemble returns E distinct bookies, never a read-only or an
excluded one, raises NotEnoughBookies (with needed/available) when too few remain, is
reproducible for a seed and independent of the order bookies are listed in, and
prefers bookies with more free space; choose_replacement never returns a member of
the ensemble. Also that BookieRecord and Cookie survive their JSON round trip and
reject bad JSON with MalformedFrame only.

How: many seeded generators over fixed bookie sets, plus tables of bad records.
"""

from __future__ import annotations

import collections
import random

import pytest

from common.errors import MalformedFrame, NotEnoughBookies
from ledger.placement import choose_ensemble, choose_replacement
from metadata.bookie_record import BookieRecord, Cookie

GIB = 1024**3


def _bookie(name: str, *, read_only: bool = False, free_bytes: int = 100 * GIB) -> BookieRecord:
    return BookieRecord(
        bookie_id=name, address=f"{name}:3181", http_address=f"{name}:8000", read_only=read_only,
        free_bytes=free_bytes, total_bytes=200 * GIB, disk_usage_ratio=0.5, version="test",
        started_at_ms=1_700_000_000_000,
    )


CLUSTER = ([_bookie(f"b{i}") for i in range(6)]
           + [_bookie("ro1", read_only=True), _bookie("ro2", read_only=True, free_bytes=10**15)])
WRITABLE = {f"b{i}" for i in range(6)}


@pytest.mark.parametrize("ensemble_size", [1, 2, 3, 5, 6])
def test_ensembles_are_distinct_writable_bookies(ensemble_size):
    """Over many seeds: the right size, no duplicates, no read-only bookie."""
    for seed in range(200):
        ensemble = choose_ensemble(CLUSTER, ensemble_size, random.Random(seed))
        assert len(ensemble) == ensemble_size
        assert len(set(ensemble)) == ensemble_size
        assert set(ensemble) <= WRITABLE


def test_excluded_bookies_are_never_chosen():
    """Bookies in ``exclude`` (e.g. ones that just failed) are skipped."""
    exclude = {"b0", "b3", "ro1"}
    for seed in range(200):
        ensemble = choose_ensemble(CLUSTER, 4, random.Random(seed), exclude=exclude)
        assert not set(ensemble) & exclude
        assert set(ensemble) <= WRITABLE


def test_exactly_enough_writable_bookies_are_all_chosen():
    """With E equal to the number of candidates, the ensemble is all of them."""
    ensemble = choose_ensemble(CLUSTER, 4, random.Random(1), exclude={"b4", "b5"})
    assert set(ensemble) == {"b0", "b1", "b2", "b3"}


@pytest.mark.parametrize("ensemble_size, exclude, available", [
    (7, set(), 6),                       # two read-only bookies do not count
    (3, {"b0", "b1", "b2", "b3"}, 2),
    (1, WRITABLE, 0),
])
def test_not_enough_bookies(ensemble_size, exclude, available):
    """Too few writable, non-excluded bookies raise NotEnoughBookies naming both counts."""
    with pytest.raises(NotEnoughBookies) as caught:
        choose_ensemble(CLUSTER, ensemble_size, random.Random(0), exclude=exclude)
    assert caught.value.needed == ensemble_size
    assert caught.value.available == available
    assert caught.value.retriable


def test_no_bookies_at_all():
    """An empty registry raises NotEnoughBookies, not an index error."""
    with pytest.raises(NotEnoughBookies):
        choose_ensemble([], 1, random.Random(0))


def test_same_seed_same_ensemble_whatever_the_listing_order():
    """The registry's listing order does not change the choice for a given seed."""
    for seed in range(50):
        shuffled = list(CLUSTER)
        random.Random(seed + 1000).shuffle(shuffled)
        assert choose_ensemble(CLUSTER, 3, random.Random(seed)) == choose_ensemble(
            shuffled, 3, random.Random(seed))


def test_free_space_weights_the_choice():
    """A bookie with far more free space is chosen far more often; a full one (free 0)
    is still chosen when it is needed."""
    bookies = [_bookie("roomy", free_bytes=10**12), _bookie("full", free_bytes=0),
               _bookie("middle", free_bytes=10**6)]
    counts = collections.Counter(choose_ensemble(bookies, 1, random.Random(seed))[0] for seed in range(2000))
    assert counts["roomy"] > 1900
    assert counts["roomy"] > counts["middle"] >= counts["full"]
    assert set(choose_ensemble(bookies, 3, random.Random(7))) == {"roomy", "full", "middle"}


def test_every_writable_bookie_is_eventually_chosen():
    """Equal free space: each writable bookie appears in some ensemble."""
    seen = set()
    for seed in range(200):
        seen.update(choose_ensemble(CLUSTER, 2, random.Random(seed)))
    assert seen == WRITABLE


def test_replacement_is_outside_the_ensemble():
    """choose_replacement skips the ensemble, the excluded and the read-only bookies."""
    ensemble = ("b0", "b1", "b2")
    for seed in range(200):
        replacement = choose_replacement(CLUSTER, ensemble, random.Random(seed), exclude={"b3"})
        assert replacement in {"b4", "b5"}


def test_no_replacement_left():
    """When every writable bookie is in the ensemble or excluded: NotEnoughBookies."""
    with pytest.raises(NotEnoughBookies):
        choose_replacement(CLUSTER, ("b0", "b1", "b2", "b3"), random.Random(0), exclude={"b4", "b5"})


# --- BookieRecord and Cookie -----------------------------------------------------------------

def test_bookie_record_round_trip():
    """A record decodes to an equal record; its JSON is stable (sorted keys)."""
    record = _bookie("b9", read_only=True, free_bytes=123)
    assert BookieRecord.decode(record.encode()) == record
    assert record.encode() == BookieRecord.decode(record.encode()).encode()


GOOD_RECORD = _bookie("b1").encode()


@pytest.mark.parametrize("data", [
    b"", b"{", b"\xff\xfe", b"null", b"[]", b"5", b'"text"', b"{}",
    GOOD_RECORD.replace(b'"address"', b'"addr"'),     # a missing field
])
def test_bad_bookie_records_are_malformed(data):
    """Undecodable or incomplete records raise MalformedFrame and nothing else."""
    with pytest.raises(MalformedFrame):
        BookieRecord.decode(data)


def test_cookie_round_trip_and_bad_input():
    """A cookie decodes to an equal cookie; bad input is MalformedFrame."""
    cookie = Cookie("b1", "instance-1", "/j", ["/d1", "/d2"])
    assert Cookie.decode(cookie.encode()) == cookie
    for data in (b"", b"[]", b"null", b'{"bookie_id": "b1"}'):
        with pytest.raises(MalformedFrame):
            Cookie.decode(data)
