"""Ledger ids from the cluster's counter (``/counters/ledger-id``), for one process.

Theory of operation:
- Ids come from one decimal counter in the metadata store, raised by compare-and-swap,
  so every process of the cluster draws from the same sequence and a ledger created
  later gets a larger id (a managed ledger's positions order by ledger id, so a topic
  moved to another broker must not get a smaller id there).
- One process asking for many ids at once (a broker loading a bundle of 1,000 topics,
  each creating a ledger) used to run one compare-and-swap per id, all against the same
  key: every round but one lost, retried, and after 64 losses the topic load failed with
  a version conflict (seen at 64 creations in flight). Here the requests of a process
  are coalesced: while one compare-and-swap is on its way, the requests arriving queue,
  and the next one raises the counter by their number and hands them consecutive ids.
  At most one compare-and-swap per process is in flight, so a process never races
  itself; other processes still can, and a lost race reads the counter again
  (``attempts_max`` rounds, then MetadataVersionConflict).
- The counter's value and version after our last swap are remembered, so an uncontended
  request costs one etcd transaction, not a read and a transaction.
- Ids reserved for a request cancelled meanwhile are skipped (the sequence has gaps, as
  it did when a creation failed after its increment); they are never handed out twice.
"""

from __future__ import annotations

import asyncio

from common.errors import MetadataVersionConflict
from metadata import keys
from metadata.store import Compare, MetadataStore, Put

ATTEMPTS_MAX = 64


class LedgerIdAllocator:
    def __init__(self, store: MetadataStore, key: str = keys.LEDGER_ID_COUNTER, *,
                 attempts_max: int = ATTEMPTS_MAX) -> None:
        self._store = store
        self._key = key
        self._attempts_max = attempts_max
        self._waiting: list[asyncio.Future[int]] = []
        self._runner: asyncio.Task[None] | None = None
        # (value, version) of the counter after this process's last swap, or None.
        self._known: tuple[int, int] | None = None
        self.swaps = 0           # compare-and-swaps that succeeded
        self.conflicts = 0       # compare-and-swaps that lost a race

    async def next_id(self) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run())
        return await future

    async def _run(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                first = await self._reserve(len(batch))
            except BaseException as error:
                for future in batch:
                    if not future.done():
                        future.set_exception(error if isinstance(error, Exception)
                                             else asyncio.CancelledError())
                if not isinstance(error, Exception):
                    for future in self._waiting:
                        future.cancel()
                    self._waiting = []
                    raise
                continue
            for offset, future in enumerate(batch):
                if not future.done():
                    future.set_result(first + offset)

    async def _reserve(self, count: int) -> int:
        """Raises the counter by ``count``; returns the first id of the block."""
        for _ in range(self._attempts_max):
            if self._known is None:
                record = await self._store.get(self._key)
                self._known = (int(record.value), record.version) if record is not None else (0, 0)
            value, version = self._known
            self._known = None   # unknown until this swap's outcome is known
            revision = await self._store.transaction([Compare(self._key, version)],
                                                     [Put(self._key, str(value + count).encode())])
            if revision is not None:
                self.swaps += 1
                self._known = (value + count, revision)
                return value + 1
            self.conflicts += 1
        raise MetadataVersionConflict(self._key)
