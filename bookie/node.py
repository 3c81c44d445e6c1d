"""The bookie's core: validates adds, journals them, makes them readable once durable,
fences ledgers, serves reads, and checkpoints.

Theory of operation:
- ``submit_adds`` checks each entry (size, header, ids, digest, fenced, read-only),
  appends the good ones to the journal as one batch and returns one future for the
  batch plus a result per entry. The journal calls ``_on_durable`` after the batch's
  fsync; only then does the entry enter ledger storage (readable) and only after that
  is the batch acknowledged.
- Fencing takes effect in memory at once (no add after the fence request is
  accepted) and is journaled; the fence is answered after that record's fsync.
  Recovery adds (``recovery=True``) land on fenced ledgers, as recovery needs.
- The checkpointer flushes ledger storage on an interval or when the write cache is
  half full, then records the journal position that flush covered and trims older
  journal files. On start-up the journal is replayed from the last checkpoint.
- A bookie whose disks are past the usage threshold is read-only: normal adds fail
  with BookieReadOnly (writers replace it), recovery adds and reads go on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Sequence

from bookie.config import BookieConfig
from bookie.disk_monitor import DiskUsage
from bookie.fileio import replace_file
from bookie.format import (
    JournalPosition,
    JournalRecord,
    RECORD_ADD,
    RECORD_FENCE,
    decode_checkpoint,
    encode_checkpoint,
    journal_add_record,
    journal_add_record_bytes,
    journal_fence_record,
)
from bookie.journal import Journal, list_journal_ids, replay_journal
from bookie.ledger_storage import LedgerState, LedgerStorage, ReadOutcome
from common.entry import verify_entry
from common.errors import (
    BookieReadOnly,
    EntryTooLarge,
    InvalidArgument,
    LedgerFenced,
    MagnetarError,
    MalformedFrame,
    NoSuchLedger,
    Overloaded,
)

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
# A read request names at most this many entries (a reply is bounded by bytes anyway).
READ_ENTRY_IDS_MAX = 100_000


def _retrieve_exception(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass(frozen=True, slots=True)
class AddItem:
    """One add as the wire delivered it (the servicer builds these from protobuf)."""

    ledger_id: int
    entry_id: int
    entry: bytes
    recovery: bool = False


class BookieNode:
    def __init__(self, config: BookieConfig, storage: LedgerStorage, bookie_id: str) -> None:
        self.config = config
        self.bookie_id = bookie_id
        self.storage = storage
        self.read_only = False
        # Set by the disk monitor; reported in Info and the registration.
        self.disk_usage: DiskUsage | None = None
        self.journal: Journal | None = None
        self._flush_wanted = asyncio.Event()
        self._checkpoint_lock = asyncio.Lock()
        self.replayed_records = 0
        self.last_checkpoint: JournalPosition | None = None

    # --- start-up ------------------------------------------------------------------------

    def _checkpoint_path(self) -> str:
        return os.path.join(self.config.journal.journal_dir, CHECKPOINT_FILE)

    def _read_checkpoint(self) -> JournalPosition | None:
        try:
            with open(self._checkpoint_path(), "rb") as handle:
                return decode_checkpoint(handle.read())
        except FileNotFoundError:
            return None

    def _write_checkpoint(self, position: JournalPosition) -> None:
        replace_file(self._checkpoint_path(), encode_checkpoint(position))

    def open(self) -> None:
        """Blocking start-up: storage, journal replay, a fresh journal file."""
        journal_dir = self.config.journal.journal_dir
        os.makedirs(journal_dir, exist_ok=True)
        self.storage.open()
        checkpoint = self._read_checkpoint()
        started = time.perf_counter()
        count = 0
        for _journal_id, record in replay_journal(journal_dir, checkpoint):
            self.apply_replayed(record)
            count += 1
        self.replayed_records = count
        existing = list_journal_ids(journal_dir)
        first_id = (existing[-1] + 1) if existing else 1
        self.journal = Journal(self.config.journal, on_durable=self._on_durable, first_journal_id=first_id)
        self.journal.open()
        self.last_checkpoint = checkpoint
        log.info("journal replayed: records=%d checkpoint=%s seconds=%.3f next_journal_id=%d",
                 count, checkpoint, time.perf_counter() - started, first_id)

    def apply_replayed(self, record: JournalRecord) -> None:
        """Applies one journal record found at start-up to ledger storage (also the
        seam the simulator in tests/sim/ replays its simulated journal through)."""
        if record.record_type == RECORD_ADD:
            header = verify_entry(record.entry)
            self.storage.put_entry(header.ledger_id, header.entry_id, header.last_add_confirmed, record.entry)
        elif record.record_type == RECORD_FENCE:
            self.storage.fence(record.ledger_id)

    # --- adds ----------------------------------------------------------------------------------

    def _on_durable(self, tokens: list[object]) -> None:
        put = self.storage.put_entry
        for token in tokens:
            if token is None:
                continue  # a fence: its effect was taken when it was requested
            ledger_id, entry_id, last_add_confirmed, entry = token  # type: ignore[misc]
            put(ledger_id, entry_id, last_add_confirmed, entry)
        if self.storage.needs_flush():
            self._flush_wanted.set()

    def _check_add(self, item: AddItem) -> int:
        """Validates one add; returns its last_add_confirmed or raises."""
        size = len(item.entry)
        if size > self.config.storage.entry_bytes_max:
            raise EntryTooLarge(size, self.config.storage.entry_bytes_max)
        header = verify_entry(item.entry)
        if header.ledger_id != item.ledger_id or header.entry_id != item.entry_id:
            raise MalformedFrame(
                f"entry header says {header.ledger_id}/{header.entry_id}, "
                f"envelope says {item.ledger_id}/{item.entry_id}")
        if not item.recovery:
            if self.read_only:
                raise BookieReadOnly(self.bookie_id)
            state = self.storage.ledger_state(item.ledger_id)
            if state is not None and state.fenced:
                raise LedgerFenced(item.ledger_id)
        return header.last_add_confirmed

    async def admit(self, items: Sequence[AddItem]) -> None:
        """Back-pressure before a batch is journaled: waits for journal queue and
        write cache room (bounded waits; Overloaded when they run out)."""
        assert self.journal is not None
        if self.journal.failed is not None:
            # Fatal, not an overload: fail fast instead of waiting for room first.
            raise self.journal.failed
        size = sum(len(item.entry) for item in items)
        if items:
            await self.storage.wait_for_room(items[0].ledger_id, size)
        try:
            await self.journal.wait_for_room(size, self.config.storage.write_cache_wait_s_max)
        except TimeoutError:
            raise Overloaded("journal queue full: the journal disk is not keeping up") from None

    def admits_now(self, items: Sequence[AddItem]) -> bool:
        """True when ``admit`` would return at once without raising (journal and write
        cache have room): the caller may skip awaiting it."""
        assert self.journal is not None
        size = sum(len(item.entry) for item in items)
        return self.journal.has_room(size) and (not items or self.storage.has_room(items[0].ledger_id, size))

    def hold_journal(self) -> None:
        """Adds journaled until ``start_journal_now`` do not wake the journal's writer
        (``Journal.hold_start``): the caller starts it when they are all queued."""
        if self.journal is not None:
            self.journal.hold_start()

    def start_journal_now(self) -> None:
        """What was journaled so far arrived together: an idle journal writes it now
        (``Journal.start_now``)."""
        if self.journal is not None:
            self.journal.start_now()

    def submit_adds(self, items: Sequence[AddItem]) -> tuple[list[MagnetarError | None], asyncio.Future[None] | None]:
        """Journals the valid adds of a batch. Returns one outcome per item (None for
        accepted ones) and the future of their fsync (None if none was accepted).

        A batch is cut into journal appends of at most ``group_bytes_max`` record bytes
        each, so that no journal group exceeds the bound (a stream message may carry
        up to grpc_message_bytes_max). The future returned is the last append's: the
        journal writes appends in order and fails every later one when one fails, so
        the last one's fsync covers the batch."""
        assert self.journal is not None
        group_bytes_max = self.config.journal.group_bytes_max
        outcomes: list[MagnetarError | None] = []
        futures: list[asyncio.Future[None]] = []
        buffers: list[bytes] = []
        tokens: list[object] = []
        size = 0
        record_bytes = 0
        for item in items:
            try:
                last_add_confirmed = self._check_add(item)
            except MagnetarError as error:
                outcomes.append(error)
                continue
            outcomes.append(None)
            record = journal_add_record(item.entry)
            item_record_bytes = journal_add_record_bytes(len(item.entry))
            assert item_record_bytes <= group_bytes_max, "BookieConfig makes every entry fit a group"
            if tokens and record_bytes + item_record_bytes > group_bytes_max:
                futures.append(self.journal.append(buffers, size, tokens))
                buffers, tokens, size, record_bytes = [], [], 0, 0
            buffers.extend(record)
            tokens.append((item.ledger_id, item.entry_id, last_add_confirmed, item.entry))
            size += len(item.entry)
            record_bytes += item_record_bytes
        if tokens:
            futures.append(self.journal.append(buffers, size, tokens))
        for earlier in futures[:-1]:
            # Their outcome is the last one's; retrieve a failure so it is not reported
            # as never retrieved.
            earlier.add_done_callback(_retrieve_exception)
        return outcomes, (futures[-1] if futures else None)

    # --- fencing, state, reads ---------------------------------------------------------------

    async def fence(self, ledger_id: int) -> LedgerState:
        assert self.journal is not None
        state = self.storage.fence(ledger_id)
        record = journal_fence_record(ledger_id)
        await self.journal.append([record], len(record), [None])
        log.info("ledger fenced: ledger_id=%d bookie_id=%s last_add_confirmed=%d last_entry_id=%d",
                 ledger_id, self.bookie_id, state.last_add_confirmed, state.last_entry_id)
        return state

    def ledger_state(self, ledger_id: int) -> LedgerState:
        state = self.storage.ledger_state(ledger_id)
        if state is None:
            raise NoSuchLedger(ledger_id)
        return state

    async def read(self, ledger_id: int, entry_ids: list[int], bytes_max: int) -> list[ReadOutcome]:
        if not entry_ids:
            raise InvalidArgument("a read must name at least one entry id")
        if len(entry_ids) > READ_ENTRY_IDS_MAX:
            raise InvalidArgument(f"a read names at most {READ_ENTRY_IDS_MAX} entry ids")
        if min(entry_ids) < 0:
            raise InvalidArgument("entry ids must not be negative")
        if self.storage.ledger_state(ledger_id) is None:
            raise NoSuchLedger(ledger_id)
        limit = self.config.storage.read_response_bytes_max
        bytes_max = min(bytes_max, limit) if bytes_max > 0 else limit
        return await self.storage.read_entries(ledger_id, entry_ids, bytes_max)

    # --- checkpoints --------------------------------------------------------------------------

    async def checkpoint(self) -> JournalPosition:
        """Flushes storage and lets the journal go up to what the flush covered."""
        assert self.journal is not None
        async with self._checkpoint_lock:
            # Everything up to applied_position is already in the write caches (the
            # durable callback runs before the position moves), so the flush below,
            # which swaps the caches first, makes all of it durable on the ledger disks.
            position = self.journal.applied_position
            await self.storage.flush()
            await asyncio.to_thread(self._write_checkpoint, position)
            self.last_checkpoint = position
            await asyncio.to_thread(self.journal.trim, position)
            return position

    async def run_checkpointer(self) -> None:
        interval_s = self.config.storage.flush_interval_s
        while True:
            try:
                async with asyncio.timeout(interval_s):
                    await self._flush_wanted.wait()
            except TimeoutError:
                pass
            self._flush_wanted.clear()
            try:
                await self.checkpoint()
            except MagnetarError as error:
                log.error("checkpoint failed: error=%s", error)
                await asyncio.sleep(interval_s)

    async def close(self) -> None:
        if self.journal is not None:
            await self.journal.close()
