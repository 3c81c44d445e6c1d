"""The simulator's network: the ledger client's bookie port (what ``BookieClientPool.get``
returns: add / read / fence / read_last_add_confirmed) implemented over in-memory
messages to ``SimBookie`` nodes, with the fault plan's drops, delays (hence reordering)
and partitions.

Failure semantics follow the real gRPC client: a bookie that is down refuses at once
(BookieUnavailable after a round trip); a request or reply lost in a partition or a
drop is noticed only by the caller's deadline (AddTimeout for adds after
``add_timeout_s``; reads, fences and last-add-confirmed after their timeouts); errors
the bookie returns arrive as the same catalogue classes.
"""

from __future__ import annotations

import asyncio
import random

from bookie.node import AddItem
from common.errors import AddTimeout, BookieUnavailable, MagnetarError
from ledger.bookie_client import BookieLedgerState, BookieReadResult
from ledger.config import LedgerClientConfig
from tests.sim.bookie import SimBookie


class NetworkFaults:
    def __init__(self, rng: random.Random, drop_rate: float, delay_spike_rate: float) -> None:
        self.rng = rng
        self.drop_rate = drop_rate
        self.delay_spike_rate = delay_spike_rate
        # (client name, bookie id) pairs cut off from each other.
        self.partitioned: set[tuple[str, str]] = set()
        self.enabled = True

    def delay_s(self) -> float:
        if self.enabled and self.rng.random() < self.delay_spike_rate:
            return self.rng.uniform(0.05, 1.5)
        return self.rng.uniform(0.0001, 0.002)

    def lost(self, client: str, bookie_id: str) -> bool:
        if not self.enabled:
            return False
        return (client, bookie_id) in self.partitioned or self.rng.random() < self.drop_rate


class SimBookieClient:
    def __init__(self, client_name: str, bookie: SimBookie, faults: NetworkFaults, config: LedgerClientConfig,
                 tasks: set[asyncio.Task]) -> None:
        self.bookie_id = bookie.bookie_id
        self._client = client_name
        self._bookie = bookie
        self._faults = faults
        self._config = config
        self._tasks = tasks

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, handler, timeout_s: float, timeout_error: MagnetarError):
        """One request/reply: delay, maybe lost, run on the bookie if it is up, reply
        delay, maybe lost. A lost message shows as the deadline passing."""
        async def exchange():
            await asyncio.sleep(self._faults.delay_s())
            if self._faults.lost(self._client, self.bookie_id):
                await asyncio.sleep(timeout_s * 2)   # never answered
            node = self._bookie.node
            if node is None:
                await asyncio.sleep(self._faults.delay_s())
                raise BookieUnavailable(self.bookie_id, "connection refused (simulated)")
            try:
                result = await handler(node)
            finally:
                self._bookie.check_last_add_confirmed()
            await asyncio.sleep(self._faults.delay_s())
            if self._faults.lost(self._client, self.bookie_id):
                await asyncio.sleep(timeout_s * 2)
            return result

        try:
            async with asyncio.timeout(timeout_s):
                return await exchange()
        except TimeoutError:
            raise timeout_error from None

    def add(self, ledger_id: int, entry_id: int, entry: bytes, *, recovery: bool = False) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = AddItem(ledger_id, entry_id, bytes(entry), recovery)

        async def handler(node):
            await node.admit([item])
            outcomes, durable = node.submit_adds([item])
            if outcomes[0] is not None:
                raise outcomes[0]
            assert durable is not None
            await durable

        async def run() -> None:
            try:
                await self._call(handler, self._config.add_timeout_s,
                                 AddTimeout(f"bookie {self.bookie_id} did not answer an add (simulated)"))
            except MagnetarError as error:
                if not future.done():
                    future.set_exception(error)
                return
            if not future.done():
                future.set_result(None)

        self._spawn(run())
        return future

    async def read(self, ledger_id: int, entry_ids: list[int], response_bytes_max: int) -> list[BookieReadResult]:
        async def handler(node):
            outcomes = await node.read(ledger_id, list(entry_ids), response_bytes_max)
            return [BookieReadResult(o.entry_id, o.entry, o.error) for o in outcomes]

        return await self._call(handler, self._config.read_timeout_s,
                                AddTimeout(f"bookie {self.bookie_id} did not answer a read (simulated)"))

    async def fence(self, ledger_id: int) -> BookieLedgerState:
        async def handler(node):
            state = await node.fence(ledger_id)
            return BookieLedgerState(state.last_add_confirmed, state.last_entry_id, state.fenced)

        return await self._call(handler, self._config.control_timeout_s,
                                AddTimeout(f"bookie {self.bookie_id} did not answer a fence (simulated)"))

    async def read_last_add_confirmed(self, ledger_id: int) -> BookieLedgerState:
        async def handler(node):
            state = node.ledger_state(ledger_id)
            return BookieLedgerState(state.last_add_confirmed, state.last_entry_id, state.fenced)

        return await self._call(handler, self._config.control_timeout_s,
                                AddTimeout(f"bookie {self.bookie_id} did not answer (simulated)"))

    async def close(self) -> None:
        pass


class SimPool:
    """Stands in for ``BookieClientPool``: one simulated client per bookie."""

    def __init__(self, client_name: str, bookies: dict[str, SimBookie], faults: NetworkFaults,
                 config: LedgerClientConfig) -> None:
        self._client_name = client_name
        self._bookies = bookies
        self._faults = faults
        self._config = config
        self._clients: dict[str, SimBookieClient] = {}
        self.tasks: set[asyncio.Task] = set()

    def get(self, bookie_id: str) -> SimBookieClient:
        client = self._clients.get(bookie_id)
        if client is None:
            client = self._clients[bookie_id] = SimBookieClient(
                self._client_name, self._bookies[bookie_id], self._faults, self._config, self.tasks)
        return client

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
