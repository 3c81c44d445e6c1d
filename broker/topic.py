"""A persistent topic on the broker that owns it: the managed ledger, the producers and
the subscriptions.

Publishing stores each producer frame's payload as one entry and answers with the
entry's position as message id; receipts go out in order because the managed ledger
completes appends in order. Subscriptions are loaded with the topic (every durable
cursor in etcd) so backlog and retention see them even with no consumer attached.
Closing the topic (unload, shutdown, ownership lost) sends CLOSE_PRODUCER and
CLOSE_CONSUMER so clients look the topic up again and reconnect, flushes every cursor
and closes the current ledger. A close runs once, as the topic's own task: every caller
(and the service, before it loads the topic again) waits for that one to finish, and a
caller going away does not leave it half done. Subscription creation runs as a topic
task for the same reason: a subscriber cancelled midway (its connection closed, or
CLOSE_CONSUMER) must not fail the creation for the others waiting on it.

Nothing attaches to what is going away: a consumer, a producer or a subscription
creation is refused (retriably) once the topic's close began, and a consumer is
refused while its subscription is being deleted, each checked with no await between
the check and the attachment. A consumer added to a closed dispatcher would be
attached to nothing: it would never receive another message, and nobody would tell
its client to reconnect.

Producer access modes (Pulsar's PIP-68): Shared producers coexist; an Exclusive one
is refused (ProducerFenced) while any producer is attached; WaitForExclusive queues
(bounded) until the topic is free, and is told so with a PRODUCER_SUCCESS that is not
ready yet; ExclusiveWithFencing closes every other producer and fails the queued
ones. Each grant of exclusive access moves the topic epoch, kept in the managed
ledger's properties so it survives restarts and moves: an exclusive producer that
reconnects with an older epoch was superseded meanwhile and is fenced.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import unquote

from protocol import commands
from protocol.batch import message_count
from protocol.codec import stored_metadata
from broker.config import BrokerConfig
from managed_ledger.compaction import TopicCompaction
from managed_ledger.managed_ledger_info import PURPOSE_CURSOR, ownership_tags
from broker.consumer import Consumer
from broker.deduplication import SNAPSHOT_PROPERTY, Deduplication, snapshot_position
from managed_ledger.managed_ledger import ManagedLedger
from common.position import Position
from broker.producer import Producer, generated_producer_name
from broker.topic_transactions import TopicTransactions
from protocol.proto import pulsar_api_pb2 as pb
from common.topic_name import TopicName
from ledger.client import LedgerClient
from common.errors import (
    AlreadyExists,
    MagnetarError,
    NotAllowed,
    PreconditionFailed,
    ProducerBusy,
    ProducerFenced,
    ServiceNotReady,
    SubscriptionNotFound,
    TopicFenced,
    TopicTerminated,
)
from runtime.tasks import log_failure
from metadata import keys
from metadata.store import MetadataStore, Record
from subscriptions.cursor import CursorState, ManagedCursor
from subscriptions.cursor_store import LedgerCursorStore
from subscriptions.mode import SubscriptionMode
from subscriptions.subscription import Subscription

log = logging.getLogger(__name__)

# Per client connection: the (URL, TLS URL) to name in its CLOSE_* commands, or None.
Redirect = Callable[[object], "tuple[str, str] | None"]

BROADCAST_MEMBER_SEPARATOR = "::member::"
# A consumer asks for broadcast delivery with this metadata property (also enabled for
# every consumer of a subscription the namespace policy lists as broadcast).
BROADCAST_PROPERTY = "magnetar.subscription.mode"


def broadcast_member_name(subscription: str, member: str) -> str:
    return f"{subscription}{BROADCAST_MEMBER_SEPARATOR}{member}"


def _last_batch_index(metadata: pb.MessageMetadata) -> int:
    """The batch index of an entry's last message (-1: not a batch)."""
    return message_count(metadata) - 1 if metadata.HasField("num_messages_in_batch") else -1


# The clients' MessageId.earliest is (-1, -1) and MessageId.latest (INT64_MAX, INT64_MAX);
# ledger and entry ids are uint64 on the wire.
_EARLIEST_ID = 2**64 - 1
# Below the position of every entry (ledger ids are not negative): where a
# read_compacted subscription from "earliest" starts (_compacted_start).
_BEFORE_EVERY_POSITION = Position(-1, 0)
_LATEST_ID = 2**63 - 1
# Publish-time searches read at most this many entries (binary search over a topic).
_TIME_SEARCH_READS_MAX = 200

# ProducerAccessMode (PulsarApi.proto).
ACCESS_SHARED, ACCESS_EXCLUSIVE, ACCESS_WAIT_FOR_EXCLUSIVE, ACCESS_EXCLUSIVE_WITH_FENCING = 0, 1, 2, 3
# WaitForExclusive producers queued per topic; more are refused with ProducerBusy (a
# queue is for a handful of standby writers, not a crowd).
WAITING_EXCLUSIVE_PRODUCERS_MAX = 100
# Cursors of one topic recovered at once while it loads (those with a cursor ledger).
CURSOR_LOADS_CONCURRENT_MAX = 16
# The managed-ledger property holding the topic epoch.
TOPIC_EPOCH_PROPERTY = "magnetar.topic.epoch"


class PersistentTopic:
    def __init__(self, name: TopicName, ledger: ManagedLedger, store: MetadataStore, config: BrokerConfig,
                 ledger_client: LedgerClient) -> None:
        self.name = name
        self.full_name = str(name)
        self.ledger = ledger
        self._store = store
        self._ledger_client = ledger_client
        self.config = config
        self.producers: dict[int, Producer] = {}        # by identity id()
        self.subscriptions: dict[str, Subscription] = {}
        self._creating: dict[str, asyncio.Task[Subscription]] = {}
        # Subscriptions being deleted (unsubscribe): closed, but still listed until
        # their cursor is gone.
        self._deleting: set[str] = set()
        # The cursor stores of durable subscriptions, by subscription name (stats
        # report their cursor ledgers).
        self._cursor_stores: dict[str, LedgerCursorStore] = {}
        self.closing = False
        self.closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._producer_names: set[str] = set()
        # Producer access modes: the producer holding exclusive access (granted, maybe
        # not registered yet), the WaitForExclusive producers queued, the topic epoch.
        self._exclusive_producer: Producer | None = None
        self._waiting_exclusive: collections.deque[tuple[Producer, asyncio.Future[int]]] = collections.deque()
        epoch = ledger.properties.get(TOPIC_EPOCH_PROPERTY)
        self.topic_epoch: int | None = int(epoch) if epoch is not None else None
        self._promotions: set[asyncio.Task[None]] = set()
        # Compaction (managed_ledger/compaction.py): the compacted ledger and the last run's status.
        self.compaction = TopicCompaction(ledger, pause_at=config.compaction_pause_at)
        self._compaction_task: asyncio.Task[None] | None = None
        # The namespace's destination_storage backlog quota (limit bytes, policy), as the
        # broker last read it (producer creation, each policy check): every SEND is
        # checked against it (broker/policy_enforcement.py).
        self.backlog_size_quota: tuple[int, str] | None = None
        # Deduplication (broker/deduplication.py): None while the policy is off.
        self.dedup: Deduplication | None = None
        self._dedup_lock = asyncio.Lock()
        self._dedup_snapshot_task: asyncio.Task[None] | None = None
        # The position of the deduplication snapshot last written to the managed-ledger
        # properties (None: none), and when (monotonic): a new owner replays the entries
        # after it, so retention keeps them (trim_ledgers).
        self._dedup_snapshot_written: Position | None = self._stored_dedup_snapshot_position()
        self._dedup_snapshot_written_at = time.monotonic()
        self.on_closed: Callable[["PersistentTopic"], None] | None = None
        self.created_at = time.time()
        ledger.on_fenced = self._on_ledger_fenced
        # Counters for rates (broker/stats.py measures rates from them).
        self.messages_in = 0
        self.bytes_in = 0
        # Rate limits from the namespace's policies (broker/rate_limits.py; set by the
        # service): the publish rate's scope, and the dispatch throttle every
        # subscription of the topic shares.
        self.publish_rate = None
        self.dispatch_throttle = None
        # What was published per second, while a dispatch limit is relative to it
        # (broker/rate_limits.py PublishWindow; set with the limits by the service).
        self.publish_window = None
        # Makes each subscription's own throttle when subscriptions are limited one by
        # one too (rate_limits.SubscriptionDispatchRates); None: they share the above.
        self.subscription_throttles = None
        # Transactions (broker/topic_transactions.py): the buffer, pending acks.
        self.transactions = TopicTransactions(self, store, open_max=config.transactions_open_per_topic_max,
                                              aborted_max=config.transactions_aborted_per_topic_max)

    # --- loading ---------------------------------------------------------------------------

    async def load_subscriptions(self) -> None:
        # One prefix read brings every cursor's pointer record (small JSON); each store
        # starts from its record, and those with a cursor ledger recover it side by side
        # (CURSOR_LOADS_CONCURRENT_MAX at once). A read per cursor, one after the
        # other, made a topic of 10 subscriptions wait for 11 etcd round trips at every
        # load (bench/topics_scale.py: a bundle of such topics after a failover).
        # Inline cursors (no ledger) load without awaiting anything, and without a task.
        records = await self._store.get_prefix(keys.cursors_of_topic(self.name.key_path))
        names = [unquote(record.key.rsplit("/", 1)[1]) for record in records]
        stores = [self._cursor_store(name, record.key) for name, record in zip(names, records)]
        states: list[CursorState | None | BaseException] = [
            store.load_inline(record) for store, record in zip(stores, records)]
        in_ledgers = [index for index, state in enumerate(states) if state is None]
        if in_ledgers:
            slots = asyncio.Semaphore(CURSOR_LOADS_CONCURRENT_MAX)

            async def load(store: LedgerCursorStore, record: Record) -> CursorState | None:
                async with slots:
                    return await store.load(record)

            recovered = await asyncio.gather(*(load(stores[i], records[i]) for i in in_ledgers),
                                             return_exceptions=True)
            for index, state in zip(in_ledgers, recovered):
                if isinstance(state, BaseException):
                    raise state
                states[index] = state
        for name, store, state in zip(names, stores, states):
            if state is not None:
                self.subscriptions[name] = self._make_subscription(name, state, store, SubscriptionMode.EXCLUSIVE)

    def _cursor_store(self, subscription: str, key: str | None = None) -> LedgerCursorStore:
        """``key``: the pointer's key when it was just read (not built again)."""
        config = self.ledger.config
        key = key or keys.cursor(self.name.key_path, subscription)
        return LedgerCursorStore(self._store, key, self._ledger_client,
                                 quorums=(config.ensemble_size, config.write_quorum_size, config.ack_quorum_size),
                                 owner=self.config.effective_broker_id,
                                 ledger_tags=ownership_tags(self.full_name, PURPOSE_CURSOR))

    def _make_subscription(self, name: str, state: CursorState, store: LedgerCursorStore | None,
                           mode: SubscriptionMode) -> Subscription:
        cursor = ManagedCursor(f"{self.full_name}/{name}", self.ledger, state, store,
                               flush_interval_s=self.config.cursor_flush_interval_s, durable=store is not None)
        if store is not None:
            self._cursor_stores[name] = store
        # With transactions on, a subscription reads through the topic's transaction
        # buffer (the max read position; aborted entries and markers skipped).
        entries = self.transactions.entries_for(cursor) if self.config.transactions_enabled else self.ledger
        subscription = Subscription(name, self.full_name, entries, cursor, mode,
                            partition_index=self.name.partition_index,
                            entries_max=self.config.dispatch_entries_max, bytes_max=self.config.dispatch_bytes_max,
                            redelivery_counts_max=self.config.redelivery_counts_max,
                            unacked_per_consumer_max=self.config.unacked_per_consumer_max,
                            delayed_entries_max=self.config.delayed_delivery_entries_max)
        subscription.compacted_source_of = self.compaction.source
        subscription.dispatch_throttle = self._subscription_throttle()
        return subscription

    def _subscription_throttle(self):
        if self.subscription_throttles is None:
            return self.dispatch_throttle
        return self.subscription_throttles.throttle()

    def set_dispatch_throttle(self, throttle, subscription_throttles=None) -> None:
        """New dispatch rate limits for every subscription, now and later: the topic's
        shared throttle (None: none), and the maker of each subscription's own (None: none)."""
        self.dispatch_throttle = throttle
        self.subscription_throttles = subscription_throttles
        for subscription in self.subscriptions.values():
            subscription.dispatch_throttle = self._subscription_throttle()
            subscription.dispatcher.wake()

    # --- producers ----------------------------------------------------------------------------

    def generate_producer_name(self) -> str:
        """A name no other producer anywhere has (see broker.producer)."""
        return generated_producer_name(self.config.cluster, self.config.effective_broker_id)

    def add_producer(self, producer: Producer) -> None:
        """Registers a producer; ProducerBusy if one of that name is attached. A lost
        connection detaches its producers as it is noticed (connection_lost), so a
        name held by a dead connection is free again from then on."""
        self._check_open()
        if self.ledger.terminated:
            raise TopicTerminated(f"topic {self.full_name} is terminated")
        if producer.name in self._producer_names:
            raise ProducerBusy(f"producer {producer.name} is already connected to {self.full_name}")
        if producer.access_mode != ACCESS_SHARED and self._exclusive_producer is not producer:
            # Granted exclusive access, then fenced out before it was attached.
            raise ProducerFenced(f"producer {producer.name} lost exclusive access to {self.full_name}")
        self._producer_names.add(producer.name)
        self.producers[id(producer)] = producer

    def remove_producer(self, producer: Producer) -> None:
        if self.producers.pop(id(producer), None) is not None:
            self._producer_names.discard(producer.name)
        self.release_access(producer)

    # --- compaction ---------------------------------------------------------------------------

    def trigger_compaction(self) -> None:
        """Starts a compaction (PreconditionFailed if one is running); its outcome is
        ``compaction.status``."""
        self._check_open()
        if self._compaction_task is not None and not self._compaction_task.done():
            raise PreconditionFailed(f"compaction of {self.full_name} is already in progress")
        self.compaction.status = "RUNNING"
        task = asyncio.get_running_loop().create_task(self.compaction.run())
        task.add_done_callback(functools.partial(log_failure, owner=f"topic {self.full_name}"))
        self._compaction_task = task

    def bytes_since_compaction(self) -> int:
        """The topic's bytes after the compaction horizon (all of them if it was never
        compacted), by the mean entry size: what a compaction threshold is compared to."""
        record = self.compaction.record
        entries = (self.entries_between(record.horizon, self.ledger.last_confirmed) if record is not None
                   else self.ledger.number_of_entries())
        return int(entries * self.mean_entry_bytes())

    def compact_past(self, threshold_bytes: int) -> bool:
        """The namespace's automatic compaction (``compactionThreshold``): starts a
        compaction when more than ``threshold_bytes`` were written since the last one
        and none is running; whether it started one. 0: off."""
        if threshold_bytes <= 0 or self.closing:
            return False
        if self._compaction_task is not None and not self._compaction_task.done():
            return False
        written = self.bytes_since_compaction()
        if written <= threshold_bytes:
            return False
        log.info("compaction threshold passed, compacting: topic=%s bytes=%d threshold=%d", self.full_name,
                 written, threshold_bytes)
        self.trigger_compaction()
        return True

    # --- deduplication -----------------------------------------------------------------------

    async def set_deduplication(self, enabled: bool) -> None:
        """Follows the namespace policy. Turning it on restores the last snapshot and
        replays the entries stored after it (or, with no snapshot, starts from the
        end of the topic and records that)."""
        if enabled == (self.dedup is not None) and (enabled or self._dedup_snapshot_written is None):
            return
        async with self._dedup_lock:
            if not enabled:
                if self.dedup is not None or SNAPSHOT_PROPERTY in self.ledger.properties:
                    # Off: the snapshot goes, and with it what retention kept for it.
                    self.dedup = None
                    await self.ledger.set_properties({SNAPSHOT_PROPERTY: None})
                    log.info("deduplication disabled: topic=%s", self.full_name)
                self._dedup_snapshot_written = None
                return
            if self.dedup is not None:
                return
            dedup = Deduplication()
            snapshot = self.ledger.properties.get(SNAPSHOT_PROPERTY)
            if snapshot is None:
                await self.ledger.set_properties({SNAPSHOT_PROPERTY: dedup.take_snapshot(self.ledger.last_confirmed)})
                replayed = 0
            else:
                dedup.restore(snapshot)
                replayed = await self._replay_for_deduplication(dedup)
            self._dedup_written(dedup.snapshot_position)
            self._check_open()
            self.dedup = dedup
            log.info("deduplication enabled: topic=%s producers=%d replayed_entries=%d", self.full_name,
                     len(dedup.persisted), replayed)

    async def _replay_for_deduplication(self, dedup: Deduplication) -> int:
        """Reads the entries after the snapshot's position: each names its producer and
        sequence ids. At most about SNAPSHOT_INTERVAL_ENTRIES after a crash."""
        ledger = self.ledger
        position = ledger.next_position(dedup.snapshot_position) if dedup.snapshot_position.entry_id >= 0 \
            else ledger.normalize(Position(dedup.snapshot_position.ledger_id, 0))
        if position < ledger.first_position:
            position = ledger.first_position
        end = ledger.last_confirmed
        count = 0
        while position <= end:
            entries = await ledger.read(position, 500, self.config.dispatch_bytes_max)
            if not entries:
                break
            for entry in entries:
                if entry.position > end:
                    break
                metadata = stored_metadata(entry.data)
                dedup.replay(metadata.producer_name, metadata.sequence_id, metadata.highest_sequence_id,
                             entry.position)
                count += 1
            position = ledger.next_position(entries[-1].position)
        return count

    def on_stored(self, producer_name: str, sequence_id: int, highest_sequence_id: int, position: Position) -> None:
        """A SEND's entry is stored (called in entry order): deduplication counts it
        and writes a snapshot now and then."""
        dedup = self.dedup
        if dedup is None:
            return
        dedup.on_stored(producer_name, sequence_id, highest_sequence_id, position)
        if dedup.snapshot_due():
            self._start_dedup_snapshot(dedup)

    def _start_dedup_snapshot(self, dedup: Deduplication) -> None:
        """Writes a snapshot of what is stored so far, unless one is being written."""
        if self._dedup_snapshot_task is not None or self.closing:
            return
        position = dedup.last_stored
        snapshot = dedup.take_snapshot(position)
        task = asyncio.get_running_loop().create_task(self._write_dedup_snapshot(snapshot, position))
        self._dedup_snapshot_task = task
        task.add_done_callback(functools.partial(log_failure, owner=f"topic {self.full_name}"))

    async def _write_dedup_snapshot(self, snapshot: str, position: Position) -> None:
        try:
            await self.ledger.set_properties({SNAPSHOT_PROPERTY: snapshot})
            self._dedup_written(position)
        except MagnetarError as error:
            # The next snapshot (or the replay of a longer tail) covers it.
            log.warning("deduplication snapshot not written: topic=%s error=%s", self.full_name, error)
        finally:
            self._dedup_snapshot_task = None

    def _stored_dedup_snapshot_position(self) -> Position | None:
        """The position of the deduplication snapshot in the managed-ledger properties
        (None: none, or unreadable): retention keeps what comes after it from the
        moment the topic loads, deduplication on in memory or not yet (it is turned on
        by the first producer; replaying then needs those entries)."""
        text = self.ledger.properties.get(SNAPSHOT_PROPERTY)
        if text is None:
            return None
        try:
            return snapshot_position(text)
        except MagnetarError as error:
            log.warning("deduplication snapshot unreadable, retention keeps nothing for it: topic=%s error=%s",
                        self.full_name, error)
            return None

    def _dedup_written(self, position: Position) -> None:
        self._dedup_snapshot_written = position
        self._dedup_snapshot_written_at = time.monotonic()

    async def _final_dedup_snapshot(self) -> None:
        """On close, after the last append: a new owner then has nothing to replay."""
        dedup = self.dedup
        if dedup is None or self.ledger.fenced_error is not None:
            return
        if self._dedup_snapshot_task is not None:
            await asyncio.gather(self._dedup_snapshot_task, return_exceptions=True)
        if dedup.snapshot_position == self.ledger.last_confirmed:
            return
        position = self.ledger.last_confirmed
        try:
            await self.ledger.set_properties({SNAPSHOT_PROPERTY: dedup.take_snapshot(position)})
            self._dedup_written(position)
        except MagnetarError as error:
            log.warning("deduplication snapshot not written at close: topic=%s error=%s", self.full_name, error)

    # --- producer access modes ------------------------------------------------------------------

    async def acquire_access(self, producer: Producer, epoch: int | None, on_queued: Callable[[], None]
                             ) -> int | None:
        """Grants ``producer`` its access mode; returns the topic epoch it holds (None:
        the topic never had an exclusive producer). ``epoch``: the one the client held
        before (a reconnect). ``on_queued`` is called when a WaitForExclusive producer
        starts to wait. A cancelled caller leaves nothing granted or queued."""
        self._check_open()
        mode = producer.access_mode
        holder = self._exclusive_producer
        if mode != ACCESS_SHARED and epoch is not None and self.topic_epoch is not None and epoch < self.topic_epoch:
            # A reconnect of an exclusive producer that another superseded meanwhile.
            # (Pulsar would queue a WaitForExclusive one here, and its sends would time
            # out; failing it at once says what happened.)
            raise ProducerFenced(f"topic {self.full_name} epoch moved to {self.topic_epoch}; "
                                 f"the producer held {epoch}")
        if mode == ACCESS_SHARED:
            if holder is not None or self._waiting_exclusive:
                raise ProducerBusy(f"topic {self.full_name} has an exclusive producer: "
                                   f"{holder.name if holder else 'queued'}")
            return self.topic_epoch
        if mode == ACCESS_EXCLUSIVE:
            if holder is not None or self._waiting_exclusive:
                raise ProducerFenced(f"topic {self.full_name} has an exclusive producer: "
                                     f"{holder.name if holder else 'queued'}")
            if self.producers:
                raise ProducerFenced(f"topic {self.full_name} has shared producers")
            return await self._become_exclusive(producer, epoch)
        if mode == ACCESS_EXCLUSIVE_WITH_FENCING:
            if holder is not None or self.producers:
                self._fence_producers()
            return await self._become_exclusive(producer, epoch)
        if mode == ACCESS_WAIT_FOR_EXCLUSIVE:
            if holder is None and not self.producers:
                return await self._become_exclusive(producer, epoch)
            if len(self._waiting_exclusive) >= WAITING_EXCLUSIVE_PRODUCERS_MAX:
                raise ProducerBusy(f"topic {self.full_name} has {WAITING_EXCLUSIVE_PRODUCERS_MAX} producers "
                                   "waiting for exclusive access")
            granted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiting_exclusive.append((producer, granted))
            on_queued()
            log.info("producer waiting for exclusive access: topic=%s producer=%s", self.full_name, producer.name)
            try:
                return await granted
            except asyncio.CancelledError:
                self._waiting_exclusive = collections.deque(
                    item for item in self._waiting_exclusive if item[0] is not producer)
                self.release_access(producer)
                raise
        raise NotAllowed(f"unknown producer access mode {mode}")

    def _fence_producers(self) -> None:
        """ExclusiveWithFencing: every other producer is closed (its client reconnects
        and is refused: ProducerFenced) and every queued one fails."""
        waiting, self._waiting_exclusive = self._waiting_exclusive, collections.deque()
        for producer, granted in waiting:
            if not granted.done():
                granted.set_exception(ProducerFenced(f"fenced out of {self.full_name}"))
        for producer in list(self.producers.values()):
            log.info("producer fenced out: topic=%s producer=%s", self.full_name, producer.name)
            if not producer.closed:
                producer.connection.write_command(commands.close_producer(producer.producer_id))
                producer.connection.forget_producer(producer)
            producer.closed = True
            self.remove_producer(producer)
        self._exclusive_producer = None

    async def _become_exclusive(self, producer: Producer, epoch: int | None) -> int:
        current = self.topic_epoch
        if epoch is not None and current is not None and epoch < current:
            raise ProducerFenced(f"topic {self.full_name} epoch moved to {current}; the producer held {epoch}")
        # Taken before the await below, so that a concurrent request sees it.
        self._exclusive_producer = producer
        if epoch is not None and epoch == current:
            new_epoch = epoch                     # a reconnect of the holder
        else:
            # A new grant. An epoch the client claims beyond the topic's was never
            # granted here (a deleted topic's, or forged): it is not adopted, so
            # epochs only ever move by one (a forged 2**64 - 1 made every later grant
            # overflow the wire field, and no exclusive producer could be created).
            new_epoch = (current if current is not None else -1) + 1
        try:
            if new_epoch != current:
                await self.ledger.set_properties({TOPIC_EPOCH_PROPERTY: str(new_epoch)})
        except BaseException:
            if self._exclusive_producer is producer:
                self._exclusive_producer = None
            raise
        self.topic_epoch = new_epoch
        log.info("exclusive producer: topic=%s producer=%s epoch=%d", self.full_name, producer.name, new_epoch)
        return new_epoch

    def release_access(self, producer: Producer) -> None:
        """The producer left: if it held exclusive access, the next queued one gets it."""
        if self._exclusive_producer is not producer:
            return
        self._exclusive_producer = None
        while self._waiting_exclusive and not self.closing:
            successor, granted = self._waiting_exclusive.popleft()
            if granted.done():
                continue
            self._exclusive_producer = successor    # reserved until its epoch is stored
            task = asyncio.get_running_loop().create_task(self._promote(successor, granted))
            self._promotions.add(task)
            task.add_done_callback(self._promotions.discard)
            task.add_done_callback(functools.partial(log_failure, owner=f"topic {self.full_name}"))
            return

    async def _promote(self, producer: Producer, granted: asyncio.Future[int]) -> None:
        self._exclusive_producer = None
        try:
            epoch = await self._become_exclusive(producer, None)
        except MagnetarError as error:
            if not granted.done():
                granted.set_exception(error)
            return
        if granted.done():            # the waiting client went away meanwhile
            self.release_access(producer)
        else:
            granted.set_result(epoch)

    def publish(self, producer: Producer, payload: bytes, num_messages: int) -> asyncio.Future[Position]:
        producer.messages_in += num_messages
        producer.bytes_in += len(payload)
        self.messages_in += num_messages
        self.bytes_in += len(payload)
        if self.publish_window is not None:      # a dispatch limit relative to publishing
            self.publish_window.add(num_messages, len(payload), time.monotonic())
        return self.ledger.append(payload)

    # --- subscriptions --------------------------------------------------------------------------

    async def subscribe(self, consumer: Consumer, *, durable: bool, initial_position: int,
                        start_message_id: pb.MessageIdData | None, rollback_duration_s: int = 0,
                        broadcast: bool = False, read_compacted: bool = False) -> Subscription:
        """Attaches a consumer (creating the subscription if needed). In a broadcast
        subscription each member — consumers with one name — gets its own durable
        subscription ``<subscription>::member::<name>`` and so its own cursor and every
        message; members of the same name share it in the mode they asked for."""
        self._check_open()
        name = consumer.subscription_name
        if broadcast:
            if not durable:
                raise PreconditionFailed("a broadcast subscription is durable: readers cannot join it")
            name = broadcast_member_name(name, consumer.name)
        if read_compacted and consumer.mode.shares_messages:
            raise NotAllowed("read_compacted is only for exclusive and failover subscriptions and readers")
        subscription = self.subscriptions.get(name)
        if subscription is None:
            subscription = await self._create_once(
                name, lambda: self._new_subscription(name, consumer.mode, durable, initial_position,
                                                     start_message_id, rollback_duration_s, read_compacted))
            self._check_open()   # the topic may have begun closing while it was created
        self._check_not_deleting(name)
        # Before the consumer is added (which rewinds the cursor), so the dispatcher knows
        # what it reads from the start; back as it was if the consumer is refused.
        previously, subscription.read_compacted = subscription.read_compacted, read_compacted
        try:
            subscription.add_consumer(consumer, consumer.mode)
        except BaseException:
            subscription.read_compacted = previously
            raise
        return subscription

    async def _create_once(self, name: str, create: Callable[[], Awaitable[Subscription]]) -> Subscription:
        """Creates a subscription exactly once however many ask at the same time (the
        creation awaits storage, so a plain check-then-create would let two concurrent
        first consumers each make their own and each get every message). The creation
        is the topic's task, not the first caller's: cancelling a caller leaves it to
        finish for the others."""
        pending = self._creating.get(name)
        if pending is None:
            # Not once the close began: the close waits only for the creations under
            # way when it started, and one started later would be added after it.
            self._check_open()
            self._check_not_deleting(name)
            pending = asyncio.get_running_loop().create_task(self._create(name, create))
            # Owned by the topic (its close waits for it); a failure is logged here too,
            # in case every caller went away before it ended.
            pending.add_done_callback(functools.partial(log_failure, owner=f"topic {self.full_name}"))
            self._creating[name] = pending
        return await asyncio.shield(pending)

    async def _create(self, name: str, create: Callable[[], Awaitable[Subscription]]) -> Subscription:
        try:
            subscription = await create()
        finally:
            self._creating.pop(name, None)
        assert name not in self.subscriptions, name
        self.subscriptions[name] = subscription
        return subscription

    async def _new_subscription(self, name: str, mode: SubscriptionMode, durable: bool, initial_position: int,
                                start_message_id: pb.MessageIdData | None, rollback_duration_s: int,
                                read_compacted: bool = False) -> Subscription:
        start = self._start_position(initial_position, start_message_id, durable)
        compacted_start = None
        if rollback_duration_s > 0:
            start = await self.find_position_by_time(int((time.time() - rollback_duration_s) * 1000))
        elif read_compacted:
            compacted_start = self._compacted_start(initial_position, start_message_id, durable)
            start = compacted_start or start
        state = CursorState(mark_delete=self._before(start))
        store = self._cursor_store(name) if durable else None
        subscription = self._make_subscription(name, state, store, mode)
        if durable:
            await subscription.cursor.save_now()
        else:
            subscription.cursor.seek_read(start)
        log.info("subscription created: topic=%s subscription=%s durable=%s start=%s",
                 self.full_name, name, durable, start)
        return subscription

    def _before(self, position: Position) -> Position:
        """The mark-delete position that makes ``position`` the next to read."""
        if position.entry_id > 0:
            return Position(position.ledger_id, position.entry_id - 1)
        # The entry before the first of a ledger: the last of the previous ledger, or
        # "nothing" within this one; either way next_position lands on ``position``.
        previous = [l for l in self.ledger.ledger_ids() if l < position.ledger_id]
        if previous:
            return Position(previous[-1], self.ledger.last_entry_of(previous[-1]))
        return Position(position.ledger_id, -1)

    def _start_position(self, initial_position: int, start_message_id: pb.MessageIdData | None,
                        durable: bool) -> Position:
        ledger = self.ledger
        if start_message_id is not None and not durable:
            if start_message_id.ledgerId == _EARLIEST_ID:
                return ledger.first_position                             # MessageId.earliest
            if start_message_id.ledgerId == _LATEST_ID:
                return ledger.end_position                               # MessageId.latest
            # Start at the entry itself: the client drops what it should not see
            # (messages before a batch index, or the start message when not inclusive).
            return ledger.normalize(Position(start_message_id.ledgerId, start_message_id.entryId))
        if initial_position == pb.CommandSubscribe.Earliest:
            return ledger.first_position
        return ledger.end_position

    def _compacted_start(self, initial_position: int, start_message_id: pb.MessageIdData | None,
                         durable: bool) -> Position | None:
        """Where a new read_compacted subscription starts when that is before the oldest
        entry the topic still stores (else None: where ``_start_position`` puts it); see
        ``_compacted_position``."""
        if start_message_id is not None and not durable:
            return self._compacted_position(start_message_id)
        if initial_position == pb.CommandSubscribe.Earliest and self.compaction.record is not None:
            return _BEFORE_EVERY_POSITION
        return None

    def _compacted_position(self, message_id: pb.MessageIdData) -> Position | None:
        """Where ``message_id`` puts a read_compacted subscription (a start or a seek)
        when that is before the oldest entry the topic still stores; None when it is
        where it puts any subscription. The compacted ledger keeps the latest value of
        keys whose ledgers retention has deleted since, at their original positions; a
        position moved onto the topic's stored entries would skip them. So "earliest"
        is before every position, and an id inside the compacted range (a reader back
        after a reconnect) is taken as it is (Pulsar reads both the same way). The
        mark-delete position goes just before it, and the dispatcher reads the compacted
        ledger from right after the mark-delete position (``Dispatcher._compacted_from``),
        also after a rewind."""
        record = self.compaction.record
        if record is None or message_id.ledgerId == _LATEST_ID:
            return None
        if message_id.ledgerId == _EARLIEST_ID:
            return _BEFORE_EVERY_POSITION
        requested = Position(message_id.ledgerId, message_id.entryId)
        if requested <= record.horizon and requested < self.ledger.first_position:
            return requested
        return None

    def seek_position(self, message_id: pb.MessageIdData, *, read_compacted: bool = False) -> Position:
        """Where a SEEK to ``message_id`` puts the cursor (the next entry to deliver):
        MessageId.earliest is the oldest stored entry, MessageId.latest the end of the
        topic, any other id its own entry (the client drops what it should not see
        again: the sought message itself unless it asked for an inclusive start). For a
        read_compacted subscription, what ``_compacted_position`` says first."""
        compacted = self._compacted_position(message_id) if read_compacted else None
        if compacted is not None:
            return compacted
        if message_id.ledgerId == _EARLIEST_ID:
            return self.ledger.first_position
        if message_id.ledgerId == _LATEST_ID:
            return self.ledger.end_position
        return self.ledger.normalize(Position(message_id.ledgerId, message_id.entryId))

    async def unsubscribe(self, name: str, consumer: Consumer | None) -> None:
        subscription = self.subscriptions.get(name)
        if subscription is None:
            raise SubscriptionNotFound(f"subscription {name} not found on {self.full_name}")
        others = [c for c in subscription.consumers if c is not consumer]
        if others:
            raise PreconditionFailed(f"subscription {name} has {len(others)} other consumers attached")
        if name in self._deleting:
            raise PreconditionFailed(f"subscription {name} of {self.full_name} is being deleted")
        if consumer is not None:
            subscription.remove_consumer(consumer)
        # From here until it leaves self.subscriptions, nothing may attach to it.
        self._deleting.add(name)
        try:
            await subscription.dispatcher.close()
            await subscription.cursor.delete()
        finally:
            self._deleting.discard(name)
        self.subscriptions.pop(name, None)
        self._cursor_stores.pop(name, None)
        await self.transactions.drop_subscription(name)   # its held acknowledgements go with it
        log.info("subscription deleted: topic=%s subscription=%s", self.full_name, name)

    async def create_subscription(self, name: str, position: Position | None) -> None:
        """Admin: create a durable subscription at ``position`` (None: the end)."""
        if name in self.subscriptions or name in self._creating:
            raise AlreadyExists(f"subscription {name} already exists on {self.full_name}")

        async def create() -> Subscription:
            start = position if position is not None else self.ledger.end_position
            state = CursorState(mark_delete=self._before(self.ledger.normalize(start)))
            subscription = self._make_subscription(name, state, self._cursor_store(name),
                                                   SubscriptionMode.EXCLUSIVE)
            await subscription.cursor.save_now()
            return subscription

        await self._create_once(name, create)

    # --- queries --------------------------------------------------------------------------------

    async def last_message_id(self, *, read_compacted: bool = False) -> tuple[Position, int]:
        """The last stored message: (position, batch index; -1 if not a batch). An empty
        topic answers (current ledger, -1). For a read_compacted consumer, when nothing
        follows the compaction horizon, the last message of the compacted ledger: the
        topic's own last may be one compaction dropped (a tombstone, say), and the
        clients' has_message_available would then stay true with nothing left to read
        (what Pulsar fixed in apache/pulsar#18808)."""
        last = self.ledger.last_confirmed
        record = self.compaction.record
        if read_compacted and record is not None and last <= record.horizon:
            compacted = await self.compaction.last_entry()
            if compacted is None:
                return Position(max(self.ledger.current_ledger_id, last.ledger_id), -1), -1
            if compacted.batch_size:
                return compacted.position, compacted.keep_bits.bit_length() - 1
            return compacted.position, _last_batch_index(stored_metadata(compacted.stored))
        if last.entry_id < 0:
            return Position(max(self.ledger.current_ledger_id, last.ledger_id), -1), -1
        entries = await self.ledger.read(last, 1, 1)
        if not entries:
            return last, -1
        return last, _last_batch_index(stored_metadata(entries[0].data))

    async def _publish_time(self, position: Position) -> int:
        entries = await self.ledger.read(position, 1, 1)
        if not entries:
            return -1
        return int(stored_metadata(entries[0].data).publish_time)

    async def find_position_by_time(self, timestamp_ms: int) -> Position:
        """The first entry published at or after ``timestamp_ms`` (binary search over
        the topic's entries by publish time; the end of the topic if none)."""
        ledger = self.ledger
        end = ledger.end_position
        positions: list[tuple[int, int]] = []   # (ledger_id, entry count)
        for ledger_id in ledger.ledger_ids():
            count = ledger.last_entry_of(ledger_id) + 1
            if count > 0:
                positions.append((ledger_id, count))
        total = sum(count for _, count in positions)
        if total == 0:
            return end

        def at(index: int) -> Position:
            for ledger_id, count in positions:
                if index < count:
                    return Position(ledger_id, index)
                index -= count
            raise AssertionError(index)

        low, high = 0, total
        reads = 0
        while low < high and reads < _TIME_SEARCH_READS_MAX:
            middle = (low + high) // 2
            reads += 1
            if await self._publish_time(at(middle)) >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        return at(low) if low < total else end

    # --- backlog (policies: broker/policy_enforcement.py) ----------------------------------------

    def mean_entry_bytes(self) -> float:
        entries = self.ledger.number_of_entries()
        return self.ledger.total_size() / entries if entries > 0 else 0.0

    def backlog_bytes(self) -> int:
        """The slowest durable subscription's unconsumed entries times the mean entry
        size (Pulsar's estimate); 0 with no durable subscription."""
        return int(self.backlog_entries() * self.mean_entry_bytes())

    def backlog_entries(self, *, pending: bool = False) -> int:
        """The slowest durable subscription's unconsumed entries (0 with no durable
        subscription); with ``pending``, appends not yet confirmed count too (what the
        backlog is about to be)."""
        if not any(s.cursor.durable for s in self.subscriptions.values()):
            return 0
        backlog = self.entries_between(self.consumed_upto(), self.ledger.last_confirmed)
        return backlog + self.ledger.pending_appends if pending else backlog

    async def oldest_unconsumed_publish_ms(self) -> int | None:
        """The publish time of the slowest durable subscription's next entry (None: no
        backlog)."""
        if not any(s.cursor.durable for s in self.subscriptions.values()):
            return None
        upto = self.consumed_upto()
        if upto >= self.ledger.last_confirmed:
            return None
        published = await self._publish_time(self.ledger.next_position(upto))
        return published if published >= 0 else None

    def position_after(self, position: Position, count: int) -> Position:
        """The entry ``count`` entries after ``position`` (position + count), or the end
        of the topic if there are fewer."""
        assert count > 0
        ledger = self.ledger
        for ledger_id in ledger.ledger_ids():
            if ledger_id < position.ledger_id:
                continue
            last = ledger.last_entry_of(ledger_id)
            first = position.entry_id + 1 if ledger_id == position.ledger_id else 0
            available = last - first + 1
            if available >= count:
                return Position(ledger_id, first + count - 1)
            if available > 0:
                count -= available
        return ledger.end_position

    # --- closing ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closing or self.closed:
            raise TopicFenced(f"topic {self.full_name} is being closed")
        if self.ledger.fenced_error is not None:
            raise self.ledger.fenced_error

    def _check_not_deleting(self, subscription: str) -> None:
        if subscription in self._deleting:
            # Retriable: once the deletion is done, the client's retry creates it anew.
            raise ServiceNotReady(f"subscription {subscription} of {self.full_name} is being deleted: retry")

    def _on_ledger_fenced(self, error: MagnetarError) -> None:
        log.warning("topic lost its managed ledger, closing: topic=%s error=%s", self.full_name, error)
        self._start_close(disconnect_clients=True)

    async def close(self, *, disconnect_clients: bool = True, redirect: Redirect | None = None) -> None:
        """Closes the topic; returns once it is closed, also to a caller that came
        after the close began (``disconnect_clients`` and ``redirect`` are the first
        caller's). ``redirect`` gives, per client connection, the (URL, TLS URL) its
        CLOSE_PRODUCER / CLOSE_CONSUMER names as the broker to reconnect to, or None."""
        await asyncio.shield(self._start_close(disconnect_clients=disconnect_clients, redirect=redirect))

    async def wait_closed(self) -> None:
        """Returns once a close that began has finished (at once if none began)."""
        if self._close_task is not None:
            await asyncio.shield(self._close_task)

    def _start_close(self, *, disconnect_clients: bool, redirect: Redirect | None = None) -> asyncio.Task[None]:
        if self._close_task is None:
            self.closing = True
            self._close_task = asyncio.get_running_loop().create_task(self._close(disconnect_clients, redirect))
            self._close_task.add_done_callback(functools.partial(log_failure, owner=f"topic {self.full_name}"))
        return self._close_task

    async def _close(self, disconnect_clients: bool, redirect: Redirect | None = None) -> None:
        assert self.closing
        if self.publish_rate is not None:
            self.publish_rate.close()   # nothing stays paused on a topic that is gone
        waiting, self._waiting_exclusive = self._waiting_exclusive, collections.deque()
        for _producer, granted in waiting:
            if not granted.done():
                granted.set_exception(TopicFenced(f"topic {self.full_name} is being closed"))
        for task in list(self._promotions):
            task.cancel()
        if self._compaction_task is not None:
            self._compaction_task.cancel()
            await asyncio.gather(self._compaction_task, return_exceptions=True)
        for producer in list(self.producers.values()):
            if disconnect_clients and not producer.closed:
                url, url_tls = (redirect(producer.connection) if redirect is not None else None) or ("", "")
                producer.connection.write_command(commands.close_producer(producer.producer_id, assigned_url=url,
                                                                          assigned_url_tls=url_tls))
                producer.connection.forget_producer(producer)
            producer.closed = True
        self.producers.clear()
        if self._creating:
            # A subscription still being created would be added after the close.
            await asyncio.gather(*self._creating.values(), return_exceptions=True)
        # Every consumer of every subscription is told first, with no await in between,
        # and only then are the subscriptions closed: a subscription's close persists its
        # cursor, which waits on etcd and the bookies, so a close during an etcd outage
        # (a broker fencing itself) would otherwise leave the consumers of the
        # subscriptions after it attached to a topic that no longer serves them, never
        # told to reconnect (the hosts harness found it: tests/hosts/).
        subscriptions = list(self.subscriptions.values())
        for subscription in subscriptions:
            for consumer in list(subscription.consumers):
                assert isinstance(consumer, Consumer), consumer
                if disconnect_clients:
                    consumer.disconnect(redirect(consumer.connection) if redirect is not None else None)
                consumer.closed = True
                subscription.remove_consumer(consumer)
        for subscription in subscriptions:
            assert not subscription.consumers, subscription.name
            await subscription.close()
        try:
            await self.ledger.close()
        except MagnetarError as error:
            log.warning("closing managed ledger failed: topic=%s error=%s", self.full_name, error)
        await self._final_dedup_snapshot()
        self.closed = True
        if self.on_closed is not None:
            self.on_closed(self)
        log.info("topic closed: topic=%s", self.full_name)

    async def delete(self, *, force: bool) -> None:
        if not force and (self.producers or any(s.consumers for s in self.subscriptions.values())):
            raise PreconditionFailed(f"topic {self.full_name} has connected producers or consumers")
        await self.close(disconnect_clients=True)
        for name, subscription in list(self.subscriptions.items()):
            await subscription.cursor.delete()
        await self._store.delete_prefix(keys.cursors_of_topic(self.name.key_path))
        await self.transactions.drop_all()   # acknowledgements held in transactions
        await self._store.delete(keys.topic_activity(self.name.key_path))
        await self.compaction.delete()
        await self.ledger.delete()
        log.info("topic deleted: topic=%s", self.full_name)

    async def terminate(self) -> Position:
        last = await self.ledger.terminate()
        for subscription in self.subscriptions.values():
            subscription.dispatcher.wake()
        return last

    def ensure_not_terminated(self) -> None:
        if self.ledger.terminated:
            raise TopicTerminated(f"topic {self.full_name} is terminated")

    # --- retention ---------------------------------------------------------------------------

    def consumed_upto(self) -> Position:
        """The lowest mark-delete position of the durable subscriptions (with none, the
        last stored entry: retention alone then decides)."""
        marks = [s.cursor.mark_delete_position for s in self.subscriptions.values() if s.cursor.durable]
        # (The compacted ledger holds copies of what it serves up to its horizon; what
        # comes after it trim_ledgers keeps, but that is not backlog.)
        return min(marks) if marks else self.ledger.last_confirmed

    async def trim_ledgers(self, retention_minutes: int, retention_mb: int,
                           may_delete: Callable[[int], bool] | None = None) -> list[int]:
        """Deletes the ledgers every durable cursor has passed that retention no longer
        protects (see managed_ledger/retention.py), oldest first and, given ``may_delete`` (the
        archive's gate: archived ledgers only), no further than the first it refuses.
        None holding entries after the last deduplication snapshot written (a quiet
        topic's stale snapshot is renewed here) or after the compaction horizon.
        Returns their ids."""
        from managed_ledger.retention import LedgerSpan, ledgers_to_delete

        if self.closing:
            return []
        dedup = self.dedup
        if dedup is not None and dedup.snapshot_stale(time.monotonic() - self._dedup_snapshot_written_at):
            self._start_dedup_snapshot(dedup)     # moves the hold below on (next time)
        ledger = self.ledger
        now_ms = int(time.time() * 1000)
        # A ledger not closed yet (the current one, or one whose close is in progress)
        # is as young as can be.
        spans = [LedgerSpan(info.ledger_id, ledger.last_entry_of(info.ledger_id), max(info.size_bytes, 0),
                            info.closed_ms if info.closed_ms > 0 else now_ms) for info in ledger.ledger_infos()]
        upto = self.consumed_upto()
        if self._dedup_snapshot_written is not None:
            # A new owner replays the entries after the last snapshot written.
            upto = min(upto, self._dedup_snapshot_written)
        compacted = self.compaction.record
        if compacted is not None:
            # The next compaction reads the entries after the horizon (Pulsar's
            # __compaction cursor holds them the same way).
            upto = min(upto, compacted.horizon)
        doomed = ledgers_to_delete(spans, ledger.current_ledger_id, tuple(upto), retention_minutes, retention_mb,
                                   now_ms)
        if may_delete is not None:
            doomed = list(itertools.takewhile(may_delete, doomed))
        if not doomed:
            return []
        await ledger.delete_ledgers_before(doomed[-1] + 1)
        return doomed

    # --- stats ---------------------------------------------------------------------------------

    def entries_between(self, after: Position, upto: Position) -> int:
        """Entries in (after, upto] of this topic."""
        return self.ledger.entries_between(after, upto)

    def cursor_ledger_id(self, subscription: str) -> int:
        """The ledger holding a durable subscription's cursor state (-1: none, the
        state is inline in etcd or the subscription is not durable)."""
        store = self._cursor_stores.get(subscription)
        return store.ledger_id if store is not None else -1

