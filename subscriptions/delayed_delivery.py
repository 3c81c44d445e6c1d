"""The delayed-delivery tracker of a shared or key-shared subscription: the entries
read from the topic whose ``deliver_at_time`` has not come yet, and when each is due.

Pure core: no clock reads, no asyncio; the dispatcher passes the wall-clock time in
milliseconds (``deliver_at_time`` is an epoch time set by the producer).

Theory of operation:
- Nothing here is persisted. The entries it holds are not acknowledged, so the cursor's
  mark-delete position stays before them; after a broker restart or an ownership move
  the dispatcher reads again from the mark-delete position and every delayed entry not
  yet delivered is tracked anew. That is the whole recovery story, and why the tracker
  may drop everything on a cursor reset (a seek): what follows the new position is read
  again.
- Memory: entries are kept in time buckets, each an ``array('q')`` of
  (deliver_at_ms, ledger_id, entry_id) triples, 24 bytes per entry. A bucket's width
  grows with how far ahead its entries are due (1 s within the next hour, 1 min within
  the next day, 1 h beyond), so the number of buckets is bounded by about
  3,600 + 1,440 + the hours ahead of the farthest entry, whatever the entry count.
  When a bucket's start time has passed, its entries that are due are released and the
  others are put again into (narrower) buckets measured from now: each entry moves at
  most twice. An entry is never released before its time.
- Bounded: at ``entries_max`` entries ``full`` is True and the dispatcher stops
  reading new entries of the topic until some are released (backpressure on the
  subscription, not loss).
"""

from __future__ import annotations

import heapq
from array import array

# Bucket widths by how far ahead an entry is due: (due within, bucket width), in ms.
_TIERS_MS = ((3_600_000, 1_000), (86_400_000, 60_000))
_FAR_WIDTH_MS = 3_600_000
_TRIPLE = 3


def _bucket_start(deliver_at_ms: int, now_ms: int) -> int:
    ahead = deliver_at_ms - now_ms
    width = _FAR_WIDTH_MS
    for within, tier_width in _TIERS_MS:
        if ahead <= within:
            width = tier_width
            break
    return deliver_at_ms - deliver_at_ms % width


class DelayedDeliveryTracker:
    def __init__(self, entries_max: int) -> None:
        assert entries_max > 0
        self.entries_max = entries_max
        self._buckets: dict[int, array] = {}
        self._starts: list[int] = []      # heap of the bucket start times
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def full(self) -> bool:
        return self._count >= self.entries_max

    @property
    def bucket_count(self) -> int:
        return len(self._buckets)

    def add(self, deliver_at_ms: int, ledger_id: int, entry_id: int, now_ms: int) -> None:
        """Tracks an entry due at ``deliver_at_ms`` (the caller checked ``full``)."""
        assert self._count < self.entries_max, "add to a full delayed-delivery tracker"
        self._put(deliver_at_ms, ledger_id, entry_id, now_ms)
        self._count += 1

    def _put(self, deliver_at_ms: int, ledger_id: int, entry_id: int, now_ms: int) -> None:
        start = _bucket_start(deliver_at_ms, now_ms)
        if start <= now_ms < deliver_at_ms:
            # Due within the bucket already open: a bucket of its own exact time (it
            # must not be opened again before then, or pop_due would spin).
            start = deliver_at_ms
        bucket = self._buckets.get(start)
        if bucket is None:
            bucket = self._buckets[start] = array("q")
            heapq.heappush(self._starts, start)
        bucket.extend((deliver_at_ms, ledger_id, entry_id))

    def next_due_ms(self) -> int | None:
        """No later than the earliest due time held (None: nothing held)."""
        return self._starts[0] if self._starts else None

    def pop_due(self, now_ms: int, count_max: int) -> list[tuple[int, int]]:
        """Up to ``count_max`` (ledger_id, entry_id) due at or before ``now_ms``, in no
        particular order; the others stay."""
        released: list[tuple[int, int]] = []
        while self._starts and self._starts[0] <= now_ms and len(released) < count_max:
            start = heapq.heappop(self._starts)
            bucket = self._buckets.pop(start)
            keep = array("q")
            for index in range(0, len(bucket), _TRIPLE):
                deliver_at_ms, ledger_id, entry_id = bucket[index:index + _TRIPLE]
                if deliver_at_ms <= now_ms and len(released) < count_max:
                    released.append((ledger_id, entry_id))
                else:
                    keep.extend((deliver_at_ms, ledger_id, entry_id))
            for index in range(0, len(keep), _TRIPLE):
                deliver_at_ms, ledger_id, entry_id = keep[index:index + _TRIPLE]
                # Due later than now, or left over by count_max: its new bucket starts
                # no earlier than this one did, and never after its due time.
                self._put(deliver_at_ms, ledger_id, entry_id, now_ms)
        self._count -= len(released)
        assert self._count >= 0
        return released

    def clear(self) -> None:
        self._buckets.clear()
        self._starts.clear()
        self._count = 0

    def memory_bytes(self) -> int:
        """About how many bytes the buckets take (array payloads plus per-bucket
        overhead of the array object, its dict slot and heap slot)."""
        return sum(bucket.buffer_info()[1] * bucket.itemsize + 64 + 100 + 8 for bucket in self._buckets.values())
