"""One add-stream reply may answer several consecutive batches (issue 16: every reply is
a gRPC write the bookie must complete before the next, so batches made durable by one
journal round share one). The bookie merges only batches that are durable and whose
writer allows it; the writer matches results to its batches by count, in order, and
breaks the stream on a reply that does not fit."""

import asyncio

import pytest

from bookie.node import AddItem
from bookie.server import BookieServicer
from common.errors import BookieUnavailable, LedgerFenced
from ledger.bookie_client import BookieClient
from ledger.config import LedgerClientConfig
from protocol.proto import bookie_pb2

# --- the bookie's side: BookieServicer.AddEntries with a node whose journal we drive ---


class _Node:
    """Accepts every add; each batch's durability is a future the test resolves."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []

    async def admit(self, items) -> None:
        return None

    def submit_adds(self, items):
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return [None] * len(items), future


class _Requests:
    """The stream's requests, handed out as the test releases them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def send(self, first_entry: int, count: int, *, merge: bool = True) -> None:
        self.queue.put_nowait(bookie_pb2.AddRequest(
            entries=[bookie_pb2.AddEntry(ledger_id=7, entry_id=first_entry + i, entry=b"x") for i in range(count)],
            replies_may_merge=merge))

    def end(self) -> None:
        self.queue.put_nowait(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        request = await self.queue.get()
        if request is None:
            raise StopAsyncIteration
        return request


class _Context:
    def peer(self) -> str:
        return "test"


async def _replies(servicer, requests) -> asyncio.Queue:
    """Runs the call; its replies (lists of entry ids, or None at its end) land in a queue."""
    replies: asyncio.Queue = asyncio.Queue()

    async def collect() -> None:
        async for response in servicer.AddEntries(requests, _Context()):
            replies.put_nowait([(r.entry_id, r.error_code) for r in response.results])
        replies.put_nowait(None)

    asyncio.get_running_loop().create_task(collect())
    return replies


async def _until(predicate) -> None:
    async with asyncio.timeout(5):
        while not predicate():
            await asyncio.sleep(0.001)


async def _stream(*batches: tuple[int, int], merge: bool = True):
    """A call with ``batches`` (first entry id, entries) read and journaled, none
    durable yet: (node, requests, replies)."""
    node = _Node()
    requests = _Requests()
    replies = await _replies(BookieServicer(node), requests)
    for first, count in batches:
        requests.send(first, count, merge=merge)
    await _until(lambda: len(node.futures) == len(batches))
    return node, requests, replies


async def _next(replies: asyncio.Queue):
    async with asyncio.timeout(5):
        return await replies.get()


async def test_batches_durable_together_share_one_reply_and_order_holds():
    node, requests, replies = await _stream((0, 2), (2, 1), (3, 3))
    for future in node.futures:   # one journal round makes all three durable
        future.set_result(None)
    assert await _next(replies) == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]
    requests.end()
    assert await _next(replies) is None


async def test_a_batch_not_yet_durable_waits_for_its_own_reply():
    node, requests, replies = await _stream((0, 1), (1, 1), (2, 1))
    node.futures[0].set_result(None)   # the first round covers the first batch only
    assert await _next(replies) == [(0, 0)]
    assert replies.empty()
    node.futures[1].set_exception(LedgerFenced("fenced meanwhile"))
    node.futures[2].set_result(None)
    assert await _next(replies) == [(1, LedgerFenced.code), (2, 0)]
    requests.end()
    assert await _next(replies) is None


async def test_a_writer_that_does_not_allow_merging_gets_one_reply_per_batch():
    node, _requests, replies = await _stream((0, 1), (1, 2), merge=False)
    for future in node.futures:
        future.set_result(None)
    assert await _next(replies) == [(0, 0)]
    assert await _next(replies) == [(1, 0), (2, 0)]


async def test_the_stream_ending_while_replies_merge_ends_the_call():
    node, requests, replies = await _stream((0, 1), (1, 1))
    requests.end()
    await asyncio.sleep(0.01)   # the end mark is queued behind both batches
    for future in node.futures:
        future.set_result(None)
    assert await _next(replies) == [(0, 0), (1, 0)]
    assert await _next(replies) is None


# --- the writer's side: BookieClient matching replies to its batches ---


class _Call:
    """An AddEntries call: records writes; replies come from the test."""

    def __init__(self) -> None:
        self.written: list[bookie_pb2.AddRequest] = []
        self.replies: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    async def write(self, request) -> None:
        self.written.append(request)

    async def read(self):
        return await self.replies.get()

    def cancel(self) -> None:
        self.cancelled = True


class _Stub:
    def __init__(self) -> None:
        self.calls: list[_Call] = []

    def AddEntries(self, metadata=None):  # noqa: N802 - gRPC's method name
        self.calls.append(_Call())
        return self.calls[-1]


def _reply(*entries: tuple[int, int]) -> bookie_pb2.AddResponse:
    return bookie_pb2.AddResponse(results=[
        bookie_pb2.AddResult(ledger_id=7, entry_id=entry_id, error_code=code) for entry_id, code in entries])


async def _client_with_batches(sizes: list[int]):
    """A client whose stream carries one written batch per size (each add waits for the
    write of the one before, so each becomes its own batch)."""
    client = BookieClient("b1", "127.0.0.1:1", LedgerClientConfig(add_timeout_s=5.0))
    stub = _Stub()
    client._stub = stub   # the edge: a bookie's gRPC service
    futures = []
    entry_id = 0
    for size in sizes:
        for _ in range(size):
            futures.append(client.add(7, entry_id, b"x"))
            entry_id += 1
        await _until(lambda: stub.calls and sum(len(r.entries) for r in stub.calls[0].written) == entry_id)
    assert [len(r.entries) for r in stub.calls[0].written] == sizes
    assert all(r.replies_may_merge for r in stub.calls[0].written)
    return client, stub.calls[0], futures


async def test_one_reply_settles_several_batches_in_order():
    client, call, futures = await _client_with_batches([1, 2, 1])
    try:
        call.replies.put_nowait(_reply((0, 0), (1, 0), (2, LedgerFenced.code)))
        call.replies.put_nowait(_reply((3, 0)))
        async with asyncio.timeout(5):
            await futures[0]
            await futures[1]
            with pytest.raises(LedgerFenced):
                await futures[2]
            await futures[3]
        assert not call.cancelled
    finally:
        await client.close()


@pytest.mark.parametrize("reply", [
    [(0, 0), (1, 0)],            # ends inside the second batch
    [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)],   # more results than entries in flight
    [],                          # no results at all
], ids=["splits-a-batch", "too-many", "empty"])
async def test_a_reply_that_does_not_fit_the_batches_breaks_the_stream(reply):
    client, call, futures = await _client_with_batches([1, 2, 1])
    try:
        call.replies.put_nowait(_reply(*reply))
        async with asyncio.timeout(5):
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
        # Checked before anything is resolved: every add fails (and is written again
        # elsewhere by the ledger's ensemble change), none passes on a broken reply.
        assert all(isinstance(outcome, BookieUnavailable) for outcome in outcomes), outcomes
        assert call.cancelled
    finally:
        await client.close()
