"""Reading entries of a ledger from its bookies.

Theory of operation: for each fragment the read covers, every entry is first asked of
the first bookie of its write set, grouped so that each bookie gets one call per batch
of entries (a range, not an entry at a time). Entries that fail there (bookie down,
missing, digest mismatch) are asked of the next bookie of their write set, and so on
through Qw bookies. Every entry returned is checked: header, ids and CRC32C digest. A
corrupt replica is counted in ``digest_errors`` and never returned as data; the read
fails only if no replica of an entry is good.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ledger.bookie_client import BookieClientPool
from ledger.config import LedgerClientConfig
from common.entry import entry_payload, verify_entry
from common.errors import (
    DigestMismatch,
    EntryIdOutOfRange,
    InvalidArgument,
    MagnetarError,
    MalformedFrame,
    NoSuchEntry,
)
from ledger.metadata import LedgerMetadata
from ledger.quorum import write_set


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    data: bytes   # the whole encoded entry (header + payload)

    @property
    def payload(self) -> memoryview:
        return entry_payload(self.data)


@dataclass
class ReadStats:
    digest_errors: int = 0
    replica_errors: int = 0
    entries_read: int = 0
    digest_error_entries: set[int] = field(default_factory=set)


class LedgerReader:
    def __init__(self, metadata: LedgerMetadata, pool: BookieClientPool, config: LedgerClientConfig) -> None:
        self.metadata = metadata
        self._pool = pool
        self._config = config
        self.stats = ReadStats()

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries first..last inclusive, in order; raises if any of them cannot be read."""
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise InvalidArgument(f"bad entry range {first_entry_id}..{last_entry_id}")
        metadata = self.metadata
        if metadata.is_closed and last_entry_id > metadata.last_entry_id:
            raise EntryIdOutOfRange(metadata.ledger_id, last_entry_id, metadata.last_entry_id)
        found: dict[int, LedgerEntry] = {}
        index = metadata.fragment_index_for(first_entry_id)
        while index < len(metadata.fragments):
            fragment = metadata.fragments[index]
            if fragment.first_entry_id > last_entry_id:
                break
            start = max(first_entry_id, fragment.first_entry_id)
            end = min(last_entry_id, metadata.fragment_last_entry_id(index, last_entry_id))
            if start <= end:
                await self._read_fragment(fragment.bookies, list(range(start, end + 1)), found)
            index += 1
        return [found[entry_id] for entry_id in range(first_entry_id, last_entry_id + 1)]

    async def _read_fragment(self, ensemble: tuple[str, ...], entry_ids: list[int],
                             found: dict[int, LedgerEntry]) -> None:
        metadata = self.metadata
        remaining = entry_ids
        last_errors: dict[int, MagnetarError] = {}
        for position in range(metadata.write_quorum_size):
            by_bookie: dict[str, list[int]] = {}
            for entry_id in remaining:
                members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum_size)
                by_bookie.setdefault(ensemble[members[position]], []).append(entry_id)
            outcomes = await asyncio.gather(*(
                self._read_from_bookie(bookie_id, ids, found, last_errors) for bookie_id, ids in by_bookie.items()
            ))
            remaining = [entry_id for failed in outcomes for entry_id in failed]
            if not remaining:
                return
        remaining.sort()
        first_failure = remaining[0]
        raise last_errors.get(first_failure, NoSuchEntry(metadata.ledger_id, first_failure))

    async def _read_from_bookie(self, bookie_id: str, entry_ids: list[int], found: dict[int, LedgerEntry],
                                errors: dict[int, MagnetarError]) -> list[int]:
        """Reads what it can; returns the ids that failed on this bookie."""
        client = self._pool.get(bookie_id)
        failed: list[int] = []
        position = 0
        batch_max = self._config.read_batch_entries_max
        while position < len(entry_ids):
            batch = entry_ids[position:position + batch_max]
            try:
                results = await client.read(self.metadata.ledger_id, batch, self._config.read_response_bytes_max)
            except MagnetarError as error:
                self.stats.replica_errors += len(entry_ids) - position
                for entry_id in entry_ids[position:]:
                    errors[entry_id] = error
                failed.extend(entry_ids[position:])
                return failed
            if not results:
                raise MalformedFrame(f"bookie {bookie_id} answered a read with no results")
            for result in results:
                entry_id = result.entry_id
                if result.entry is None:
                    assert result.error is not None
                    if isinstance(result.error, DigestMismatch):
                        self.stats.digest_errors += 1
                        self.stats.digest_error_entries.add(entry_id)
                    else:
                        self.stats.replica_errors += 1
                    errors[entry_id] = result.error
                    failed.append(entry_id)
                    continue
                try:
                    header = verify_entry(result.entry)
                    if header.ledger_id != self.metadata.ledger_id or header.entry_id != entry_id:
                        raise DigestMismatch(self.metadata.ledger_id, entry_id,
                                             f"bookie returned entry {header.ledger_id}/{header.entry_id}")
                except (DigestMismatch, MalformedFrame) as error:
                    self.stats.digest_errors += 1
                    self.stats.digest_error_entries.add(entry_id)
                    errors[entry_id] = error if isinstance(error, DigestMismatch) else DigestMismatch(
                        self.metadata.ledger_id, entry_id, str(error))
                    failed.append(entry_id)
                    continue
                found[entry_id] = LedgerEntry(self.metadata.ledger_id, entry_id, result.entry)
                self.stats.entries_read += 1
            position += len(results)
        return failed

    async def read_last_add_confirmed(self) -> int:
        """The highest last_add_confirmed any bookie of the last fragment reports (what
        a tailing reader may safely read up to)."""
        metadata = self.metadata
        if metadata.is_closed:
            return metadata.last_entry_id
        ensemble = metadata.current_ensemble
        states = await asyncio.gather(
            *(self._pool.get(bookie_id).read_last_add_confirmed(metadata.ledger_id) for bookie_id in ensemble),
            return_exceptions=True)
        best = max((s.last_add_confirmed for s in states if not isinstance(s, BaseException)), default=-1)
        # Entries of earlier fragments were all confirmed when the ensemble changed.
        return max(best, metadata.fragments[-1].first_entry_id - 1)
