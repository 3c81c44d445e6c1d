"""A topic's deduplication (the shell around broker/deduplication.py, kept for
``PersistentTopic``): following the namespace policy, restoring the last snapshot and
replaying the entries stored after it when it is turned on, counting each stored SEND,
and writing snapshots into the managed-ledger properties now and then and at close.
Retention keeps the entries after the last snapshot written (``snapshot_written``): a
new owner replays them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Protocol

from broker.deduplication import SNAPSHOT_PROPERTY, Deduplication, snapshot_position
from common.errors import MagnetarError
from common.position import Position
from protocol.codec import stored_metadata
from runtime.tasks import log_failure

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from managed_ledger.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)


class DeduplicatedTopic(Protocol):
    """What deduplication needs of its topic (``PersistentTopic``)."""

    full_name: str
    ledger: ManagedLedger
    config: BrokerConfig
    closing: bool

    def _check_open(self) -> None: ...


class TopicDeduplication:
    def __init__(self, topic: DeduplicatedTopic) -> None:
        self._topic = topic
        # Deduplication (broker/deduplication.py): None while the policy is off.
        self.dedup: Deduplication | None = None
        self._dedup_lock = asyncio.Lock()
        self._dedup_snapshot_task: asyncio.Task[None] | None = None
        # The position of the deduplication snapshot last written to the managed-ledger
        # properties (None: none), and when (monotonic): a new owner replays the entries
        # after it, so retention keeps them (trim_ledgers).
        self.snapshot_written: Position | None = self._stored_dedup_snapshot_position()
        self.snapshot_written_at = time.monotonic()

    async def set_deduplication(self, enabled: bool) -> None:
        """Follows the namespace policy. Turning it on restores the last snapshot and
        replays the entries stored after it (or, with no snapshot, starts from the
        end of the topic and records that)."""
        if enabled == (self.dedup is not None) and (enabled or self.snapshot_written is None):
            return
        async with self._dedup_lock:
            if not enabled:
                if self.dedup is not None or SNAPSHOT_PROPERTY in self._topic.ledger.properties:
                    # Off: the snapshot goes, and with it what retention kept for it.
                    self.dedup = None
                    await self._topic.ledger.set_properties({SNAPSHOT_PROPERTY: None})
                    log.info("deduplication disabled: topic=%s", self._topic.full_name)
                self.snapshot_written = None
                return
            if self.dedup is not None:
                return
            dedup = Deduplication()
            snapshot = self._topic.ledger.properties.get(SNAPSHOT_PROPERTY)
            if snapshot is None:
                await self._topic.ledger.set_properties(
                    {SNAPSHOT_PROPERTY: dedup.take_snapshot(self._topic.ledger.last_confirmed)})
                replayed = 0
            else:
                dedup.restore(snapshot)
                replayed = await self._replay_for_deduplication(dedup)
            self._dedup_written(dedup.snapshot_position)
            self._topic._check_open()
            self.dedup = dedup
            log.info("deduplication enabled: topic=%s producers=%d replayed_entries=%d", self._topic.full_name,
                     len(dedup.persisted), replayed)

    async def _replay_for_deduplication(self, dedup: Deduplication) -> int:
        """Reads the entries after the snapshot's position: each names its producer and
        sequence ids. At most about SNAPSHOT_INTERVAL_ENTRIES after a crash."""
        ledger = self._topic.ledger
        position = ledger.next_position(dedup.snapshot_position) if dedup.snapshot_position.entry_id >= 0 \
            else ledger.normalize(Position(dedup.snapshot_position.ledger_id, 0))
        if position < ledger.first_position:
            position = ledger.first_position
        end = ledger.last_confirmed
        count = 0
        while position <= end:
            entries = await ledger.read(position, 500, self._topic.config.dispatch_bytes_max)
            if not entries:
                break
            for entry in entries:
                if entry.position > end:
                    break
                metadata = stored_metadata(entry.data)
                dedup.replay(metadata.producer_name, metadata.sequence_id, metadata.highest_sequence_id,
                             entry.position)
                count += 1
            position = ledger.next_position(entries[-1].position)
        return count

    def on_stored(self, producer_name: str, sequence_id: int, highest_sequence_id: int, position: Position) -> None:
        """A SEND's entry is stored (called in entry order): deduplication counts it
        and writes a snapshot now and then."""
        dedup = self.dedup
        if dedup is None:
            return
        dedup.on_stored(producer_name, sequence_id, highest_sequence_id, position)
        if dedup.snapshot_due():
            self.start_snapshot(dedup)

    def start_snapshot(self, dedup: Deduplication) -> None:
        """Writes a snapshot of what is stored so far, unless one is being written."""
        if self._dedup_snapshot_task is not None or self._topic.closing:
            return
        position = dedup.last_stored
        snapshot = dedup.take_snapshot(position)
        task = asyncio.get_running_loop().create_task(self._write_dedup_snapshot(snapshot, position))
        self._dedup_snapshot_task = task
        task.add_done_callback(functools.partial(log_failure, owner=f"topic {self._topic.full_name}"))

    async def _write_dedup_snapshot(self, snapshot: str, position: Position) -> None:
        try:
            await self._topic.ledger.set_properties({SNAPSHOT_PROPERTY: snapshot})
            self._dedup_written(position)
        except MagnetarError as error:
            # The next snapshot (or the replay of a longer tail) covers it.
            log.warning("deduplication snapshot not written: topic=%s error=%s", self._topic.full_name, error)
        finally:
            self._dedup_snapshot_task = None

    def _stored_dedup_snapshot_position(self) -> Position | None:
        """The position of the deduplication snapshot in the managed-ledger properties
        (None: none, or unreadable): retention keeps what comes after it from the
        moment the topic loads, deduplication on in memory or not yet (it is turned on
        by the first producer; replaying then needs those entries)."""
        text = self._topic.ledger.properties.get(SNAPSHOT_PROPERTY)
        if text is None:
            return None
        try:
            return snapshot_position(text)
        except MagnetarError as error:
            log.warning("deduplication snapshot unreadable, retention keeps nothing for it: topic=%s error=%s",
                        self._topic.full_name, error)
            return None

    def _dedup_written(self, position: Position) -> None:
        self.snapshot_written = position
        self.snapshot_written_at = time.monotonic()

    async def final_snapshot(self) -> None:
        """On close, after the last append: a new owner then has nothing to replay."""
        dedup = self.dedup
        if dedup is None or self._topic.ledger.fenced_error is not None:
            return
        if self._dedup_snapshot_task is not None:
            await asyncio.gather(self._dedup_snapshot_task, return_exceptions=True)
        if dedup.snapshot_position == self._topic.ledger.last_confirmed:
            return
        position = self._topic.ledger.last_confirmed
        try:
            await self._topic.ledger.set_properties({SNAPSHOT_PROPERTY: dedup.take_snapshot(position)})
            self._dedup_written(position)
        except MagnetarError as error:
            log.warning("deduplication snapshot not written at close: topic=%s error=%s", self._topic.full_name, error)
