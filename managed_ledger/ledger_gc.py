"""The ledger collector: deletes ledgers a broker created and never recorded (or
stopped recording), which nothing would delete otherwise, so their bookie space is
not lost for ever. BookKeeper's answer to the same leak is its garbage collector,
which compares the ledgers that exist with those their owners reference; this is ours.

Orphans come from a broker that dies (kill -9) between creating a ledger and recording
it, or between un-recording and deleting it: a compaction run's partial compacted
ledger, a new ledger at rollover, a cursor ledger whose pointer write never happened,
a trimmed ledger whose delete never happened, the ledgers of a topic whose delete
stopped half-way.

Conservative above all: **a live ledger must never be deleted** (that loses data);
leaking one is the lesser harm. So a ledger is deleted only if every one of these holds:
1. its metadata is tagged with an owner (``managed-ledger``: a topic name) and a
   purpose this module knows (managed_ledger/ledger_references.py ``KNOWN_PURPOSES``);
   untagged ledgers (older ones, other clients, ``magnetar shell``) are never touched;
2. it has a creation time (``created_ms``) and is older than the grace period
   (``grace_s``, 1 h by default) — far longer than any create-to-record window;
3. its owner's references were read without error (an unreadable or malformed record
   keeps every ledger of that owner) and none of them names it — or the owner's
   managed-ledger record does not exist (the topic was deleted);
4. the same holds again when the references are read once more right before deleting;
5. the delete is one etcd transaction that also compares every record those last
   references were read from (the managed-ledger record, each cursor pointer, the
   archive record's absence) and the ledger's own metadata version: if any of them
   changed since, nothing is deleted and the ledger is looked at in a later pass.

Race analysis (a recorder R — the broker that created ledger L — against the collector C):
- R records L *before* C's transaction: the record R wrote has a new version, C's
  compare on it fails, L stays. Steps 4 and 5 together make "recorded between the check
  and the delete" impossible to miss, not just unlikely.
- R records L *after* C's transaction: R's write would name a ledger whose metadata
  is gone. Every recording write is guarded the other way round, in the same
  transaction as the record it changes: a rollover records its new ledger only if the
  ledger's metadata is still at the version it was created with
  (``ManagedLedger._start_new_ledger``), a compaction commits its ledger only if the
  ledger's metadata exists at the version read just before (``set_properties(...,
  recording=...)``), a cursor store points at its ledger only if the ledger's metadata
  is at the version its handle knows (``LedgerCursorStore._save_snapshot``). So R's
  write fails: a rollover creates another ledger, a compaction run ends in ERROR, a
  cursor save is retried into a new ledger. Nothing acknowledged is lost.
- So for every ledger, etcd orders the collector's delete and the owner's record: the
  first to commit makes the other's compare fail. The grace period is not what keeps
  data safe; it keeps the collector from failing recorders that are merely slow.
- A compaction run, or any writer, slower than the grace period loses its unrecorded
  ledger (and fails as above): the grace must exceed the longest compaction run.
- Two collectors (an auditor whose lease was lost but not yet noticed): each delete is
  guarded on the ledger's metadata version; the second finds it gone.
- Clocks: the age is the collector's wall clock minus the creating broker's; a skew
  well below the grace period does not matter, and a ctime in the future is "young".
- A deleted topic (no managed-ledger record): its ledgers are collected after the
  grace. Should a topic of the same name be created meanwhile, its record's creation
  changes the compared version (absent → present) and the delete fails; a re-created
  topic never lists the old topic's ledgers, so they are collected in a later pass.

Bounded: a pass looks at no more than ``ledgers_per_pass_max`` ledgers (resuming
after the last one looked at), one pass per ``interval_s``, every etcd call under
``call_timeout_s``. It runs only where the auto-recovery auditor is elected (magnetar
/autorecovery.py). Deleting is what the managed ledger does: the metadata goes, and
each bookie's GC drops the entries of ledgers missing from ``/ledgers/``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, TypeVar

from managed_ledger.ledger_references import GUARDS_MAX, KNOWN_PURPOSES, References, owner_topic, read_references
from managed_ledger.managed_ledger_info import OWNER_TAG, PURPOSE_TAG
from common.errors import ConfigError, MagnetarError
from common.topic_name import TopicName
from ledger.client import LedgerClient
from ledger.metadata import LedgerMetadata
from metadata import keys
from metadata.store import Compare, MetadataStore

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True)
class LedgerGcConfig:
    # Off: no ledger is ever collected (orphans leak, as before).
    enabled: bool = True
    # A ledger younger than this is never collected: it must exceed the longest time
    # between creating a ledger and recording it, a compaction run included. BookKeeper
    # collects at once with its over-replicated-ledger GC off by default; an hour costs
    # an hour of leaked space and leaves every ordinary recorder far behind.
    grace_s: float = 3600.0
    # One pass per interval; a pass looks at this many ledgers at most (a pass costs a
    # listing of ledger ids, one read per ledger and a few per owner: at 1,000 ledgers
    # a minute the collector stays far below what etcd serves the brokers).
    interval_s: float = 60.0
    ledgers_per_pass_max: int = 1000
    # Every etcd call of a pass is given up after this (the ledger is kept).
    call_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.grace_s <= 30 * 86_400:
            raise ConfigError("ledger_gc grace_s must be in [1, 2592000]")
        if not 0 < self.interval_s <= 86_400:
            raise ConfigError("ledger_gc interval_s must be in (0, 86400]")
        if not 1 <= self.ledgers_per_pass_max <= 1_000_000:
            raise ConfigError("ledger_gc ledgers_per_pass_max must be in [1, 1000000]")
        if not 0 < self.call_timeout_s <= 600:
            raise ConfigError("ledger_gc call_timeout_s must be in (0, 600]")


class Verdict(str, enum.Enum):
    """What the collector decided about one ledger."""

    UNTAGGED = "untagged"                  # no owner or no purpose: not ours to judge
    UNKNOWN_PURPOSE = "unknown-purpose"    # a ledger kind ledger_references does not know
    UNKNOWN_OWNER = "unknown-owner"        # the owner tag names no topic
    NO_CTIME = "no-ctime"                  # created before ledgers carried created_ms
    YOUNG = "young"                        # within the grace period (or a ctime ahead)
    REFERENCED = "referenced"
    OWNER_UNREADABLE = "owner-unreadable"  # its owner's records could not be read
    TOO_MANY_GUARDS = "too-many-guards"    # its owner spans more records than a transaction holds
    GONE = "gone"                          # deleted since it was listed
    DELETE_REFUSED = "delete-refused"      # the guarded delete found a record changed
    COLLECT = "collect"                    # its owner exists and references it nowhere
    COLLECT_OWNER_DELETED = "collect-owner-deleted"   # its topic was deleted

    @property
    def collects(self) -> bool:
        return self in (Verdict.COLLECT, Verdict.COLLECT_OWNER_DELETED)


@dataclass(frozen=True)
class Candidate:
    """A tagged ledger past its grace: collected unless its owner references it."""

    ledger_id: int
    owner: TopicName
    purpose: str
    age_s: float


def judge_metadata(metadata: LedgerMetadata, now_ms: int, grace_s: float) -> Verdict | Candidate:
    """The part of the decision that needs only the ledger's own metadata. Pure."""
    owner = metadata.custom.get(OWNER_TAG)
    purpose = metadata.custom.get(PURPOSE_TAG)
    if not owner or not purpose:
        return Verdict.UNTAGGED
    if purpose not in KNOWN_PURPOSES:
        return Verdict.UNKNOWN_PURPOSE
    topic = owner_topic(owner)
    if topic is None:
        return Verdict.UNKNOWN_OWNER
    if metadata.created_ms <= 0:
        return Verdict.NO_CTIME
    age_s = (now_ms - metadata.created_ms) / 1000.0
    if age_s < grace_s:
        return Verdict.YOUNG
    return Candidate(metadata.ledger_id, topic, purpose, age_s)


def judge_references(candidate: Candidate, references: References | None) -> Verdict:
    """The rest of it, given the owner's references (None: they could not be read). Pure."""
    if references is None:
        return Verdict.OWNER_UNREADABLE
    assert references.owner == str(candidate.owner), (references.owner, candidate.owner)
    if candidate.ledger_id in references.ledger_ids:
        return Verdict.REFERENCED
    if len(references.guards) + 2 > GUARDS_MAX:
        return Verdict.TOO_MANY_GUARDS
    return Verdict.COLLECT if references.exists else Verdict.COLLECT_OWNER_DELETED


def delete_guards(metadata_version: int, candidate: Candidate, references: References) -> list[Compare]:
    """The compares of the delete transaction: the ledger's metadata as judged, every
    record the references were read from as read, and no archive record for it. Pure."""
    assert metadata_version > 0
    archive_key = keys.archive_ledger(candidate.owner.key_path, candidate.ledger_id)
    assert all(guard.key != archive_key for guard in references.guards), "an archived ledger is referenced"
    return [Compare(keys.ledger(candidate.ledger_id), metadata_version), *references.guards,
            Compare(archive_key, 0)]


@dataclass
class LedgerGcStats:
    passes: int = 0
    ledgers_examined: int = 0
    ledgers_collected: int = 0
    # Deletes refused by their transaction (a record changed after the last check).
    deletes_refused: int = 0
    # Ledgers, references or listings that could not be read (kept).
    read_failures: int = 0
    last_pass_s: float = 0.0
    verdicts: dict[str, int] = field(default_factory=dict)


class LedgerCollector:
    """Runs passes while ``elected()`` (the auto-recovery auditor's election)."""

    def __init__(self, store: MetadataStore, client: LedgerClient, config: LedgerGcConfig, *,
                 wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._store = store
        self._client = client
        self.config = config
        self._wall_clock_ms = wall_clock_ms
        self._resume_after = -1      # the last ledger id looked at: the next pass goes on after it
        self.stats = LedgerGcStats()

    async def run(self, elected: Callable[[], bool]) -> None:
        config = self.config
        if not config.enabled:
            log.info("ledger collector off")
            return
        log.info("ledger collector on: grace_s=%g interval_s=%g ledgers_per_pass_max=%d call_timeout_s=%g",
                 config.grace_s, config.interval_s, config.ledgers_per_pass_max, config.call_timeout_s)
        while True:
            await asyncio.sleep(config.interval_s)
            if not elected():
                continue
            try:
                await self.collect_once(elected)
            except (MagnetarError, TimeoutError) as error:
                self.stats.read_failures += 1
                log.warning("ledger collector pass failed: error=%s", error or type(error).__name__)
            except Exception:
                # A broken invariant of the collector: it stops collecting (leaking is
                # the safe side) and leaves the rest of auto-recovery running.
                log.error("ledger collector stopped by an unexpected error; no more ledgers are collected "
                          "until the process restarts", exc_info=True)
                return

    async def _call(self, call: Awaitable[_T]) -> _T:
        async with asyncio.timeout(self.config.call_timeout_s):
            return await call

    async def collect_once(self, elected: Callable[[], bool] = lambda: True) -> list[int]:
        """One pass; returns the ledgers it deleted."""
        started = time.monotonic()
        listed = await self._call(self._store.get_prefix(keys.LEDGERS, keys_only=True))
        ledger_ids = sorted(int(record.key[len(keys.LEDGERS):]) for record in listed
                            if record.key[len(keys.LEDGERS):].isdigit())
        batch = [ledger_id for ledger_id in ledger_ids if ledger_id > self._resume_after]
        if not batch:
            batch = ledger_ids   # wrapped around
        batch = batch[:self.config.ledgers_per_pass_max]
        self._resume_after = batch[-1] if batch else -1
        references: dict[str, References | None] = {}
        collected: list[int] = []
        for ledger_id in batch:
            if not elected():
                break
            self.stats.ledgers_examined += 1
            verdict = await self._examine(ledger_id, references)
            self.stats.verdicts[verdict.value] = self.stats.verdicts.get(verdict.value, 0) + 1
            if verdict.collects:
                collected.append(ledger_id)
        self.stats.passes += 1
        self.stats.last_pass_s = time.monotonic() - started
        log.debug("ledger collector pass: examined=%d collected=%d seconds=%.3f", len(batch), len(collected),
                  self.stats.last_pass_s)
        return collected

    async def _examine(self, ledger_id: int, cache: dict[str, References | None]) -> Verdict:
        try:
            record = await self._call(self._store.get(keys.ledger(ledger_id)))
            if record is None:
                return Verdict.GONE
            metadata = LedgerMetadata.decode(record.value)
        except (MagnetarError, TimeoutError) as error:
            self.stats.read_failures += 1
            log.warning("ledger collector cannot read a ledger, kept: ledger_id=%d error=%s", ledger_id,
                        error or type(error).__name__)
            return Verdict.OWNER_UNREADABLE
        judged = judge_metadata(metadata, self._wall_clock_ms(), self.config.grace_s)
        if isinstance(judged, Verdict):
            return judged
        candidate = judged
        owner = str(candidate.owner)
        if owner not in cache:
            cache[owner] = await self._references(candidate.owner)
        verdict = judge_references(candidate, cache[owner])
        if verdict == Verdict.TOO_MANY_GUARDS:
            log.warning("ledger collector keeps an unreferenced ledger, its owner has too many records to guard "
                        "a delete: ledger_id=%d owner=%s", ledger_id, owner)
        if not verdict.collects:
            return verdict
        # Right before deleting: the references once more, fresh (the owner may have
        # recorded it since this pass read them), and the delete guarded by them.
        fresh = await self._references(candidate.owner)
        cache[owner] = fresh
        verdict = judge_references(candidate, fresh)
        if not verdict.collects:
            return verdict
        assert fresh is not None
        try:
            deleted = await self._call(self._client.delete_ledger_if(
                ledger_id, delete_guards(record.version, candidate, fresh)))
        except (MagnetarError, TimeoutError) as error:
            self.stats.read_failures += 1
            log.warning("ledger collector delete failed, kept: ledger_id=%d error=%s", ledger_id,
                        error or type(error).__name__)
            return Verdict.OWNER_UNREADABLE
        if not deleted:
            self.stats.deletes_refused += 1
            cache.pop(owner, None)
            log.info("ledger collector delete refused, a record changed meanwhile: ledger_id=%d owner=%s",
                     ledger_id, owner)
            return Verdict.DELETE_REFUSED
        self.stats.ledgers_collected += 1
        log.info("orphan ledger collected: ledger_id=%d owner=%s purpose=%s age_s=%.0f state=%s "
                 "last_entry_id=%d length_bytes=%d reason=%s", ledger_id, owner, candidate.purpose,
                 candidate.age_s, metadata.state.value, metadata.last_entry_id, metadata.length_bytes,
                 verdict.value)
        return verdict

    async def _references(self, topic: TopicName) -> References | None:
        try:
            return await read_references(self._store, topic, call_timeout_s=self.config.call_timeout_s)
        except (MagnetarError, TimeoutError) as error:
            self.stats.read_failures += 1
            log.warning("ledger collector cannot read an owner's references, its ledgers are kept: owner=%s "
                        "error=%s", topic, error or type(error).__name__)
            return None
