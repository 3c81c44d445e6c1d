"""The gRPC add sender against a write that never returns (the edge, gRPC's AddEntries
call, faked): what the hosts harness met when a new add stream was opened toward an
isolated bookie: its write waited for the stream's headers to go, and cancelling the
call did not end that wait (grpc.aio's write waits on an event only a sent header sets).

Proves: the add times out after ``add_timeout_s``, and so does every later add for that
bookie: the sender is never held by the write. Before, the first add failed by the
timeout and every later one waited for ever (a broker's topics on that bookie stalled
until the end of the run).
"""

from __future__ import annotations

import asyncio
import time

from common.errors import AddTimeout
from ledger.bookie_client import BookieClient
from ledger.config import LedgerClientConfig

ADD_TIMEOUT_S = 0.5


class _HeldCall:
    """Writes wait for ever, whatever cancel() says; reads wait for ever."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, _request) -> None:
        await asyncio.Event().wait()

    async def read(self):
        await asyncio.Event().wait()

    def cancel(self) -> None:
        self.cancelled = True


class _Stub:
    def __init__(self) -> None:
        self.calls: list[_HeldCall] = []

    def AddEntries(self, metadata=None):  # noqa: N802 - gRPC's method name
        call = _HeldCall()
        self.calls.append(call)
        return call


async def test_a_held_write_does_not_hold_the_sender():
    client = BookieClient("b1", "127.0.0.1:1", LedgerClientConfig(add_timeout_s=ADD_TIMEOUT_S))
    stub = client._stub = _Stub()  # the edge: a bookie's gRPC service
    try:
        for attempt in range(3):
            started = time.monotonic()
            future = client.add(1, attempt, b"entry")
            try:
                async with asyncio.timeout(5 * ADD_TIMEOUT_S):
                    await future
            except AddTimeout:
                pass
            except TimeoutError:
                raise AssertionError(f"add {attempt} neither succeeded nor timed out in {5 * ADD_TIMEOUT_S}s") \
                    from None
            took = time.monotonic() - started
            assert took <= ADD_TIMEOUT_S + 0.5, (attempt, took)
        assert len(stub.calls) == 3 and all(call.cancelled for call in stub.calls)
    finally:
        await client.close()
