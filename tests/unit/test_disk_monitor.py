"""The read-only decision (bookie/disk_monitor.py).

What it proves: decide_read_only turns read-only at or above the threshold, stays
read-only until usage drops below the low water mark (hysteresis, so a bookie near the
line does not flap), and a writable bookie between the two marks stays writable;
measure() reports the worst directory's ratio and counts a shared filesystem once;
check() republishes the registration on a flip at once, and on free space only when it
moved by more than 1% of the disk (or nothing was published yet).

How: a table of (currently_read_only, ratio) -> decision, a usage trace walked through
the rule, and measure() over a stubbed shutil.disk_usage (no real disk numbers, which
change under the test).
"""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

from bookie import disk_monitor
from bookie.disk_monitor import decide_read_only

THRESHOLD = 0.95
LWM = 0.90


@pytest.mark.parametrize("currently_read_only, ratio, expected", [
    (False, 0.0, False),
    (False, 0.89, False),
    (False, 0.90, False),     # between the marks a writable bookie stays writable
    (False, 0.949, False),
    (False, 0.95, True),      # at the threshold
    (False, 1.0, True),
    (True, 1.0, True),
    (True, 0.95, True),
    (True, 0.92, True),       # between the marks a read-only bookie stays read-only
    (True, 0.90, True),       # at the low water mark: not yet below it
    (True, 0.8999, False),
    (True, 0.0, False),
])
def test_decision_table(currently_read_only, ratio, expected):
    """Each (state, usage) pair gives the documented decision."""
    assert decide_read_only(currently_read_only, ratio, THRESHOLD, LWM) is expected


def test_hysteresis_over_a_usage_trace():
    """Usage rising and falling around the marks flips the state only at the marks."""
    trace = [(0.50, False), (0.92, False), (0.96, True), (0.93, True), (0.91, True),
             (0.90, True), (0.89, False), (0.93, False), (0.95, True), (0.10, False)]
    read_only = False
    for ratio, expected in trace:
        read_only = decide_read_only(read_only, ratio, THRESHOLD, LWM)
        assert read_only is expected, ratio


def test_equal_marks_mean_no_band():
    """With lwm == threshold the bookie is read-only exactly at or above it."""
    assert decide_read_only(True, 0.949, 0.95, 0.95) is False
    assert decide_read_only(False, 0.95, 0.95, 0.95) is True


@pytest.mark.parametrize("threshold, lwm", [(0.9, 0.95), (0.9, 0.0), (1.1, 0.9), (0.0, 0.0)])
def test_inconsistent_marks_are_programmer_errors(threshold, lwm):
    """DiskConfig validates the marks; reaching here with bad ones is a bug."""
    with pytest.raises(AssertionError):
        decide_read_only(False, 0.5, threshold, lwm)


Usage = namedtuple("Usage", "total used free")


def test_measure_reports_the_worst_directory(monkeypatch):
    """The ratio is the highest used share; free and total add up distinct filesystems."""
    usages = {"/a": Usage(1000, 500, 500), "/b": Usage(2000, 1900, 100), "/c": Usage(4000, 1000, 3000)}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usages[path])
    monkeypatch.setattr(disk_monitor, "_device_of", lambda path: hash(path))
    usage = disk_monitor.measure(["/a", "/b", "/c"])
    assert usage.ratio == pytest.approx(0.95)
    assert usage.worst_directory == "/b"
    assert usage.total_bytes == 7000
    assert usage.free_bytes == 3600


def test_measure_counts_a_shared_filesystem_once(monkeypatch):
    """Journal and ledger dirs on one disk do not double its size."""
    shared = Usage(1000, 250, 750)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shared)
    monkeypatch.setattr(disk_monitor, "_device_of", lambda path: 42)
    usage = disk_monitor.measure(["/journal", "/ledgers"])
    assert (usage.total_bytes, usage.free_bytes) == (1000, 750)
    assert usage.ratio == pytest.approx(0.25)
    assert usage.worst_directory == "/journal"


def test_measure_treats_an_empty_filesystem_as_full(monkeypatch):
    """A filesystem reporting 0 total bytes counts as full (never divide by zero)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, 0))
    monkeypatch.setattr(disk_monitor, "_device_of", lambda path: 1)
    assert disk_monitor.measure(["/x"]).ratio == 1.0


def test_measure_on_a_real_directory(tmp_path):
    """On a real directory the numbers are consistent (0 <= ratio <= 1, free <= total)."""
    usage = disk_monitor.measure([str(tmp_path)])
    assert 0.0 <= usage.ratio <= 1.0
    assert 0 <= usage.free_bytes <= usage.total_bytes
    assert usage.worst_directory == str(tmp_path)


GIB = 1024**3


@pytest.mark.parametrize("read_only, ratio, published_free, free, expected", [
    # (bookie read-only now, usage ratio, free bytes last published, free bytes now,
    #  (read_only, flipped, republish))
    (False, 0.50, None, 50 * GIB, (False, False, True)),         # nothing published yet
    (False, 0.50, 50 * GIB, 50 * GIB, (False, False, False)),    # idle: no etcd write
    (False, 0.50, 50 * GIB, 49 * GIB, (False, False, False)),    # moved exactly 1%: not more
    (False, 0.50, 50 * GIB, 48 * GIB, (False, False, True)),     # moved more than 1%
    (False, 0.96, 4 * GIB, 4 * GIB, (True, True, True)),         # a flip is published at once
    (True, 0.92, 8 * GIB, 8 * GIB, (True, False, False)),        # inside the band: no flap
    (True, 0.80, 20 * GIB, 20 * GIB, (False, True, True)),       # writable again
])
def test_check_republishes_flips_at_once_and_free_space_past_one_percent(read_only, ratio, published_free, free,
                                                                         expected):
    usage = disk_monitor.DiskUsage(total_bytes=100 * GIB, free_bytes=free, ratio=ratio, worst_directory="/d")
    checked = disk_monitor.check(usage, read_only, published_free, THRESHOLD, LWM)
    assert (checked.read_only, checked.flipped, checked.republish) == expected
