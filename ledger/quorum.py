"""Quorum arithmetic for striped ledgers. Pure.

- Entry ``n`` is written to the write set ``[(n + i) % E for i in range(Qw)]``
  (bookie indices in the fragment's ensemble), so consecutive entries rotate over the
  ensemble and each bookie holds Qw/E of them.
- ``AckTracker`` records which indices acknowledged which pending entries and says
  which entries have completed, strictly in entry order: an entry completes once Qa of
  its write set acknowledged it *and* every earlier entry completed. That ordering is
  what makes last_add_confirmed a single number that only moves forward.
- An entry that was acknowledged by Qa bookies is missing from at most Qw - Qa of its
  write set. So once ``Qw - Qa + 1`` bookies of every write set have been fenced (or
  have answered "no such entry"), no further entry can complete (or that entry cannot
  have been acknowledged). ``covers_every_write_set`` checks that condition, the one
  ledger recovery relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> list[int]:
    assert entry_id >= 0
    assert 1 <= write_quorum_size <= ensemble_size
    return [(entry_id + i) % ensemble_size for i in range(write_quorum_size)]


def covers_write_set(responded: set[int], members: list[int], write_quorum_size: int, ack_quorum_size: int) -> bool:
    """True when at least Qw - Qa + 1 of the write set are in ``responded``."""
    needed = write_quorum_size - ack_quorum_size + 1
    return sum(1 for index in members if index in responded) >= needed


def covers_every_write_set(responded: set[int], ensemble_size: int, write_quorum_size: int,
                           ack_quorum_size: int) -> bool:
    """True when ``responded`` covers every write set of the ensemble (there are E
    distinct write sets, one per starting index)."""
    return all(
        covers_write_set(responded, write_set(start, ensemble_size, write_quorum_size),
                         write_quorum_size, ack_quorum_size)
        for start in range(ensemble_size)
    )


@dataclass
class _Pending:
    acked: set[int] = field(default_factory=set)


class AckTracker:
    """Acknowledgements of pending entries, completed in entry order."""

    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                 last_add_confirmed: int = -1) -> None:
        assert ensemble_size >= write_quorum_size >= ack_quorum_size >= 1
        self.ensemble_size = ensemble_size
        self.write_quorum_size = write_quorum_size
        self.ack_quorum_size = ack_quorum_size
        self.last_add_confirmed = last_add_confirmed
        self._pending: dict[int, _Pending] = {}
        self._next_entry_id = last_add_confirmed + 1

    def add(self, entry_id: int) -> None:
        assert entry_id == self._next_entry_id, (entry_id, self._next_entry_id)
        self._pending[entry_id] = _Pending()
        self._next_entry_id += 1

    def write_set(self, entry_id: int) -> list[int]:
        return write_set(entry_id, self.ensemble_size, self.write_quorum_size)

    def ack(self, entry_id: int, index: int) -> None:
        pending = self._pending.get(entry_id)
        if pending is None:
            return  # already completed (a late or duplicate acknowledgement)
        assert index in self.write_set(entry_id), (entry_id, index)
        pending.acked.add(index)

    def unack(self, entry_id: int, index: int) -> None:
        pending = self._pending.get(entry_id)
        if pending is not None:
            pending.acked.discard(index)

    def acked_by(self, entry_id: int) -> set[int]:
        pending = self._pending.get(entry_id)
        return set(pending.acked) if pending is not None else set()

    def complete(self, limit_entry_id: int | None = None) -> list[int]:
        """Pops and returns the entries that completed, in order. Entries at or past
        ``limit_entry_id`` are held back (an ensemble change is being recorded)."""
        done: list[int] = []
        while True:
            entry_id = self.last_add_confirmed + 1
            if limit_entry_id is not None and entry_id >= limit_entry_id:
                break
            pending = self._pending.get(entry_id)
            if pending is None or len(pending.acked) < self.ack_quorum_size:
                break
            del self._pending[entry_id]
            self.last_add_confirmed = entry_id
            done.append(entry_id)
        return done

    def pending_ids(self) -> list[int]:
        return sorted(self._pending)

    def __len__(self) -> int:
        return len(self._pending)
