"""Message deduplication of one topic (the namespace policy ``deduplication``), as
Pulsar does it: per producer name, the highest sequence id stored; a SEND whose
sequence id is not above it is a duplicate, acknowledged without being stored.

Pure core: no IO, no clock. The topic feeds it and persists its snapshots.

Theory of operation:
- Two maps per producer name: ``pushed`` (the highest sequence id handed to the
  managed ledger) and ``persisted`` (the highest whose entry is stored: its receipt
  went out). A SEND with ``sequence_id <= persisted`` is a duplicate of a stored
  message: it gets a receipt with message id (-1, -1) and is not stored. One with
  ``persisted < sequence_id <= pushed`` duplicates a message still being written: its
  fate is not known yet, so it is refused (the client reconnects and resends, and by
  then it is settled). A batch counts by its lowest sequence id and advances the maps
  to its highest.
- When a store fails, ``pushed`` falls back to ``persisted`` for that producer: the
  client resends what failed. A resend of something still in flight on an old
  connection (the producer reconnected meanwhile) is refused until it settles, so it
  can be neither lost nor stored twice.
- Durability: a snapshot (the ``persisted`` map and the position of the last entry it
  covers) is written into the managed-ledger properties every
  ``SNAPSHOT_INTERVAL_ENTRIES`` stored entries, when entries are stored and the last
  snapshot is ``SNAPSHOT_INTERVAL_S`` old (a quiet topic), and when the topic closes. A new owner
  (after a restart, a crash or a move) loads the snapshot and replays the entries
  after its position — each stored entry's metadata names its producer and sequence
  ids — so the maps are exact again, however the previous owner ended. Retention
  therefore keeps the entries after the last snapshot written (as Pulsar's
  deduplication cursor does): deleted, a crash would replay less than was stored and
  take resends of it for new messages.
- Bounded: at most ``PRODUCERS_MAX`` producer names are remembered; the least recently
  used is forgotten first (Pulsar's brokerDeduplicationMaxNumberOfProducers is
  10,000 too).
"""

from __future__ import annotations

import collections
import enum
import json

from common.errors import MalformedFrame
from common.position import Position

PRODUCERS_MAX = 10_000
# Entries stored between snapshots: a new owner replays at most about this many.
SNAPSHOT_INTERVAL_ENTRIES = 1000
# A topic that stored entries since its last snapshot writes one at least this often
# (Pulsar's brokerDeduplicationSnapshotIntervalSeconds is 120 too): retention keeps the
# entries after the last snapshot, so a quiet topic's snapshot must move on by time.
SNAPSHOT_INTERVAL_S = 120.0
SNAPSHOT_PROPERTY = "magnetar.dedup.snapshot"
SNAPSHOT_FORMAT_VERSION = 1


class Verdict(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"          # stored already: acknowledge, do not store
    IN_FLIGHT = "in-flight"          # being stored: outcome unknown, refuse


class Deduplication:
    def __init__(self, producers_max: int = PRODUCERS_MAX) -> None:
        assert producers_max > 0
        self._producers_max = producers_max
        self.pushed: dict[str, int] = {}
        self.persisted: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.snapshot_position = Position(-1, -1)
        self.entries_since_snapshot = 0
        # The position of the last entry counted (on_stored or replay): what a snapshot
        # taken now covers.
        self.last_stored = Position(-1, -1)
        self.duplicates = 0

    def check(self, producer: str, sequence_id: int, highest_sequence_id: int) -> Verdict:
        """Classifies a SEND; a NEW one is counted as pushed."""
        if sequence_id <= self.persisted.get(producer, -1):
            self.duplicates += 1
            return Verdict.DUPLICATE
        if sequence_id <= self.pushed.get(producer, -1):
            return Verdict.IN_FLIGHT
        self.pushed[producer] = max(sequence_id, highest_sequence_id)
        return Verdict.NEW

    def on_stored(self, producer: str, sequence_id: int, highest_sequence_id: int, position: Position) -> None:
        """An entry of ``producer`` is stored at ``position`` (called in entry order)."""
        top = max(sequence_id, highest_sequence_id)
        persisted = self.persisted
        if top > persisted.get(producer, -1):
            persisted[producer] = top
        persisted.move_to_end(producer)
        while len(persisted) > self._producers_max:
            forgotten, _ = persisted.popitem(last=False)
            self.pushed.pop(forgotten, None)
        self.entries_since_snapshot += 1
        self.last_stored = position

    def on_store_failed(self, producer: str) -> None:
        """An entry of ``producer`` was not stored: what was pushed after the last
        stored one is unknown again (the client resends it)."""
        if producer in self.persisted:
            self.pushed[producer] = self.persisted[producer]
        else:
            self.pushed.pop(producer, None)

    def last_sequence_id(self, producer: str) -> int:
        return self.persisted.get(producer, -1)

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot_due(self) -> bool:
        return self.entries_since_snapshot >= SNAPSHOT_INTERVAL_ENTRIES

    def snapshot_stale(self, seconds_since_snapshot: float) -> bool:
        """True when entries were stored since the last snapshot and it is
        ``SNAPSHOT_INTERVAL_S`` old: time for one, however few the entries."""
        return self.entries_since_snapshot > 0 and seconds_since_snapshot >= SNAPSHOT_INTERVAL_S

    def take_snapshot(self, position: Position) -> str:
        """The snapshot as of ``position`` (every entry up to it is counted)."""
        self.snapshot_position = position
        self.entries_since_snapshot = 0
        return json.dumps({"format_version": SNAPSHOT_FORMAT_VERSION, "position": list(position),
                           "producers": dict(self.persisted)}, separators=(",", ":"))

    def restore(self, snapshot: str) -> None:
        position, producers = _parse_snapshot(snapshot)
        self.persisted = collections.OrderedDict(producers)
        self.pushed = dict(producers)
        self.snapshot_position = position
        self.last_stored = position
        self.entries_since_snapshot = 0

    def replay(self, producer: str, sequence_id: int, highest_sequence_id: int, position: Position) -> None:
        """An entry stored after the snapshot, read back when the topic loads."""
        self.on_stored(producer, sequence_id, highest_sequence_id, position)
        self.pushed[producer] = self.persisted[producer]


def snapshot_position(snapshot: str) -> Position:
    """The position a snapshot covers up to (MalformedFrame if it is not one)."""
    return _parse_snapshot(snapshot)[0]


def _parse_snapshot(snapshot: str) -> tuple[Position, dict[str, int]]:
    try:
        doc = json.loads(snapshot)
        if doc.get("format_version", 0) > SNAPSHOT_FORMAT_VERSION:
            raise ValueError("unknown format")
        position = Position(int(doc["position"][0]), int(doc["position"][1]))
        producers = {str(name): int(value) for name, value in doc["producers"].items()}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        raise MalformedFrame(f"bad deduplication snapshot: {error}") from None
    return position, producers
