"""The write handle (ledger/handle.py) and entries that no bookie will accept.

What it proves:
- submit refuses a payload whose encoded entry is over the client's entry_bytes_max
  with EntryTooLarge before giving it an entry id: nothing is sent, and the handle goes
  on with the next entry id for smaller entries (before, the limit was half the gRPC
  message size, far above what bookies accept);
- entry_bytes_max defaults to the bookies' default and is validated in the config;
- a bookie answering EntryTooLarge, InvalidArgument or MalformedFrame (an entry no
  other bookie would take either; reachable when the client's limit is above its
  bookies') fails the handle with that error, with no ensemble change and no metadata
  write (before, each such reply replaced bookies until NotEnoughBookies); so does a
  bookie refusing the writer's credentials (AuthenticationFailed, AuthorizationDenied);
- a bookie that is unavailable still gets replaced (the ensemble change still works).

How: the handle runs on a LedgerContext over the in-memory metadata store and a real
BookieRegistry; the bookie client pool is a fake whose bookies answer each add at once
with a programmed outcome. Errors are rebuilt with error_for_code, as they arrive over
the wire (without their fields).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from bookie.config import ENTRY_BYTES_MAX_DEFAULT as BOOKIE_ENTRY_BYTES_MAX_DEFAULT
from bookie.config import LedgerStorageConfig
from ledger.bookie_registry import BookieRegistry
from ledger.config import LedgerClientConfig
from ledger.context import LedgerContext
from common.entry import ENTRY_HEADER_SIZE
from common.errors import (
    AuthenticationFailed,
    AuthorizationDenied,
    BookieUnavailable,
    ConfigError,
    EntryTooLarge,
    InvalidArgument,
    MagnetarError,
    MalformedFrame,
    error_for_code,
)
from ledger.handle import WriteHandle
from ledger.metadata import Fragment, LedgerMetadata, LedgerState, VersionedMetadata
from metadata import keys
from metadata.bookie_record import BookieRecord
from metadata.memory_store import MemoryStore

KIB = 1024
MIB = 1024 * KIB
BOOKIES = ["b1", "b2", "b3", "b4", "b5"]
ENSEMBLE = ("b1", "b2", "b3")


class _FakeBookie:
    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.adds: list[int] = []
        # entry_id -> the error this bookie answers with (absent: success).
        self.refuse: dict[int, MagnetarError] = {}

    def add(self, ledger_id: int, entry_id: int, entry: bytes, *, recovery: bool = False) -> asyncio.Future[None]:
        self.adds.append(entry_id)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        error = self.refuse.get(entry_id)
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
        return future


class _FakePool:
    def __init__(self) -> None:
        self.bookies = {bookie_id: _FakeBookie(bookie_id) for bookie_id in BOOKIES}

    def get(self, bookie_id: str) -> _FakeBookie:
        return self.bookies[bookie_id]


def _record(bookie_id: str) -> BookieRecord:
    return BookieRecord(bookie_id, f"{bookie_id}:3181", f"{bookie_id}:8000", False, 10**12, 10**12, 0.1,
                        "test", 0)


@pytest.fixture
async def setup():
    store = MemoryStore()
    for bookie_id in BOOKIES:
        await store.put(keys.bookie(bookie_id), _record(bookie_id).encode())
    registry = BookieRegistry(store)
    await registry.start()
    pool = _FakePool()
    config = LedgerClientConfig(entry_bytes_max=64 * KIB)
    context = LedgerContext(store, registry, pool, config, random.Random(1))   # type: ignore[arg-type]
    metadata = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                              state=LedgerState.OPEN, fragments=(Fragment(0, ENSEMBLE),))
    version = await store.create(keys.ledger(7), metadata.encode())
    handle = WriteHandle(context, VersionedMetadata(metadata, version))
    try:
        yield store, pool, handle
    finally:
        await registry.close()


def _adds(pool: _FakePool) -> dict[str, list[int]]:
    return {bookie_id: bookie.adds for bookie_id, bookie in pool.bookies.items() if bookie.adds}


def test_entry_bytes_max_defaults_to_the_bookies_and_is_validated():
    """Client and bookie agree by default; out-of-range values are ConfigErrors."""
    assert LedgerClientConfig().entry_bytes_max == BOOKIE_ENTRY_BYTES_MAX_DEFAULT
    assert LedgerStorageConfig(ledger_dirs=("/x",)).entry_bytes_max == LedgerClientConfig().entry_bytes_max
    with pytest.raises(ConfigError, match="entry_bytes_max"):
        LedgerClientConfig(entry_bytes_max=1024)
    with pytest.raises(ConfigError, match="entry_bytes_max"):
        LedgerClientConfig(grpc_message_bytes_max=16 * MIB, batch_bytes_max=4 * MIB,
                           read_response_bytes_max=4 * MIB, entry_bytes_max=8 * MIB + 1)


async def test_an_oversized_entry_is_refused_before_it_gets_an_id(setup):
    """One byte over the limit: EntryTooLarge naming the payload limit, nothing sent.
    An entry exactly at the limit and the ones after it get ids 0, 1, ..."""
    _store, pool, handle = setup
    payload_max = 64 * KIB - ENTRY_HEADER_SIZE
    with pytest.raises(EntryTooLarge) as caught:
        handle.submit_nowait(b"x" * (payload_max + 1))
    assert caught.value.size_bytes == payload_max + 1
    assert caught.value.size_bytes_max == payload_max
    assert _adds(pool) == {}
    assert handle.failure is None
    assert await handle.add(b"y" * payload_max) == 0
    assert await handle.add(b"small") == 1
    assert handle.last_add_confirmed == 1


@pytest.mark.parametrize("error_class", [EntryTooLarge, InvalidArgument, MalformedFrame, AuthenticationFailed,
                                         AuthorizationDenied])
async def test_an_entry_a_bookie_calls_invalid_fails_the_handle(setup, error_class):
    """Entry 1 is refused by every bookie as invalid: the handle fails with that error
    type, entry 0 stays acknowledged, no bookie is replaced and the metadata is as
    created; later submits raise the same failure."""
    store, pool, handle = setup
    for bookie in pool.bookies.values():
        bookie.refuse[1] = error_for_code(error_class.code, f"refused by {bookie.bookie_id}")
    assert await handle.add(b"good") == 0
    with pytest.raises(error_class):
        await asyncio.wait_for(handle.add(b"bad"), 5)
    await asyncio.sleep(0)
    assert isinstance(handle.failure, error_class)
    assert handle.ensemble_changes == 0
    assert handle.last_add_confirmed == 0
    assert set(_adds(pool)) == set(ENSEMBLE)
    record = await store.get(keys.ledger(7))
    assert LedgerMetadata.decode(record.value).fragments == (Fragment(0, ENSEMBLE),)
    with pytest.raises(error_class):
        handle.submit_nowait(b"later")


async def test_an_unavailable_bookie_is_still_replaced(setup):
    """BookieUnavailable from one bookie: an ensemble change replaces it and the entry
    completes on the new ensemble."""
    store, pool, handle = setup
    pool.bookies["b2"].refuse[0] = BookieUnavailable("b2", "stream broke")
    assert await asyncio.wait_for(handle.add(b"entry"), 5) == 0
    assert handle.failure is None
    assert handle.ensemble_changes == 1
    assert "b2" not in handle.metadata.current_ensemble
    record = await store.get(keys.ledger(7))
    # From entry 0 on (nothing was confirmed yet), so the first fragment is replaced.
    assert LedgerMetadata.decode(record.value).current_ensemble == handle.metadata.current_ensemble
    assert "b2" not in LedgerMetadata.decode(record.value).current_ensemble
