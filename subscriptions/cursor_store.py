"""Durable cursor state: etcd holds a small pointer record, the cursor ledger on the
bookies holds the state itself (docs/architecture.md, "The data path of a dispatch").

etcd record ``/cursors/<topic>/<subscription>`` (JSON):
    {"mark_delete": [ledger, entry], "cursor_ledger": id or -1, "snapshot_entry": id,
     "inline": base64 CursorRecord or null, "owner": broker id, "session": id}

- A new subscription's first save (its starting position: nothing acknowledged yet)
  is inline in etcd, with no ledger. A subscription that never acknowledged anything
  stays that way.
- Every later save goes to the cursor ledger. The first creates it, writes a snapshot
  as its first entry and points etcd at it. Later saves append a delta (the entries
  acknowledged since the previous save, plus the mark-delete position), or a fresh
  snapshot every ``deltas_per_snapshot`` saves or after a reset. Only snapshots move
  the etcd pointer, so etcd sees a write every ``deltas_per_snapshot`` flushes, not
  every flush. Deltas go only to the ledger etcd points at: a snapshot whose pointer
  write failed is written again (to the same new ledger) before any delta follows it.
- When the ledger holds ``ledger_entries_max`` records, or its handle failed, it rolls
  over: a new ledger starts with a snapshot, etcd points at it, and the ledger etcd
  pointed at before is deleted (whenever the pointer moves to another ledger).
- A new owner (``load``) opens the cursor ledger with recovery — fencing the previous
  owner's writes — replays the last snapshot and the deltas after it, and starts a
  ledger of its own at its first save.
- Every pointer write is a compare-and-set against the version this store last read
  or wrote. Losing it means another broker wrote the pointer: the topic moved. The
  store then raises ``TopicFenced`` (as it does when its cursor ledger was fenced by the
  new owner's recovery) and the cursor stops saving. One write of ours whose reply was
  lost (a timeout after etcd applied it) must not look like that: the pointer carries
  this store's random ``session``, and a pointer found with our own session is ours.

The ack state stays exact however many holes it has: nothing is ever dropped, the
bitmaps of AckSet cost one bit per entry and compress well.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from typing import Sequence

from ledger.client import LedgerClient
from common.errors import LedgerFenced, MagnetarError, MalformedFrame, MetadataVersionConflict, NoSuchLedger, TopicFenced
from ledger.handle import WriteHandle
from metadata import keys
from metadata.store import Compare, Delete, MetadataStore, Put, Record
from subscriptions.ack_set import AckSet
from subscriptions.cursor import CursorState
from subscriptions.cursor_record import (
    KIND_DELTA,
    KIND_SNAPSHOT,
    CursorRecord,
    apply_delta,
    decode_record,
    encode_record,
)

log = logging.getLogger(__name__)

# Saves between snapshots: replaying a cursor reads at most this many deltas.
DELTAS_PER_SNAPSHOT = 64
# Records per cursor ledger before it rolls over (the old one is then deleted).
LEDGER_ENTRIES_MAX = 10_000


class LedgerCursorStore:
    def __init__(self, store: MetadataStore, key: str, ledger_client: LedgerClient, *,
                 quorums: tuple[int, int, int], owner: str, ledger_tags: dict[str, str] | None = None) -> None:
        self._store = store
        self._key = key
        # The custom metadata of the cursor ledgers this store creates: the pointer's
        # key, plus the owner's tags (the topic and purpose, which the broker's ledger
        # collector reads: managed_ledger/ledger_gc.py).
        self._ledger_custom = {**(ledger_tags or {}), "cursor": key}
        self._client = ledger_client
        self._quorums = quorums
        self._owner = owner
        # Written into every pointer: tells our own writes from another broker's. Made
        # at the first write: most cursors a broker loads are never written by it.
        self._session_value: str | None = None
        self._handle: WriteHandle | None = None
        self._ledger_id = -1          # the ledger etcd points at (ours or a previous owner's)
        self._version = 0             # the pointer's version as last read or written (0: absent)
        self._snapshot_entry = -1
        self._deltas_since_snapshot = 0
        self.saves = 0
        self.snapshots = 0

    @property
    def _session(self) -> str:
        if self._session_value is None:
            self._session_value = uuid.uuid4().hex
        return self._session_value

    # --- loading -----------------------------------------------------------------------

    async def load(self, record: Record | None = None) -> CursorState | None:
        """The saved state (None: no pointer). ``record``: the pointer, already read
        (a topic reads all its cursors' pointers in one prefix read)."""
        if record is None:
            record = await self._store.get(self._key)
        if record is None:
            return None
        ledger_id, snapshot_entry, inline = self._adopt_pointer(record)
        if ledger_id < 0:
            return self._inline_state(inline)
        try:
            reader = await self._client.open_ledger(ledger_id, recovery=True)
        except NoSuchLedger:
            raise MalformedFrame(f"cursor ledger {ledger_id} of {self._key} is gone") from None
        last = reader.metadata.last_entry_id
        if last < snapshot_entry:
            raise MalformedFrame(f"cursor ledger {ledger_id} ends at {last}, before its snapshot {snapshot_entry}")
        state: CursorState | None = None
        entry_id = snapshot_entry
        while entry_id <= last:
            batch_end = min(last, entry_id + 255)
            for entry in await reader.read(entry_id, batch_end):
                record_value = decode_record(entry.payload)
                if record_value.kind == KIND_SNAPSHOT or state is None:
                    if record_value.kind != KIND_SNAPSHOT:
                        raise MalformedFrame(f"cursor ledger {ledger_id} entry {entry.entry_id}: "
                                             "replay does not start at a snapshot")
                    state = _state_of(record_value)
                else:
                    # Deltas only ever move the mark-delete position forward (a reset
                    # writes a snapshot), so taking the record's is taking the latest.
                    apply_delta(state.acked, record_value)
                    state.mark_delete = record_value.mark_delete
                    state.acked.discard_up_to(state.mark_delete.ledger_id, state.mark_delete.entry_id)
                    state.batches = record_value.batches
                    state.properties = record_value.properties
            entry_id = batch_end + 1
        assert state is not None
        log.info("cursor recovered from its ledger: cursor=%s ledger_id=%d records=%d mark_delete=%s acked=%d",
                 self._key, ledger_id, last - snapshot_entry + 1, state.mark_delete, len(state.acked))
        return state

    def load_inline(self, record: Record) -> CursorState | None:
        """``load`` from a pointer already read that holds the state itself (a cursor
        that never acknowledged past its start), with nothing awaited; None when the
        state is in a cursor ledger: ``load`` recovers it. A topic loads its inline
        cursors this way, without a task each (bench/topics_scale.py's failover)."""
        ledger_id, _snapshot_entry, inline = self._adopt_pointer(record)
        return self._inline_state(inline) if ledger_id < 0 else None

    def _adopt_pointer(self, record: Record) -> tuple[int, int, str | None]:
        """(cursor ledger, snapshot entry, inline state) of a pointer record, which
        this store then writes over (its version)."""
        try:
            pointer = json.loads(record.value)
            ledger_id = int(pointer.get("cursor_ledger", -1))
            snapshot_entry = int(pointer.get("snapshot_entry", -1))
            inline = pointer.get("inline")
        except (ValueError, TypeError, AttributeError) as error:
            raise MalformedFrame(f"bad cursor pointer {self._key}: {error}") from None
        self._ledger_id = ledger_id
        self._version = record.version
        return ledger_id, snapshot_entry, inline

    def _inline_state(self, inline: str | None) -> CursorState:
        if inline is None:
            raise MalformedFrame(f"cursor pointer {self._key} has neither a ledger nor inline state")
        return _state_of(decode_record(base64.b64decode(inline)))

    # --- saving -------------------------------------------------------------------------

    async def save(self, state: CursorState, delta: AckSet | None) -> None:
        """Persists the state. ``delta`` is what was acknowledged since the previous
        save; None asks for a snapshot (first save, after a reset, or on demand).
        Raises TopicFenced when another broker owns the cursor now."""
        self.saves += 1
        handle = self._handle
        if handle is not None and isinstance(handle.failure, LedgerFenced):
            raise TopicFenced(f"cursor {self._key}: ledger {handle.ledger_id} fenced by a new owner")
        if self._version == 0 and self._handle is None and self._ledger_id < 0 \
                and not len(state.acked) and not state.batches:
            await self._save_inline(state)   # the starting position: no pointer yet
            return
        if (handle is None or delta is None or handle.failure is not None
                or handle.ledger_id != self._ledger_id      # etcd does not point at it (yet)
                or self._deltas_since_snapshot >= DELTAS_PER_SNAPSHOT
                or handle.last_add_confirmed + 1 >= LEDGER_ENTRIES_MAX):
            await self._save_snapshot(state)
            return
        record = CursorRecord(KIND_DELTA, state.mark_delete, delta, state.batches, state.properties)
        await self._add(handle, encode_record(record))
        self._deltas_since_snapshot += 1

    async def _add(self, handle: WriteHandle, payload: bytes) -> int:
        try:
            return await handle.add(payload)
        except LedgerFenced:
            # Only a new owner's load() opens our cursor ledger with recovery.
            raise TopicFenced(f"cursor {self._key}: ledger {handle.ledger_id} fenced by a new owner") from None

    async def _save_inline(self, state: CursorState) -> None:
        record = encode_record(CursorRecord(KIND_SNAPSHOT, state.mark_delete, AckSet(), state.batches,
                                            state.properties))
        await self._write_pointer({
            "mark_delete": list(state.mark_delete), "cursor_ledger": -1, "snapshot_entry": -1,
            "inline": base64.b64encode(record).decode()})

    async def _save_snapshot(self, state: CursorState) -> None:
        record = encode_record(CursorRecord(KIND_SNAPSHOT, state.mark_delete, state.acked, state.batches,
                                            state.properties))
        if self._handle is None or self._handle.failure is not None \
                or self._handle.last_add_confirmed + 1 >= LEDGER_ENTRIES_MAX:
            old_handle = self._handle
            self._handle = await self._client.create_ledger(*self._quorums, custom=self._ledger_custom)
            if old_handle is not None:
                await self._retire(old_handle)
        handle = self._handle
        entry_id = await self._add(handle, record)
        try:
            # The pointer names the ledger only while its metadata is as the handle
            # knows it: a ledger the broker's ledger collector deleted (this save came
            # after its grace period, managed_ledger/ledger_gc.py) is never pointed at.
            await self._write_pointer({
                "mark_delete": list(state.mark_delete), "cursor_ledger": handle.ledger_id,
                "snapshot_entry": entry_id, "inline": None},
                guards=(Compare(keys.ledger(handle.ledger_id), handle.metadata_version),))
        except NoSuchLedger:
            if self._handle is handle:
                self._handle = None    # the next save starts a new ledger
            raise
        previous_ledger, self._ledger_id = self._ledger_id, handle.ledger_id
        self._snapshot_entry = entry_id
        self._deltas_since_snapshot = 0
        self.snapshots += 1
        if previous_ledger >= 0 and previous_ledger != self._ledger_id:
            # Nothing points at it any more (it was ours before a rollover, or the
            # previous owner's, which recovery already sealed).
            await self._delete_ledger(previous_ledger)

    async def _retire(self, handle: WriteHandle) -> None:
        """Closes a handle being replaced; deletes its ledger if etcd never pointed at it
        (a snapshot whose pointer write failed): nothing else would."""
        try:
            await handle.close()
        except MagnetarError as error:
            log.warning("closing a cursor ledger failed: cursor=%s ledger_id=%d error=%s", self._key,
                        handle.ledger_id, error)
        if handle.ledger_id != self._ledger_id:
            await self._delete_ledger(handle.ledger_id)

    async def _write_pointer(self, pointer: dict, guards: Sequence[Compare] = ()) -> None:
        """Compare-and-set of the etcd pointer; TopicFenced if another broker wrote it.
        ``guards``: one more compare of the same transaction (the cursor ledger's
        metadata); when it fails with the pointer as we left it, NoSuchLedger."""
        value = json.dumps({**pointer, "owner": self._owner, "session": self._session}).encode()
        try:
            self._version = await self._swap_pointer(value, guards)
            return
        except MetadataVersionConflict:
            current = await self._store.get(self._key)
            if guards and (current.version if current is not None else 0) == self._version:
                raise NoSuchLedger(int(pointer["cursor_ledger"])) from None
            if current is None or _session_of(current.value) != self._session:
                raise TopicFenced(f"cursor {self._key} was taken over (its pointer changed)") from None
        # An earlier write of ours landed though its reply was lost: nobody else wrote
        # since (they would have replaced the session), so ours is the version to follow.
        self._version = current.version
        try:
            self._version = await self._swap_pointer(value, guards)
        except MetadataVersionConflict:
            current = await self._store.get(self._key)
            if guards and current is not None and current.version == self._version:
                raise NoSuchLedger(int(pointer["cursor_ledger"])) from None
            raise TopicFenced(f"cursor {self._key} was taken over (its pointer changed)") from None

    async def _swap_pointer(self, value: bytes, guards: Sequence[Compare]) -> int:
        if not guards:
            return await self._store.compare_and_set(self._key, value, expected_version=self._version)
        revision = await self._store.transaction([Compare(self._key, self._version), *guards],
                                                 [Put(self._key, value)])
        if revision is None:
            raise MetadataVersionConflict(self._key)
        return revision

    async def _delete_ledger(self, ledger_id: int) -> None:
        """Deletes a ledger nothing points at. A failure is logged, not raised: the save
        that replaced it has succeeded (or will be retried without it), and retrying
        the save would not retry the delete."""
        try:
            await self._client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass
        except MagnetarError as error:
            log.warning("deleting a cursor ledger failed, it is left behind: cursor=%s ledger_id=%d error=%s",
                        self._key, ledger_id, error)

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    async def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                await handle.close()
            except MagnetarError as error:
                log.warning("closing a cursor ledger failed: cursor=%s error=%s", self._key, error)

    async def delete(self) -> None:
        """Deletes the pointer (only while it is still ours) and the cursor ledger."""
        unpointed = self._handle.ledger_id if self._handle is not None else -1
        await self.close()
        deleted = await self._store.transaction([Compare(self._key, self._version)], [Delete(self._key)])
        if deleted is None:
            current = await self._store.get(self._key)
            if current is not None and _session_of(current.value) != self._session:
                raise TopicFenced(f"cursor {self._key} was taken over (its pointer changed)")
            if current is not None:
                await self._store.compare_and_delete(self._key, expected_version=current.version)
        self._version = 0
        if unpointed >= 0 and unpointed != self._ledger_id:
            await self._delete_ledger(unpointed)   # a snapshot's ledger whose pointer write failed
        if self._ledger_id >= 0:
            await self._delete_ledger(self._ledger_id)
            self._ledger_id = -1


def _session_of(pointer: bytes) -> str | None:
    try:
        session = json.loads(pointer).get("session")
    except (ValueError, AttributeError):
        return None
    return session if isinstance(session, str) else None


def _state_of(record: CursorRecord) -> CursorState:
    return CursorState(record.mark_delete, record.acked, dict(record.batches), dict(record.properties))

