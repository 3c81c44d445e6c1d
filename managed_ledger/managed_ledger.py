"""The managed ledger: one topic's ordered list of ledgers, written by its owner.

Theory of operation:
- ``open`` reads the ledger list from etcd, recovers the last ledger (fencing the
  previous owner, whose late writes then fail), learns every ledger's entry count, drops
  empty ones, creates a fresh ledger and records it by compare-and-swap. A lost
  compare-and-swap means another broker opened the topic: this one must not write.
- ``append`` takes the stored payload of one producer frame (one entry, batch or
  not). It returns a future of the entry's Position, and these futures resolve strictly
  in append order, also across a rollover (the new ledger's first entry may be
  confirmed before the old ledger's last): producers receive receipts in order.
- Appends go to the write handle with ``submit_nowait`` (an awaiting submit could not
  keep append order without a task per append), so the handle's own pending limits do
  not hold them back. They are bounded upstream instead: the broker stops reading
  producers' connections when a topic's pending sends reach
  ``pending_sends_per_topic_max`` / ``pending_send_bytes_per_topic_max`` (set to the
  handle's limits) or the broker's bounds are reached (broker/publish_limits.py).
- Rollover happens after an append that fills the current ledger (entries, bytes or
  age). Appends that arrive while the next ledger is created wait in order in a queue;
  the old ledger is closed once its own adds completed. Creating a ledger needs etcd:
  when a rollover the full ledger asked for fails (etcd away, docs/architecture.md
  "Metadata outages"), it is deferred rather than failing the appends: the queued ones
  go to the current ledger, which is healthy and keeps taking appends past its size
  thresholds, and the rollover is tried again after ``ROLL_RETRY_S`` doubling to
  ``ROLL_RETRY_S_MAX``. That overrun is bounded by the outage: past the lease's fence
  the broker closes its topics. A rollover after a write failure (no healthy ledger to
  go on with) is retried a few times and then fails the appends, as before.
- A write failure that is not fencing rolls over to a new ledger, and the appends in
  flight on the failed one go to the new ledger first, in order, ahead of those
  queued meanwhile (as Pulsar's managed ledger re-sends its pending adds): failing
  them while later appends went on to the new ledger would store a producer's later
  messages before an earlier one, which its client then sends again after them (the
  hosts harness saw a failover consumer get a producer's message n+1 before n). An
  append is moved on at most ``WRITE_ATTEMPTS_MAX`` times; then it fails together
  with every append behind it (the producer retries, in order). An entry the ledger
  client refuses as
  invalid (too large) fails only its own append, in order: no ledger would take it,
  and rolling over for it would create ledgers without end. Fencing (LedgerFenced, or
  a lost compare-and-swap of the ledger list) means another broker took the topic:
  everything pending fails with TopicFenced and ``on_fenced`` tells the topic to close.
- ``terminate`` and ``close`` stop taking appends first, then wait for the pending
  ones: an append accepted during the wait would be acknowledged past the recorded
  terminated position (and invisible after a reload).
- A rolled-over ledger whose close fails keeps what its handle confirmed (entry count
  and size, as Pulsar's ledgerClosed records them) so reads, trimming and stats see a
  finished ledger rather than one forever closing.
- Reads serve confirmed entries only, from the broker-wide entry cache when present
  (appends are put there as they are confirmed, so tailing subscriptions never touch
  the bookies) and otherwise from the bookies, a ledger at a time; a ledger the
  archive serves (its bookie copy was deleted after archiving, broker/archiver.py)
  is read from the archive instead, the same entry bytes at the same positions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable, Generator, Protocol, Sequence

from managed_ledger.managed_ledger_info import PURPOSE_LEDGER, LedgerInfo, ManagedLedgerInfo, ownership_tags
from common.position import ENTRIES_PER_LEDGER_MAX, ManagedEntry, Position, entries_between, normalize
from common.topic_name import TopicName
from ledger.client import LedgerClient
from runtime.eager_future import call_when_done, new_eager_future
from common.entry import ENTRY_HEADER_SIZE
from common.entry_cache import EntryCache
from common.errors import (
    ConfigError,
    EntryTooLarge,
    InvalidArgument,
    LedgerError,
    LedgerFenced,
    MagnetarError,
    MetadataError,
    MetadataKeyExists,
    MetadataUnavailable,
    MetadataVersionConflict,
    NoSuchLedger,
    PersistenceError,
    TopicFenced,
    TopicNotFound,
    TopicTerminated,
)
from runtime.tasks import log_failure
from ledger.handle import WriteHandle
from ledger.reader import LedgerReader
from metadata import keys
from metadata.store import Compare, MetadataStore, Put

log = logging.getLogger(__name__)

# Errors from WriteHandle.submit_nowait that blame the entry, not the ledger.
_INVALID_ENTRY_ERRORS = (InvalidArgument, EntryTooLarge)
# Entries asked of the bookies in one read call when the cache misses a run of them
# (the ledger client splits it into read_batch_entries_max calls per bookie anyway);
# within it, a run also stops at the read's byte budget, estimated from entry sizes.
_MISS_RUN_ENTRIES_MAX = 500
# A deferred rollover (see the module docstring) is tried again after this, doubling up
# to the maximum: a second lets a short etcd restart pass with one or two tries, and
# each try holds new appends back only as long as creating a ledger takes to fail.
ROLL_RETRY_S = 1.0
ROLL_RETRY_S_MAX = 8.0
# A read ahead brings in at most this share of the entry cache (by the mean size of the
# entries of the read before it).
READ_AHEAD_CACHE_SHARE = 1 / 8
# Attempts at creating a ledger when the current one failed (no ledger to go on with).
_ROLL_ATTEMPTS_MAX = 5
# Ledgers an append may be tried on after write failures (its first and two more):
# each is a new ledger on a new ensemble, so a third failure in a row means the
# bookies or etcd are away for longer than a retry is worth; the producer's own send
# timeout (30 s by default) bounds the wait in any case.
WRITE_ATTEMPTS_MAX = 3
# Record writes with an unknown outcome remembered until one is answered (_write_info).
UNANSWERED_WRITES_MAX = 64


@dataclass(frozen=True)
class ManagedLedgerConfig:
    ensemble_size: int = 2
    write_quorum_size: int = 2
    ack_quorum_size: int = 2
    # Roll over to a new ledger past any of these (Pulsar's defaults: 50,000 entries,
    # 2 GiB, 4 hours).
    ledger_entries_max: int = 50_000
    ledger_bytes_max: int = 2 * 1024 * 1024 * 1024
    ledger_age_s_max: float = 4 * 3600.0
    # Readers of closed ledgers kept open per managed ledger.
    readers_max: int = 16
    # Reads ahead of a catch-up reader (``_read_ahead``) in flight at once per managed
    # ledger (several subscriptions may catch up in different places); 0: none.
    read_aheads_max: int = 2
    # False: no ledger is created when the managed ledger opens, only at the first
    # append (broker flag --lazy-ledgers; see ``ManagedLedger.open``).
    ledger_on_open: bool = True

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise ConfigError("managed ledger quorums must satisfy E >= Qw >= Qa >= 1")
        if self.ledger_entries_max < 1 or self.ledger_bytes_max < 1024 or self.ledger_age_s_max <= 0:
            raise ConfigError("managed ledger rollover thresholds must be positive")
        if not 0 <= self.read_aheads_max <= 16:
            raise ConfigError("read_aheads_max must be in [0, 16]")
        if self.ledger_entries_max > ENTRIES_PER_LEDGER_MAX:
            raise ConfigError(f"ledger_entries_max must be at most {ENTRIES_PER_LEDGER_MAX} (a cursor's ack "
                              "bitmap covers that many entries of one ledger)")


class ArchivedLedgers(Protocol):
    """The topic's archive, as reads need it (broker/topic_archive.py's TopicArchive)."""

    def serves(self, ledger_id: int) -> bool:
        """True when the ledger is read from the archive (the bookies dropped it)."""

    async def read(self, ledger_id: int, first: int, last: int, bytes_max: int) -> list[ManagedEntry]:
        """Entries first..last (at most about bytes_max, at least one)."""


@dataclass(slots=True)
class _ReadAhead:
    """Entries first..last of a ledger being read from the bookies into the entry cache
    before a reader asks for them."""

    ledger_id: int
    first: int
    last: int
    task: asyncio.Task[None]


def _consume_outcome(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class _Append:
    __slots__ = ("payload", "future", "ledger_id", "add_future", "refused", "appended_at", "submitted_at",
                 "attempts")

    def __init__(self, payload: bytes, future: asyncio.Future[Position]) -> None:
        self.payload = payload
        self.future = future
        # time.perf_counter() at append and at submit to the write handle (stage timing).
        self.appended_at = time.perf_counter()
        self.submitted_at = self.appended_at
        self.ledger_id = -1
        self.add_future: asyncio.Future[int] | None = None
        # The ledger client refused the entry itself (the ledger is fine).
        self.refused = False
        # Ledgers it was submitted to (more than one after write failures).
        self.attempts = 0


class ManagedLedger:
    def __init__(self, topic: TopicName, store: MetadataStore, ledger_client: LedgerClient, cache: EntryCache,
                 config: ManagedLedgerConfig, *, clock: Callable[[], float] = time.monotonic,
                 archive: ArchivedLedgers | None = None) -> None:
        self.topic = topic
        self.name = str(topic)
        self._store = store
        self._client = ledger_client
        self._cache = cache
        self.config = config
        self._clock = clock
        self.archive = archive
        self._key = keys.managed_ledger(topic.key_path)
        self._info = ManagedLedgerInfo()
        self._version = 0
        self._ledgers: collections.OrderedDict[int, LedgerInfo] = collections.OrderedDict()
        self._handle: WriteHandle | None = None
        self._handle_opened_at = 0.0
        self._handle_entries = 0
        self._handle_bytes = 0
        self._queued: collections.deque[_Append] = collections.deque()    # waiting for a ledger
        self._inflight: collections.deque[_Append] = collections.deque()  # submitted, in order
        self._rolling: asyncio.Task[None] | None = None
        # A rollover that failed while the current ledger was healthy waits until then.
        self._roll_deferred_until = 0.0
        self._roll_failures = 0
        self.rollovers_deferred = 0
        self._closing_handles: set[asyncio.Task[None]] = set()
        # The current handle and those of rolled-over ledgers still closing.
        self._open_handles: dict[int, WriteHandle] = {}
        self._readers: collections.OrderedDict[int, LedgerReader] = collections.OrderedDict()
        # Reads ahead under way (at most config.read_aheads_max), owned here: cancelled
        # at close.
        self._read_aheads: list[_ReadAhead] = []
        self.read_ahead_entries = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._metadata_lock = asyncio.Lock()
        # The records written since the last answered write whose replies never came
        # (see _write_info): all expected the same version, so at most one was applied.
        # Bounded: past it the oldest is forgotten (at worst a needless fence).
        self._unanswered: collections.deque[bytes] = collections.deque(maxlen=UNANSWERED_WRITES_MAX)
        self.last_confirmed = Position(-1, -1)
        self.fenced_error: MagnetarError | None = None
        self.closed = False
        # Set before termination or closing waits for pending appends: no new ones.
        self._terminating = False
        self._closing = False
        self._termination: asyncio.Task[Position] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self.on_fenced: Callable[[MagnetarError], None] | None = None
        self.entries_added = 0
        self.bytes_added = 0
        # Stage histograms of the broker (broker/metrics.py BROKER_STAGES), or None.
        self.stages = getattr(ledger_client, "stages", None)
        # time.perf_counter() when last_confirmed last moved: dispatchers time how long
        # the newest entry took from confirmed to sent (the "dispatch" stage).
        self.last_confirmed_at = 0.0

    def _log_failure(self, task: asyncio.Task) -> None:
        """Done-callback of the managed ledger's own tasks: a shared task's callers get
        its outcome through shield, but every caller may have gone away before it
        ended, so its failure is logged (and retrieved) here."""
        log_failure(task, owner=f"managed ledger {self.name}")

    # --- opening ----------------------------------------------------------------------

    async def open(self, *, create_if_missing: bool) -> None:
        """Learns the ledgers (recovering any left open), then starts a new ledger.
        With ``config.ledger_on_open`` False no ledger is created here: the first append
        creates one (``append`` queues while it is made), so an idle topic holds no open
        ledger, and a bundle of idle topics taken over after a crash has none to
        recover. The record is still claimed — written once under its version, by the
        recovery's own write or an unchanged one — so the previous owner is fenced as
        before: its next write of the ledger list fails."""
        record = await self._store.get(self._key)
        created = False
        if record is None:
            if not create_if_missing:
                raise TopicNotFound(f"topic {self.name} does not exist")
            try:
                self._info, self._version = await self.create_record(self._store, self.topic)
                created = True
            except MetadataKeyExists:
                return await self.open(create_if_missing=False)
        else:
            self._info = ManagedLedgerInfo.decode(record.value)
            self._version = record.version
        written = await self._learn_ledgers()
        if self._info.terminated_position is not None:
            self.last_confirmed = self._info.terminated_position
        elif self.config.ledger_on_open:
            await self._start_new_ledger()
        elif not (created or written):
            await self._write_info()
        # Debug: the broker's "topic loaded" line says it (a bundle's load logged both).
        log.debug("managed ledger opened: topic=%s ledgers=%d last_confirmed=%s",
                  self.name, len(self._ledgers), self.last_confirmed)

    @staticmethod
    async def create_record(store: MetadataStore, topic: TopicName) -> tuple[ManagedLedgerInfo, int]:
        """Creates a topic's empty managed-ledger record (the topic then exists);
        MetadataKeyExists if it already does. Returns the record and its version."""
        info = ManagedLedgerInfo(created_ms=int(time.time() * 1000))
        version = await store.create(keys.managed_ledger(topic.key_path), info.encode())
        return info, version

    async def _learn_ledgers(self) -> bool:
        """Recovers unclosed ledgers, learns entry counts, drops empty ledgers; True if
        it wrote the record."""
        changed = False
        kept: list[LedgerInfo] = []
        for info in self._info.ledgers:
            if not info.known:
                try:
                    reader = await self._client.open_ledger(info.ledger_id, recovery=True)
                except NoSuchLedger:
                    log.error("ledger listed by a managed ledger is gone: topic=%s ledger_id=%d",
                              self.name, info.ledger_id)
                    changed = True
                    continue
                info.entries = reader.metadata.last_entry_id + 1
                info.size_bytes = reader.metadata.length_bytes
                info.closed_ms = int(time.time() * 1000)   # recovery closed it just now
                changed = True
            if info.entries == 0:
                await self._delete_ledger_quietly(info.ledger_id)
                changed = True
                continue
            kept.append(info)
        self._info.ledgers = kept
        if changed:
            await self._write_info()
        self._ledgers = collections.OrderedDict((i.ledger_id, i) for i in kept)
        if kept:
            last = kept[-1]
            self.last_confirmed = Position(last.ledger_id, last.entries - 1)
        return changed

    async def _delete_ledger_quietly(self, ledger_id: int) -> None:
        try:
            await self._client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass

    async def _write_info(self, guards: Sequence[Compare] = ()) -> None:
        """Compare-and-swap of the ledger list; a lost race fences this owner.

        A write whose reply was lost (etcd slow or away: MetadataUnavailable) may still
        have been applied, and then the next write finds a newer version than ours. That
        is not a take-over: when the record holds exactly what our unanswered write
        wrote — any of the writes left unanswered since the last answered one, as a
        caller cancelled again while the next write was on the way leaves two —, its
        version is adopted and the write goes on.

        ``guards`` are further conditions of the same transaction: a write that records
        a ledger also requires the ledger's metadata to be as its handle knows it, so a
        ledger the ledger collector deleted meanwhile is never recorded
        (managed_ledger/ledger_gc.py, the race analysis). A failed guard, with the record as we
        left it, raises MetadataVersionConflict and does not fence."""
        async with self._metadata_lock:
            encoded = self._info.encode()
            if await self._swap_info(encoded, guards):
                return
            current = await self._store.get(self._key)
            if current is not None and current.value in self._unanswered:
                log.info("managed ledger record: a write whose reply was lost had been applied: topic=%s "
                         "version=%d", self.name, current.version)
                self._unanswered.clear()
                self._version = current.version
                if await self._swap_info(encoded, guards):
                    return
                current = await self._store.get(self._key)
            if guards and current is not None and current.version == self._version:
                raise MetadataVersionConflict(", ".join(guard.key for guard in guards))
            error = TopicFenced(f"topic {self.name} was taken over (managed ledger changed)")
            self._fence(error)
            raise error

    async def _swap_info(self, encoded: bytes, guards: Sequence[Compare] = ()) -> bool:
        """One compare-and-swap of the record: False on a version conflict (of the record
        or of a guard). A write whose outcome is unknown — its reply lost
        (MetadataUnavailable) or its caller cancelled while it was on the way (a client
        that hung up mid-request) — is raised, its record remembered as unanswered."""
        try:
            if guards:
                revision = await self._store.transaction([Compare(self._key, self._version), *guards],
                                                         [Put(self._key, encoded)])
                if revision is None:
                    return False
            else:
                revision = await self._store.compare_and_set(self._key, encoded, expected_version=self._version)
        except (MetadataUnavailable, asyncio.CancelledError):
            self._unanswered.append(encoded)
            raise
        except MetadataVersionConflict:
            return False
        self._version = revision
        self._unanswered.clear()
        return True

    @property
    def properties(self) -> dict[str, str]:
        """The topic's free-form properties (a copy): topic epoch, deduplication
        snapshot and the like, kept in the managed-ledger record."""
        return dict(self._info.properties)

    async def set_properties(self, updates: dict[str, str | None], *, recording: Sequence[int] = ()) -> None:
        """Sets (None: removes) properties, by compare-and-swap of the record; a lost
        race fences this owner (TopicFenced), as for any change of the record.

        ``recording``: ledgers the new properties name (a compacted ledger). The write
        then also requires each one's metadata to exist at the version read just
        before, in the same transaction, so a ledger the ledger collector deleted is
        never recorded (managed_ledger/ledger_gc.py, the race analysis): NoSuchLedger if one is
        gone, MetadataVersionConflict if one changed meanwhile."""
        guards: list[Compare] = []
        for ledger_id in recording:
            record = await self._store.get(keys.ledger(ledger_id))
            if record is None:
                raise NoSuchLedger(ledger_id)
            guards.append(Compare(keys.ledger(ledger_id), record.version))
        previous = dict(self._info.properties)
        for key, value in updates.items():
            if value is None:
                self._info.properties.pop(key, None)
            else:
                self._info.properties[key] = value
        try:
            await self._write_info(guards)
        except BaseException:
            self._info.properties = previous
            raise

    async def _start_new_ledger(self) -> None:
        config = self.config
        handle = await self._client.create_ledger(
            config.ensemble_size, config.write_quorum_size, config.ack_quorum_size,
            custom=ownership_tags(self.name, PURPOSE_LEDGER))
        info = LedgerInfo(handle.ledger_id, created_ms=int(time.time() * 1000))
        self._info.ledgers.append(info)
        try:
            # Recorded only if its metadata is still there as created (not collected).
            await self._write_info([Compare(keys.ledger(handle.ledger_id), handle.metadata_version)])
        except MagnetarError:
            self._info.ledgers.pop()
            await self._delete_ledger_quietly(handle.ledger_id)
            raise
        self._ledgers[info.ledger_id] = info
        self._handle = handle
        self._open_handles[handle.ledger_id] = handle
        self._handle_opened_at = self._clock()
        self._handle_entries = 0
        self._handle_bytes = 0
        log.info("managed ledger rolled to a new ledger: topic=%s ledger_id=%d", self.name, handle.ledger_id)

    # --- appends --------------------------------------------------------------------------

    @property
    def terminated(self) -> bool:
        return self._info.terminated_position is not None

    def append(self, payload: bytes) -> asyncio.Future[Position]:
        """Stores one entry; the future resolves with its position, in append order
        (an EagerFuture: the connection writes the receipt in the turn it is stored)."""
        future: asyncio.Future[Position] = new_eager_future()
        if self.fenced_error is not None:
            future.set_exception(self.fenced_error)
            return future
        if self.closed or self._closing:
            future.set_exception(TopicFenced(f"topic {self.name} is closed"))
            return future
        if self.terminated or self._terminating:
            future.set_exception(TopicTerminated(f"topic {self.name} is terminated"))
            return future
        append = _Append(payload, future)
        if self._handle is None or self._rolling is not None:
            self._queued.append(append)
            self._ensure_rolling()
        else:
            self._submit(append)
        return future

    def _submit(self, append: _Append) -> None:
        handle = self._handle
        assert handle is not None
        try:
            add_future = handle.submit_nowait(append.payload)
        except _INVALID_ENTRY_ERRORS as error:
            if handle.failure is not None:
                # The handle failed (a bookie refused an earlier entry) and repeats
                # that error to every submit: a write failure, not this entry's fault.
                self._on_submit_failure(handle, append, error)
                return
            log.info("entry refused by the ledger client: topic=%s size_bytes=%d error=%s",
                     self.name, len(append.payload), error)
            # Fail it in its place among the in-flight appends: futures resolve in order.
            refused: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            refused.set_exception(error)
            append.ledger_id = handle.ledger_id
            append.add_future = refused
            append.refused = True
            self._inflight.append(append)
            self._on_add_done(refused)
            return
        except MagnetarError as error:
            self._on_submit_failure(handle, append, error)
            return
        append.ledger_id = handle.ledger_id
        append.add_future = add_future
        append.attempts += 1
        self._inflight.append(append)
        # Inside the handle's completion of the entry: _on_add_done does not call back
        # into the handle.
        call_when_done(add_future, self._on_add_done)
        stages = self.stages
        if stages is not None:
            append.submitted_at = now = time.perf_counter()
            stages.observe("managed_ledger_queue", now - append.appended_at)
        self._handle_entries += 1
        self._handle_bytes += len(append.payload)
        if self._ledger_full() and self._clock() >= self._roll_deferred_until:
            self._ensure_rolling()

    def _on_submit_failure(self, handle: WriteHandle, append: _Append, error: MagnetarError) -> None:
        """The handle cannot take entries any more: the append waits for the next ledger."""
        self._on_write_failure(handle, error)
        self._queued.append(append)
        self._ensure_rolling()

    def _ledger_full(self) -> bool:
        config = self.config
        return (self._handle_entries >= config.ledger_entries_max
                or self._handle_bytes >= config.ledger_bytes_max
                or self._clock() - self._handle_opened_at >= config.ledger_age_s_max)

    def _on_add_done(self, _future: asyncio.Future[int]) -> None:
        """Completes appends in order from the head of the in-flight queue."""
        confirmed = False
        # The completed appends' outcomes, in order (settled by _settle).
        outcomes: list[tuple[asyncio.Future[Position], Position | MagnetarError]] = []
        stages = self.stages
        now = time.perf_counter()
        while self._inflight:
            head = self._inflight[0]
            assert head.add_future is not None
            if not head.add_future.done():
                break
            self._inflight.popleft()
            error = head.add_future.exception() if not head.add_future.cancelled() else LedgerError("cancelled")
            if error is None:
                position = Position(head.ledger_id, head.add_future.result())
                assert position > self.last_confirmed, (position, self.last_confirmed)
                self.last_confirmed = position
                self._cache.put(position.ledger_id, position.entry_id, head.payload)
                self.entries_added += 1
                self.bytes_added += len(head.payload)
                confirmed = True
                outcomes.append((head.future, position))
                if stages is not None:
                    stages.observe("ledger_add", now - head.submitted_at)
            else:
                # What completed before ``head`` is settled first, whatever comes of it.
                self._settle(outcomes, confirmed, now)
                confirmed = False
                outcomes = []
                if self._retry_on_next_ledger(head, error):
                    # ``head`` and the rest of its ledger's in-flight appends are queued
                    # for the next ledger; nothing behind them can complete first.
                    if self._handle is not None and self._handle.ledger_id == head.ledger_id:
                        self._on_write_failure(self._handle, error)
                    else:
                        self._ensure_rolling()
                        while self._queued and self._rolling is None and self._handle is not None:
                            self._submit(self._queued.popleft())
                    return
                outcomes.append((head.future, self._classify(error)))
                # Settled before the failure is handled: a fence fails the appends
                # behind this one, whose errors must not overtake it.
                self._settle(outcomes, confirmed, now)
                confirmed = False
                outcomes = []
                if not head.refused and self._handle is not None and self._handle.ledger_id == head.ledger_id:
                    self._on_write_failure(self._handle, error)
        self._settle(outcomes, confirmed, now)

    def _retry_on_next_ledger(self, head: _Append, error: BaseException) -> bool:
        """After ``head`` (just taken off the in-flight queue) failed: if the failure is
        its current ledger's (not a fence, not the entry refused) and it may be tried
        again, moves it and every append still in flight on that ledger, in order, to
        the front of the queue for the next ledger, and returns True. Past
        ``WRITE_ATTEMPTS_MAX`` every append in flight and queued fails instead, in
        order (so none behind the failed one is stored before it), and it returns False
        for the caller to fail ``head``."""
        # The failed ledger's handle (the current one, or already replaced: a submit
        # may have met its failure first and started the rollover).
        failed = self._open_handles.get(head.ledger_id)
        if head.refused or isinstance(error, (LedgerFenced, TopicFenced) + _INVALID_ENTRY_ERRORS) or failed is None \
                or failed.failure is None or self.fenced_error is not None:
            return False
        if any(append.ledger_id != head.ledger_id for append in self._inflight):
            return False   # a later ledger took appends already: retried ones would come after them
        if head.attempts >= WRITE_ATTEMPTS_MAX:
            failure = self._classify(error)
            behind = list(self._inflight) + list(self._queued)
            self._inflight.clear()
            self._queued.clear()
            log.warning("appends failed after %d ledgers: topic=%s count=%d error=%s", head.attempts, self.name,
                        len(behind) + 1, error)
            self._settle([(head.future, failure)] + [(append.future, failure) for append in behind], False,
                         time.perf_counter())
            return False
        retried = [head] + list(self._inflight)
        self._inflight.clear()
        for append in reversed(retried):
            if append.add_future is not None:
                # Its outcome on the failed ledger no longer matters (retrieved, so
                # asyncio does not report it as never retrieved).
                append.add_future.add_done_callback(_consume_outcome)
            append.add_future = None
            self._queued.appendleft(append)
        log.info("appends moved to the next ledger after a write failure: topic=%s ledger_id=%d count=%d",
                 self.name, head.ledger_id, len(retried))
        return True

    def _settle(self, outcomes: list[tuple[asyncio.Future[Position], Position | MagnetarError]], confirmed: bool,
                now: float) -> None:
        """Wakes the readers when entries were confirmed, then settles the appends in
        order. Both are eager futures (runtime/eager_future.py): a caught-up dispatcher
        sends the entries here, and then the connections write the receipts, in this
        turn; the dispatch does not wait behind the receipts of its own entries (step 7
        of docs/performance.md). The handle completes entries one by one, so a reply
        that confirms several wakes the readers once per entry; a dispatcher then sends
        one entry per wake, as many frames as one wake for all would write."""
        if confirmed:
            self.last_confirmed_at = now
            self._wake_waiters()
        for future, outcome in outcomes:
            if future.done():
                continue
            if isinstance(outcome, Position):
                future.set_result(outcome)
            else:
                future.set_exception(outcome)

    def _classify(self, error: BaseException) -> MagnetarError:
        if isinstance(error, LedgerFenced) or isinstance(error, TopicFenced):
            return self.fenced_error or TopicFenced(f"topic {self.name} was taken over")
        if isinstance(error, MagnetarError) and not isinstance(error, LedgerError):
            return error
        return PersistenceError(f"storing to topic {self.name} failed: {error}")

    def _on_write_failure(self, handle: WriteHandle, error: BaseException) -> None:
        if isinstance(error, LedgerFenced):
            self._fence(TopicFenced(f"topic {self.name}: ledger {handle.ledger_id} fenced by another broker"))
            return
        if self._handle is handle:
            log.warning("managed ledger write failed, rolling over: topic=%s ledger_id=%d error=%s",
                        self.name, handle.ledger_id, error)
            self._handle = None
            self._close_handle_later(handle)
            self._ensure_rolling()

    def _ensure_rolling(self) -> None:
        # While terminating or closing, a new ledger is only worth creating for appends
        # accepted before (queued ones); nothing else will be written to it.
        stopping = self._terminating or self._closing
        if self._rolling is None and self.fenced_error is None and not self.closed and \
                (self._queued or not stopping):
            self._rolling = asyncio.get_running_loop().create_task(self._roll())
            # Owned here (close and terminate wait for it through _drain); a failure
            # other than the ones _roll hands to the appends is logged.
            self._rolling.add_done_callback(self._log_failure)

    async def _roll(self) -> None:
        old = self._handle
        # A healthy current ledger (a rollover because it is full, not because it
        # failed) can take the appends if no new ledger can be made now: one try.
        attempts = 1 if old is not None else _ROLL_ATTEMPTS_MAX
        try:
            for attempt in range(attempts):
                try:
                    await self._start_new_ledger()
                    break
                except TopicFenced:
                    raise
                except (LedgerError, MetadataError) as error:
                    log.warning("creating a ledger failed: topic=%s attempt=%d error=%s", self.name, attempt, error)
                    if attempt == attempts - 1:
                        raise
                    await asyncio.sleep(0.2 * (attempt + 1))
        except MagnetarError as error:
            if self._defer_roll(old, error):
                pass   # the queued appends go to the current ledger, below
            else:
                failure = self._classify(error)
                while self._queued:
                    append = self._queued.popleft()
                    if not append.future.done():
                        append.future.set_exception(failure)
                return
        else:
            self._roll_failures = 0
            self._roll_deferred_until = 0.0
        finally:
            self._rolling = None
        if old is not None and old is not self._handle:
            self._close_handle_later(old)
        while self._queued and self._rolling is None and self._handle is not None:
            self._submit(self._queued.popleft())

    def _defer_roll(self, old: WriteHandle | None, error: MagnetarError) -> bool:
        """After a failed rollover: True if the current ledger goes on taking appends
        (it is the one the rollover started from, and healthy) and the rollover is
        tried again later; False if the appends must fail."""
        if old is None or self._handle is not old or old.failure is not None or self.fenced_error is not None \
                or isinstance(error, TopicFenced) or self.closed:
            return False
        self._roll_failures += 1
        self.rollovers_deferred += 1
        delay_s = min(ROLL_RETRY_S * 2 ** (self._roll_failures - 1), ROLL_RETRY_S_MAX)
        self._roll_deferred_until = self._clock() + delay_s
        log.warning("rollover deferred, the current ledger takes the appends meanwhile: topic=%s ledger_id=%d "
                    "entries=%d retry_s=%.1f error=%s", self.name, old.ledger_id, self._handle_entries, delay_s, error)
        return True

    async def _close_handle(self, handle: WriteHandle) -> None:
        """Closes a ledger we wrote and records its final size (if we still own it)."""
        try:
            versioned = await handle.close()
            entries = versioned.metadata.last_entry_id + 1
            size_bytes = versioned.metadata.length_bytes
        except MagnetarError as error:
            # What the handle confirmed is final (no add completes after a failed close)
            # and is all a producer was told was stored; record that, as Pulsar's
            # ledgerClosed does, so the ledger stops counting as open (trimming skips
            # open ledgers, stats report them as unknown).
            entries = handle.last_add_confirmed + 1
            size_bytes = handle.length_bytes
            log.warning("closing a ledger failed, keeping what it confirmed: topic=%s ledger_id=%d entries=%d "
                        "error=%s", self.name, handle.ledger_id, entries, error)
        assert entries >= 0, entries
        info = self._ledgers.get(handle.ledger_id)
        if info is not None:
            info.entries = entries
            info.size_bytes = size_bytes
            info.closed_ms = int(time.time() * 1000)
        self._open_handles.pop(handle.ledger_id, None)
        if info is not None and self.fenced_error is None:
            try:
                await self._write_info()
            except MagnetarError:
                pass

    def _close_handle_later(self, handle: WriteHandle) -> None:
        async def close() -> None:
            await self._close_handle(handle)

        task = asyncio.get_running_loop().create_task(close())
        self._closing_handles.add(task)   # awaited by _close
        task.add_done_callback(self._closing_handles.discard)
        task.add_done_callback(self._log_failure)

    def _fence(self, error: MagnetarError) -> None:
        if self.fenced_error is not None:
            return
        self.fenced_error = error
        log.warning("managed ledger fenced: topic=%s error=%s", self.name, error)
        for append in list(self._queued) + list(self._inflight):
            if not append.future.done():
                append.future.set_exception(error)
        self._queued.clear()
        self._wake_waiters()
        if self.on_fenced is not None:
            self.on_fenced(error)

    # --- reads ------------------------------------------------------------------------------

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def wait_for_entries(self) -> asyncio.Future[None]:
        """Resolves when new entries are confirmed (or the ledger closes). An
        EagerFuture: a dispatcher's ``call_when_done`` runs inside ``_settle``, before
        the receipts of the same entries are written."""
        waiter: asyncio.Future[None] = new_eager_future()
        if self.closed or self.fenced_error is not None:
            waiter.set_result(None)
        else:
            self._waiters.append(waiter)
        return waiter

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    def ledger_infos(self) -> list[LedgerInfo]:
        return list(self._ledgers.values())

    def last_entry_of(self, ledger_id: int) -> int:
        """Last confirmed entry id of a ledger of this topic (-1: none)."""
        handle = self._open_handles.get(ledger_id)
        if handle is not None:
            if self.last_confirmed.ledger_id == ledger_id:
                return self.last_confirmed.entry_id
            if self.last_confirmed.ledger_id > ledger_id:
                # Appends complete in order: once a later ledger has a confirmed entry,
                # this one's confirmed entries are final.
                return handle.last_add_confirmed
            return -1
        info = self._ledgers.get(ledger_id)
        return info.entries - 1 if info is not None and info.known else -1

    def _may_grow(self, ledger_id: int) -> bool:
        """True for the current ledger, and for a rolled-over one whose in-flight
        appends have not all completed (nothing after it is confirmed yet)."""
        if self._handle is not None and self._handle.ledger_id == ledger_id:
            return True
        return ledger_id in self._open_handles and self.last_confirmed.ledger_id <= ledger_id

    def normalize(self, position: Position) -> Position:
        """The same place in the topic, moved off the end of a finished ledger (or off a
        deleted one) to the first entry of the next ledger holding one. Positions in the
        current ledger are left as they are, written or not."""
        return normalize(position, self._ledgers, self.last_entry_of, self._may_grow)

    def next_position(self, position: Position) -> Position:
        """The position right after ``position`` (possibly not written yet)."""
        return self.normalize(Position(position.ledger_id, position.entry_id + 1))

    @property
    def first_position(self) -> Position:
        """The oldest position still stored (or the next to be written, if none is)."""
        return self.normalize(Position(-1, 0))

    @property
    def end_position(self) -> Position:
        """The position right after the last confirmed entry: where a reader starting
        at the end (MessageId.latest) reads next."""
        if self.last_confirmed.entry_id >= 0:
            return self.next_position(self.last_confirmed)
        return self.first_position

    def entries_between(self, after: Position, upto: Position) -> int:
        """Entries in (after, upto] of this topic."""
        return entries_between(self._ledgers, self.last_entry_of, after, upto)

    def _walk(self, start: Position, count_max: int, bytes_max: int) -> Generator[
            tuple[int, int, int, int], list[ManagedEntry] | None, list[ManagedEntry]]:
        """The ranges a read from ``start`` covers, possibly spanning ledgers: yields
        (ledger_id, first, last, bytes left), is sent the entries read of each, and
        returns them all (sans-IO: ``read`` sends what it awaited, ``read_cached`` what the
        cache holds). Stops at the bounds, at the last confirmed entry, or at an empty range."""
        assert count_max > 0
        entries: list[ManagedEntry] = []
        size = 0
        position = self.normalize(start)
        while len(entries) < count_max and size < bytes_max and position <= self.last_confirmed:
            ledger_id = position.ledger_id
            last = self.last_entry_of(ledger_id)
            if position.entry_id > last:
                break  # the current ledger, nothing confirmed past here yet
            end = min(last, position.entry_id + (count_max - len(entries)) - 1)
            chunk = yield ledger_id, position.entry_id, end, bytes_max - size
            if not chunk:
                break
            entries.extend(chunk)
            size += sum(len(e.data) for e in chunk)
            position = self.next_position(chunk[-1].position)
        return entries

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        """Confirmed entries from ``start`` on (at most count_max / about bytes_max),
        possibly spanning ledgers. An empty list means nothing is there yet."""
        walk = self._walk(start, count_max, bytes_max)
        try:
            span = next(walk)
            while True:
                span = walk.send(await self._read_ledger(*span))
        except StopIteration as finished:
            return finished.value

    def read_cached(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry] | None:
        """What ``read`` returns, when every entry it would return is in the entry cache
        (the tail a caught-up reader asks for, just confirmed); None when one is not, or
        an archive serves a ledger of the range (then ``read``, which may await)."""
        walk = self._walk(start, count_max, bytes_max)
        try:
            span = next(walk)
            while True:
                chunk = self._cached_range(*span)
                if chunk is None:
                    walk.close()
                    return None
                span = walk.send(chunk)
        except StopIteration as finished:
            return finished.value

    def _cached_range(self, ledger_id: int, first: int, last: int, bytes_max: int) -> list[ManagedEntry] | None:
        """Entries first..last of a ledger (about bytes_max) from the cache; None on a miss
        or for a ledger the archive serves."""
        if self.archive is not None and self.archive.serves(ledger_id):
            return None
        entries: list[ManagedEntry] = []
        size = 0
        for entry_id in range(first, last + 1):
            if size >= bytes_max:
                break
            cached = self._cache.get(ledger_id, entry_id)
            if cached is None:
                return None
            entries.append(ManagedEntry(Position(ledger_id, entry_id), cached))
            size += len(cached)
        return entries

    async def _read_ledger(self, ledger_id: int, first: int, last: int, bytes_max: int) -> list[ManagedEntry]:
        if self.archive is not None and self.archive.serves(ledger_id):
            return await self.archive.read(ledger_id, first, last, bytes_max)
        entries: list[ManagedEntry] = []
        size = 0
        entry_id = first
        awaited_ahead = -1
        while entry_id <= last and size < bytes_max:
            cached = self._cache.get(ledger_id, entry_id)
            if cached is not None:
                entries.append(ManagedEntry(Position(ledger_id, entry_id), cached))
                size += len(cached)
                entry_id += 1
                continue
            ahead = self._read_ahead_covering(ledger_id, entry_id)
            if ahead is not None and awaited_ahead != entry_id:
                # Being read already: wait for that read rather than read it twice
                # (shielded: this reader's cancellation leaves it to the others). If the
                # entry is still missing after it (failed, or evicted), read it here.
                awaited_ahead = entry_id
                try:
                    await asyncio.shield(ahead.task)
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    # The read ahead was cancelled (closing), not this reader.
                continue
            # A run of misses: read it from the bookies in one call per bookie, no longer
            # than the byte budget left is expected to hold.
            run_max = self._miss_run_entries_max(ledger_id, bytes_max - size, size, len(entries))
            miss_end = entry_id
            while miss_end < last and miss_end - entry_id + 1 < run_max and \
                    self._cache.get(ledger_id, miss_end + 1) is None:
                miss_end += 1
            for entry in await self._read_into_cache(ledger_id, entry_id, miss_end):
                entries.append(entry)
                size += len(entry.data)
            entry_id = miss_end + 1
        if entries:
            self._read_ahead(ledger_id, entries[-1].position.entry_id + 1, len(entries), size)
        return entries

    # --- reading ahead of a catch-up reader ---------------------------------------------------

    def _read_ahead_covering(self, ledger_id: int, entry_id: int) -> _ReadAhead | None:
        for ahead in self._read_aheads:
            if ahead.ledger_id == ledger_id and ahead.first <= entry_id <= ahead.last:
                return ahead
        return None

    def _read_ahead(self, ledger_id: int, first: int, count: int, size: int) -> None:
        """After a read of ``count`` entries (``size`` bytes) that ended before ``first``:
        when that entry is confirmed but not in the cache (a reader catching up on a
        backlog the cache no longer holds), starts reading the next run from the bookies
        into the cache: as many entries as the read returned, but never more than
        ``READ_AHEAD_CACHE_SHARE`` of the cache by their mean size, so what it brings in
        does not push out what readers were just given and will read again. The reader's
        next round then finds them there, or awaits that read, instead of sending its
        entries and only then asking the bookies: the bookies' read overlaps the
        dispatch. A tailing reader (nothing confirmed past ``first``) and one reading
        from the cache start nothing; at most ``read_aheads_max`` are under way."""
        if len(self._read_aheads) >= self.config.read_aheads_max or self._closing or self.closed:
            return
        bytes_max = self._cache.capacity_bytes * READ_AHEAD_CACHE_SHARE
        if size > bytes_max:
            count = int(count * bytes_max / size)
            if count < 1:
                return   # a cache too small for one more entry: nothing to gain
        last = min(self.last_entry_of(ledger_id), first + count - 1)
        if first > last or self._cache.contains(ledger_id, first) or \
                self._read_ahead_covering(ledger_id, first) is not None:
            return
        task = asyncio.get_running_loop().create_task(self._read_ahead_run(ledger_id, first, last),
                                                      name=f"read ahead {self.name} {ledger_id}:{first}-{last}")
        ahead = _ReadAhead(ledger_id, first, last, task)
        self._read_aheads.append(ahead)
        task.add_done_callback(lambda _task: self._read_aheads.remove(ahead))

    async def _read_ahead_run(self, ledger_id: int, first: int, last: int) -> None:
        """Reads entries first..last into the cache. A failure is only logged: the reader
        that wants them reads them itself and meets the error there."""
        try:
            read = await self._read_into_cache(ledger_id, first, last)
        except MagnetarError as error:
            log.debug("read ahead failed, left to the reader: topic=%s ledger_id=%d first=%d last=%d error=%s",
                      self.name, ledger_id, first, last, error)
            return
        except Exception:   # noqa: BLE001 - never the reader's failure; logged loudly as a bug
            log.warning("read ahead failed unexpectedly, left to the reader: topic=%s ledger_id=%d first=%d "
                        "last=%d", self.name, ledger_id, first, last, exc_info=True)
            return
        self.read_ahead_entries += len(read)

    async def _read_into_cache(self, ledger_id: int, first: int, last: int) -> list[ManagedEntry]:
        """Entries first..last from the bookies, put in the entry cache as they are
        returned (not if the ledger was trimmed or deleted meanwhile)."""
        reader = await self._reader(ledger_id)
        read = await reader.read(first, last)
        keep = ledger_id in self._ledgers
        entries = []
        for ledger_entry in read:
            data = memoryview(ledger_entry.data)[ENTRY_HEADER_SIZE:]
            if keep:
                self._cache.put(ledger_id, ledger_entry.entry_id, data)
            entries.append(ManagedEntry(Position(ledger_id, ledger_entry.entry_id), data))
        return entries

    def _miss_run_entries_max(self, ledger_id: int, bytes_left: int, seen_bytes: int, seen_count: int) -> int:
        """Entries a run of cache misses may read: the byte budget left over the
        expected entry size (a closed ledger's mean, from its metadata; otherwise the mean
        of the entries this read has seen), at least one. With no size known yet, one
        entry: its size then sizes the next run."""
        assert bytes_left > 0
        info = self._ledgers.get(ledger_id)
        if info is not None and info.known and info.entries > 0:
            entry_bytes = info.size_bytes / info.entries
        elif seen_count > 0:
            entry_bytes = seen_bytes / seen_count
        else:
            return 1
        run_max = int(bytes_left / entry_bytes) if entry_bytes > 0 else _MISS_RUN_ENTRIES_MAX
        return max(1, min(_MISS_RUN_ENTRIES_MAX, run_max))

    async def _reader(self, ledger_id: int) -> LedgerReader:
        handle = self._open_handles.get(ledger_id)
        if handle is not None:
            return handle.reader()
        reader = self._readers.get(ledger_id)
        if reader is None:
            reader = await self._client.open_ledger(ledger_id, recovery=False)
            self._readers[ledger_id] = reader
            while len(self._readers) > self.config.readers_max:
                self._readers.popitem(last=False)
        else:
            self._readers.move_to_end(ledger_id)
        return reader

    # --- termination, closing, deletion ------------------------------------------------------

    async def terminate(self) -> Position:
        """No appends after this; returns the last position. Appends are refused from
        the call on (TopicTerminated); those accepted before complete first, so every
        acknowledged entry is at or before the terminated position. Concurrent calls
        share one termination, which runs as its own task so that a caller going away
        does not leave it half done."""
        if self.terminated:
            assert self._info.terminated_position is not None
            return self._info.terminated_position
        if self._termination is None:
            self._terminating = True
            self._termination = asyncio.get_running_loop().create_task(self._terminate())
            self._termination.add_done_callback(self._log_failure)
        return await asyncio.shield(self._termination)

    async def _terminate(self) -> Position:
        assert self._terminating
        try:
            await self._drain()
            if self.fenced_error is not None:
                raise self.fenced_error
            assert not self._inflight, len(self._inflight)
            position = self.last_confirmed
            self._info.terminated_position = position
            try:
                await self._write_info()
            except MagnetarError:
                self._info.terminated_position = None
                raise
        except BaseException:
            # Not terminated after all: appends may go on.
            self._terminating = False
            self._termination = None
            raise
        assert self.last_confirmed == position, (self.last_confirmed, position)
        handle, self._handle = self._handle, None
        if handle is not None:
            await self._close_handle(handle)
        self._wake_waiters()
        log.info("managed ledger terminated: topic=%s last=%s", self.name, position)
        return position

    async def _drain(self) -> None:
        """Waits for every queued and in-flight append to finish (bounded by the
        ledger client's own add timeouts), and for a rollover in progress."""
        pending: list[asyncio.Future] = [a.future for a in list(self._queued) + list(self._inflight)]
        if self._rolling is not None:
            pending.append(self._rolling)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._rolling is not None:
            # Started by a completion during the wait (a full or failed ledger).
            await asyncio.gather(self._rolling, return_exceptions=True)

    async def close(self) -> None:
        """Stops appends, lets pending ones finish, closes the current ledger. Every
        caller returns once that is done (one close, run as its own task, like
        ``terminate``)."""
        if self._close_task is None:
            self._closing = True
            self._close_task = asyncio.get_running_loop().create_task(self._close())
            self._close_task.add_done_callback(self._log_failure)
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        assert self._closing
        for ahead in list(self._read_aheads):
            ahead.task.cancel()
        if self._termination is not None:
            await asyncio.gather(self._termination, return_exceptions=True)
        await self._drain()
        self.closed = True
        handle, self._handle = self._handle, None
        if handle is not None and self.fenced_error is None:
            await self._close_handle(handle)
        if self._closing_handles:
            await asyncio.gather(*self._closing_handles, return_exceptions=True)
        self._wake_waiters()

    async def delete(self) -> None:
        """Deletes every ledger and the managed ledger's metadata."""
        await self.close()
        for ledger_id in list(self._ledgers):
            await self._delete_ledger_quietly(ledger_id)
        await self._store.delete(self._key)
        self._ledgers.clear()

    # --- side ledgers (the compacted ledger) ---------------------------------------------------

    async def create_side_ledger(self, purpose: str) -> WriteHandle:
        """A ledger of this topic outside its list of ledgers (the compactor's output),
        with the topic's quorums; the caller records, reads and deletes it."""
        config = self.config
        return await self._client.create_ledger(config.ensemble_size, config.write_quorum_size,
                                                config.ack_quorum_size, custom=ownership_tags(self.name, purpose))

    async def open_side_ledger(self, ledger_id: int) -> LedgerReader:
        return await self._client.open_ledger(ledger_id, recovery=False)

    async def delete_side_ledger(self, ledger_id: int) -> None:
        await self._delete_ledger_quietly(ledger_id)

    # --- trimming (retention) ---------------------------------------------------------------

    async def delete_ledgers_before(self, ledger_id: int) -> list[int]:
        """Deletes whole ledgers older than ``ledger_id`` (never one still open: the
        current one, or a rolled-over one whose close is in progress)."""
        doomed = [l for l in self._ledgers if l < ledger_id and l not in self._open_handles]
        if not doomed:
            return []
        self._info.ledgers = [i for i in self._info.ledgers if i.ledger_id not in doomed]
        await self._write_info()
        for doomed_id in doomed:
            self._ledgers.pop(doomed_id, None)
            self._readers.pop(doomed_id, None)
            await self._delete_ledger_quietly(doomed_id)
        log.info("ledgers trimmed: topic=%s ledger_ids=%s", self.name, doomed)
        return doomed

    # --- stats ------------------------------------------------------------------------------------

    @property
    def current_ledger_id(self) -> int:
        return self._handle.ledger_id if self._handle is not None else -1

    @property
    def pending_appends(self) -> int:
        """Appends handed over and not yet confirmed (waiting for a ledger or in flight)."""
        return len(self._queued) + len(self._inflight)

    def number_of_entries(self) -> int:
        total = 0
        for ledger_id in self._ledgers:
            total += self.last_entry_of(ledger_id) + 1
        return total

    def total_size(self) -> int:
        total = 0
        for ledger_id, info in self._ledgers.items():
            if info.known:
                total += info.size_bytes
            elif self._handle is not None and self._handle.ledger_id == ledger_id:
                total += self._handle_bytes
        return total

