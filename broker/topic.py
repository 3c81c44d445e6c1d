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

The topic's parts, each in a module of its own: producer access modes
(broker/producer_access.py), deduplication (broker/topic_deduplication.py), where
message ids, times and counts fall (broker/topic_positions.py), transactions
(broker/topic_transactions.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import unquote

from protocol import commands
from broker.config import BrokerConfig
from managed_ledger.compaction import TopicCompaction
from managed_ledger.managed_ledger_info import PURPOSE_CURSOR, ownership_tags
from broker.consumer import Consumer
from broker.deduplication import Deduplication
from managed_ledger.managed_ledger import ManagedLedger
from common.position import Position
from broker.producer import Producer, generated_producer_name
from broker.producer_access import ACCESS_SHARED, ProducerAccess
from broker.topic_deduplication import TopicDeduplication
from broker.topic_positions import TopicPositions
from broker.topic_retention import TopicRetention
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


# Cursors of one topic recovered at once while it loads (those with a cursor ledger).
CURSOR_LOADS_CONCURRENT_MAX = 16


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
        # Producer access modes (broker/producer_access.py).
        self.access = ProducerAccess(self)
        # Compaction (managed_ledger/compaction.py): the compacted ledger and the last run's status.
        self.compaction = TopicCompaction(ledger, pause_at=config.compaction_pause_at)
        self._compaction_task: asyncio.Task[None] | None = None
        # Where message ids, publish times and entry counts fall (broker/topic_positions.py).
        self.positions = TopicPositions(ledger, self.compaction)
        # Backlog and retention (broker/topic_retention.py).
        self.retention = TopicRetention(self)
        # The namespace's destination_storage backlog quota (limit bytes, policy), as the
        # broker last read it (producer creation, each policy check): every SEND is
        # checked against it (broker/policy_enforcement.py).
        self.backlog_size_quota: tuple[int, str] | None = None
        # Deduplication (broker/topic_deduplication.py).
        self.deduplication = TopicDeduplication(self)
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
        if producer.access_mode != ACCESS_SHARED and self.access.exclusive_producer is not producer:
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

    # --- deduplication (broker/topic_deduplication.py) ----------------------------------------

    @property
    def dedup(self) -> Deduplication | None:
        """None while the namespace policy is off."""
        return self.deduplication.dedup

    async def set_deduplication(self, enabled: bool) -> None:
        await self.deduplication.set_deduplication(enabled)

    def on_stored(self, producer_name: str, sequence_id: int, highest_sequence_id: int, position: Position) -> None:
        self.deduplication.on_stored(producer_name, sequence_id, highest_sequence_id, position)

    # --- producer access modes (broker/producer_access.py) ------------------------------------

    @property
    def topic_epoch(self) -> int | None:
        return self.access.topic_epoch

    async def acquire_access(self, producer: Producer, epoch: int | None, on_queued: Callable[[], None]
                             ) -> int | None:
        return await self.access.acquire_access(producer, epoch, on_queued)

    def release_access(self, producer: Producer) -> None:
        self.access.release_access(producer)

    # --- publishing ------------------------------------------------------------------------------

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
        start = self.positions.start_position(initial_position, start_message_id, durable)
        compacted_start = None
        if rollback_duration_s > 0:
            start = await self.find_position_by_time(int((time.time() - rollback_duration_s) * 1000))
        elif read_compacted:
            compacted_start = self.positions.compacted_start(initial_position, start_message_id, durable)
            start = compacted_start or start
        state = CursorState(mark_delete=self.positions.before(start))
        store = self._cursor_store(name) if durable else None
        subscription = self._make_subscription(name, state, store, mode)
        if durable:
            await subscription.cursor.save_now()
        else:
            subscription.cursor.seek_read(start)
        log.info("subscription created: topic=%s subscription=%s durable=%s start=%s",
                 self.full_name, name, durable, start)
        return subscription

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
            state = CursorState(mark_delete=self.positions.before(self.ledger.normalize(start)))
            subscription = self._make_subscription(name, state, self._cursor_store(name),
                                                   SubscriptionMode.EXCLUSIVE)
            await subscription.cursor.save_now()
            return subscription

        await self._create_once(name, create)

    # --- queries (broker/topic_positions.py) ---------------------------------------------------

    def seek_position(self, message_id: pb.MessageIdData, *, read_compacted: bool = False) -> Position:
        return self.positions.seek_position(message_id, read_compacted=read_compacted)

    async def last_message_id(self, *, read_compacted: bool = False) -> tuple[Position, int]:
        return await self.positions.last_message_id(read_compacted=read_compacted)

    async def find_position_by_time(self, timestamp_ms: int) -> Position:
        return await self.positions.find_position_by_time(timestamp_ms)

    def position_after(self, position: Position, count: int) -> Position:
        return self.positions.position_after(position, count)

    # --- backlog and retention (broker/topic_retention.py) --------------------------------------

    def mean_entry_bytes(self) -> float:
        return self.retention.mean_entry_bytes()

    def backlog_bytes(self) -> int:
        return self.retention.backlog_bytes()

    def backlog_entries(self, *, pending: bool = False) -> int:
        return self.retention.backlog_entries(pending=pending)

    async def oldest_unconsumed_publish_ms(self) -> int | None:
        return await self.retention.oldest_unconsumed_publish_ms()

    async def trim_ledgers(self, retention_minutes: int, retention_mb: int,
                           may_delete: Callable[[int], bool] | None = None) -> list[int]:
        return await self.retention.trim_ledgers(retention_minutes, retention_mb, may_delete)

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
        self.access.close()
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
        await self.deduplication.final_snapshot()
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

    # --- stats ---------------------------------------------------------------------------------

    def entries_between(self, after: Position, upto: Position) -> int:
        """Entries in (after, upto] of this topic."""
        return self.ledger.entries_between(after, upto)

    def cursor_ledger_id(self, subscription: str) -> int:
        """The ledger holding a durable subscription's cursor state (-1: none, the
        state is inline in etcd or the subscription is not durable)."""
        store = self._cursor_stores.get(subscription)
        return store.ledger_id if store is not None else -1

