"""Calls to etcd asked for in the same turn of the event loop, sent as one request.

Every gRPC call costs the caller's process about 100-130 µs of CPU in grpc.aio,
whatever it carries (a get of one small key included), and etcd a request of its own.
A broker taking over a bundle loads its topics side by side, and each load reads a
few keys (the topic's record, its policies, its cursors' pointers): about 8 reads
per topic, so 8,000 calls for a bundle of 1,000 topics, half of the broker's CPU in
that load (bench/topics_scale.py, docs/architecture.md "Loading a bundle").

So reads are queued, and the queue is sent at the end of the current turn of the
loop (``call_soon``), or as soon as it holds ``BATCH_MAX`` reads: one read alone goes
as it always did; several go as one read-only etcd transaction whose operations are
the reads, in order. etcd serves a read-only transaction as a linearizable read of
one revision, so each read answers exactly what it would have answered alone at that
moment (every reply was already "some revision at or after the call"). A batch of 8
costs about 26 µs of CPU per read instead of 130 (measured on loopback, in n40's note).

Writes (transactions) are batched the same way (``disjoint_groups``): the
transactions of one turn whose keys do not overlap go as one etcd transaction, whose
compares are all of theirs and whose operations all of theirs. When every compare
holds, that is what each would have done alone, each key written at the batch's
revision (its new version, as a caller learns it). When one does not hold, nothing of
the batch was applied and each is sent again alone, so each gets its own answer; the
same when etcd refuses the batch as a whole (its size, an unknown lease). A caller
cancelled while its write waits for the end of the turn may still have it applied:
the same unknown outcome as a cancellation while a call is on the way, which callers
already handle (a write after a cancellation is "maybe applied", never "not applied").

This module holds the queue and the grouping only: ``send`` (given by the store)
sends a batch and returns one outcome per call; what a reply or an error means is the
store's.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, Hashable, Sequence, TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")

# etcd refuses a transaction of more than --max-txn-ops compares, or operations (128 by
# default): a batch carries at most this many calls, and a group of writes at most this
# many compares and this many operations.
BATCH_MAX = 64


class TurnBatches(Generic[Request, Reply]):
    def __init__(self, send: Callable[[Sequence[Request]], Awaitable[Sequence[Reply]]],
                 spawn: Callable[[Awaitable[None]], object], *, batch_max: int = BATCH_MAX) -> None:
        """``send``: sends a batch and returns its replies, in order (an exception
        instance for a read of the batch that failed alone). ``spawn``: runs a
        coroutine as a task the owner tracks (and cancels when it closes)."""
        assert batch_max >= 1
        self._send = send
        self._spawn = spawn
        self._batch_max = batch_max
        self._queue: list[tuple[Request, asyncio.Future[Reply]]] = []
        self._flush_scheduled = False
        self.batches = 0    # sent so far, and the reads they carried (for tests and notes)
        self.reads = 0

    def submit(self, request: Request) -> asyncio.Future[Reply]:
        """Queues a call; its future gets the reply (or the batch's error). Cancelling
        the future does not take the call back: it is sent, and its reply dropped."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._queue.append((request, future))
        if len(self._queue) >= self._batch_max:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._scheduled_flush)
        return future

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        if batch:
            self.batches += 1
            self.reads += len(batch)
            self._spawn(self._run(batch))

    async def _run(self, batch: list[tuple[Request, asyncio.Future[Reply]]]) -> None:
        try:
            replies = await self._send([request for request, _future in batch])
        except asyncio.CancelledError:
            for _request, future in batch:
                future.cancel()
            raise
        except BaseException as error:
            for _request, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        assert len(replies) == len(batch), (len(replies), len(batch))
        for (_request, future), reply in zip(batch, replies):
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)


def disjoint_groups(keys_of: Sequence[tuple[set[Hashable], int, int]], *,
                    ops_max: int = BATCH_MAX) -> list[list[int]]:
    """Groups calls (given as (keys, compares, operations) each, in order) so that the
    calls of a group touch no key in common and hold at most ``ops_max`` compares and
    ``ops_max`` operations together (a call bigger than that is a group of its own).
    A call that shares a key with an earlier call lands in a later group than it: sent
    group after group, calls on one key keep the order they were asked in. Returns the
    groups as lists of indexes, each in order."""
    groups: list[tuple[list[int], set[Hashable], list[int]]] = []
    for index, (keys, compares, operations) in enumerate(keys_of):
        after = max((g for g, (_m, taken, _c) in enumerate(groups) if not taken.isdisjoint(keys)), default=-1)
        for members, taken, counts in groups[after + 1:]:
            if counts[0] + compares <= ops_max and counts[1] + operations <= ops_max:
                members.append(index)
                taken.update(keys)
                counts[0] += compares
                counts[1] += operations
                break
        else:
            groups.append(([index], set(keys), [compares, operations]))
    return [members for members, _taken, _counts in groups]
