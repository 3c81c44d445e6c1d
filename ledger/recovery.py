"""Ledger recovery: closing a ledger whose writer may be gone, at exactly the last entry
that could have been acknowledged to it.

Steps (each safe to repeat if a recoverer dies half-way):
1. Mark the metadata IN_RECOVERY (compare-and-swap). From now on the old writer's
   ensemble changes fail, so the last fragment stays the last fragment.
2. Fence the ledger on the bookies of the last fragment. Once the fenced bookies cover
   every write set (Qw - Qa + 1 of each), no add of the old writer can complete.
3. Every entry up to the highest last_add_confirmed any fenced bookie has seen was
   acknowledged. Read forward from there: an entry found on any bookie (with a good
   digest) is recovered; an entry that Qw - Qa + 1 bookies of its write set say they
   lack cannot have been acknowledged, and the ledger ends before it.
4. Write the recovered entries again (recovery adds, accepted by fenced bookies) to
   their write sets, replacing bookies that did not answer, so each has Qa copies.
5. Close the metadata at the last recovered entry (compare-and-swap).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from ledger.context import LedgerContext
from common.entry import verify_entry
from common.errors import (
    DigestMismatch,
    LedgerMetadataConflict,
    LedgerRecoveryFailed,
    MagnetarError,
    MalformedFrame,
    NoSuchEntry,
    NoSuchLedger,
)
from ledger.metadata import LedgerMetadata, LedgerState, VersionedMetadata
from ledger.placement import choose_replacement
from ledger.quorum import covers_every_write_set, write_set

log = logging.getLogger(__name__)

# Entries examined per round of recovery reads.
_RECOVERY_READ_WINDOW = 256


async def recover_ledger(context: LedgerContext, ledger_id: int) -> VersionedMetadata:
    """Recovers and closes the ledger (no-op if it is closed); returns the metadata."""
    for _attempt in range(context.config.metadata_attempts_max):
        versioned = await context.read_metadata(ledger_id)
        metadata = versioned.metadata
        if metadata.state == LedgerState.CLOSED:
            return versioned
        if metadata.state == LedgerState.OPEN:
            try:
                versioned = await context.write_metadata(replace(metadata, state=LedgerState.IN_RECOVERY),
                                                         versioned.version)
            except LedgerMetadataConflict:
                continue
        try:
            return await _recover(context, versioned)
        except LedgerMetadataConflict:
            continue  # another recoverer closed it, or an ensemble change raced: look again
    raise LedgerRecoveryFailed(f"ledger {ledger_id}: recovery lost too many metadata races")


async def _fence_all(context: LedgerContext, metadata: LedgerMetadata) -> tuple[set[int], int]:
    """Fences the last fragment's bookies; returns the indices that answered and the
    highest last_add_confirmed they reported."""
    ensemble = metadata.current_ensemble
    results = await asyncio.gather(
        *(context.pool.get(bookie_id).fence(metadata.ledger_id) for bookie_id in ensemble),
        return_exceptions=True)
    fenced: set[int] = set()
    last_add_confirmed = -1
    for index, result in enumerate(results):
        if isinstance(result, BaseException):
            log.info("fence failed on a bookie: ledger_id=%d bookie_id=%s error=%s",
                     metadata.ledger_id, ensemble[index], result)
            continue
        fenced.add(index)
        last_add_confirmed = max(last_add_confirmed, result.last_add_confirmed)
    return fenced, last_add_confirmed


async def _read_window(context: LedgerContext, metadata: LedgerMetadata, entry_ids: list[int]
                       ) -> dict[int, bytes | None]:
    """For each id: the entry bytes, None if it provably was never acknowledged;
    raises LedgerRecoveryFailed if neither can be told (too many bookies silent)."""
    ensemble = metadata.current_ensemble
    e, qw, qa = metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
    by_index: dict[int, list[int]] = {}
    for entry_id in entry_ids:
        for index in write_set(entry_id, e, qw):
            by_index.setdefault(index, []).append(entry_id)

    async def ask(index: int, ids: list[int]):
        client = context.pool.get(ensemble[index])
        outcomes: dict[int, object] = {}
        position = 0
        while position < len(ids):
            try:
                results = await client.read(metadata.ledger_id, ids[position:], context.config.read_response_bytes_max)
            except NoSuchLedger:
                return index, {entry_id: "absent" for entry_id in ids}
            except MagnetarError as error:
                for entry_id in ids[position:]:
                    outcomes[entry_id] = error
                return index, outcomes
            if not results:
                break
            for result in results:
                if result.entry is not None:
                    try:
                        header = verify_entry(result.entry)
                        if header.ledger_id == metadata.ledger_id and header.entry_id == result.entry_id:
                            outcomes[result.entry_id] = result.entry
                            continue
                    except (DigestMismatch, MalformedFrame):
                        pass
                    outcomes[result.entry_id] = "corrupt"
                elif isinstance(result.error, NoSuchEntry):
                    outcomes[result.entry_id] = "absent"
                else:
                    outcomes[result.entry_id] = result.error
            position += len(results)
        return index, outcomes

    answers = await asyncio.gather(*(ask(index, ids) for index, ids in by_index.items()))
    by_bookie = dict(answers)
    decided: dict[int, bytes | None] = {}
    for entry_id in entry_ids:
        members = write_set(entry_id, e, qw)
        data = next((by_bookie[i].get(entry_id) for i in members
                     if isinstance(by_bookie[i].get(entry_id), bytes)), None)
        if data is not None:
            decided[entry_id] = data  # type: ignore[assignment]
            continue
        absent = sum(1 for i in members if by_bookie[i].get(entry_id) == "absent")
        if absent >= qw - qa + 1:
            decided[entry_id] = None
            break  # the ledger ends before this entry
        raise LedgerRecoveryFailed(
            f"ledger {metadata.ledger_id}: cannot tell whether entry {entry_id} was acknowledged "
            f"({absent} of {qw} bookies say absent, {qw - qa + 1} needed)")
    return decided


async def _recover(context: LedgerContext, versioned: VersionedMetadata) -> VersionedMetadata:
    metadata = versioned.metadata
    ledger_id = metadata.ledger_id
    assert metadata.state == LedgerState.IN_RECOVERY
    e, qw, qa = metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
    fenced, last_add_confirmed = await _fence_all(context, metadata)
    if not covers_every_write_set(fenced, e, qw, qa):
        raise LedgerRecoveryFailed(f"ledger {ledger_id}: fenced {sorted(fenced)} of {e} bookies, "
                                   f"not enough to cover every write set")
    fragment_first = metadata.fragments[-1].first_entry_id
    start = max(last_add_confirmed, fragment_first - 1) + 1

    recovered: list[tuple[int, bytes]] = []
    next_id = start
    while True:
        window = list(range(next_id, next_id + _RECOVERY_READ_WINDOW))
        decided = await _read_window(context, metadata, window)
        ended = False
        for entry_id in window:
            if entry_id not in decided:
                break
            data = decided[entry_id]
            if data is None:
                ended = True
                break
            recovered.append((entry_id, data))
        if ended:
            break
        next_id = window[-1] + 1

    if recovered:
        silent = set(range(e)) - fenced
        if silent:
            # Replace bookies that did not answer, from the first recovered entry on,
            # so the re-replicated entries get their full write sets.
            ensemble = list(metadata.current_ensemble)
            failed_bookies = {ensemble[i] for i in silent}
            for index in sorted(silent):
                ensemble[index] = choose_replacement(context.registry.writable(), ensemble, context.rng,
                                                     exclude=failed_bookies)
            metadata = metadata.with_ensemble_from(start, tuple(ensemble))
            versioned = await context.write_metadata(metadata, versioned.version)
        await _rereplicate(context, metadata, recovered)

    last_entry_id = recovered[-1][0] if recovered else start - 1
    length_bytes = 0
    if recovered:
        length_bytes = verify_entry(recovered[-1][1]).length_bytes
    elif last_entry_id >= 0:
        length_bytes = await _length_of(context, metadata, last_entry_id)
    closed = await context.write_metadata(metadata.closed(last_entry_id, length_bytes), versioned.version)
    log.info("ledger recovered: ledger_id=%d last_entry_id=%d recovered_entries=%d length_bytes=%d",
             ledger_id, last_entry_id, len(recovered), length_bytes)
    return closed


async def _rereplicate(context: LedgerContext, metadata: LedgerMetadata, recovered: list[tuple[int, bytes]]) -> None:
    e, qw, qa = metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size
    replies: list[tuple[int, list[asyncio.Future[None]]]] = []
    for entry_id, data in recovered:
        ensemble = metadata.ensemble_for(entry_id)
        futures = [context.pool.get(ensemble[i]).add(metadata.ledger_id, entry_id, data, recovery=True)
                   for i in write_set(entry_id, e, qw)]
        replies.append((entry_id, futures))
    for entry_id, futures in replies:
        results = await asyncio.gather(*futures, return_exceptions=True)
        good = sum(1 for r in results if not isinstance(r, BaseException))
        if good < qa:
            errors = [r for r in results if isinstance(r, BaseException)]
            raise LedgerRecoveryFailed(f"ledger {metadata.ledger_id}: entry {entry_id} re-replicated to "
                                       f"{good} bookies, {qa} needed: {errors[:1]}")


async def _length_of(context: LedgerContext, metadata: LedgerMetadata, entry_id: int) -> int:
    """Ledger length up to ``entry_id``, read from that entry's header."""
    from ledger.reader import LedgerReader

    reader = LedgerReader(metadata, context.pool, context.config)
    try:
        (entry,) = await reader.read(entry_id, entry_id)
    except MagnetarError as error:
        log.warning("could not read the last entry for the ledger length: ledger_id=%d entry_id=%d error=%s",
                    metadata.ledger_id, entry_id, error)
        return metadata.length_bytes
    return verify_entry(entry.data).length_bytes
