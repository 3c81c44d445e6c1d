"""Replication workers: copy the fragments the auditor recorded as under-replicated to
bookies outside their ensemble, then swap the ensemble in the ledger metadata.

Theory of operation, for one under-replicated ledger:
1. Take the ledger's lock: a key under ``/autorecovery/locks/`` created only if absent,
   under the worker's lease. A second worker finds the key and moves on; a worker that
   dies mid-copy loses its lease, the key vanishes after the TTL and another worker
   starts over.
2. Read the metadata. Open ledgers are skipped (their writer changes its ensemble).
   For each fragment naming a missing bookie, and each position that bookie holds:
   choose a writable bookie not in the fragment's ensemble (nor missing, nor
   decommissioning), read every entry of that position's share from the surviving
   replicas of its write set, verify each entry's header, ids and CRC32C digest, and
   write it to the target as a recovery add (accepted by fenced ledgers; the target
   verifies the digest again before journaling and answers after its fsync).
3. Swap the bookie in that fragment by compare-and-swap on the metadata version. If
   someone changed the metadata meanwhile, re-read: if the fragment still names the
   missing bookie at that position, swap again; otherwise the copy is abandoned (its
   entries become garbage the target's GC removes once the ledger is no longer
   under-replicated and its ensemble does not name the target).
4. Delete the under-replicated record if it is still the one read (the auditor may
   have found more meanwhile), and release the lock.

Nothing is swapped before the copy is complete, so a crash at any point leaves the
metadata naming only bookies that hold what it says they hold (or the missing one).
Copying is rate-limited to ``rate_bytes_per_s`` per worker.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from common.entry import verify_entry
from common.errors import (
    DigestMismatch,
    LedgerMetadataConflict,
    MagnetarError,
    MalformedFrame,
    MetadataKeyExists,
    MetadataVersionConflict,
    NoSuchLedger,
    NotEnoughBookies,
    ReplicationFailed,
)
from ledger.config import AutoRecoveryConfig
from ledger.context import LedgerContext
from ledger.metadata import Fragment, LedgerMetadata, VersionedMetadata
from ledger.placement import choose_replacement
from ledger.quorum import write_set
from ledger.under_replication import UnderReplicatedRecord, fragment_entry_range, under_replicated_fragments
from metadata import keys
from metadata.store import Lease

log = logging.getLogger(__name__)

# The longest a worker waits before trying a ledger again that failed here.
RETRY_DELAY_S_MAX = 60.0


class RateLimiter:
    """A token bucket over bytes: ``acquire(n)`` returns once n bytes may go. The bucket
    holds at most one second's worth, so an idle worker cannot burst past the rate."""

    def __init__(self, rate_bytes_per_s: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        assert rate_bytes_per_s > 0
        self._rate = rate_bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(rate_bytes_per_s)
        self._updated = clock()

    async def acquire(self, size_bytes: int) -> None:
        now = self._clock()
        self._tokens = min(float(self._rate), self._tokens + (now - self._updated) * self._rate)
        self._updated = now
        self._tokens -= size_bytes
        if self._tokens < 0:
            await self._sleep(-self._tokens / self._rate)


@dataclass
class ReplicationStats:
    bytes_replicated: int = 0
    entries_replicated: int = 0
    fragments_replicated: int = 0
    ledgers_replicated: int = 0
    failures: int = 0
    lock_contended: int = 0


class ReplicationWorker:
    def __init__(self, context: LedgerContext, config: AutoRecoveryConfig, worker_id: str,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._context = context
        self._config = config
        self.worker_id = worker_id
        self._rng = rng or random.Random()
        self._clock = clock
        # Ledgers whose last attempt here failed (e.g. no bookie left to copy to): when
        # to try again and the delay that got there, doubling up to RETRY_DELAY_S_MAX,
        # so a ledger that cannot be finished yet costs a metadata read and a WARNING
        # a minute, not every round. Holds only recorded ledgers (pruned each round).
        self._retry: dict[int, tuple[float, float]] = {}
        self._limiter = RateLimiter(config.rate_bytes_per_s)
        self._lease: Lease | None = None
        self.stats = ReplicationStats()

    # --- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Replicates what is recorded, round after round, until cancelled."""
        try:
            while True:
                try:
                    await self.run_round()
                except MagnetarError as error:
                    log.warning("replication round failed: worker_id=%s error=%s", self.worker_id, error)
                await asyncio.sleep(self._config.worker_interval_s)
        finally:
            await self.close()

    async def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None and not lease.is_lost:
            try:
                await self._context.store.revoke_lease(lease)
            except MagnetarError:
                pass

    async def _held_lease(self) -> Lease:
        if self._lease is None or self._lease.is_lost:
            self._lease = await self._context.store.grant_lease(self._config.lease_ttl_s)
        return self._lease

    async def run_round(self) -> int:
        """One pass over the recorded ledgers; returns how many were replicated. A
        ledger that failed here waits out its back-off first."""
        records = await self._context.store.get_prefix(keys.UNDER_REPLICATED, keys_only=True)
        ledger_ids = [keys.under_replicated_ledger_id(record.key) for record in records]
        self._rng.shuffle(ledger_ids)   # workers spread over the list instead of queueing on one lock
        recorded = set(ledger_ids)
        for ledger_id in [known for known in self._retry if known not in recorded]:
            del self._retry[ledger_id]
        done = 0
        for ledger_id in ledger_ids:
            retry = self._retry.get(ledger_id)
            if retry is not None and self._clock() < retry[0]:
                continue
            failures = self.stats.failures
            if await self.replicate_locked(ledger_id):
                done += 1
                self._retry.pop(ledger_id, None)
            elif self.stats.failures > failures:
                delay = min(retry[1] * 2, RETRY_DELAY_S_MAX) if retry is not None else self._config.worker_interval_s
                self._retry[ledger_id] = (self._clock() + delay, delay)
        return done

    async def replicate_locked(self, ledger_id: int, missing: set[str] | None = None) -> bool:
        """Takes the ledger's lock and replicates it; False if another worker holds the
        lock or the ledger could not be finished this time."""
        store = self._context.store
        lease = await self._held_lease()
        lock_key = keys.replication_lock(ledger_id)
        try:
            lock_version = await store.create(lock_key, self.worker_id.encode(), lease=lease)
        except MetadataKeyExists:
            self.stats.lock_contended += 1
            return False
        try:
            return await self.replicate(ledger_id, missing)
        except (ReplicationFailed, NotEnoughBookies, LedgerMetadataConflict) as error:
            self.stats.failures += 1
            log.warning("re-replication failed, will retry: ledger_id=%d error=%s", ledger_id, error)
            return False
        finally:
            try:
                await store.compare_and_delete(lock_key, expected_version=lock_version)
            except (MetadataVersionConflict, MagnetarError) as error:
                # Gone already (lease lost) or etcd away: the lease expires it anyway.
                log.info("replication lock not released: ledger_id=%d error=%s", ledger_id, error)

    # --- one ledger ---------------------------------------------------------------------

    async def replicate(self, ledger_id: int, missing: set[str] | None = None) -> bool:
        """Re-replicates every fragment of the ledger naming a bookie in ``missing`` (by
        default: what its under-replicated record says). Call with the lock held."""
        store = self._context.store
        record_key = keys.under_replicated(ledger_id)
        stored = await store.get(record_key)
        record_version = stored.version if stored is not None else 0
        if missing is None:
            if stored is None:
                return False
            try:
                missing = set(UnderReplicatedRecord.decode(stored.value).missing_bookies)
            except MalformedFrame as error:
                log.warning("dropping a bad under-replicated record: ledger_id=%d error=%s", ledger_id, error)
                await store.delete(record_key)
                return False
        try:
            versioned = await self._context.read_metadata(ledger_id)
        except NoSuchLedger:
            if stored is not None:
                await self._delete_record(record_key, record_version)
            return True
        if not versioned.metadata.is_closed:
            log.info("under-replicated ledger is open, left to its writer: ledger_id=%d", ledger_id)
            return False
        indices, _named = under_replicated_fragments(versioned.metadata, missing)
        for index in indices:
            fragment = versioned.metadata.fragments[index]
            for position, bookie_id in enumerate(fragment.bookies):
                if bookie_id in missing:
                    versioned = await self._replace(versioned, index, position, missing)
        if stored is not None:
            await self._delete_record(record_key, record_version)
        self.stats.ledgers_replicated += 1
        return True

    async def _delete_record(self, key: str, version: int) -> None:
        try:
            await self._context.store.compare_and_delete(key, expected_version=version)
        except MetadataVersionConflict:
            pass   # the auditor rewrote it meanwhile: the next round looks again

    async def _replace(self, versioned: VersionedMetadata, index: int, position: int,
                       missing: set[str]) -> VersionedMetadata:
        metadata = versioned.metadata
        fragment = metadata.fragments[index]
        old_bookie = fragment.bookies[position]
        registry = self._context.registry
        target = choose_replacement(registry.writable(), fragment.bookies, self._rng, exclude=missing)
        copied = await self._copy(metadata, index, position, target, missing)
        for _attempt in range(self._config.swap_attempts_max):
            current = versioned.metadata
            here = _fragment_at(current, fragment.first_entry_id)
            if (here is None or here.bookies[position] != old_bookie or not current.is_closed
                    or current.last_entry_id != metadata.last_entry_id):
                raise ReplicationFailed(f"ledger {metadata.ledger_id}: fragment {index} changed during the copy")
            new_index = current.fragments.index(here)
            bookies = list(here.bookies)
            bookies[position] = target
            fragments = list(current.fragments)
            fragments[new_index] = Fragment(here.first_entry_id, tuple(bookies))
            try:
                swapped = await self._context.write_metadata(replace(current, fragments=tuple(fragments)),
                                                             versioned.version)
            except LedgerMetadataConflict:
                versioned = await self._context.read_metadata(metadata.ledger_id)
                continue
            self.stats.fragments_replicated += 1
            log.info("fragment re-replicated: ledger_id=%d fragment=%d first_entry_id=%d from=%s to=%s "
                     "entries=%d", metadata.ledger_id, index, fragment.first_entry_id, old_bookie, target, copied)
            return swapped
        raise ReplicationFailed(f"ledger {metadata.ledger_id}: ensemble swap lost too many races")

    async def _copy(self, metadata: LedgerMetadata, index: int, position: int, target: str,
                    missing: set[str]) -> int:
        """Copies the entries fragment ``index`` keeps at ``position`` to ``target``;
        returns how many."""
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        ensemble = metadata.fragments[index].bookies
        entry_ids = [entry_id for entry_id in fragment_entry_range(metadata, index)
                     if position in write_set(entry_id, e, qw)]
        target_client = self._context.pool.get(target)
        copied = 0
        step = self._config.copy_batch_entries
        for start in range(0, len(entry_ids), step):
            batch = entry_ids[start:start + step]
            entries = await self._read_surviving(metadata, ensemble, position, batch, missing)
            size = sum(len(data) for data in entries.values())
            await self._limiter.acquire(size)
            futures = [target_client.add(metadata.ledger_id, entry_id, entries[entry_id], recovery=True)
                       for entry_id in batch]
            results = await asyncio.gather(*futures, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise ReplicationFailed(f"ledger {metadata.ledger_id}: target {target} refused "
                                        f"{len(failed)} entries: {failed[0]}")
            copied += len(batch)
            self.stats.entries_replicated += len(batch)
            self.stats.bytes_replicated += size
        return copied

    async def _read_surviving(self, metadata: LedgerMetadata, ensemble: tuple[str, ...], position: int,
                              entry_ids: list[int], missing: set[str]) -> dict[int, bytes]:
        """Each entry from the first replica of its write set that returns it intact:
        other positions first, the missing bookie itself last (a decommissioning bookie
        is still up)."""
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        found: dict[int, bytes] = {}
        remaining = list(entry_ids)
        for attempt in range(qw):
            by_bookie: dict[str, list[int]] = {}
            for entry_id in remaining:
                members = write_set(entry_id, e, qw)
                sources = ([i for i in members if i != position and ensemble[i] not in missing]
                           + [i for i in members if i != position and ensemble[i] in missing]
                           + [position])
                if attempt < len(sources):
                    by_bookie.setdefault(ensemble[sources[attempt]], []).append(entry_id)
            if not by_bookie:
                break
            await asyncio.gather(*(self._read_from(metadata.ledger_id, bookie_id, ids, found)
                                   for bookie_id, ids in by_bookie.items()))
            remaining = [entry_id for entry_id in remaining if entry_id not in found]
            if not remaining:
                return found
        raise ReplicationFailed(f"ledger {metadata.ledger_id}: no intact replica of entries "
                                f"{remaining[:5]} (of {len(remaining)})")

    async def _read_from(self, ledger_id: int, bookie_id: str, entry_ids: list[int], found: dict[int, bytes]) -> None:
        client = self._context.pool.get(bookie_id)
        position = 0
        while position < len(entry_ids):
            try:
                results = await client.read(ledger_id, entry_ids[position:],
                                            self._context.config.read_response_bytes_max)
            except MagnetarError as error:
                log.info("replica read failed: ledger_id=%d bookie_id=%s error=%s", ledger_id, bookie_id, error)
                return
            if not results:
                return
            for result in results:
                if result.entry is None:
                    continue
                try:
                    header = verify_entry(result.entry)
                except (DigestMismatch, MalformedFrame):
                    log.warning("corrupt replica skipped: ledger_id=%d entry_id=%d bookie_id=%s",
                                ledger_id, result.entry_id, bookie_id)
                    continue
                if header.ledger_id == ledger_id and header.entry_id == result.entry_id:
                    found[result.entry_id] = result.entry
            position += len(results)


def _fragment_at(metadata: LedgerMetadata, first_entry_id: int) -> Fragment | None:
    for fragment in metadata.fragments:
        if fragment.first_entry_id == first_entry_id:
            return fragment
    return None
