"""Where a start message id lands (ManagedLedger.normalize) while its ledger rolls over
and closes: the broker's side of a reader that was asked to start after 1:9 for a range
ending at 1:19 (the Spark tail reader, spark/tail.py) and got 2:0 first.

What it proves: a written position of a ledger stays where it is in every state the
ledger passes through. Those states are: current; full with its rollover waiting for
the new ledger (with appends in flight on it, then without); rolled over with its close
under way, before and after the next ledger confirmed an entry; closed; reloaded by a
new owner. A position past a finished ledger's end moves to the next ledger's first
entry. So the skip was not a rollover race here. Its cause was retention, which removed
the archived ledger from the topic
(tests/integration/test_reader_start_in_archived_ledger.py).

How: a real ManagedLedger over the in-memory metadata store and FakeLedgerClient, its
gates holding the rollover's ledger creation, the adds and the old ledger's close.
"""

from __future__ import annotations

import asyncio

from common.entry_cache import EntryCache
from common.position import Position
from managed_ledger.managed_ledger import ManagedLedger
from metadata.memory_store import MemoryStore
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_managed_ledger import MIB, TIMEOUT_S, TOPIC, config, opened, until

ENTRIES = 20


def assert_written_positions_stay(ledger: ManagedLedger, ledger_id: int, written: int, state: str) -> None:
    for entry_id in range(written):
        position = Position(ledger_id, entry_id)
        assert ledger.normalize(position) == position, f"{state}: {position} moved to {ledger.normalize(position)}"


async def test_written_positions_stay_in_every_state_of_a_rollover():
    store, client = MemoryStore(), FakeLedgerClient()
    ledger = await opened(store, client, ledger_entries_max=ENTRIES)
    first = ledger.current_ledger_id
    async with asyncio.timeout(TIMEOUT_S):
        for index in range(ENTRIES - 5):
            await ledger.append(b"x%d" % index)
    assert_written_positions_stay(ledger, first, ENTRIES - 5, "current ledger")

    # The last 5 entries of the ledger in flight, the rollover waiting for its ledger.
    client.create_gate = asyncio.Event()
    client.close_gate = asyncio.Event()
    client.hold_adds = True
    appends = [ledger.append(b"y%d" % index) for index in range(5)]
    await until(lambda: client.creating == 1, "the rollover waits for the new ledger")
    assert_written_positions_stay(ledger, first, ENTRIES - 5, "full, adds in flight, rolling")
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(*appends)
    assert_written_positions_stay(ledger, first, ENTRIES, "full, rolling")

    # Rolled over: three appends on the new ledger in flight, the old one closing.
    client.hold_adds = True
    later = [ledger.append(b"z%d" % index) for index in range(3)]
    client.create_gate.set()
    await until(lambda: ledger.current_ledger_id not in (-1, first), "rolled over")
    second = ledger.current_ledger_id
    assert first in ledger._open_handles
    assert_written_positions_stay(ledger, first, ENTRIES, "closing, nothing on the next ledger")
    assert ledger.normalize(Position(first, ENTRIES)) in (Position(first, ENTRIES), Position(second, 0))
    client.release_adds()
    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(*later)
    assert first in ledger._open_handles
    assert_written_positions_stay(ledger, first, ENTRIES, "closing, the next ledger confirmed entries")
    assert ledger.normalize(Position(first, ENTRIES)) == Position(second, 0)

    client.close_gate.set()
    await until(lambda: not ledger._closing_handles, "the old ledger closed")
    assert_written_positions_stay(ledger, first, ENTRIES, "closed")
    assert ledger.normalize(Position(first, ENTRIES)) == Position(second, 0)
    await ledger.close()

    reloaded = ManagedLedger(TOPIC, store, client, EntryCache(64 * MIB), config(ledger_entries_max=ENTRIES))
    await reloaded.open(create_if_missing=False)
    assert_written_positions_stay(reloaded, first, ENTRIES, "reloaded")
    assert reloaded.normalize(Position(first, ENTRIES)) == Position(second, 0)
    await reloaded.close()
