"""The auditor: one per cluster, elected through etcd, records which closed ledgers have
fragments on missing bookies (see ledger/under_replication.py).

Theory of operation:
- Election: every candidate tries to create ``/autorecovery/auditor`` under its own
  lease; whoever succeeds audits until its lease is lost. The others retry each
  interval, so a dead auditor is replaced within the lease TTL plus an interval.
- A round lists registered bookies, decommissioning marks and every ledger's metadata.
  A bookie that some ledger names and that is not registered is *missing since* the
  first round that saw it so; past ``grace_period_s`` it is gone. A bookie that
  registers again is forgotten (a restart within the grace period costs nothing).
  The time a bookie has been unregistered is counted from the first round of *this*
  auditor, so a new auditor waits a full grace period before declaring anything gone.
- For each closed ledger naming a gone or decommissioning bookie, the record under
  ``/autorecovery/under-replicated/<ledger_id>`` is written (or rewritten when the
  finding changed); records of ledgers no longer under-replicated (or deleted) are
  removed. The round's counts are the auditor's metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from common.errors import MagnetarError, MalformedFrame, MetadataKeyExists, MetadataVersionConflict
from ledger.config import AutoRecoveryConfig
from ledger.metadata import LedgerMetadata
from ledger.under_replication import UnderReplicatedRecord, under_replicated_fragments
from metadata import keys
from metadata.store import Lease, MetadataStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditResult:
    ledgers_audited: int
    under_replicated_ledgers: int
    under_replicated_fragments: int
    gone_bookies: tuple[str, ...]
    decommissioned_bookies: tuple[str, ...]
    # Open ledgers naming a missing bookie (their writer's, or recovery's, to fix).
    open_ledgers_on_missing: int


class Auditor:
    def __init__(self, store: MetadataStore, config: AutoRecoveryConfig, auditor_id: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._config = config
        self.auditor_id = auditor_id
        self._clock = clock
        self._lease: Lease | None = None
        # bookie id -> monotonic time this auditor first saw it unregistered.
        self._missing_since: dict[str, float] = {}
        self.last_result: AuditResult | None = None
        self.rounds = 0

    @property
    def elected(self) -> bool:
        return self._lease is not None and not self._lease.is_lost

    async def run(self) -> None:
        try:
            while True:
                try:
                    if await self.campaign():
                        await self.audit_once()
                except MagnetarError as error:
                    log.warning("audit round failed: auditor_id=%s error=%s", self.auditor_id, error)
                await asyncio.sleep(self._config.audit_interval_s)
        finally:
            await self.close()

    async def campaign(self) -> bool:
        """True while this candidate is the auditor."""
        if self.elected:
            return True
        if self._lease is not None:
            log.warning("auditor lost its lease: auditor_id=%s", self.auditor_id)
            self._lease = None
            self._missing_since.clear()
        lease = await self._store.grant_lease(self._config.lease_ttl_s)
        try:
            await self._store.create(keys.AUDITOR, self.auditor_id.encode(), lease=lease)
        except MetadataKeyExists:
            await self._store.revoke_lease(lease)
            return False
        self._lease = lease
        log.info("elected auditor: auditor_id=%s", self.auditor_id)
        return True

    async def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None and not lease.is_lost:
            try:
                await self._store.revoke_lease(lease)
            except MagnetarError:
                pass

    async def audit_once(self) -> AuditResult:
        store = self._store
        registered = {record.key[len(keys.BOOKIES):]
                      for record in await store.get_prefix(keys.BOOKIES, keys_only=True)}
        decommissioned = {record.key[len(keys.DECOMMISSIONED):]
                          for record in await store.get_prefix(keys.DECOMMISSIONED, keys_only=True)}
        ledgers: list[LedgerMetadata] = []
        for record in await store.get_prefix(keys.LEDGERS):
            try:
                ledgers.append(LedgerMetadata.decode(record.value))
            except MalformedFrame as error:
                log.warning("auditor skips unreadable ledger metadata: key=%s error=%s", record.key, error)
        referenced = set().union(*(metadata.all_bookies() for metadata in ledgers)) if ledgers else set()
        now = self._clock()
        for bookie_id in referenced - registered:
            if bookie_id not in self._missing_since:
                log.info("bookie unregistered, grace period starts: bookie_id=%s grace_period_s=%s",
                         bookie_id, self._config.grace_period_s)
                self._missing_since[bookie_id] = now
        for bookie_id in list(self._missing_since):
            if bookie_id in registered or bookie_id not in referenced:
                del self._missing_since[bookie_id]
        gone = {bookie_id for bookie_id, since in self._missing_since.items()
                if now - since >= self._config.grace_period_s}
        missing = gone | decommissioned

        existing: dict[int, tuple[UnderReplicatedRecord | None, int]] = {}
        for record in await store.get_prefix(keys.UNDER_REPLICATED):
            try:
                decoded: UnderReplicatedRecord | None = UnderReplicatedRecord.decode(record.value)
            except MalformedFrame:
                decoded = None
            existing[keys.under_replicated_ledger_id(record.key)] = (decoded, record.version)

        found_ledgers = 0
        found_fragments = 0
        open_on_missing = 0
        seen: set[int] = set()
        for metadata in ledgers:
            ledger_id = metadata.ledger_id
            seen.add(ledger_id)
            if not metadata.is_closed:
                if missing & metadata.all_bookies():
                    open_on_missing += 1
                # An open ledger's record (it was reopened? never: closed is final) is
                # left alone; only closed ledgers are recorded.
                continue
            indices, named = under_replicated_fragments(metadata, missing)
            previous = existing.get(ledger_id)
            if indices:
                found_ledgers += 1
                found_fragments += len(indices)
                record = UnderReplicatedRecord(ledger_id, indices, named, int(time.time() * 1000), self.auditor_id)
                if previous is None or previous[0] is None or not previous[0].same_finding(record):
                    await store.put(keys.under_replicated(ledger_id), record.encode())
                    log.info("ledger under-replicated: ledger_id=%d fragments=%s missing_bookies=%s",
                             ledger_id, indices, named)
            elif previous is not None:
                await self._delete(ledger_id, previous[1])
        for ledger_id, (_record, version) in existing.items():
            if ledger_id not in seen:
                await self._delete(ledger_id, version)   # the ledger was deleted
        result = AuditResult(len(ledgers), found_ledgers, found_fragments, tuple(sorted(gone)),
                             tuple(sorted(decommissioned)), open_on_missing)
        self.last_result = result
        self.rounds += 1
        return result

    async def _delete(self, ledger_id: int, version: int) -> None:
        try:
            await self._store.compare_and_delete(keys.under_replicated(ledger_id), expected_version=version)
        except MetadataVersionConflict:
            pass   # a worker finished it (and deleted it) meanwhile
