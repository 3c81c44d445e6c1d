"""Topic compaction (Pulsar's): the latest value of every key, as a compacted view a
``read_compacted`` consumer reads up to the compaction horizon (the last entry when
compaction started), then the topic itself.

One pass over the topic from its first stored entry to the horizon: each message's key
is its partition key; a message with a null value (or an empty payload) is a
tombstone that drops its key; messages without a key are all kept (Pulsar leaves them
alone). Batches are split to find each message's key, and a batch of which only some
messages survive is kept with the bits of those (subscriptions/compacted_view.py).
Compressed or encrypted batches cannot be split: compaction fails with an error
status, and the previous view (if any) stays.

The result goes into the managed-ledger properties (``magnetar.compaction``); the
topic keeps its entries stored (retention counts the view's first entry as not
consumed). Status, as Pulsar's admin API reports it: NOT_RUN, RUNNING, SUCCESS, ERROR.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from common.errors import MagnetarError, PreconditionFailed
from common.position import Position
from protocol.batch import is_batch, parse_batch
from protocol.codec import decode_stored, stored_metadata
from subscriptions.compacted_view import ENTRIES_MAX, CompactedEntry, CompactedView

if TYPE_CHECKING:
    from broker.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)

COMPACTION_PROPERTY = "magnetar.compaction"
# Distinct keys one compaction tracks (each costs a dict slot; about 150 bytes).
KEYS_MAX = 1_000_000
_READ_ENTRIES = 500
_READ_BYTES = 8 * 1024 * 1024


async def compact(ledger: "ManagedLedger") -> CompactedView:
    horizon = ledger.last_confirmed
    latest: dict[str, tuple[Position, int]] = {}
    keyless: list[tuple[Position, int]] = []
    sizes: dict[Position, int] = {}
    position = ledger.first_position
    while horizon.entry_id >= 0 and position <= horizon:
        entries = await ledger.read(position, _READ_ENTRIES, _READ_BYTES)
        if not entries:
            break
        for entry in entries:
            if entry.position > horizon:
                break
            metadata = stored_metadata(entry.data)
            if is_batch(metadata):
                messages = parse_batch(metadata, decode_stored(entry.data).payload)
                sizes[entry.position] = len(messages)
                for message in messages:
                    single = message.metadata
                    key = single.partition_key if single.HasField("partition_key") else None
                    tombstone = single.null_value or len(message.payload) == 0
                    _note(latest, keyless, key, tombstone, entry.position, message.batch_index)
            else:
                payload = decode_stored(entry.data).payload
                key = metadata.partition_key if metadata.HasField("partition_key") else None
                tombstone = metadata.null_value or len(payload) == 0
                _note(latest, keyless, key, tombstone, entry.position, -1)
            if len(latest) > KEYS_MAX:
                raise PreconditionFailed(f"topic {ledger.name} has more than {KEYS_MAX} keys to compact")
        position = ledger.next_position(entries[-1].position)
    kept: dict[Position, int] = {}
    for entry_position, batch_index in list(latest.values()) + keyless:
        bits = kept.get(entry_position, 0)
        kept[entry_position] = bits | (1 << batch_index if batch_index >= 0 else 0)
    if len(kept) > ENTRIES_MAX:
        raise PreconditionFailed(f"the compacted view of {ledger.name} would name {len(kept)} entries, more than "
                                 f"{ENTRIES_MAX}")
    view_entries = []
    for entry_position in sorted(kept):
        size = sizes.get(entry_position, 0)
        bits = kept[entry_position]
        if size and bits == (1 << size) - 1:
            size, bits = 0, 0                   # every message of the batch survives
        view_entries.append(CompactedEntry(entry_position, size, bits))
    return CompactedView(horizon, view_entries)


def _note(latest: dict[str, tuple[Position, int]], keyless: list[tuple[Position, int]], key: str | None,
          tombstone: bool, position: Position, batch_index: int) -> None:
    if key is None:
        if not tombstone:
            keyless.append((position, batch_index))
        return
    if tombstone:
        latest.pop(key, None)
    else:
        latest.pop(key, None)            # re-insert: dict order is not used, value is
        latest[key] = (position, batch_index)


class TopicCompaction:
    """A topic's compaction state: the current view, and the status of the last run."""

    def __init__(self, ledger: "ManagedLedger") -> None:
        self._ledger = ledger
        self.status = "NOT_RUN"
        self.last_error = ""
        text = ledger.properties.get(COMPACTION_PROPERTY)
        self.view: CompactedView | None = None
        if text is not None:
            try:
                self.view = CompactedView.decode(text)
            except MagnetarError as error:
                log.warning("compacted view unreadable, ignored: topic=%s error=%s", ledger.name, error)

    async def run(self) -> None:
        """One compaction; the status says how it ended (errors are not raised)."""
        self.status, self.last_error = "RUNNING", ""
        try:
            view = await compact(self._ledger)
            await self._ledger.set_properties({COMPACTION_PROPERTY: view.encode()})
        except MagnetarError as error:
            self.status, self.last_error = "ERROR", error.message
            log.warning("compaction failed: topic=%s error=%s", self._ledger.name, error)
            return
        self.view = view
        self.status = "SUCCESS"
        log.info("topic compacted: topic=%s horizon=%s entries=%d", self._ledger.name, view.horizon,
                 len(view.entries))
