"""The bookie's gRPC shell: decodes requests, calls BookieNode, encodes replies.

Per-item failures (a bad entry in a batch, a missing entry in a read) travel as
``error_code`` fields; a failure of a whole call (bad arguments, an unknown ledger)
aborts the call with the gRPC status from ``_STATUS_BY_ERROR`` and the Magnetar code in
the ``magnetar-error-code`` trailing metadata, which ``ledger/bookie_client.py`` turns
back into the typed error. Nothing a peer sends can stop the server: every handler
catches our errors, and gRPC itself rejects bytes that are not HTTP/2.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator

import grpc

from bookie.node import AddItem, BookieNode
from runtime.tasks import cancel_and_wait
from protocol.bookie_rpc import error_code_metadata
from protocol.proto import bookie_pb2, bookie_pb2_grpc
from common.errors import (
    BookieReadOnly,
    EntryTooLarge,
    InvalidArgument,
    MagnetarError,
    MalformedFrame,
    NoSuchLedger,
    Overloaded,
    ShuttingDown,
)

if TYPE_CHECKING:
    from bookie.metrics import BookieMetrics

log = logging.getLogger(__name__)

# Add batches read from one stream but not yet answered; past this the stream stops
# reading (gRPC flow control then holds the writer back).
STREAM_BATCHES_IN_FLIGHT_MAX = 64

_STATUS_BY_ERROR: list[tuple[type[MagnetarError], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedFrame, grpc.StatusCode.INVALID_ARGUMENT),
    (EntryTooLarge, grpc.StatusCode.INVALID_ARGUMENT),
    (NoSuchLedger, grpc.StatusCode.NOT_FOUND),
    (BookieReadOnly, grpc.StatusCode.FAILED_PRECONDITION),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
]


def status_for_error(error: MagnetarError) -> grpc.StatusCode:
    for cls, status in _STATUS_BY_ERROR:
        if isinstance(error, cls):
            return status
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext, error: MagnetarError) -> None:
    context.set_trailing_metadata(error_code_metadata(error.code))
    await context.abort(status_for_error(error), error.message)


@dataclass(slots=True)
class PendingBatch:
    """One AddRequest read from a stream and not yet answered."""

    items: list[AddItem]
    # Per item: None (accepted, durable when ``future`` resolves) or its error.
    outcomes: list[MagnetarError | None]
    future: asyncio.Future[None] | None   # None when nothing of the batch was accepted
    arrived: float                        # time.perf_counter() when read
    replies_may_merge: bool


def add_items(request: bookie_pb2.AddRequest) -> list[AddItem]:
    return [AddItem(e.ledger_id, e.entry_id, e.entry, e.recovery) for e in request.entries]


class BookieServicer(bookie_pb2_grpc.BookieServicer):
    def __init__(self, node: BookieNode, metrics: "BookieMetrics | None" = None) -> None:
        self._node = node
        self._metrics = metrics

    async def AddEntries(self, request_iterator: AsyncIterator[bookie_pb2.AddRequest],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[bookie_pb2.AddResponse]:
        """The replies to one gRPC add stream's requests, in order (the add socket,
        bookie/add_socket.py, answers its own with the same admitted_batch, submit_batch,
        settled_results and count_reply)."""
        pending: asyncio.Queue[PendingBatch | None] = asyncio.Queue(maxsize=STREAM_BATCHES_IN_FLIGHT_MAX)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    arrived = time.perf_counter()
                    await pending.put(await self.admitted_batch(request, add_items(request), arrived))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a broken stream ends the reader, never the server
                log.info("add stream ended: peer=%s error=%s", context.peer(), error)
            finally:
                try:
                    pending.put_nowait(None)
                except asyncio.QueueFull:
                    pass

        # Owned by this call: cancelled and awaited when the stream ends, however it ends.
        reader = asyncio.get_running_loop().create_task(read_requests(), name="add-stream-reader")
        # A batch taken from the queue that could not join the reply being built (not
        # durable yet, or its writer wants one reply per batch): the next reply's first.
        carried: PendingBatch | None = None
        ended = False   # the reader's end mark was taken while merging
        try:
            while not ended:
                batch = carried if carried is not None else await pending.get()
                carried = None
                if batch is None:
                    break
                results = await self._settle(batch)
                durable_at = time.perf_counter()
                # Batches already durable behind this one go in the same reply: under
                # load one journal round makes several batches durable at once, and
                # every reply is a write gRPC must complete before the next.
                merged = 1
                while batch.replies_may_merge and not pending.empty():
                    following = pending.get_nowait()
                    if following is None:
                        ended = True
                        break
                    if not following.replies_may_merge \
                            or (following.future is not None and not following.future.done()):
                        carried = following
                        break
                    results.extend(await self._settle(following))
                    merged += 1
                yield bookie_pb2.AddResponse(results=results)
                self.count_reply(batch, durable_at, merged)
                if carried is None and reader.done() and pending.empty():
                    break  # the reader may have stopped on a full queue
        finally:
            await cancel_and_wait(reader)

    @property
    def node(self) -> BookieNode:
        return self._node

    async def admitted_batch(self, request: bookie_pb2.AddRequest, items: list[AddItem],
                             arrived: float) -> PendingBatch:
        """Waits for room (``node.admit``, bounded), then journals the request's valid
        adds; a refusal (Overloaded, a failed journal) answers every item with it."""
        try:
            await self._node.admit(items)
        except MagnetarError as error:
            return PendingBatch(items, [error] * len(items), None, arrived, request.replies_may_merge)
        return self.submit_batch(request, items, arrived)

    def submit_batch(self, request: bookie_pb2.AddRequest, items: list[AddItem], arrived: float) -> PendingBatch:
        """Journals an admitted request's valid adds (``node.admit`` done, or
        ``node.admits_now`` true); its outcomes and journal future, as a batch to answer."""
        future = None
        try:
            outcomes, future = self._node.submit_adds(items)
        except MagnetarError as error:
            outcomes = [error] * len(items)
        return PendingBatch(items, outcomes, future, arrived, request.replies_may_merge)

    async def _settle(self, batch: PendingBatch) -> list[bookie_pb2.AddResult]:
        """Waits until a gRPC stream's batch is durable (or failed); its results."""
        if batch.future is not None:
            try:
                await batch.future
            except MagnetarError:
                pass    # read by settled_results
        return self.settled_results(batch, on_add_socket=False)

    def count_reply(self, batch: PendingBatch, durable_at: float, merged: int) -> None:
        """Metrics of one reply written: from durable to written, batches it answered."""
        if self._metrics is not None:
            if batch.future is not None:
                self._metrics.add_reply.observe(time.perf_counter() - durable_at)
            self._metrics.add_replies_merged.observe(merged)

    def settled_results(self, batch: PendingBatch, *, on_add_socket: bool) -> list[bookie_pb2.AddResult]:
        """The results of a batch whose journal future is done (or that has none),
        counted in the metrics."""
        outcomes = batch.outcomes
        if batch.future is not None:
            assert batch.future.done(), "a batch is answered once its journal future is done"
            error = batch.future.exception()
            if error is not None:
                if not isinstance(error, MagnetarError):
                    raise error
                outcomes = [outcome or error for outcome in outcomes]
        results = []
        errors = 0
        for item, outcome in zip(batch.items, outcomes):
            if outcome is None:
                results.append(bookie_pb2.AddResult(ledger_id=item.ledger_id, entry_id=item.entry_id))
            else:
                errors += 1
                results.append(bookie_pb2.AddResult(
                    ledger_id=item.ledger_id, entry_id=item.entry_id,
                    error_code=outcome.code, error_message=outcome.message))
        if self._metrics is not None:
            self._metrics.on_adds(len(batch.items) - errors, errors, sum(len(i.entry) for i in batch.items),
                                  on_add_socket=on_add_socket)
            self._metrics.add_latency.observe(time.perf_counter() - batch.arrived)
        return results

    async def ReadEntries(self, request: bookie_pb2.ReadRequest,
                          context: grpc.aio.ServicerContext) -> bookie_pb2.ReadResponse:
        try:
            outcomes = await self._node.read(request.ledger_id, list(request.entry_ids),
                                             request.response_bytes_max)
        except MagnetarError as error:
            await _abort(context, error)
            raise AssertionError("abort returns by raising")
        results = []
        size = 0
        for outcome in outcomes:
            if outcome.entry is not None:
                results.append(bookie_pb2.ReadResult(entry_id=outcome.entry_id, entry=outcome.entry))
                size += len(outcome.entry)
            else:
                assert outcome.error is not None
                results.append(bookie_pb2.ReadResult(entry_id=outcome.entry_id, error_code=outcome.error.code,
                                                     error_message=outcome.error.message))
        if self._metrics is not None:
            self._metrics.on_reads(len(results), size)
        return bookie_pb2.ReadResponse(results=results)

    @staticmethod
    def _state_response(state) -> bookie_pb2.LedgerStateResponse:
        return bookie_pb2.LedgerStateResponse(last_add_confirmed=state.last_add_confirmed,
                                              last_entry_id=state.last_entry_id, fenced=state.fenced)

    async def ReadLastAddConfirmed(self, request: bookie_pb2.LedgerRequest,
                                   context: grpc.aio.ServicerContext) -> bookie_pb2.LedgerStateResponse:
        try:
            return self._state_response(self._node.ledger_state(request.ledger_id))
        except MagnetarError as error:
            return bookie_pb2.LedgerStateResponse(error_code=error.code, error_message=error.message,
                                                  last_add_confirmed=-1, last_entry_id=-1)

    async def Fence(self, request: bookie_pb2.LedgerRequest,
                    context: grpc.aio.ServicerContext) -> bookie_pb2.LedgerStateResponse:
        try:
            return self._state_response(await self._node.fence(request.ledger_id))
        except MagnetarError as error:
            return bookie_pb2.LedgerStateResponse(error_code=error.code, error_message=error.message,
                                                  last_add_confirmed=-1, last_entry_id=-1)

    async def Info(self, request: bookie_pb2.InfoRequest,
                   context: grpc.aio.ServicerContext) -> bookie_pb2.InfoResponse:
        info = self._node_info()
        return bookie_pb2.InfoResponse(**info)

    def _node_info(self) -> dict:
        from common.version import __version__

        node = self._node
        usage = node.disk_usage
        return {
            "bookie_id": node.bookie_id,
            "read_only": node.read_only,
            "free_bytes": usage.free_bytes if usage else 0,
            "total_bytes": usage.total_bytes if usage else 0,
            "disk_usage_ratio": usage.ratio if usage else 0.0,
            "ledger_count": len(node.storage.ledger_ids()),
            "version": __version__,
        }

