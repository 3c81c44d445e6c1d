"""Bookies this ledger client saw fail an add lately, chosen last for new ensembles
and replacements (BookKeeper quarantines a failing bookie for the same reason,
``bookieQuarantineTimeSeconds``).

Why: a bookie cut from this client but not from etcd (or paused, until its registration
lapses) is still registered and writable. A ledger created meanwhile (a managed ledger's
rollover, a cursor's ledger) or a replacement chosen for another failure may pick it,
and its adds wait a whole add timeout more before the next ensemble change. While other
bookies are enough, a quarantined one is not chosen; when they are not, it is (the
quarantine prefers, it never refuses). Entries and their durability are untouched: this
only orders the choice of bookies.

Bounded: one entry per bookie id, forgotten ``hold_s`` after its last failure, and at
most ``SIZE_MAX`` of them (the oldest go first).
"""

from __future__ import annotations

import time
from typing import Callable

SIZE_MAX = 1024


class BookieQuarantine:
    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._hold_s = hold_s
        self._clock = clock
        self._failed_at: dict[str, float] = {}   # in order of the last failure

    def add(self, bookie_id: str) -> None:
        if self._hold_s <= 0:
            return
        self._failed_at.pop(bookie_id, None)
        self._failed_at[bookie_id] = self._clock()
        while len(self._failed_at) > SIZE_MAX:
            del self._failed_at[next(iter(self._failed_at))]

    def members(self) -> frozenset[str]:
        """The bookies that failed within the last ``hold_s``."""
        if not self._failed_at:
            return frozenset()
        oldest_kept = self._clock() - self._hold_s
        while self._failed_at:
            bookie_id, failed_at = next(iter(self._failed_at.items()))
            if failed_at > oldest_kept:
                break
            del self._failed_at[bookie_id]
        return frozenset(self._failed_at)
