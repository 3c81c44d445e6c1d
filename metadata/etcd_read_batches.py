"""Reads of etcd asked for in the same turn of the event loop, sent as one request.

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

This module holds the queue only: ``send`` (given by the store) sends a batch and
returns one reply per read, or raises; what a reply or an error means is the store's.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, Sequence, TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")

# etcd refuses a transaction of more than --max-txn-ops operations (128 by default).
BATCH_MAX = 64


class ReadBatches(Generic[Request, Reply]):
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
        """Queues a read; its future gets the reply (or the batch's error). Cancelling
        the future does not take the read back: it is sent, and its reply dropped."""
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
