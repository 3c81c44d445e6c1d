"""A topic's part in transactions (the shell around transactions/buffer.py and
transactions/pending_acks.py): transactional sends, the markers that end a
transaction on the topic, what each subscription may read, and acknowledgements
pending in transactions.

- **Sends**: a SEND with a transaction id opens the transaction in the topic's buffer
  (its bound: the last confirmed position then) and is appended like any entry, its
  MessageMetadata carrying the id (stamped here if the client left it out), so the
  outcome can be matched to entries after a restart.
- **Reading**: each subscription reads through ``TransactionalEntries``, a view of the
  managed ledger whose ``last_confirmed`` is the buffer's max read position; entries of
  aborted transactions and markers are acknowledged on that subscription's cursor as
  they are read, so the dispatcher skips them as acknowledged (and the cursor moves
  past them: retention is not held back).
- **END_TXN_ON_PARTITION**: the decision is applied to the buffer first (an abort hides
  the entries from that moment; a commit lets readers past them), then a marker entry
  is appended, and the coordinator is answered once the marker is stored (Qa fsyncs).
- **Recovery**: a topic that a transaction named (etcd key
  ``/transactions/topics/<topic>``, written by the coordinator at
  ADD_PARTITION_TO_TXN and ADD_SUBSCRIPTION_TO_TXN, before the client may send or
  acknowledge) has its pending acknowledgements loaded and is replayed on load from the
  slowest cursor's first unacknowledged entry: transactional entries with no marker
  after them are open again, aborted ones hidden again. Entries before the slowest
  cursor are acknowledged by every subscription, so their outcome no longer matters.
- **Acknowledgements in a transaction** (individual on any subscription, cumulative on
  exclusive and failover ones) are checked for conflicts, written to etcd
  (transactions/store.py) and only then answered. From then on the subscription's
  dispatcher holds the messages back (``Subscription.held_acks``, the port
  subscriptions/ports.HeldAcks: neither delivered nor redelivered, to any consumer),
  and on a shared subscription they no longer count as unacknowledged at their
  consumer. Commit applies them to the cursor and flushes it before the coordinator is
  answered; abort releases them (``Subscription.release_held``: delivered again, the
  redelivery count raised). Loading the topic restores them before any consumer can
  attach, so a restart does not deliver them again either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from common.errors import MagnetarError, NotAllowed, ServiceNotReady, SubscriptionNotFound, TransactionConflict
from common.position import ManagedEntry, Position
from metadata import keys
from protocol.codec import decode_stored, encode_stored, stored_metadata
from protocol.proto import pulsar_api_pb2 as pb
from runtime.eager_future import call_when_done
from subscriptions.ports import AckedMessage
from transactions.buffer import MARKER_TXN_ABORT, MARKER_TXN_COMMIT, TransactionBuffer
from transactions.pending_acks import PendingAck, PendingAcks, TxnAcks
from transactions.records import TxnId
from transactions.store import PendingAckStore

if TYPE_CHECKING:
    from broker.producer import Producer
    from subscriptions.cursor import ManagedCursor
    from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)

# Entries read per round when a new owner replays a transactional topic.
REPLAY_ENTRIES_PER_READ = 500
REPLAY_BYTES_PER_READ = 8 * 1024 * 1024
MARKER_PRODUCER = "__transaction_marker"


# Transactional sends that may wait at once for a topic's mark to be read.
DEFERRED_SENDS_MAX = 10_000


def _pass_on(done: asyncio.Future[Position], waiting: asyncio.Future[Position]) -> None:
    if waiting.done():
        return
    if done.cancelled():
        waiting.cancel()
    elif done.exception() is not None:
        waiting.set_exception(done.exception())
    else:
        waiting.set_result(done.result())


def txn_of(metadata: pb.MessageMetadata) -> TxnId | None:
    if not metadata.HasField("txnid_most_bits") and not metadata.HasField("txnid_least_bits"):
        return None
    return TxnId(metadata.txnid_most_bits, metadata.txnid_least_bits)


def marker_entry(txn_id: TxnId, *, commit: bool) -> bytes:
    metadata = pb.MessageMetadata(producer_name=MARKER_PRODUCER, sequence_id=0,
                                  publish_time=int(time.time() * 1000),
                                  marker_type=MARKER_TXN_COMMIT if commit else MARKER_TXN_ABORT,
                                  txnid_most_bits=txn_id.most, txnid_least_bits=txn_id.least)
    return encode_stored(metadata, b"")


def stamped(payload: bytes, txn_id: TxnId) -> bytes:
    """The stored payload with the transaction id in its metadata (the Java client puts
    it there; a client that does not gets it added, with a new checksum)."""
    section = decode_stored(payload)
    if txn_of(section.metadata) == txn_id:
        return payload
    metadata = pb.MessageMetadata()
    metadata.CopyFrom(section.metadata)
    metadata.txnid_most_bits, metadata.txnid_least_bits = txn_id.most, txn_id.least
    return encode_stored(metadata, bytes(section.payload))


class TransactionalEntries:
    """What one subscription reads of its topic (subscriptions/ports.EntrySource): the
    managed ledger up to the max read position, with hidden entries acknowledged on
    this subscription's cursor as they are read. Everything else is the ledger's."""

    def __init__(self, ledger: Any, owner: "TopicTransactions", cursor: "ManagedCursor") -> None:
        self._ledger = ledger
        self._owner = owner
        self._buffer = owner.buffer
        self._cursor = cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    @property
    def last_confirmed(self) -> Position:
        return self._buffer.max_read_position(self._ledger.last_confirmed)

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        if start > self.last_confirmed:
            return []
        return self._visible(await self._ledger.read(start, count_max, bytes_max))

    def read_cached(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry] | None:
        if start > self.last_confirmed:
            return []
        entries = self._ledger.read_cached(start, count_max, bytes_max)
        return None if entries is None else self._visible(entries)

    def _visible(self, entries: list[ManagedEntry]) -> list[ManagedEntry]:
        buffer = self._buffer
        if not buffer.used:
            return entries   # no transaction ever touched the topic: the ledger's own read
        limit = self.last_confirmed
        kept = [entry for entry in entries if entry.position <= limit] if buffer.open else entries
        for entry in kept:
            try:
                metadata = stored_metadata(entry.data)
            except MagnetarError:
                continue   # the dispatcher logs and skips it
            if buffer.hides(txn_of(metadata), metadata.marker_type):
                self._cursor.ack(entry.position)
        return kept

    def wait_for_entries(self) -> asyncio.Future[None]:
        """The ledger's own wait (settled eagerly, in the turn the entries are
        confirmed): a transaction that ends here moves the max read position and then
        appends its marker, whose confirmation wakes the readers."""
        return self._ledger.wait_for_entries()


class TopicTransactions:
    """One topic's transactions; ``topic`` is its PersistentTopic (broker/topic.py, which
    owns this object: not imported here, so the two modules stay acyclic)."""

    def __init__(self, topic: Any, store: Any, *, open_max: int, aborted_max: int) -> None:
        self._topic = topic
        self._store = store
        self.buffer = TransactionBuffer(open_max=open_max, aborted_max=aborted_max)
        self.pending: dict[str, PendingAcks] = {}
        self._ack_store = PendingAckStore(store, topic.name.key_path)
        # A coordinator named this topic in a transaction (the etcd key exists).
        self.marked = False
        self._marking: asyncio.Task[None] | None = None
        # When this broker rebuilt the buffer as it loaded the topic (epoch ms; 0: it
        # had nothing to rebuild, as Pulsar's transactionBufferStats say it).
        self.recover_start_ms = 0
        self.recover_end_ms = 0
        # Transactional sends waiting for the mark to be read (``publish``).
        self._deferred: list[tuple[Any, bytes, int, TxnId, asyncio.Future[Position]]] = []
        # Transactions ended on this topic since it loaded here (its buffer: Pulsar's
        # pulsar_txn_tb_committed_total / _aborted_total), and on each subscription
        # ([committed, aborted]: pulsar_txn_tp_committed_count_total / _aborted_...;
        # an entry per existing subscription that saw one, gone with it).
        self.committed = 0
        self.aborted = 0
        self.ended_on: dict[str, list[int]] = {}

    def entries_for(self, cursor: "ManagedCursor") -> TransactionalEntries:
        return TransactionalEntries(self._topic.ledger, self, cursor)

    # --- sends -----------------------------------------------------------------------------------

    def publish(self, producer: "Producer", payload: bytes, num_messages: int, txn_id: TxnId) -> asyncio.Future[Position]:
        """Appends a transactional send (raises what refuses it: the caller answers
        SEND_ERROR).

        The topic must be marked (ADD_PARTITION_TO_TXN came first: its coordinator
        wrote the mark to etcd before answering). A coordinator on another broker cannot
        tell this one, so a send to a topic not known here as marked waits for the mark
        to be read from etcd; sends arriving meanwhile queue behind it, in order, and
        are appended in that order once it is read (or all refused if it is absent)."""
        if self.marked and not self._deferred:
            return self._append(producer, payload, num_messages, txn_id)
        if len(self._deferred) >= DEFERRED_SENDS_MAX:
            raise ServiceNotReady(f"topic {self._topic.full_name}: {len(self._deferred)} transactional sends wait "
                                  "for its transaction mark to be read")
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        self._deferred.append((producer, payload, num_messages, txn_id, future))
        self._refresh_mark()
        return future

    def _append(self, producer: "Producer", payload: bytes, num_messages: int, txn_id: TxnId) -> asyncio.Future[Position]:
        self.buffer.begin(txn_id, self._topic.ledger.last_confirmed)
        return self._topic.publish(producer, stamped(payload, txn_id), num_messages)

    def _refresh_mark(self) -> None:
        if self._marking is not None and not self._marking.done():
            return

        async def refresh() -> None:
            error: MagnetarError | None = None
            try:
                self.marked = await self._store.get(keys.transactional_topic(self._topic.name.key_path)) is not None
            except MagnetarError as failure:
                error = ServiceNotReady(f"the transaction mark of topic {self._topic.full_name} could not be "
                                        f"read: {failure}")
            deferred, self._deferred = self._deferred, []
            for producer, payload, num_messages, txn_id, future in deferred:
                if future.done():
                    continue
                if error is None and not self.marked:
                    error = NotAllowed(f"topic {self._topic.full_name} is not part of transaction {txn_id} "
                                       "(ADD_PARTITION_TO_TXN first)")
                if error is not None:
                    future.set_exception(error)
                    continue
                try:
                    stored = self._append(producer, payload, num_messages, txn_id)
                except MagnetarError as failure:
                    future.set_exception(failure)
                    continue
                call_when_done(stored, lambda done, waiting=future: _pass_on(done, waiting))

        self._marking = asyncio.get_running_loop().create_task(refresh())

    # --- END_TXN_ON_PARTITION ---------------------------------------------------------------------

    async def end(self, txn_id: TxnId, *, commit: bool) -> None:
        self.buffer.end(txn_id, commit=commit)
        position = await self._topic.ledger.append(marker_entry(txn_id, commit=commit))
        self.buffer.marker_stored(txn_id, position)
        self.buffer.forget_trimmed(self._topic.ledger.first_position)
        if commit:
            self.committed += 1
        else:
            self.aborted += 1
        log.info("transaction ended on topic: topic=%s txn=%s action=%s marker=%s", self._topic.full_name, txn_id,
                 "commit" if commit else "abort", position)

    # --- acknowledgements -------------------------------------------------------------------------

    def _pending_of(self, subscription: "Subscription") -> PendingAcks:
        """The subscription's pending acknowledgements, which its dispatcher consults
        from now on (subscriptions/ports.HeldAcks: held entries are not delivered).
        SubscriptionNotFound for one deleted already (its held acknowledgements went
        with it: ``drop_subscription``)."""
        if self._topic.subscriptions.get(subscription.name) is not subscription:
            raise SubscriptionNotFound(f"subscription {subscription.name} of {self._topic.full_name} was deleted")
        pending = self.pending.setdefault(subscription.name, PendingAcks())
        subscription.held_acks = pending
        return pending

    async def acknowledge(self, subscription: "Subscription", txn_id: TxnId, acks: list[AckedMessage],
                          *, cumulative: bool) -> None:
        """Holds ``acks`` in ``txn_id`` (raises what refuses them: the caller answers
        with it). Durable (etcd) before it returns; from then on the messages are held
        back from every consumer of the subscription until the transaction ends."""
        pending = self._pending_of(subscription)
        entries: list[PendingAck] = [(a.position, a.ack_set, a.batch_size) for a in acks]
        cursor = subscription.cursor
        if cumulative:
            if subscription.mode.shares_messages:
                raise NotAllowed("cumulative acknowledgement is not allowed on shared subscriptions")
            if len(entries) != 1:
                raise NotAllowed(f"a cumulative acknowledgement names one message, not {len(entries)}")
            previous = pending.add_cumulative(txn_id, entries[0], cursor.mark_delete_position)
            undo = lambda: pending.restore_cumulative(previous)   # noqa: E731
        else:
            for position, _ack_set, _size in entries:
                if cursor.is_acked(position):
                    # Pulsar's rule: acknowledged before (plainly, or by a committed
                    # transaction) cannot be acknowledged again in a transaction.
                    raise TransactionConflict(f"message {position} is acknowledged already")
            replaced = pending.add(txn_id, entries)
            undo = lambda: pending.undo(txn_id, entries, replaced)   # noqa: E731
        try:
            await self._ack_store.write(subscription.name, txn_id, pending.encode(txn_id))
        except BaseException:
            # Not durable: not pending either (the client is told it failed). An
            # acknowledgement of the same transaction made durable before stays.
            undo()
            # Held while the write was in flight, a message may have been passed over
            # by the dispatcher (its consumer left, a redelivery): delivered again.
            released = [position for position, _a, _s in entries if not pending.holds(position)]
            if released:
                subscription.release_held([] if cumulative else released,
                                          through=released[-1] if cumulative else None, leave_sent=True)
            raise
        if self.pending.get(subscription.name) is not pending:
            # The subscription was deleted while the record was being written (its
            # records deleted then): this one goes too.
            await self._ack_store.delete(subscription.name, txn_id)
            raise SubscriptionNotFound(f"subscription {subscription.name} of {self._topic.full_name} was deleted")
        if not cumulative:
            subscription.hold([position for position, ack_set, size in entries
                               if pending.holds(position)])

    async def end_on_subscription(self, subscription: "Subscription | None", name: str, txn_id: TxnId,
                                  *, commit: bool) -> None:
        pending = self.pending.get(name)
        acks = pending.take(txn_id) if pending is not None else TxnAcks()
        if subscription is not None and (acks.individual or acks.cumulative is not None):
            acked = [AckedMessage(position, ack_set, size) for position, ack_set, size in acks.individual]
            if commit:
                if acked:
                    subscription.acknowledge(None, acked, cumulative=False)
                if acks.cumulative is not None:
                    position, ack_set, size = acks.cumulative
                    if subscription.mode.shares_messages:
                        # Made shared since (every consumer left, a shared one came):
                        # the acknowledgement still stands, straight on the cursor.
                        subscription.cursor.ack_cumulative(position, list(ack_set) if ack_set else None)
                    else:
                        subscription.acknowledge(None, [AckedMessage(position, ack_set, size)], cumulative=True)
                # Durable before the coordinator hears it: after this the acknowledgement
                # survives any crash, and the pending record may go.
                await subscription.cursor.flush()
            else:
                through = acks.cumulative[0] if acks.cumulative is not None else None
                subscription.release_held([a.position for a in acked], through=through)
        await self._ack_store.delete(name, txn_id)
        if subscription is not None and self._topic.subscriptions.get(name) is subscription:
            self.ended_on.setdefault(name, [0, 0])[0 if commit else 1] += 1
        log.info("transaction ended on subscription: topic=%s subscription=%s txn=%s action=%s acks=%d "
                 "cumulative=%s", self._topic.full_name, name, txn_id, "commit" if commit else "abort",
                 len(acks.individual), acks.cumulative[0] if acks.cumulative is not None else None)

    # --- deletion ------------------------------------------------------------------------------------

    async def drop_subscription(self, name: str) -> None:
        """The subscription was deleted (its cursor is gone): the acknowledgements held
        on it in open transactions go with it, as Pulsar deletes a subscription's
        pending-ack store. Those transactions' commit or abort later finds nothing here
        to apply or release (a subscription made again under the name is a new one: it
        is neither held back by them nor acknowledged by their commit)."""
        pending = self.pending.pop(name, None)
        self.ended_on.pop(name, None)
        try:
            await self._ack_store.delete_subscription(name)
        except MagnetarError as error:
            # The subscription is gone all the same; its records go when the topic is
            # next loaded (``recover`` removes those of subscriptions that do not exist).
            log.warning("pending acknowledgements of a deleted subscription not removed yet: topic=%s "
                        "subscription=%s error=%s", self._topic.full_name, name, error)
        if pending is not None and len(pending):
            log.info("pending acknowledgements dropped with their subscription: topic=%s subscription=%s txns=%s",
                     self._topic.full_name, name, sorted(str(t) for t in pending.txns))

    async def drop_all(self) -> None:
        """The topic was deleted: every subscription's pending acknowledgements go."""
        self.pending.clear()
        self.ended_on.clear()
        await self._ack_store.delete_all()

    # --- recovery -----------------------------------------------------------------------------------

    async def recover(self) -> None:
        """Rebuilds the buffer and the pending acknowledgements of a topic a
        transaction named (nothing to do, one etcd read, for any other)."""
        self.marked = await self._store.get(keys.transactional_topic(self._topic.name.key_path)) is not None
        if not self.marked:
            return
        started = time.monotonic()
        self.recover_start_ms = int(time.time() * 1000)
        ledger = self._topic.ledger
        cursors = [s.cursor.mark_delete_position for s in self._topic.subscriptions.values()]
        position = ledger.next_position(min(cursors)) if cursors else ledger.first_position
        before = min(cursors) if cursors else Position(position.ledger_id, position.entry_id - 1)
        read = 0
        end = ledger.last_confirmed
        while position <= end:
            entries = await ledger.read(position, REPLAY_ENTRIES_PER_READ, REPLAY_BYTES_PER_READ)
            if not entries:
                break
            for entry in entries:
                metadata = stored_metadata(entry.data)
                self.buffer.replay(txn_of(metadata), metadata.marker_type, entry.position, before)
                before = entry.position
            read += len(entries)
            position = ledger.next_position(entries[-1].position)
        for name, by_txn in (await self._ack_store.load()).items():
            if name not in self._topic.subscriptions:
                # Its subscription was deleted, the broker dying before its records
                # went: they go now (drop_subscription).
                await self._ack_store.delete_subscription(name)
                log.info("pending acknowledgements of a deleted subscription removed: topic=%s subscription=%s "
                         "txns=%d", self._topic.full_name, name, len(by_txn))
                continue
            pending = self.pending.setdefault(name, PendingAcks())
            for txn_id, acks in by_txn.items():
                pending.restore(txn_id, acks)
            subscription = self._topic.subscriptions.get(name)
            if subscription is not None:
                # Held back from the first read on: a new owner reads from the
                # mark-delete position and would deliver them again.
                subscription.held_acks = pending
        self.recover_end_ms = int(time.time() * 1000)
        log.info("transaction buffer recovered: topic=%s entries_read=%d open=%d aborted=%d pending_ack_txns=%d "
                 "seconds=%.3f", self._topic.full_name, read, len(self.buffer.open), len(self.buffer.aborted),
                 sum(len(p.by_txn) for p in self.pending.values()), time.monotonic() - started)
