"""The write handle: the single writer of an open ledger.

Theory of operation:
- ``submit`` gives the payload the next entry id, encodes it once (header with the
  current last_add_confirmed, CRC32C) and sends the same bytes to each bookie of its
  write set. The returned future resolves with the entry id once Qa bookies acked it
  and every earlier entry completed (``AckTracker``), so acknowledgements reach the
  application in entry order and last_add_confirmed only grows.
- A bookie error other than "fenced" (unavailable, timeout, read-only, disk error)
  starts an ensemble change: the failed bookies are replaced by writable ones from the
  registry for entries from last_add_confirmed + 1 on, the new fragment is written to
  the ledger metadata by compare-and-swap, acknowledgements the failed bookies gave for
  those entries are forgotten, and the entries are sent to the replacements. While the
  change is being recorded no entry at or past its start completes (a reader must be
  able to find every acknowledged entry through the metadata), and new entries wait.
- LedgerFenced from any bookie, or a metadata compare-and-swap that finds the ledger
  IN_RECOVERY or CLOSED, means another client recovered the ledger: every pending
  and later add fails with LedgerFenced. This writer must stop.
- An error that says the entry itself is invalid (EntryTooLarge, InvalidArgument,
  MalformedFrame) would be given by every bookie, so replacing bookies cannot help:
  the handle fails with that error. ``submit`` refuses entries over the client's
  ``entry_bytes_max`` before they get an entry id, so this only happens when the
  client's limit is above its bookies'. So does a bookie's refusal of this writer's
  credentials (AuthenticationFailed, AuthorizationDenied: a missing or wrong service
  token, a role the bookie does not allow): it is this writer's configuration, and
  replacing bookies would only spend the ensemble changes (about 20 s) before failing.
- ``close`` waits for pending adds, then records state CLOSED and the last entry id.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from dataclasses import dataclass

from runtime.eager_future import call_when_done, new_eager_future
from runtime.tasks import cancel_and_wait, log_failure
from ledger.context import LedgerContext
from common.entry import ENTRY_HEADER_SIZE, encode_entry
from common.errors import (
    BookieReadOnly,
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    LedgerMetadataConflict,
    MagnetarError,
    MalformedFrame,
    MetadataError,
    NotEnoughBookies,
    SecurityError,
)
from ledger.metadata import LedgerState, VersionedMetadata
from ledger.placement import choose_replacement
from ledger.quorum import AckTracker
from ledger.reader import LedgerEntry, LedgerReader

log = logging.getLogger(__name__)

# When no replacement bookie exists, a failed but still registered bookie is retried
# this many times (pauses of 50 ms growing to 1 s: about 15 s in all) before the
# handle fails; long enough for a stream to reconnect, short enough that a bookie
# that is really gone fails the writer (which then rolls to a new ledger).
_SAME_BOOKIE_ATTEMPTS_MAX = 30

# Errors a bookie gives for the entry itself, which every other bookie would give too;
# and a refusal of this writer's credentials (a wrong or missing service token, a role
# not allowed), which is this writer's configuration, not the bookie's failure.
_ENTRY_REJECTED_ERRORS = (EntryTooLarge, InvalidArgument, MalformedFrame, SecurityError)


class _HandleState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(slots=True)
class _PendingAdd:
    entry_id: int
    data: bytes
    future: asyncio.Future[int]


class WriteHandle:
    def __init__(self, context: LedgerContext, versioned: VersionedMetadata) -> None:
        metadata = versioned.metadata
        assert metadata.state == LedgerState.OPEN
        self._context = context
        self._versioned = versioned
        self.ledger_id = metadata.ledger_id
        self._ensemble: list[str] = list(metadata.current_ensemble)
        self._tracker = AckTracker(metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size)
        self._pending: dict[int, _PendingAdd] = {}
        self._held: list[_PendingAdd] = []   # submitted during an ensemble change
        self._next_entry_id = 0
        self._pending_bytes = 0
        self._length_bytes = 0      # payload bytes of completed entries
        self._submitted_bytes = 0   # payload bytes of every entry given an id
        self._state = _HandleState.OPEN
        self._failure: MagnetarError | None = None
        self._failed_indices: set[int] = set()
        self._failed_bookies: set[str] = set()
        self._change_task: asyncio.Task[None] | None = None
        self._change_start: int | None = None
        self._same_bookie_attempts = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.ensemble_changes = 0

    # --- properties -----------------------------------------------------------------------

    @property
    def metadata(self):
        return self._versioned.metadata

    @property
    def metadata_version(self) -> int:
        """The etcd version of the metadata as this handle last wrote or read it: what a
        recorder compares to prove the ledger still exists as it knows it
        (managed_ledger/ledger_gc.py, the race analysis)."""
        return self._versioned.version

    @property
    def last_add_confirmed(self) -> int:
        return self._tracker.last_add_confirmed

    @property
    def length_bytes(self) -> int:
        return self._length_bytes

    @property
    def is_closed(self) -> bool:
        return self._state == _HandleState.CLOSED

    @property
    def failure(self) -> MagnetarError | None:
        return self._failure

    # --- adds -----------------------------------------------------------------------------------

    async def add(self, payload: bytes | memoryview) -> int:
        """Adds one entry and waits for it; returns its entry id."""
        return await (await self.submit(payload))

    async def submit(self, payload: bytes | memoryview) -> asyncio.Future[int]:
        """Waits for room among the pending adds, then sends the entry; returns a future
        of its entry id (resolved in entry order)."""
        config = self._context.config
        while (len(self._pending) >= config.pending_adds_max
               or self._pending_bytes >= config.pending_bytes_max) and self._state == _HandleState.OPEN:
            self._room.clear()
            await self._room.wait()
        return self.submit_nowait(payload)

    def submit_nowait(self, payload: bytes | memoryview) -> asyncio.Future[int]:
        if self._state == _HandleState.FAILED:
            assert self._failure is not None
            raise self._failure
        if self._state != _HandleState.OPEN:
            raise LedgerClosed(self.ledger_id)
        entry_bytes_max = self._context.config.entry_bytes_max
        if len(payload) + ENTRY_HEADER_SIZE > entry_bytes_max:
            # Before the entry gets an id: the handle stays usable for smaller entries.
            raise EntryTooLarge(len(payload), entry_bytes_max - ENTRY_HEADER_SIZE)
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        self._submitted_bytes += len(payload)
        data = encode_entry(self.ledger_id, entry_id, self._tracker.last_add_confirmed, self._submitted_bytes,
                            payload)
        # Eager: the managed ledger settles its append in the turn the entry completes.
        future: asyncio.Future[int] = new_eager_future()
        pending = _PendingAdd(entry_id, data, future)
        self._pending[entry_id] = pending
        self._pending_bytes += len(data)
        self._tracker.add(entry_id)
        self._idle.clear()
        if self._change_task is not None:
            self._held.append(pending)
        else:
            self._send(pending, self._tracker.write_set(entry_id))
        return future

    def _send(self, pending: _PendingAdd, indices: list[int]) -> None:
        pool = self._context.pool
        for index in indices:
            bookie_id = self._ensemble[index]
            reply = pool.get(bookie_id).add(self.ledger_id, pending.entry_id, pending.data)
            # Run inside the bookie client's settling of the reply (runtime/eager_future.py);
            # _on_reply does not call back into the bookie client.
            call_when_done(reply, lambda f, entry_id=pending.entry_id, index=index, bookie_id=bookie_id:
                           self._on_reply(entry_id, index, bookie_id, f))

    def _on_reply(self, entry_id: int, index: int, bookie_id: str, reply: asyncio.Future[None]) -> None:
        if self._state in (_HandleState.FAILED, _HandleState.CLOSED):
            if not reply.cancelled():
                reply.exception()  # consume it
            return
        if reply.cancelled():
            error: BaseException | None = LedgerError(f"add to {bookie_id} cancelled")
        else:
            error = reply.exception()
        if self._ensemble[index] != bookie_id:
            return  # from a bookie that was replaced meanwhile
        if error is not None and bookie_id in self._failed_bookies:
            return  # a further failure of a bookie already being replaced
        if error is None:
            self._tracker.ack(entry_id, index)
            self._same_bookie_attempts = 0
            self._complete()
            return
        if isinstance(error, LedgerFenced):
            self._fail(LedgerFenced(self.ledger_id))
            return
        if isinstance(error, _ENTRY_REJECTED_ERRORS):
            # Not the bookie's fault: another bookie would refuse the entry (or these
            # credentials) as well.
            log.info("bookie refused an entry or the credentials, failing the handle: ledger_id=%d "
                     "bookie_id=%s entry_id=%d error=%s", self.ledger_id, bookie_id, entry_id, error)
            self._fail(error)
            return
        if not isinstance(error, MagnetarError):
            error = LedgerError(f"add to {bookie_id} failed: {error!r}")
        if index not in self._failed_indices:
            level = logging.INFO if isinstance(error, BookieReadOnly) else logging.WARNING
            log.log(level, "bookie failed during add, changing ensemble: ledger_id=%d bookie_id=%s entry_id=%d "
                    "error=%s", self.ledger_id, bookie_id, entry_id, error)
        self._failed_indices.add(index)
        self._failed_bookies.add(bookie_id)
        if not isinstance(error, BookieReadOnly):
            # Chosen last for new ensembles and replacements for a while (a read-only
            # bookie is not chosen anyway).
            self._context.quarantine.add(bookie_id)
        if self._change_task is None:
            self._change_start = self._tracker.last_add_confirmed + 1
            self._change_task = asyncio.get_running_loop().create_task(self._change_ensemble())
            # Owned by the handle: close stops it; a failure _change_ensemble does not
            # turn into the handle's own is logged.
            self._change_task.add_done_callback(functools.partial(log_failure, owner=f"ledger {self.ledger_id}"))

    def _complete(self) -> None:
        done = self._tracker.complete(self._change_start)
        if not done:
            return
        # last_add_confirmed never passes an entry an ack quorum has not acknowledged: it
        # moved to the last entry completed now, every entry up to it in order.
        last_add_confirmed = self._tracker.last_add_confirmed
        assert done[-1] == last_add_confirmed, (done, last_add_confirmed)
        assert next(iter(self._pending)) == done[0], (next(iter(self._pending)), done[0])
        for entry_id in done:
            pending = self._pending.pop(entry_id)
            self._pending_bytes -= len(pending.data)
            self._length_bytes += len(pending.data) - ENTRY_HEADER_SIZE
            if not pending.future.done():
                pending.future.set_result(entry_id)
        # What is still pending lies after it (entries are kept in submission order).
        assert not self._pending or next(iter(self._pending)) == last_add_confirmed + 1, \
            (next(iter(self._pending)), last_add_confirmed)
        self._room.set()
        if not self._pending:
            self._idle.set()

    def _fail(self, error: MagnetarError) -> None:
        if self._state == _HandleState.FAILED:
            return
        log.warning("write handle failed: ledger_id=%d last_add_confirmed=%d error=%s",
                    self.ledger_id, self._tracker.last_add_confirmed, error)
        self._state = _HandleState.FAILED
        self._failure = error
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(error)
        self._pending.clear()
        self._held.clear()
        self._pending_bytes = 0
        self._room.set()
        self._idle.set()

    # --- ensemble change ------------------------------------------------------------------------

    async def _change_ensemble(self) -> None:
        try:
            while self._failed_indices and self._state not in (_HandleState.FAILED, _HandleState.CLOSED):
                indices = sorted(self._failed_indices)
                self._failed_indices = set()
                start = self._tracker.last_add_confirmed + 1
                self._change_start = start
                new_ensemble = await self._replacements(indices)
                if new_ensemble == self._ensemble:
                    # No other bookie to take over: the failed ones are still registered
                    # and writable, so the failure was transient (a broken stream). Send
                    # the pending entries to them again; no metadata change is needed.
                    self._retry_same_bookies(indices)
                    continue
                await self._record_ensemble(start, tuple(new_ensemble))
                replaced = {index: (self._ensemble[index], new_ensemble[index]) for index in indices}
                for index in indices:
                    if new_ensemble[index] == self._ensemble[index]:
                        # Kept in place (no replacement was left for it) while others
                        # were replaced: it is a member again, and its next failure must
                        # start another change. Left in _failed_bookies, that failure was
                        # ignored and the entries it held back never completed (found by
                        # the seeded simulation, tests/sim, seed 108).
                        self._failed_bookies.discard(new_ensemble[index])
                self._ensemble = new_ensemble
                self.ensemble_changes += 1
                log.info("ensemble changed: ledger_id=%d first_entry_id=%d replaced=%s",
                         self.ledger_id, start, replaced)
                held_ids = {pending.entry_id for pending in self._held}
                for entry_id in self._tracker.pending_ids():
                    members = self._tracker.write_set(entry_id)
                    resend = [index for index in indices if index in members]
                    for index in resend:
                        self._tracker.unack(entry_id, index)
                    pending = self._pending.get(entry_id)
                    if pending is not None and resend and entry_id not in held_ids:
                        self._send(pending, resend)
            held, self._held = self._held, []
            for pending in held:
                self._send(pending, self._tracker.write_set(pending.entry_id))
        except (MetadataError, LedgerError) as error:
            # NotEnoughBookies, LedgerFenced and LedgerMetadataConflict are LedgerErrors.
            self._fail(error)
        finally:
            self._change_task = None
            self._change_start = None
            if self._state not in (_HandleState.FAILED, _HandleState.CLOSED):
                self._complete()

    async def _replacements(self, indices: list[int]) -> list[str]:
        """The ensemble with each failed index replaced by a writable bookie not in it.
        If none is left, a failed bookie that is still registered and writable keeps
        its place (after a pause that grows with the attempts, up to a limit)."""
        registry = self._context.registry
        new_ensemble = list(self._ensemble)
        for index in indices:
            try:
                new_ensemble[index] = choose_replacement(registry.writable(), new_ensemble, self._context.rng,
                                                         exclude=self._failed_bookies,
                                                         avoid=self._context.quarantine.members())
                continue
            except NotEnoughBookies:
                bookie_id = self._ensemble[index]
                alive = registry.get(bookie_id)
                self._same_bookie_attempts += 1
                if alive is None or alive.read_only or self._same_bookie_attempts > _SAME_BOOKIE_ATTEMPTS_MAX:
                    raise
            await asyncio.sleep(min(0.05 * self._same_bookie_attempts, 1.0))
        return new_ensemble

    def _retry_same_bookies(self, indices: list[int]) -> None:
        for index in indices:
            self._failed_bookies.discard(self._ensemble[index])
        held_ids = {pending.entry_id for pending in self._held}
        for entry_id in self._tracker.pending_ids():
            members = self._tracker.write_set(entry_id)
            resend = [index for index in indices if index in members and
                      index not in self._tracker.acked_by(entry_id)]
            pending = self._pending.get(entry_id)
            if pending is not None and resend and entry_id not in held_ids:
                self._send(pending, resend)
        log.info("retrying the same bookies (no replacement available): ledger_id=%d bookies=%s attempt=%d",
                 self.ledger_id, [self._ensemble[i] for i in indices], self._same_bookie_attempts)

    async def _record_ensemble(self, start: int, ensemble: tuple[str, ...]) -> None:
        context = self._context
        for _attempt in range(context.config.metadata_attempts_max):
            current = self._versioned
            if current.metadata.state != LedgerState.OPEN:
                raise LedgerFenced(self.ledger_id)
            updated = current.metadata.with_ensemble_from(start, ensemble)
            try:
                self._versioned = await context.write_metadata(updated, current.version)
                return
            except LedgerMetadataConflict:
                self._versioned = await context.read_metadata(self.ledger_id)
        raise LedgerMetadataConflict(f"ledger {self.ledger_id}: ensemble change lost too many races")

    # --- reads of own entries, close ----------------------------------------------------------------

    def reader(self) -> LedgerReader:
        """A reader on the current metadata, for entries up to last_add_confirmed."""
        return LedgerReader(self._versioned.metadata, self._context.pool, self._context.config)

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        if last_entry_id > self._tracker.last_add_confirmed:
            from common.errors import EntryIdOutOfRange

            raise EntryIdOutOfRange(self.ledger_id, last_entry_id, self._tracker.last_add_confirmed)
        return await self.reader().read(first_entry_id, last_entry_id)

    async def close(self) -> VersionedMetadata:
        """Waits for pending adds, then closes the ledger in metadata."""
        if self._state == _HandleState.CLOSED:
            return self._versioned
        if self._state == _HandleState.OPEN:
            self._state = _HandleState.CLOSING
            await self._idle.wait()
        if self._change_task is not None:
            # Nothing is pending (idle, or failed), so an ensemble change has nothing
            # left to move; stop it rather than leave it retrying behind the close.
            await cancel_and_wait(self._change_task)
        if self._state == _HandleState.FAILED and isinstance(self._failure, LedgerFenced):
            raise LedgerFenced(self.ledger_id)
        last_entry_id = self._tracker.last_add_confirmed
        context = self._context
        for _attempt in range(context.config.metadata_attempts_max):
            current = self._versioned
            if current.metadata.state == LedgerState.CLOSED:
                if current.metadata.last_entry_id != last_entry_id:
                    raise LedgerFenced(self.ledger_id)
                break
            if current.metadata.state == LedgerState.IN_RECOVERY:
                raise LedgerFenced(self.ledger_id)
            try:
                self._versioned = await context.write_metadata(
                    current.metadata.closed(last_entry_id, self._length_bytes), current.version)
                break
            except LedgerMetadataConflict:
                self._versioned = await context.read_metadata(self.ledger_id)
        else:
            raise LedgerMetadataConflict(f"ledger {self.ledger_id}: close lost too many races")
        self._state = _HandleState.CLOSED
        log.info("ledger closed: ledger_id=%d last_entry_id=%d length_bytes=%d",
                 self.ledger_id, last_entry_id, self._length_bytes)
        return self._versioned
