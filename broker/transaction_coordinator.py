"""Transaction coordinators served by this broker (Pulsar's PIP-31 coordinator; the
records' rules are transactions/records.py, their storage transactions/store.py).

Ownership: there are ``transaction_coordinators`` coordinators, coordinator N being
partition N of the partitioned topic
``persistent://pulsar/system/transaction_coordinator_assign`` (created at start, with
its tenant and namespace). Clients find coordinator N as they find any topic (partition
metadata, then a lookup of the partition), connect to its owner and send
TC_CLIENT_CONNECT_REQUEST. A broker serves coordinator N while it owns that partition's
bundle: every request checks it (``ensure_serving``), so a coordinator moves with its
bundle on unload or failover, and the new owner loads the records from etcd. Record
writes are compare-and-swap: a broker that lost the bundle and still answers fails to
write rather than overwrite the new owner's decision.

Ending: END_TXN writes the decision (COMMITTING / ABORTING) and only then tells each
partition (END_TXN_ON_PARTITION: the topic appends a marker) and each subscription
(END_TXN_ON_SUBSCRIPTION: pending acknowledgements applied or released), through the
topic's owner; when all have answered the record is deleted and END_TXN answered. A
participant that cannot be reached is retried with a capped back-off until it answers
(the decision is taken: it must be carried out), by one task per ending transaction.
A coordinator that loads records finds COMMITTING / ABORTING ones and finishes them;
OPEN ones keep their deadline (wall clock). A sweep every ``transaction_sweep_interval_s``
aborts OPEN transactions past their deadline: the timeout.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from typing import Any

from common.errors import (
    AlreadyExists,
    AuthorizationDenied,
    MagnetarError,
    MetadataVersionConflict,
    NotOwner,
    ServiceNotReady,
    TopicNotFound,
    TransactionCoordinatorNotFound,
    TransactionNotFound,
)
from common.histograms import WeightedHistogram
from common.topic_name import NamespaceName, TopicName
from metadata import keys
from metadata.policies import TenantInfo
from transactions.records import TxnId, TxnRecord, TxnStatus, timeout_ms_for
from transactions.store import CoordinatorStore, PendingAckStore

log = logging.getLogger(__name__)

SYSTEM_TENANT = "pulsar"
SYSTEM_NAMESPACE = "system"
ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
# Back-off between attempts to tell a participant the outcome.
END_RETRY_DELAY_S = 0.1
END_RETRY_DELAY_S_MAX = 5.0
# Pulsar's transaction execution latency buckets (ms; pulsar_txn_execution_latency_le_*).
EXECUTION_BUCKETS_MS = (10, 20, 50, 100, 500, 1_000, 5_000, 15_000, 30_000, 60_000, 300_000, 1_500_000, 3_000_000)
# Ended transactions remembered per coordinator, so a retried END_TXN (its answer was
# lost) gets the outcome instead of TransactionNotFound.
ENDED_REMEMBERED = 10_000


# Tests only: the path of a file. The first transaction carried out after its decision
# while the file does not exist creates it and stops there for ever (the decision
# written, no participant told), so that a test can kill -9 the broker at that point; a
# restarted broker finds the file and goes on.
PAUSE_FILE_ENV = "MAGNETAR_TRANSACTION_PAUSE_FILE"


async def _pause_once_if_asked(txn_id: TxnId) -> None:
    path = os.environ.get(PAUSE_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "x"):
            pass
    except FileExistsError:
        return
    log.warning("transaction paused after its decision (%s): txn=%s", PAUSE_FILE_ENV, txn_id)
    await asyncio.Event().wait()


def assign_partition(coordinator_id: int) -> TopicName:
    return TopicName.parse(f"{ASSIGN_TOPIC}-partition-{coordinator_id}")


class Coordinator:
    """One coordinator's records, as loaded by the broker serving it."""

    def __init__(self, coordinator_id: int, store: CoordinatorStore) -> None:
        self.coordinator_id = coordinator_id
        self.store = store
        self.records: dict[TxnId, TxnRecord] = {}
        self.ending: dict[TxnId, asyncio.Task[None]] = {}
        self.ended: collections.OrderedDict[TxnId, bool] = collections.OrderedDict()
        # One writer at a time per transaction record: requests for one transaction
        # are applied in turn (different transactions do not wait for each other).
        self.locks: dict[TxnId, asyncio.Lock] = {}
        # Since this broker loaded it (Pulsar's coordinator stats and pulsar_txn_*
        # metrics; they start again where the coordinator moves, as Pulsar's do).
        self.loaded_at_ms = int(time.time() * 1000)
        self.created = 0
        self.committed = 0
        self.aborted = 0
        self.timed_out = 0
        self.record_writes = 0   # the "transaction log" appends: etcd record writes
        # Ended transactions' lifetimes, open to ended, in ms (Pulsar's execution latency).
        self.execution_ms = WeightedHistogram(EXECUTION_BUCKETS_MS)

    def lock(self, txn_id: TxnId) -> asyncio.Lock:
        return self.locks.setdefault(txn_id, asyncio.Lock())

    def record(self, txn_id: TxnId) -> TxnRecord:
        record = self.records.get(txn_id)
        if record is None:
            raise TransactionNotFound(f"transaction {txn_id} is not open on coordinator {self.coordinator_id}")
        return record

    def remember_ended(self, txn_id: TxnId, committed: bool) -> None:
        self.ended[txn_id] = committed
        while len(self.ended) > ENDED_REMEMBERED:
            self.ended.popitem(last=False)


class TransactionCoordinators:
    def __init__(self, service: Any) -> None:
        """``service``: the BrokerService that owns this (broker/service.py; not
        imported here, so the two modules stay acyclic)."""
        self._service = service
        self._config = service.config
        self._store = service.store
        self._coordinators: dict[int, Coordinator] = {}
        self._loading: dict[int, asyncio.Task[Coordinator]] = {}
        self._marked_topics: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closed = False

    @property
    def count(self) -> int:
        return self._config.transaction_coordinators

    def served(self) -> list[Coordinator]:
        """The coordinators loaded here (this broker serves their assign partitions, as
        of its last check), by id."""
        return [self._coordinators[n] for n in sorted(self._coordinators)]

    # --- start -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Creates the system tenant and namespace and the assign topic with one
        partition per coordinator (as Pulsar's ``initialize-transaction-coordinator-
        metadata`` does), if missing."""
        resources = self._service.resources
        try:
            await resources.create_tenant(SYSTEM_TENANT, TenantInfo(allowedClusters=[self._config.cluster]))
        except AlreadyExists:
            pass
        try:
            await resources.create_namespace(NamespaceName(SYSTEM_TENANT, SYSTEM_NAMESPACE))
        except AlreadyExists:
            pass
        try:
            await resources.create_partitioned(TopicName.parse(ASSIGN_TOPIC), self.count)
        except AlreadyExists:
            pass

    async def run_sweeps(self) -> None:
        """Aborts transactions past their deadline, on every coordinator served here;
        first loads each coordinator whose assign partition this broker serves but no
        client has asked for yet (after a restart or a failover the timeouts and the
        ending transactions must go on without waiting for a client)."""
        while True:
            await asyncio.sleep(self._config.transaction_sweep_interval_s)
            await self._load_served()
            for coordinator in list(self._coordinators.values()):
                if not await self._still_serving(coordinator):
                    continue
                now_ms = int(time.time() * 1000)
                for record in list(coordinator.records.values()):
                    if record.expired(now_ms) and record.txn_id not in coordinator.ending:
                        log.info("transaction timed out, aborting: txn=%s", record.txn_id)
                        try:
                            await self._decide(coordinator, record.txn_id, commit=False)
                            coordinator.timed_out += 1
                        except MagnetarError as error:
                            log.warning("timed-out transaction not aborted yet: txn=%s error=%s", record.txn_id,
                                        error)

    async def _load_served(self) -> None:
        ownership = self._service.topic_ownership
        for coordinator_id in range(self.count):
            if coordinator_id in self._coordinators or coordinator_id in self._loading:
                continue
            try:
                if ownership is None or await ownership.is_serving(assign_partition(coordinator_id)):
                    await self.coordinator(coordinator_id)
            except MagnetarError as error:
                log.info("transaction coordinator not loaded yet: coordinator=%d error=%s", coordinator_id, error)

    async def _still_serving(self, coordinator: Coordinator) -> bool:
        try:
            await self._service.ensure_serving(assign_partition(coordinator.coordinator_id))
            return True
        except (NotOwner, ServiceNotReady):
            self._drop(coordinator)
            return False

    def _drop(self, coordinator: Coordinator) -> None:
        if self._coordinators.get(coordinator.coordinator_id) is coordinator:
            del self._coordinators[coordinator.coordinator_id]
            for task in coordinator.ending.values():
                task.cancel()
            log.info("transaction coordinator no longer served here: coordinator=%d", coordinator.coordinator_id)

    async def close(self) -> None:
        self._closed = True
        for coordinator in list(self._coordinators.values()):
            for task in list(coordinator.ending.values()):
                task.cancel()
            await asyncio.gather(*coordinator.ending.values(), return_exceptions=True)
        self._coordinators.clear()

    # --- finding a coordinator ---------------------------------------------------------------------

    async def coordinator(self, coordinator_id: int) -> Coordinator:
        """The coordinator, loaded, if this broker serves it; TransactionCoordinatorNotFound
        otherwise (the client looks the assign partition up again)."""
        if not 0 <= coordinator_id < self.count:
            raise TransactionCoordinatorNotFound(f"there is no transaction coordinator {coordinator_id} "
                                                 f"(coordinators: {self.count})")
        try:
            await self._service.ensure_serving(assign_partition(coordinator_id))
        except (NotOwner, ServiceNotReady) as error:
            known = self._coordinators.get(coordinator_id)
            if known is not None:
                self._drop(known)
            raise TransactionCoordinatorNotFound(f"transaction coordinator {coordinator_id} is not served by "
                                                 f"this broker: {error}") from None
        known = self._coordinators.get(coordinator_id)
        if known is not None:
            return known
        loading = self._loading.get(coordinator_id)
        if loading is None:
            loading = asyncio.get_running_loop().create_task(self._load(coordinator_id))
            self._loading[coordinator_id] = loading
            loading.add_done_callback(lambda _t: self._loading.pop(coordinator_id, None))
        return await asyncio.shield(loading)

    async def _load(self, coordinator_id: int) -> Coordinator:
        coordinator = Coordinator(coordinator_id, CoordinatorStore(self._store, coordinator_id))
        records = await coordinator.store.load()
        for record in records:
            coordinator.records[record.txn_id] = record
        self._coordinators[coordinator_id] = coordinator
        ending = [r for r in records if r.ending]
        for record in ending:
            self._start_ending(coordinator, record)
        log.info("transaction coordinator loaded: coordinator=%d open=%d ending=%d", coordinator_id,
                 len(records) - len(ending), len(ending))
        return coordinator

    def _coordinator_of(self, txn_id: TxnId) -> int:
        return txn_id.most

    # --- requests ----------------------------------------------------------------------------------

    def _check_owner(self, record: TxnRecord, role: str | None) -> None:
        """Only the role that opened a transaction, or a superuser, may add to it or
        end it (authentication off: every record's owner is None, anyone may)."""
        if not record.owned_by(role) and not self._service.authorizer.is_superuser(role):
            raise AuthorizationDenied(f"role {role!r} did not open transaction {record.txn_id}")

    async def new_txn(self, coordinator_id: int, txn_ttl: int, owner: str | None = None) -> TxnId:
        coordinator = await self.coordinator(coordinator_id)
        if len(coordinator.records) >= self._config.transactions_per_coordinator_max:
            from common.errors import Overloaded

            raise Overloaded(f"coordinator {coordinator_id} has {len(coordinator.records)} open transactions, "
                             "the most allowed")
        txn_id = await coordinator.store.next_txn_id()
        now_ms = int(time.time() * 1000)
        record = TxnRecord(txn_id, TxnStatus.OPEN, now_ms + timeout_ms_for(txn_ttl), owner=owner, opened_ms=now_ms)
        async with coordinator.lock(txn_id):
            await coordinator.store.write(record)
            coordinator.record_writes += 1
            coordinator.records[txn_id] = record
        coordinator.created += 1
        log.debug("transaction opened: txn=%s deadline_ms=%d", txn_id, record.deadline_ms)
        return txn_id

    async def add_partitions(self, txn_id: TxnId, topics: list[str], role: str | None = None) -> None:
        names = [str(TopicName.parse(topic)) for topic in topics]
        coordinator = await self.coordinator(self._coordinator_of(txn_id))
        async with coordinator.lock(txn_id):
            record = coordinator.record(txn_id)
            self._check_owner(record, role)
            updated = record.with_partitions(names)
            if updated != record:
                # The topics' marks first: a send may follow this answer at once, and
                # the topic's new owner must know to rebuild its buffer after a crash.
                for name in names:
                    await self._mark_topic(name)
                await coordinator.store.write(updated)
                coordinator.record_writes += 1
                coordinator.records[txn_id] = updated

    async def _mark_topic(self, name: str) -> None:
        if name in self._marked_topics:
            return
        topic_name = TopicName.parse(name)
        key = keys.transactional_topic(topic_name.key_path)
        if await self._store.get(key) is None:
            await self._store.put(key, b"1")
        loaded = self._service.loaded_topic(topic_name)
        if loaded is not None:
            loaded.transactions.marked = True
        self._marked_topics[name] = None
        while len(self._marked_topics) > ENDED_REMEMBERED:
            self._marked_topics.popitem(last=False)

    async def add_subscriptions(self, txn_id: TxnId, subscriptions: list[tuple[str, str]],
                                role: str | None = None) -> None:
        pairs = [(str(TopicName.parse(topic)), name) for topic, name in subscriptions]
        coordinator = await self.coordinator(self._coordinator_of(txn_id))
        async with coordinator.lock(txn_id):
            record = coordinator.record(txn_id)
            self._check_owner(record, role)
            updated = record.with_subscriptions(pairs)
            if updated != record:
                # Marked as a partition's topic is: its new owner must load the
                # acknowledgements pending in transactions when it loads the topic.
                for topic, _name in pairs:
                    await self._mark_topic(topic)
                await coordinator.store.write(updated)
                coordinator.record_writes += 1
                coordinator.records[txn_id] = updated

    async def end(self, txn_id: TxnId, *, commit: bool, role: str | None = None) -> None:
        """END_TXN: decides, then returns once every participant has been told (within
        ``transaction_end_timeout_s``; past it the client gets an error and the outcome
        is still carried out)."""
        coordinator = await self.coordinator(self._coordinator_of(txn_id))
        if txn_id not in coordinator.records and txn_id in coordinator.ended:
            if coordinator.ended[txn_id] == commit:
                return
            from common.errors import InvalidTxnStatus

            raise InvalidTxnStatus(f"transaction {txn_id} was {'committed' if coordinator.ended[txn_id] else 'aborted'}")
        record = coordinator.records.get(txn_id)
        if record is not None:
            self._check_owner(record, role)
        task = await self._decide(coordinator, txn_id, commit=commit)
        try:
            async with asyncio.timeout(self._config.transaction_end_timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            raise ServiceNotReady(f"transaction {txn_id}: {'commit' if commit else 'abort'} decided, its "
                                  "participants not all told yet") from None

    async def _decide(self, coordinator: Coordinator, txn_id: TxnId, *, commit: bool) -> asyncio.Task[None]:
        async with coordinator.lock(txn_id):
            record = coordinator.record(txn_id)
            decided = record.ended_by(commit)
            if decided != record:
                await coordinator.store.write(decided)   # the decision point
                coordinator.record_writes += 1
                coordinator.records[txn_id] = decided
                log.info("transaction decided: txn=%s action=%s partitions=%d subscriptions=%d", txn_id,
                         "commit" if commit else "abort", len(decided.partitions), len(decided.subscriptions))
            return self._start_ending(coordinator, decided)

    def _start_ending(self, coordinator: Coordinator, record: TxnRecord) -> asyncio.Task[None]:
        task = coordinator.ending.get(record.txn_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._carry_out(coordinator, record))
            coordinator.ending[record.txn_id] = task
            task.add_done_callback(lambda _t: coordinator.ending.pop(record.txn_id, None))
        return task

    async def _carry_out(self, coordinator: Coordinator, record: TxnRecord) -> None:
        commit = record.committing
        await _pause_once_if_asked(record.txn_id)
        # Acknowledgements first, then the partitions: a consume-transform-produce
        # transaction's input is consumed before its output becomes visible.
        for topic, subscription in record.subscriptions:
            await self._until_done(lambda t=topic, s=subscription: self._end_on_subscription(
                t, s, record.txn_id, commit), f"subscription {topic}/{subscription}")
        for topic in record.partitions:
            await self._until_done(lambda t=topic: self._end_on_partition(t, record.txn_id, commit),
                                   f"partition {topic}")
        async with coordinator.lock(record.txn_id):
            await coordinator.store.delete(record.txn_id)
            coordinator.records.pop(record.txn_id, None)
            coordinator.locks.pop(record.txn_id, None)
            coordinator.remember_ended(record.txn_id, commit)
            coordinator.record_writes += 1
            if commit:
                coordinator.committed += 1
            else:
                coordinator.aborted += 1
            if record.opened_ms:
                coordinator.execution_ms.observe(max(0, int(time.time() * 1000) - record.opened_ms))
        log.info("transaction ended: txn=%s action=%s", record.txn_id, "commit" if commit else "abort")

    async def _until_done(self, attempt, what: str) -> None:
        delay_s = END_RETRY_DELAY_S
        while True:
            try:
                await attempt()
                return
            except MetadataVersionConflict:
                raise   # another broker serves this coordinator now: it carries the outcome out
            except (MagnetarError, OSError, TimeoutError) as error:
                log.info("transaction outcome not delivered yet, retrying: participant=%s error=%s delay_s=%.1f",
                         what, error, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, END_RETRY_DELAY_S_MAX)

    # --- participants ------------------------------------------------------------------------------

    def _peer_url(self, owner: Any) -> str:
        """Where another broker is told an outcome: its plain URL, or its TLS one when
        this cluster's brokers serve TLS only (``--no-plain-ports``)."""
        if owner.service_url_tls and (not self._config.plain_ports_enabled or not owner.service_url):
            return owner.service_url_tls
        return owner.service_url

    async def _end_on_partition(self, topic: str, txn_id: TxnId, commit: bool) -> None:
        name = TopicName.parse(topic)
        owner = await self._service.owner_of(name)
        if not owner.is_self:
            await self._service.transaction_peers.end_on_partition(self._peer_url(owner), txn_id, topic, commit)
            return
        try:
            loaded = await self._service.get_topic(name, create=False)
        except TopicNotFound:
            log.info("transaction partition is gone, nothing to end: topic=%s txn=%s", topic, txn_id)
            return
        await loaded.transactions.end(txn_id, commit=commit)

    async def _end_on_subscription(self, topic: str, subscription: str, txn_id: TxnId, commit: bool) -> None:
        name = TopicName.parse(topic)
        owner = await self._service.owner_of(name)
        if not owner.is_self:
            await self._service.transaction_peers.end_on_subscription(self._peer_url(owner), txn_id, topic,
                                                                      subscription, commit)
            return
        await self.end_locally_on_subscription(name, subscription, txn_id, commit)

    async def end_locally_on_subscription(self, name: TopicName, subscription: str, txn_id: TxnId,
                                          commit: bool) -> None:
        try:
            loaded = await self._service.get_topic(name, create=False)
        except TopicNotFound:
            # Deleted with its pending acknowledgements (one written while it was
            # being deleted may remain: removed here).
            await PendingAckStore(self._store, name.key_path).delete(subscription, txn_id)
            return
        await loaded.transactions.end_on_subscription(loaded.subscriptions.get(subscription), subscription, txn_id,
                                                      commit=commit)

    async def end_locally_on_partition(self, name: TopicName, txn_id: TxnId, commit: bool) -> None:
        try:
            loaded = await self._service.get_topic(name, create=False)
        except TopicNotFound:
            return
        await loaded.transactions.end(txn_id, commit=commit)
