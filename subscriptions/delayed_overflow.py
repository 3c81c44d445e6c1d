"""The overflow of a full delayed-delivery tracker: a range of topic positions whose
delayed entries are not held in memory but read again from the topic later. Pure.

Theory of operation:
- While the tracker (``delayed_delivery.py``) has room, every delayed entry read is
  held there. The first delayed entry read when it is full *opens* the overflow at its
  position. From then on, until the overflow is drained, **every** entry read that
  carries a ``deliver_at_time`` — due or not — extends the overflow instead of being
  tracked or sent; entries without one are dispatched as usual. So the invariant is
  simple: in ``[start, end]`` an unacknowledged entry with a ``deliver_at_time`` has been
  neither tracked nor sent. Nothing else is remembered per entry: the memory is the
  same for ten entries or ten million.
- Draining (the dispatcher's rescan) reads the topic from ``start``, in order: a due
  entry goes to the replay set, one not yet due to the tracker while it has room;
  entries without a ``deliver_at_time``, acknowledged or already dispatched are passed
  over. It stops at the first entry it cannot take, and ``start`` moves there; past
  ``end`` the overflow closes and the tracker takes delayed entries again.
- When: a rescan runs once the tracker is down to half its capacity, or when the
  earliest due time seen in the overflow has come (known until a rescan stops part way
  — then unknown, and only room in the tracker triggers the next one). Entries of the
  overflow due earlier than the tracker's own can therefore be late while both are
  full; the tracker's capacity (1,000,000 by default) makes that the exception.
- Like the tracker, nothing is persisted: the entries stay unacknowledged, and after a
  restart the dispatcher reads them again from the mark-delete position.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.position import Position


@dataclass
class DelayedOverflow:
    start: Position              # the first position not yet drained
    end: Position                # the last position read into the overflow
    due_min_ms: int | None       # the earliest due time in it, when known
    entries: int = 0             # delayed entries put in (and not yet taken out): for stats

    def extend(self, position: Position, deliver_at_ms: int) -> None:
        assert position > self.end, (position, self.end)
        self.end = position
        self.entries += 1
        if self.due_min_ms is not None:
            self.due_min_ms = min(self.due_min_ms, deliver_at_ms)

    def rescan_due(self, tracker_count: int, tracker_entries_max: int, now_ms: int) -> bool:
        """Whether the dispatcher should drain some of it now."""
        if tracker_count <= tracker_entries_max // 2:
            return True
        return self.due_min_ms is not None and self.due_min_ms <= now_ms

    def drained_to(self, position: Position, taken: int, *, stopped: bool) -> None:
        """A rescan took ``taken`` entries and got as far as ``position`` (the first it
        did not take); when it ``stopped`` before ``end`` the earliest due time of the
        rest is unknown."""
        assert position >= self.start, (position, self.start)
        self.start = position
        self.entries = max(0, self.entries - taken)
        if stopped:
            self.due_min_ms = None

    @property
    def drained(self) -> bool:
        return self.start > self.end
