"""An in-memory stand-in for ledger.client.LedgerClient, for the broker unit tests
(test_managed_ledger.py, test_broker_service.py, test_broker_connection.py).

It provides what the managed ledger and the cursor store call on the ledger-client
edge: ``create_ledger`` (a write handle: ``submit_nowait`` / ``add``,
``last_add_confirmed``, ``length_bytes``, ``close``, ``reader``), ``open_ledger`` (with
recovery: fences the writer and closes the ledger) and ``delete_ledger``. Entries are
encoded with the real entry format (common/entry.py) so readers slice the same header.

Tests steer it: ``hold_adds`` keeps add futures pending until ``release_adds``;
``eager_adds`` makes add futures EagerFutures, settled callbacks and all inside
``complete_pending``, as the real write handle's are (runtime/eager_future.py);
``entry_bytes_max`` makes ``submit_nowait`` refuse larger entries with EntryTooLarge
(what the ledger client does once it knows the bookies' limit); ``fail`` fails a handle
the way a bookie's refusal does; ``close_error`` makes
``WriteHandle.close`` fail; ``close_gate`` makes it wait, and ``create_gate`` makes
``create_ledger`` wait (``creating`` counts the calls waiting there). Every read is recorded as
(ledger_id, first, last) in ``reads``; ``read_gate`` makes reads wait until it is set,
``read_error`` makes them fail.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from common.entry import ENTRY_BYTES_MAX_DEFAULT
from common.entry import ENTRY_HEADER_SIZE, encode_entry
from runtime.eager_future import new_eager_future
from common.errors import EntryTooLarge, LedgerClosed, LedgerFenced, MagnetarError, NoSuchEntry, NoSuchLedger
from ledger.reader import LedgerEntry


@dataclass
class FakeClientConfig:
    entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT


@dataclass
class FakeMetadata:
    ledger_id: int
    last_entry_id: int = -1
    length_bytes: int = 0
    closed: bool = False

    @property
    def is_closed(self) -> bool:
        return self.closed


@dataclass
class FakeVersioned:
    metadata: FakeMetadata
    version: int = 1


@dataclass
class _Ledger:
    ledger_id: int
    entries: list[bytes] = field(default_factory=list)   # encoded entries (header + payload)
    payload_bytes: int = 0
    closed: bool = False
    fenced: bool = False
    custom: dict[str, str] = field(default_factory=dict)

    def metadata(self) -> FakeMetadata:
        return FakeMetadata(self.ledger_id, len(self.entries) - 1, self.payload_bytes, self.closed)


class FakeReader:
    def __init__(self, client: "FakeLedgerClient", ledger: _Ledger) -> None:
        self._client = client
        self._ledger = ledger
        self.metadata = ledger.metadata()

    @property
    def ledger_id(self) -> int:
        return self._ledger.ledger_id

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        assert 0 <= first_entry_id <= last_entry_id, (first_entry_id, last_entry_id)
        self._client.reads.append((self._ledger.ledger_id, first_entry_id, last_entry_id))
        await asyncio.sleep(0)
        if self._client.read_gate is not None:
            await self._client.read_gate.wait()
        if self._client.read_error is not None:
            raise self._client.read_error
        if last_entry_id >= len(self._ledger.entries):
            raise NoSuchEntry(self._ledger.ledger_id, last_entry_id)
        return [LedgerEntry(self._ledger.ledger_id, entry_id, self._ledger.entries[entry_id])
                for entry_id in range(first_entry_id, last_entry_id + 1)]


class FakeWriteHandle:
    def __init__(self, client: "FakeLedgerClient", ledger: _Ledger) -> None:
        self._client = client
        self._ledger = ledger
        self.ledger_id = ledger.ledger_id
        self._next_entry_id = 0
        self._pending: list[tuple[int, bytes, asyncio.Future[int]]] = []
        self.last_add_confirmed = -1
        self.length_bytes = 0
        self._closed = False
        self.failure: MagnetarError | None = None
        # The fake keeps no ledger metadata in the metadata store, so a guard on the
        # ledger's key (managed_ledger/managed_ledger.py _write_info) compares "absent" (0).
        self.metadata_version = 0

    def fail(self, error: MagnetarError) -> None:
        """What a WriteHandle does on an error it cannot recover from (a bookie refused
        an entry as invalid): pending adds fail, later submits raise the error."""
        self.failure = error
        pending, self._pending = self._pending, []
        for _entry_id, _payload, future in pending:
            if not future.done():
                future.set_exception(error)

    def submit_nowait(self, payload: bytes | memoryview) -> asyncio.Future[int]:
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise LedgerClosed(self.ledger_id)
        size = len(payload) + ENTRY_HEADER_SIZE
        if size > self._client.config.entry_bytes_max:
            raise EntryTooLarge(size, self._client.config.entry_bytes_max)
        entry_id = self._next_entry_id
        self._next_entry_id += 1
        future: asyncio.Future[int] = (new_eager_future() if self._client.eager_adds
                                       else asyncio.get_running_loop().create_future())
        self._pending.append((entry_id, bytes(payload), future))
        self._client.submitted += 1
        if not self._client.hold_adds:
            asyncio.get_running_loop().call_soon(self.complete_pending)
        return future

    async def add(self, payload: bytes | memoryview) -> int:
        return await self.submit_nowait(payload)

    def complete_pending(self) -> None:
        """Completes every pending add, in entry order (fails them if fenced)."""
        pending, self._pending = self._pending, []
        for entry_id, payload, future in pending:
            if future.done():
                continue
            if self._ledger.fenced:
                future.set_exception(LedgerFenced(self.ledger_id))
                continue
            assert entry_id == len(self._ledger.entries), (entry_id, len(self._ledger.entries))
            self._ledger.payload_bytes += len(payload)
            self._ledger.entries.append(encode_entry(self.ledger_id, entry_id, self.last_add_confirmed,
                                                     self._ledger.payload_bytes, payload))
            self.last_add_confirmed = entry_id
            self.length_bytes = self._ledger.payload_bytes
            future.set_result(entry_id)

    async def close(self) -> FakeVersioned:
        if self._client.close_gate is not None:
            await self._client.close_gate.wait()
        self._closed = True
        if self._client.close_error is not None:
            raise self._client.close_error
        while self._pending and not self._client.hold_adds:
            self.complete_pending()
        self._ledger.closed = True
        return FakeVersioned(self._ledger.metadata())

    def reader(self) -> FakeReader:
        return FakeReader(self._client, self._ledger)


class FakeLedgerClient:
    def __init__(self, *, first_ledger_id: int = 1) -> None:
        self.config = FakeClientConfig()
        self.ledgers: dict[int, _Ledger] = {}
        self.handles: dict[int, FakeWriteHandle] = {}
        self._next_ledger_id = first_ledger_id
        self.hold_adds = False
        self.eager_adds = False
        self.close_error: MagnetarError | None = None
        self.close_gate: asyncio.Event | None = None
        self.create_gate: asyncio.Event | None = None
        self.creating = 0
        self.reads: list[tuple[int, int, int]] = []
        # Reads wait for read_gate while it is set (and not yet set free), and raise
        # read_error while it is set.
        self.read_gate: asyncio.Event | None = None
        self.read_error: MagnetarError | None = None
        self.created = 0
        self.submitted = 0
        # flush_adds: how often it was called, and how many entries had been submitted
        # at its latest call.
        self.flushes = 0
        self.submitted_at_flush = 0

    def flush_adds(self) -> None:
        self.flushes += 1
        self.submitted_at_flush = self.submitted

    def release_adds(self) -> None:
        self.hold_adds = False
        for handle in self.handles.values():
            handle.complete_pending()

    async def create_ledger(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int,
                            custom: dict[str, str] | None = None) -> FakeWriteHandle:
        assert ensemble_size >= write_quorum_size >= ack_quorum_size >= 1
        if self.create_gate is not None:
            self.creating += 1
            try:
                await self.create_gate.wait()
            finally:
                self.creating -= 1
        ledger_id = self._next_ledger_id
        self._next_ledger_id += 1
        self.created += 1
        ledger = _Ledger(ledger_id, custom=dict(custom or {}))
        self.ledgers[ledger_id] = ledger
        handle = FakeWriteHandle(self, ledger)
        self.handles[ledger_id] = handle
        return handle

    async def open_ledger(self, ledger_id: int, *, recovery: bool) -> FakeReader:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            raise NoSuchLedger(ledger_id)
        if recovery and not ledger.closed:
            ledger.fenced = True
            ledger.closed = True
        return FakeReader(self, ledger)

    async def delete_ledger(self, ledger_id: int) -> None:
        if self.ledgers.pop(ledger_id, None) is None:
            raise NoSuchLedger(ledger_id)
        self.handles.pop(ledger_id, None)
