"""Disk usage of a bookie's journal and ledger directories, and the read-only decision.

``decide_read_only`` is the pure rule: turn read-only when any directory's filesystem is
past ``usage_threshold``; turn writable again only when every one is below the low
water mark, so a bookie near the line does not flap. ``check`` adds the republish
policy: a read-only flip is published in the bookie's registration at once, free space
only when it moved by more than 1% of the disk since the record last written, so an idle
cluster does not write etcd every tick. ``measure`` does the IO.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass


@dataclass(frozen=True)
class DiskUsage:
    total_bytes: int
    free_bytes: int
    # The highest used share among the bookie's directories' filesystems.
    ratio: float
    worst_directory: str
    # Each directory's own (used share of its filesystem, free bytes), in the order given.
    directories: tuple[tuple[str, float, int], ...] = ()


def decide_read_only(currently_read_only: bool, ratio: float, threshold: float, lwm_threshold: float) -> bool:
    assert 0 < lwm_threshold <= threshold <= 1
    if ratio >= threshold:
        return True
    if currently_read_only and ratio >= lwm_threshold:
        return True
    return False


@dataclass(frozen=True)
class DiskCheck:
    """What one disk check decided."""

    read_only: bool     # the decision now
    flipped: bool       # it differs from the bookie's state before the check
    republish: bool     # the registration record should be written again


def check(usage: DiskUsage, currently_read_only: bool, published_free_bytes: int | None, threshold: float,
          lwm_threshold: float) -> DiskCheck:
    """The read-only decision for ``usage`` and whether to republish the registration
    (``published_free_bytes``: the free space of the record last written, None if
    none was)."""
    read_only = decide_read_only(currently_read_only, usage.ratio, threshold, lwm_threshold)
    flipped = read_only != currently_read_only
    moved = published_free_bytes is None or abs(published_free_bytes - usage.free_bytes) > usage.total_bytes // 100
    return DiskCheck(read_only=read_only, flipped=flipped, republish=flipped or moved)


def _device_of(directory: str) -> int:
    return os.stat(directory).st_dev


def measure(directories: list[str]) -> DiskUsage:
    """Blocking (statvfs per directory); call from a thread."""
    assert directories
    worst_ratio = -1.0
    worst = directories[0]
    total_free = 0
    total_size = 0
    seen_devices: set[int] = set()
    each: list[tuple[str, float, int]] = []
    for directory in directories:
        usage = shutil.disk_usage(directory)
        ratio = (usage.total - usage.free) / usage.total if usage.total else 1.0
        each.append((directory, ratio, usage.free))
        if ratio > worst_ratio:
            worst_ratio, worst = ratio, directory
        device = _device_of(directory)
        if device not in seen_devices:  # count a filesystem shared by several dirs once
            seen_devices.add(device)
            total_free += usage.free
            total_size += usage.total
    return DiskUsage(total_bytes=total_size, free_bytes=total_free, ratio=worst_ratio, worst_directory=worst,
                     directories=tuple(each))
