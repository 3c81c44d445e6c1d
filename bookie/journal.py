"""The journal: the bookie's write-ahead log, with group commit.

Theory of operation:
- Appends (a batch of adds, or a fence) queue in order. One writer task takes a group
  from the head of the queue, writes it with one vectored ``write`` and one
  ``fdatasync`` on a dedicated IO thread (bookie/io_thread.py), and only then (back
  on the event loop) hands the group's tokens to ``on_durable`` and resolves the
  callers' futures. So nothing is
  acknowledged, and nothing is made visible to readers, before its fsync.
- A group is at most ``group_bytes_max`` bytes of records: the writer takes appends
  from the head while the next one still fits. An append is never split (its records
  share one future), so an append larger than the limit on its own is written alone;
  the bookie never makes one (``BookieNode`` cuts add batches to fit, and
  ``BookieConfig`` requires the largest record to fit a group). Appends that arrive
  while a group is in its fsync wait in the queue and form the next groups, under the
  same bound.
- When the writer is idle it starts a group as soon as the queue is drained (after one
  turn of the event loop, so adds that arrived together go together; or at once when
  the caller says it queued the last of what arrived together: ``start_now``; such a
  caller may hold the appends' wake-ups until then, ``hold_start``, and a group it
  starts on an idle writer is seen done by its completion without a turn of the writer
  loop), or, with
  ``group_wait_ms_max`` > 0, once the oldest queued append has waited that long or
  the queue holds a full group, whichever comes first (BookKeeper's
  journalMaxGroupWaitMSec: fewer fsyncs for a little latency). Under load no time is
  spent waiting: while one group is in its fsync the next fills by itself.
- How long each record waited in the queue (from ``append`` until its group's write
  began) is recorded in ``stats.queue_wait`` (a histogram weighted by records).
- ``applied_position`` is the journal position up to which every record has been
  handed to ``on_durable``; a checkpoint takes it, flushes ledger storage, and may then
  delete journal files wholly before it (``trim``).
- Files rotate at ``file_bytes_max``; a new journal always starts a new file, so replay
  never has to trust a file the previous process was writing past its last fsync.
- Space is allocated ahead of the writes, ``preallocate_bytes`` at a time (fallocate on
  the IO thread, before the group that needs it), so a group's fdatasync commits its
  data and not also the file's growth. Allocated space reads as zeros, where replay
  stops (a record's size is never zero); a failed allocation (a full disk, a file
  system without fallocate) is logged and the file grows with its writes instead, but
  a failed fsync of an allocation fails the journal like any other fsync error.
- An IO error from write or fdatasync leaves the page cache in an unknown state; the
  journal then fails every pending and later append (``BookieStorageError``) rather than
  risk acknowledging what is not on disk. The bookie treats that as fatal.

Invariants: tokens reach ``on_durable`` in append order; a future resolves only after
the fsync covering its record returned; ``applied_position`` only moves forward; a
group holds at most ``group_bytes_max`` record bytes unless it is one append alone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import mmap
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from bookie.config import JournalConfig
from bookie.fileio import create_file, write_all
from bookie.format import (
    FILE_HEADER_SIZE,
    JOURNAL_MAGIC,
    JournalPosition,
    JournalRecord,
    decode_file_header,
    encode_file_header,
    iter_journal_records,
    journal_file_name,
    parse_file_id,
)
from bookie.io_thread import IoThread
from runtime.eager_future import new_eager_future, settle_all
from common.errors import BookieStorageError, MalformedFrame, ShuttingDown
from common.histograms import WeightedHistogram

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Append:
    """One ``append`` call waiting in the queue."""

    buffers: list[bytes]
    tokens: list[object]
    future: asyncio.Future[None]
    record_bytes: int    # what the write carries: the sum of the buffers' lengths
    queued_bytes: int    # the caller's size, counted against queue_bytes_max
    enqueued_at: float   # clock() when appended


@dataclass
class JournalStats:
    groups_written: int = 0
    records_written: int = 0
    bytes_written: int = 0
    fsync_seconds_total: float = 0.0
    # The largest group written, in bytes (at most group_bytes_max unless one append
    # alone was larger).
    group_bytes_largest: int = 0
    # Per record (add or fence): seconds from append until its group's write began.
    queue_wait: WeightedHistogram = field(default_factory=WeightedHistogram)
    # Allocations ahead of the writes that failed (each leaves its file growing with
    # its writes).
    preallocation_failures: int = 0


def list_journal_ids(journal_dir: str) -> list[int]:
    ids = []
    for name in os.listdir(journal_dir):
        file_id = parse_file_id(name, "journal")
        if file_id is not None:
            ids.append(file_id)
    return sorted(ids)


def replay_journal(journal_dir: str, start: JournalPosition | None) -> Iterator[tuple[int, JournalRecord]]:
    """Yields (journal_id, record) for every intact record at or after ``start``, in
    order. Runs at startup, before the bookie serves, so plain blocking IO is fine."""
    for journal_id in list_journal_ids(journal_dir):
        if start is not None and journal_id < start.journal_id:
            continue
        path = os.path.join(journal_dir, journal_file_name(journal_id))
        size = os.path.getsize(path)
        if size < FILE_HEADER_SIZE:
            log.warning("journal file shorter than its header, skipped: path=%s size=%d", path, size)
            continue
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            found_id = decode_file_header(mapped[:FILE_HEADER_SIZE], JOURNAL_MAGIC)
            if found_id != journal_id:
                raise MalformedFrame(f"journal file {path} says id {found_id}")
            offset = FILE_HEADER_SIZE
            if start is not None and journal_id == start.journal_id:
                offset = max(start.offset, FILE_HEADER_SIZE)
            last_end = offset
            for record in iter_journal_records(mapped, offset):
                last_end = record.end_offset
                yield journal_id, record
            # Zeros after the last record are allocated space never written (or a
            # torn tail that the allocation had zeroed): nothing to report.
            if last_end < size and mapped[last_end:size].count(0) != size - last_end:
                log.info("journal replay stopped before file end: journal_id=%d offset=%d size=%d",
                         journal_id, last_end, size)


class Journal:
    def __init__(
        self,
        config: JournalConfig,
        *,
        on_durable: Callable[[list[object]], None],
        first_journal_id: int,
        clock: Callable[[], float] = time.monotonic,
        on_group_written: Callable[[float, int, int], None] | None = None,
    ) -> None:
        self.config = config
        # Told (write + fdatasync seconds, records, bytes) after each group; for metrics.
        self.on_group_written = on_group_written
        self._on_durable = on_durable
        self._clock = clock
        self._journal_id = first_journal_id
        self._fd = -1
        self._file_offset = 0
        # Where the current file's allocated space ends (preallocate_bytes steps); None:
        # not preallocating this file (turned off, or an allocation failed).
        self._allocated_end: int | None = None
        # Appends not yet taken by the writer, oldest first; their record bytes summed.
        self._queue: deque[_Append] = deque()
        self._queue_record_bytes = 0
        self._pending_event = asyncio.Event()
        self._room_event = asyncio.Event()
        # Bytes (callers' sizes) appended and not yet written, the group in its write
        # included: what wait_for_room holds below queue_bytes_max.
        self._queued_bytes = 0
        self._failed: BaseException | None = None
        self._closing = False
        # The group handed to the IO thread and not yet seen done by the writer loop
        # (its completion future and its appends), and whether the writer loop waits
        # idle for appends (then start_now may start a group itself).
        self._in_flight: tuple[asyncio.Future[None], list[_Append]] | None = None
        self._idle = False
        # The caller starts the writing itself (start_now) once it has queued what
        # arrived together (hold_start): appends meanwhile do not wake the writer loop.
        self._held = False
        # One thread does every journal write and fsync, so they are ordered.
        self._io = IoThread("journal")
        self.applied_position = JournalPosition(first_journal_id, FILE_HEADER_SIZE)
        self.stats = JournalStats()
        self._last_fsync_s = 0.0
        # Of the latest group, for the stage histograms (bookie/metrics.py): its write(2)
        # seconds, and the whole round from handing it to the IO thread until the loop
        # resumed with the result (write, fdatasync and both thread hops).
        self.last_write_s = 0.0
        self.last_round_s = 0.0

    # --- lifecycle --------------------------------------------------------------------


    @property
    def queued_records(self) -> int:
        """Appends waiting for the writer (not yet in a group): the journal's queue depth."""
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        """Bytes appended and not yet written (the group being written included)."""
        return self._queued_bytes
    def open(self) -> None:
        """Creates the first file of this journal (blocking; call before serving)."""
        os.makedirs(self.config.journal_dir, exist_ok=True)
        self._open_file(self._journal_id)
        self.applied_position = JournalPosition(self._journal_id, self._file_offset)

    def _open_file(self, journal_id: int) -> None:
        assert self._fd < 0, "the previous journal file is still open"
        path = os.path.join(self.config.journal_dir, journal_file_name(journal_id))
        header = encode_file_header(JOURNAL_MAGIC, journal_id)
        # Always fsynced, even with fsync_enabled off: a journal file must never vanish
        # from its directory once records were acknowledged from it.
        self._fd = create_file(path, header, fsync=True)
        self._journal_id = journal_id
        self._file_offset = len(header)
        self._allocated_end = len(header) if self.config.preallocate_bytes > 0 else None
        log.info("journal file opened: journal_id=%d path=%s", journal_id, path)

    async def run(self) -> None:
        """The single writer loop; runs until ``close``. A group is started here, or by
        ``start_now`` while this loop waits idle; either way this loop awaits it."""
        try:
            while True:
                if self._in_flight is None:
                    if not self._queue:
                        if self._closing:
                            return
                        self._pending_event.clear()
                        self._idle = True
                        try:
                            await self._pending_event.wait()
                        finally:
                            self._idle = False
                        continue      # start_now may have started a group meanwhile
                    await self._gather()
                    self._start_group()
                completed, group = self._in_flight
                try:
                    await completed
                except OSError as error:
                    self._fail(BookieStorageError(f"journal write failed: {error}"), group)
                    log.error("journal write failed, journal stopped: error=%s", error)
                    return
                finally:
                    self._in_flight = None
        except asyncio.CancelledError:
            if self._in_flight is not None:
                self._in_flight[0].cancel()     # as before: a cancelled writer acknowledges nothing more
            raise

    def hold_start(self) -> bool:
        """Until the next ``start_now``, appends do not wake the writer loop: the
        caller (the add socket, around a read; ``start_now`` in a ``finally``) says
        when what arrived together is queued. True when this call began the hold."""
        if self._held:
            return False
        self._held = True
        return True

    def start_now(self) -> None:
        """Starts writing what is queued at once when the writer waits idle (and no
        ``group_wait_ms_max`` linger is asked for), instead of after the writer loop's
        turns. For a caller that has just queued the last of what arrived together (the
        add socket, at the end of a read): a lone add does not wait two loop turns, and
        the adds of one read still share a group. Under load the writer is never idle,
        so nothing changes there. Ends a hold (``hold_start``): what it queued and
        this call did not start wakes the writer loop, as the appends would have.

        A group started here while the writer loop waits idle is seen done by
        ``_complete_group`` itself, which wakes the loop only when there is more to do
        (a failure, more appends, closing): an add to an idle journal costs no turn of
        the writer loop."""
        self._held = False
        if self._idle and self._in_flight is None and self._queue and self.config.group_wait_ms_max <= 0 \
                and self._failed is None:
            self._start_group()
        elif self._queue:
            self._pending_event.set()

    def _start_group(self) -> None:
        """Takes a group off the queue and hands it to the IO thread; ``_in_flight``
        holds it until the writer loop has seen it end."""
        loop = asyncio.get_running_loop()
        group, group_bytes = self._take_group()
        buffers = [buffer for item in group for buffer in item.buffers]
        group_records = sum(len(item.tokens) for item in group)
        write_started = self._clock()
        for item in group:
            self.stats.queue_wait.observe(max(0.0, write_started - item.enqueued_at), len(item.tokens))
        round_started = time.perf_counter()
        # The IO thread hands the written group straight to _complete_group on the
        # loop (one hop back), which acknowledges it before the writer loop resumes:
        # the adds' replies go a loop turn sooner than through run_in_executor's future.
        completed: asyncio.Future[None] = loop.create_future()
        self._io.submit(self._write_group, (buffers, group_bytes),
                        functools.partial(self._hand_back, loop, completed, group, group_bytes, group_records,
                                          round_started))
        self._in_flight = (completed, group)

    def _hand_back(self, loop: asyncio.AbstractEventLoop, completed: asyncio.Future[None], group: list[_Append],
                   group_bytes: int, group_records: int, round_started: float,
                   position: JournalPosition | None, error: BaseException | None) -> None:
        """On the IO thread, once the group is written (or failed): to the loop."""
        try:
            loop.call_soon_threadsafe(self._complete_group, completed, group, group_bytes, group_records,
                                      round_started, position, error)
        except RuntimeError:
            pass    # the loop is closed: nobody is left to acknowledge

    def _complete_group(self, completed: asyncio.Future[None], group: list[_Append], group_bytes: int,
                        group_records: int, round_started: float, position: JournalPosition | None,
                        error: BaseException | None) -> None:
        """On the loop: a written group's records are durable; acknowledges them, then
        lets the writer loop go on (its failure is the writer loop's to handle)."""
        if completed.cancelled():
            return   # the writer loop was cancelled meanwhile (closing): as before, no acks
        # A group start_now started while the writer loop waited idle: the loop still
        # waits there and does not await ``completed``. Whatever it must handle (a
        # failure) or go on with (more appends, closing) wakes it; then it finds this
        # group in flight and awaits ``completed`` as if it had started it.
        unawaited = self._idle
        if error is not None:
            completed.set_exception(error)
            if unawaited:
                self._pending_event.set()
            return
        assert position is not None
        try:
            self._acknowledge_group(group, group_bytes, group_records, round_started, position)
        except BaseException as broken:    # the writer loop raises it, as when it did this itself
            completed.set_exception(broken)
            if unawaited:
                self._pending_event.set()
            return
        completed.set_result(None)
        if unawaited:
            self._in_flight = None          # what the writer loop does after awaiting it
            if self._queue or self._closing:
                self._pending_event.set()

    def _acknowledge_group(self, group: list[_Append], group_bytes: int, group_records: int, round_started: float,
                           position: JournalPosition) -> None:
        self.last_round_s = time.perf_counter() - round_started
        stats = self.stats
        stats.groups_written += 1
        stats.records_written += group_records
        stats.bytes_written += group_bytes
        stats.group_bytes_largest = max(stats.group_bytes_largest, group_bytes)
        if self.on_group_written is not None:
            self.on_group_written(self._last_fsync_s, group_records, group_bytes)
        self._queued_bytes -= sum(item.queued_bytes for item in group)
        assert self._queued_bytes >= 0, self._queued_bytes
        self._room_event.set()
        # Hand the durable records on before acknowledging: a reader may only see an
        # entry once a crash can no longer erase it, and the ack follows visibility.
        self._on_durable([token for item in group for token in item.tokens])
        assert position >= self.applied_position, (position, self.applied_position)
        self.applied_position = position
        # All settled before any eager callback runs: a reply merges every settled batch.
        settle_all(item.future for item in group)

    async def _gather(self) -> None:
        """Lets adds that are already runnable (the rest of a burst that arrived on the
        sockets together) join the queue, then, with ``group_wait_ms_max`` > 0, waits
        for more until the oldest queued append has waited that long or a full group is
        queued. Waiting is on an event with a deadline, never a spin (a spinning wait
        here cost the bookie half a core at a few hundred adds per second). Under load
        the head has already waited through the previous fsync, so no time is added."""
        group_bytes_max = self.config.group_bytes_max
        if self._queue_record_bytes >= group_bytes_max:
            return
        await asyncio.sleep(0)
        wait_s = self.config.group_wait_ms_max / 1000.0
        if wait_s <= 0 or not self._queue:
            return
        deadline = self._queue[0].enqueued_at + wait_s
        while self._queue_record_bytes < group_bytes_max and not self._closing:
            remaining_s = deadline - self._clock()
            if remaining_s <= 0:
                return
            self._pending_event.clear()
            try:
                async with asyncio.timeout(remaining_s):
                    await self._pending_event.wait()
            except TimeoutError:
                return

    def _take_group(self) -> tuple[list[_Append], int]:
        """Takes appends from the head of the queue while the next one fits in
        ``group_bytes_max`` (always at least one); returns them and their record bytes."""
        assert self._queue, "a group is taken only from a non-empty queue"
        group_bytes_max = self.config.group_bytes_max
        group = [self._queue.popleft()]
        group_bytes = group[0].record_bytes
        while self._queue and group_bytes + self._queue[0].record_bytes <= group_bytes_max:
            item = self._queue.popleft()
            group.append(item)
            group_bytes += item.record_bytes
        self._queue_record_bytes -= group_bytes
        assert self._queue_record_bytes >= 0, self._queue_record_bytes
        assert group_bytes <= group_bytes_max or len(group) == 1, (group_bytes, len(group))
        return group, group_bytes

    def _write_group(self, buffers: list[bytes], size: int) -> JournalPosition:
        """On the IO thread: write ``buffers`` (``size`` bytes in all), fdatasync,
        rotate. Returns the position after."""
        assert self._fd >= 0, "the journal has no open file"
        # Appending by tracking the offset ourselves: the file is only ever written here.
        self._allocate_for(size)
        write_started = time.perf_counter()
        total = write_all(self._fd, buffers, self._file_offset)
        start_time = time.perf_counter()
        self.last_write_s = start_time - write_started
        if self.config.fsync_enabled:
            os.fdatasync(self._fd)
        self._last_fsync_s = time.perf_counter() - start_time
        self.stats.fsync_seconds_total += self._last_fsync_s
        self._file_offset += total
        position = JournalPosition(self._journal_id, self._file_offset)
        if self._file_offset >= self.config.file_bytes_max:
            fd, self._fd = self._fd, -1
            # Forgotten before it is closed: if opening the next file fails, close_file
            # must not close this number again (by then it may be another file's).
            os.close(fd)
            self._open_file(self._journal_id + 1)
        return position

    def _allocate_for(self, size: int) -> None:
        """On the IO thread: makes sure the file's allocated space covers the next
        ``size`` bytes, allocating whole ``preallocate_bytes`` steps (and syncing the
        allocation, once per step, so the groups' fdatasyncs need not)."""
        allocated_end = self._allocated_end
        if allocated_end is None or self._file_offset + size <= allocated_end:
            return
        needed_end = self._file_offset + size
        step = min(self.config.preallocate_bytes, self.config.file_bytes_max)
        steps = -(-(needed_end - allocated_end) // step)
        # Not past the size at which the file rotates, unless this group needs it.
        new_end = min(allocated_end + steps * step, max(self.config.file_bytes_max, needed_end))
        try:
            os.posix_fallocate(self._fd, allocated_end, new_end - allocated_end)
        except OSError as error:
            # Not fatal: the write that follows finds out whether the disk is full.
            self._allocated_end = None
            self.stats.preallocation_failures += 1
            log.warning("journal preallocation failed, this file grows with its writes: journal_id=%d "
                        "offset=%d bytes=%d error=%s", self._journal_id, allocated_end, new_end - allocated_end,
                        error)
            return
        if self.config.fsync_enabled:
            # The allocation is metadata (size, extents). An error here is the journal's
            # failure like any fsync error (raised to the writer loop): after a failed
            # fsync the file's state is unknown, and a later fdatasync may not say so.
            os.fsync(self._fd)
        self._allocated_end = new_end

    def _fail(self, error: BaseException, group: list[_Append]) -> None:
        self._failed = error
        for item in [*group, *self._queue]:
            if not item.future.done():
                item.future.set_exception(error)
        self._queue.clear()
        self._queue_record_bytes = 0
        self._queued_bytes = 0
        # Wakes the waiters of wait_for_room, which then raise the failure.
        self._room_event.set()

    async def close(self) -> None:
        """Writes what is pending, then stops the writer and closes the file."""
        self._closing = True
        self._pending_event.set()

    def close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._io.shutdown()

    # --- appends ----------------------------------------------------------------------------

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def has_room(self, size_bytes: int) -> bool:
        """True when wait_for_room would return at once (a failed journal has none)."""
        return self._failed is None and (self._queued_bytes + size_bytes <= self.config.queue_bytes_max
                                         or self._queued_bytes == 0)

    async def wait_for_room(self, size_bytes: int, timeout_s: float) -> None:
        """Back-pressure: waits while the queue holds more than queue_bytes_max. Raises
        the journal's failure at once (now or while waiting): a failed journal never
        makes room, and waiting out the timeout would report a retriable overload."""
        if self._failed is not None:
            raise self._failed
        if self.has_room(size_bytes):
            return   # the common case, without arming a timeout (every add comes here)
        async with asyncio.timeout(timeout_s):
            while True:
                if self._failed is not None:
                    raise self._failed
                if self.has_room(size_bytes):
                    return
                self._room_event.clear()
                await self._room_event.wait()

    def append(self, buffers: list[bytes], size_bytes: int, tokens: list[object]) -> asyncio.Future[None]:
        """Queues records (given as buffers for a vectored write) and returns one future
        that resolves once all of them are fsynced. ``tokens`` (one per record) reach
        ``on_durable`` just before that. A batch from one stream message shares a future.
        ``size_bytes`` is what the caller counted in ``wait_for_room``; groups are bounded
        by the bytes actually written."""
        if self._failed is not None:
            raise self._failed
        if self._closing:
            raise ShuttingDown("journal is closing")
        assert tokens
        assert size_bytes >= 0, size_bytes
        # Eager: the add socket writes the reply in the turn the group is acknowledged.
        future: asyncio.Future[None] = new_eager_future()
        record_bytes = sum(len(buffer) for buffer in buffers)
        self._queue.append(_Append(buffers, tokens, future, record_bytes, size_bytes, self._clock()))
        self._queue_record_bytes += record_bytes
        self._queued_bytes += size_bytes
        if not self._held:
            self._pending_event.set()
        return future

    # --- trimming -------------------------------------------------------------------------------

    def trim(self, upto: JournalPosition) -> int:
        """Deletes journal files wholly before ``upto`` (a checkpointed position).
        Blocking but cheap (unlinks); returns how many files went."""
        removed = 0
        for journal_id in list_journal_ids(self.config.journal_dir):
            if journal_id >= upto.journal_id or journal_id >= self._journal_id:
                break
            os.unlink(os.path.join(self.config.journal_dir, journal_file_name(journal_id)))
            removed += 1
        if removed:
            log.info("journal files trimmed: count=%d upto_journal_id=%d", removed, upto.journal_id)
        return removed

    @property
    def current_journal_id(self) -> int:
        return self._journal_id
