"""Topic compaction (Pulsar's): a compactor writes a *compacted ledger* holding the
latest value of every key up to the compaction horizon; a ``read_compacted`` consumer
reads that ledger up to the horizon, then the topic itself.

What survives: each message's key is its partition key; a message with a null value
(or an empty payload) is a tombstone that drops its key; messages without a key are
all kept (Pulsar leaves them alone). Batches are split to find each message's key; a
batch of which only some messages survive is copied whole with the bits of its
survivors (``managed_ledger/compacted_ledger.py``). A compressed batch or message is
decompressed to find its keys (the copy stays as stored: the consumer decompresses it
and skips what its ack set marks, as from Pulsar's compactor); an encrypted batch cannot
be split: the run fails with status ERROR and the previous compaction stays.

Two passes over the input, with bounded memory whatever the number of keys:
1. Phase one reads the input in topic order and notes, per key, the position of its
   latest value (a tombstone deletes the key) in a temporary SQLite table
   (``managed_ledger/compaction_keys.py``: an 8 MiB page cache, the rest on disk).
2. Phase two reads the input again and copies into a new ledger every entry holding
   some key's latest value or a keyless message, asking the table entry range by
   entry range; then closes the ledger.
The input is the previous compacted ledger (so keys whose topic entries retention has
since deleted are not lost) followed by the topic's entries after the previous
horizon, up to the new horizon (the last entry confirmed when the run started).

Commit: the record (ledger id, horizon, entry count) goes into the managed-ledger
properties (``magnetar.compaction``) by compare-and-swap; only then is the previous
compacted ledger deleted. A run that fails deletes the ledger it was writing; a broker
that dies mid-run leaves that ledger behind (named in its metadata: ``purpose``
``compacted`` and the topic) — never a record pointing at a partial ledger.

Reading: ``read_compacted(start, n)`` finds the first compacted entry at or after
``start`` by binary search over the compacted ledger (its entries are in topic order),
remembering where each read ended so a consumer reading on needs no search.
Status, as Pulsar's admin API reports it: NOT_RUN, RUNNING, SUCCESS, ERROR.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator

from managed_ledger.compacted_ledger import CompactionRecord, decode_entry, encode_entry
from client.compression import CODECS, decompress
from managed_ledger.compaction_keys import LatestKeys
from managed_ledger.managed_ledger_info import PURPOSE_COMPACTED
from common.errors import MagnetarError
from common.position import CompactedEntry, Position
from protocol.batch import SingleMessage, is_batch, parse_batch
from protocol.codec import decode_stored, stored_metadata
from protocol.proto import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from managed_ledger.managed_ledger import ManagedLedger
    from ledger.reader import LedgerReader

log = logging.getLogger(__name__)

COMPACTION_PROPERTY = "magnetar.compaction"
# Points of a run where a test may stop the broker (BrokerConfig.compaction_pause_at):
# after phase two wrote the compacted ledger, before it is closed and committed.
PAUSE_POINTS = ("after-ledger-written",)
# One read of the input: entries and bytes (a phase's memory is about one such chunk,
# plus what its messages cost in Python objects while they are looked at).
_READ_ENTRIES = 200
_READ_BYTES = 2 * 1024 * 1024
# Messages noted per call of the table (phase one): bounds the list handed over.
_NOTES_MAX = 10_000
# Where consumers' reads ended (next topic position -> compacted entry id): a consumer
# reading on finds its place without a search. Bounded; the oldest are forgotten.
_HINTS_MAX = 1000


@dataclass(frozen=True)
class _Message:
    key: bytes | None
    tombstone: bool
    batch_index: int            # -1: not a batch


def _messages(entry: CompactedEntry) -> tuple[int, list[_Message]]:
    """(batch size or 0, the entry's live messages): those a previous compaction kept."""
    metadata = stored_metadata(entry.stored)
    if not is_batch(metadata):
        payload = decode_stored(entry.stored).payload
        size = metadata.uncompressed_size if metadata.compression in CODECS else len(payload)
        key = metadata.partition_key.encode() if metadata.HasField("partition_key") else None
        return 0, [_Message(key, metadata.null_value or size == 0, -1)]
    singles = _batch_messages(metadata, decode_stored(entry.stored).payload)
    live = []
    for single in singles:
        index = single.batch_index
        if entry.batch_size and not entry.keep_bits >> index & 1:
            continue
        meta = single.metadata
        key = meta.partition_key.encode() if meta.HasField("partition_key") else None
        live.append(_Message(key, meta.null_value or len(single.payload) == 0, index))
    return len(singles), live


def _batch_messages(metadata: pb.MessageMetadata, payload: memoryview) -> list[SingleMessage]:
    """A batch's messages; its payload decompressed first when the producer compressed it
    (MalformedFrame when it does not decompress to its declared size)."""
    if metadata.compression not in CODECS:
        return parse_batch(metadata, payload)
    plain = pb.MessageMetadata()
    plain.CopyFrom(metadata)
    plain.ClearField("compression")
    return parse_batch(plain, decompress(metadata.compression, payload, metadata.uncompressed_size))


async def _input(ledger: "ManagedLedger", previous: CompactionRecord | None, previous_reader: "LedgerReader | None",
                 horizon: Position) -> AsyncIterator[list[CompactedEntry]]:
    """The compactor's input in chunks, in topic order: the previous compacted ledger,
    then the topic after its horizon up to ``horizon``."""
    if previous is not None and previous.entries:
        assert previous_reader is not None
        entry_id = 0
        while entry_id < previous.entries:
            last = min(previous.entries - 1, entry_id + _READ_ENTRIES - 1)
            chunk = [decode_entry(e.payload) for e in await previous_reader.read(entry_id, last)]
            assert [c.position for c in chunk] == sorted(c.position for c in chunk)
            yield chunk
            entry_id = last + 1
    position = ledger.first_position
    if previous is not None:
        position = max(position, ledger.next_position(previous.horizon))
    while horizon.entry_id >= 0 and position <= horizon:
        entries = await ledger.read(position, _READ_ENTRIES, _READ_BYTES)
        chunk = [CompactedEntry(e.position, 0, 0, memoryview(e.data)) for e in entries if e.position <= horizon]
        if chunk:
            yield chunk
        if not entries or entries[-1].position >= horizon:
            return
        position = ledger.next_position(entries[-1].position)


async def compact(ledger: "ManagedLedger", previous: CompactionRecord | None,
                  spill_directory: str | None = None, *, pause_at: str = "") -> CompactionRecord:
    """One compaction of ``ledger`` (see the module's docstring); returns its record,
    not yet committed. Raises MagnetarError (the ledger it wrote is deleted).
    ``pause_at`` (tests only, PAUSE_POINTS) stops the run there for ever."""
    horizon = ledger.last_confirmed
    if previous is not None and horizon <= previous.horizon:
        return previous   # nothing was written since
    previous_reader = await ledger.open_side_ledger(previous.ledger_id) \
        if previous is not None and previous.entries else None
    table = LatestKeys(spill_directory)
    try:
        # Phase one: each key's latest value.
        notes: list[tuple[bytes, bool, Position, int]] = []
        async for chunk in _input(ledger, previous, previous_reader, horizon):
            for entry in chunk:
                notes.extend((message.key, message.tombstone, entry.position, message.batch_index)
                             for message in _messages(entry)[1] if message.key is not None)
                if len(notes) >= _NOTES_MAX:
                    await asyncio.to_thread(table.note, notes)
                    notes = []
        if notes:
            await asyncio.to_thread(table.note, notes)
        await asyncio.to_thread(table.index_positions)
        # Phase two: copy the entries that hold one.
        handle = await ledger.create_side_ledger(PURPOSE_COMPACTED)
        try:
            written = 0
            async for chunk in _input(ledger, previous, previous_reader, horizon):
                survivors = await asyncio.to_thread(table.survivors, chunk[0].position, chunk[-1].position)
                adds = []
                for entry in chunk:
                    batch_size, messages = _messages(entry)
                    latest = survivors.get(entry.position, set())
                    kept = [m.batch_index for m in messages
                            if (m.batch_index in latest if m.key is not None else not m.tombstone)]
                    if not kept:
                        continue
                    bits = 0
                    if batch_size:
                        for index in kept:
                            bits |= 1 << index
                        if bits == (1 << batch_size) - 1:
                            batch_size, bits = 0, 0     # every message of the batch survives
                    else:
                        assert kept == [-1], kept
                    adds.append(handle.submit_nowait(encode_entry(entry.position, batch_size, bits, entry.stored)))
                    written += 1
                if adds:
                    await asyncio.gather(*adds)
            if pause_at == "after-ledger-written":
                log.warning("compaction paused: point=%s topic=%s ledger_id=%d entries=%d", pause_at, ledger.name,
                            handle.ledger_id, written)
                await asyncio.Event().wait()
            await handle.close()
        except BaseException:
            await asyncio.shield(ledger.delete_side_ledger(handle.ledger_id))
            raise
        log.info("compacted ledger written: topic=%s ledger_id=%d horizon=%s entries=%d", ledger.name,
                 handle.ledger_id, horizon, written)
        return CompactionRecord(handle.ledger_id, horizon, written)
    finally:
        await asyncio.to_thread(table.close)


class TopicCompaction:
    """A topic's compaction: the committed record, reads of its compacted ledger for
    ``read_compacted`` subscriptions (``CompactedSource``), and the last run's status."""

    def __init__(self, ledger: "ManagedLedger", spill_directory: str | None = None, *, pause_at: str = "") -> None:
        assert pause_at in ("", *PAUSE_POINTS), pause_at
        self._ledger = ledger
        self._spill_directory = spill_directory
        self._pause_at = pause_at
        self.status = "NOT_RUN"
        self.last_error = ""
        self.record: CompactionRecord | None = None
        self._reader: LedgerReader | None = None
        self._hints: collections.OrderedDict[Position, int] = collections.OrderedDict()
        text = ledger.properties.get(COMPACTION_PROPERTY)
        if text is not None:
            try:
                self.record = CompactionRecord.decode(text)
            except MagnetarError as error:
                log.warning("compaction record unreadable, ignored: topic=%s error=%s", ledger.name, error)

    def source(self) -> "TopicCompaction | None":
        """What a read_compacted subscription reads first (None: never compacted)."""
        return self if self.record is not None else None

    @property
    def horizon(self) -> Position:
        assert self.record is not None
        return self.record.horizon

    async def run(self) -> None:
        """One compaction; the status says how it ended (errors are not raised)."""
        self.status, self.last_error = "RUNNING", ""
        previous = self.record
        try:
            record = await compact(self._ledger, previous, self._spill_directory, pause_at=self._pause_at)
            if record is not previous:
                try:
                    # Recorded only while its metadata exists: a run outliving the
                    # ledger collector's grace fails here rather than commit a record
                    # of a collected ledger (managed_ledger/ledger_gc.py).
                    await self._ledger.set_properties({COMPACTION_PROPERTY: record.encode()},
                                                      recording=(record.ledger_id,))
                except BaseException:
                    await asyncio.shield(self._ledger.delete_side_ledger(record.ledger_id))
                    raise
        except MagnetarError as error:
            self.status, self.last_error = "ERROR", error.message
            log.warning("compaction failed: topic=%s error=%s", self._ledger.name, error)
            return
        if record is not previous:
            self.record, self._reader = record, None
            self._hints.clear()
            if previous is not None:
                # Committed: the old ledger is read by nobody from now on (a read in
                # progress that fails for it is tried again on the new one).
                await self._ledger.delete_side_ledger(previous.ledger_id)
        self.status = "SUCCESS"
        log.info("topic compacted: topic=%s horizon=%s entries=%d", self._ledger.name, record.horizon,
                 record.entries)

    async def delete(self) -> None:
        """The topic is deleted: so is its compacted ledger."""
        if self.record is not None:
            await self._ledger.delete_side_ledger(self.record.ledger_id)
            self.record, self._reader = None, None

    # --- reading (CompactedSource) ---------------------------------------------------------

    async def read_compacted(self, start: Position, count_max: int) -> list[CompactedEntry]:
        assert count_max > 0
        for _attempt in range(2):
            record = self.record
            if record is None or record.entries == 0:
                return []
            try:
                return await self._read(record, start, count_max)
            except MagnetarError:
                if self.record is record:
                    raise
                # A new compaction replaced (and deleted) the ledger meanwhile: again.
        return []

    async def last_entry(self) -> CompactedEntry | None:
        """The compacted ledger's last entry (None: never compacted, or nothing survived
        it): the last a read_compacted reader gets when nothing follows the horizon."""
        for _attempt in range(2):
            record = self.record
            if record is None or record.entries == 0:
                return None
            try:
                reader = await self._open_reader(record)
                (found,) = await reader.read(record.entries - 1, record.entries - 1)
                return decode_entry(found.payload)
            except MagnetarError:
                if self.record is record:
                    raise
                # Replaced meanwhile, as in read_compacted: again.
        return None

    async def _open_reader(self, record: CompactionRecord) -> "LedgerReader":
        reader = self._reader
        if reader is None or reader.ledger_id != record.ledger_id:
            reader = await self._ledger.open_side_ledger(record.ledger_id)
            if self.record is record:
                self._reader = reader
        return reader

    async def _read(self, record: CompactionRecord, start: Position, count_max: int) -> list[CompactedEntry]:
        reader = await self._open_reader(record)
        first = self._hints.get(start)
        if first is None:
            first = await self._search(reader, record, start)
        if first >= record.entries:
            return []
        last = min(record.entries - 1, first + count_max - 1)
        chunk = [decode_entry(e.payload) for e in await reader.read(first, last)]
        chunk = [c for c in chunk if c.position >= start]
        if chunk and self.record is record:
            after = chunk[-1].position
            self._hints[Position(after.ledger_id, after.entry_id + 1)] = last + 1
            while len(self._hints) > _HINTS_MAX:
                self._hints.popitem(last=False)
        return chunk

    async def _search(self, reader: "LedgerReader", record: CompactionRecord, start: Position) -> int:
        """The id of the first compacted entry at or after ``start`` (``entries`` if
        none): a binary search, one entry read per step."""
        low, high = 0, record.entries
        while low < high:
            middle = (low + high) // 2
            (found,) = await reader.read(middle, middle)
            if decode_entry(found.payload).position < start:
                low = middle + 1
            else:
                high = middle
        return low
