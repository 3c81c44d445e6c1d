"""The topics a broker serves, loaded on first use (for ``BrokerService``).

Topics load on first use (a producer, consumer, lookup or admin call). Concurrent
first uses share one load: its future is registered before anything is awaited, and
the load runs as the loader's task, so a caller going away (its client disconnected)
does not cancel it for the others. A topic that is closing is loaded again only once
its close has finished (two managed ledgers of one topic would fence each other).
A topic is auto-created when its namespace exists and allows it (on by default, as in
Pulsar standalone); otherwise the caller gets TopicNotFound. A topic loads here only
once this broker serves its bundle. After a hand-over, the topics the previous owner
had loaded are preloaded (``preload_topics``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from broker.config import BrokerConfig
from broker.topic import PersistentTopic
from common.entry_cache import EntryCache
from common.errors import (
    MagnetarError,
    NamespaceNotFound,
    NotAllowed,
    ServiceNotReady,
    TenantNotFound,
    TopicNotFound,
)
from common.topic_name import NamespaceName, TopicName
from ledger.client import LedgerClient
from managed_ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from metadata.policies import NamespacePolicies, PersistencePolicies
from metadata.store import MetadataStore
from runtime.tasks import cancel_and_wait

if TYPE_CHECKING:
    from broker.archiver import Archiver
    from broker.resources import Resources
    from broker.stats_history import StatsHistory

log = logging.getLogger(__name__)

# Times one get_topic call starts over after finding the topic closing (each time a
# close and a load complete in between; more means the topic flaps, e.g. its bundle
# moves back and forth, and the caller is better told to retry).
_TOPIC_LOAD_ATTEMPTS_MAX = 4
# Topics of a bundle just handed over that load at once (ServerConnection's loads, for
# the clients that come back, are not counted against it).
PRELOADS_CONCURRENT_MAX = 8


class LoadingService(Protocol):
    """What loading topics needs of the broker service (``BrokerService``)."""

    config: BrokerConfig
    store: MetadataStore
    ledger_client: LedgerClient
    cache: EntryCache
    resources: Resources
    archiver: Archiver
    stats_history: StatsHistory
    topic_ownership: Any          # broker.service.TopicOwnership, or None: every topic is ours
    transactions: Any             # TransactionCoordinators, or None: transactions are off
    shutting_down: bool

    async def ensure_serving(self, topic: TopicName) -> None: ...

    def apply_rate_limits(self, topic: PersistentTopic, policies: NamespacePolicies) -> None: ...


class TopicLoader:
    def __init__(self, service: LoadingService) -> None:
        self._service = service
        self.topics: dict[str, asyncio.Future[PersistentTopic]] = {}
        # One task per topic being loaded (each catches and hands on its own failure):
        # cancelled and awaited by the service's close, after its background tasks.
        self._loads: set[asyncio.Task[None]] = set()
        # Loads in progress that may create their topic (see get_topic).
        self._creating_loads: set[asyncio.Future] = set()
        self.topics_preloaded = 0

    def preload_topics(self, names: list[str]) -> None:
        """Starts loading the topics a bundle's previous owner had loaded (named by the
        hand-over), ``PRELOADS_CONCURRENT_MAX`` at a time, so that their clients,
        reconnecting meanwhile, find them loaded or join their loads. Existing topics
        only; a name that fails is left to its clients. Owned like the loads."""
        if self._service.shutting_down or not names:
            return
        task = asyncio.get_running_loop().create_task(self._preload(names))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)

    async def _preload(self, names: list[str]) -> None:
        started = time.monotonic()
        slots = asyncio.Semaphore(PRELOADS_CONCURRENT_MAX)
        loaded = 0

        async def load(text: str) -> None:
            nonlocal loaded
            async with slots:
                try:
                    await self.get_topic(TopicName.parse(text), create=False)
                    loaded += 1
                except MagnetarError as error:
                    log.info("topic not preloaded: topic=%s error=%s", text, error)

        await asyncio.gather(*(load(name) for name in names))
        self.topics_preloaded += loaded
        log.info("topics preloaded: loaded=%d named=%d seconds=%.3f", loaded, len(names), time.monotonic() - started)

    def loaded_topic_names(self) -> list[TopicName]:
        return [t.name for t in self.loaded_topics()]

    async def _ledger_config(self, namespace: NamespaceName, policies: NamespacePolicies) -> ManagedLedgerConfig:
        base = self._service.config.managed_ledger
        default = PersistencePolicies(base.ensemble_size, base.write_quorum_size, base.ack_quorum_size)
        persistence = policies.persistence_policies(default)
        from dataclasses import replace

        return replace(base, ensemble_size=persistence.bookkeeperEnsemble,
                       write_quorum_size=persistence.bookkeeperWriteQuorum,
                       ack_quorum_size=persistence.bookkeeperAckQuorum)

    async def get_topic(self, name: TopicName, *, create: bool) -> PersistentTopic:
        """The loaded topic (loading it if needed). Raises TopicNotFound if it does not
        exist and may not be created here. A caller joining a load in progress gets
        that load's outcome — except a caller that may create the topic, joining a load
        that might not and found no topic (an admin stats call racing a producer's first
        use): it loads again, creating."""
        key = str(name)
        for _attempt in range(_TOPIC_LOAD_ATTEMPTS_MAX):
            if self._service.shutting_down:
                raise ServiceNotReady("broker is shutting down")
            loading = self.topics.get(key)
            if loading is None:
                loading = self._start_load(name, create=create, previous=None)
            load_creates = loading in self._creating_loads
            try:
                topic = await asyncio.shield(loading)
            except MagnetarError as error:
                if self.topics.get(key) is loading:
                    self.topics.pop(key, None)
                if isinstance(error, TopicNotFound) and create and not load_creates:
                    continue
                raise
            if not topic.closing:
                return topic
            if self.topics.get(key) is loading:
                # Replaced at once (no await in between), so concurrent callers share
                # the new load; it waits for this close to finish.
                self._start_load(name, create=create, previous=topic)
        raise ServiceNotReady(f"topic {name} keeps closing while it is loaded: retry")

    def _start_load(self, name: TopicName, *, create: bool,
                    previous: PersistentTopic | None) -> asyncio.Future[PersistentTopic]:
        """Registers the topic's load and starts it as a task of the service."""
        future: asyncio.Future[PersistentTopic] = asyncio.get_running_loop().create_future()
        self.topics[str(name)] = future
        if create:
            self._creating_loads.add(future)
            future.add_done_callback(self._creating_loads.discard)
        task = asyncio.get_running_loop().create_task(self._run_load(name, create, previous, future))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)
        return future

    async def _run_load(self, name: TopicName, create: bool, previous: PersistentTopic | None,
                        future: asyncio.Future[PersistentTopic]) -> None:
        topic: PersistentTopic | None = None
        try:
            if previous is not None:
                await previous.wait_closed()
            await self._service.ensure_serving(name)
            topic = await self._load_topic(name, create=create)
            if self._service.topic_ownership is not None and not await self._service.topic_ownership.is_serving(name):
                # The bundle left this broker while the topic loaded: do not keep it.
                raise ServiceNotReady(f"topic {name} moved to another broker while loading")
        except BaseException as error:
            if isinstance(error, Exception) and not isinstance(error, MagnetarError):
                log.error("loading a topic failed: topic=%s error=%r", name, error, exc_info=error)
            if self.topics.get(str(name)) is future:
                self.topics.pop(str(name), None)
            future.set_exception(error if isinstance(error, MagnetarError) else ServiceNotReady(str(error)))
            future.exception()  # retrieved: waiters get it through shield
            if topic is not None:
                await self._close_unkept(topic)
            if not isinstance(error, Exception):
                raise   # cancelled (the service is closing)
            return
        future.set_result(topic)

    async def _close_unkept(self, topic: PersistentTopic) -> None:
        """Closes a topic whose load failed after it was opened (its waiters were
        already told)."""
        try:
            await topic.close(disconnect_clients=False)
        except Exception as error:
            log.warning("closing a topic that was not kept failed: topic=%s error=%r", topic.full_name, error)

    async def _load_topic(self, name: TopicName, *, create: bool) -> PersistentTopic:
        namespace = name.namespace_name
        try:
            # Fresh: the topic's own policies are read from etcd at every load, and a
            # topic whose policies cannot be read is not served (ServiceNotReady,
            # broker/topic_policies.py), rather than served under its namespace's alone.
            policies = await self._service.resources.effective_policies(name, fresh=True)
        except NamespaceNotFound:
            try:
                await self._service.resources.tenant(name.tenant)
            except TenantNotFound:
                raise TopicNotFound(f"topic {name}: tenant {name.tenant} does not exist") from None
            raise TopicNotFound(f"topic {name}: namespace {namespace} does not exist") from None
        if create and name.is_partition is False and await self._service.resources.partitions(name) > 0:
            raise NotAllowed(f"{name} is a partitioned topic: use its partitions")
        may_create = create and policies.allows_auto_topic_creation(self._service.config.allow_auto_topic_creation)
        if name.is_partition and create:
            # A partition of an existing partitioned topic may always be created, and
            # a -partition-N name never otherwise (as the admin API refuses it): a
            # client still connected to a partitioned topic deleted by force must not
            # bring one of its partitions back as a topic of its own.
            parent_partitions = await self._service.resources.partitions(name.partitioned_parent)
            may_create = name.partition_index < parent_partitions
        archive = await self._service.archiver.open_topic(name)
        ledger = ManagedLedger(name, self._service.store, self._service.ledger_client, self._service.cache,
                               await self._ledger_config(namespace, policies), archive=archive)
        try:
            await ledger.open(create_if_missing=may_create)
        except BaseException:
            self._service.archiver.close_topic(name, archive)
            raise
        topic = PersistentTopic(name, ledger, self._service.store, self._service.config, self._service.ledger_client)
        topic.on_closed = self._on_topic_closed
        self._service.apply_rate_limits(topic, policies)
        try:
            await topic.load_subscriptions()
        except MagnetarError:
            # The subscriptions loaded before the failure have dispatchers (tasks) of
            # their own: closed here, not left pending for the garbage collector.
            for subscription in list(topic.subscriptions.values()):
                await subscription.close()
            await ledger.close()
            self._service.archiver.close_topic(name, archive)
            raise
        if self._service.transactions is not None:
            try:
                await topic.transactions.recover()
            except MagnetarError:
                for subscription in list(topic.subscriptions.values()):
                    await subscription.close()
                await ledger.close()
                self._service.archiver.close_topic(name, archive)
                raise
        log.info("topic loaded: topic=%s ledgers=%d last_confirmed=%s subscriptions=%d", name,
                 len(ledger.ledger_ids()), ledger.last_confirmed, len(topic.subscriptions))
        return topic

    def _on_topic_closed(self, topic: PersistentTopic) -> None:
        self._service.archiver.close_topic(topic.name, topic.ledger.archive)
        self._service.stats_history.drop(topic.full_name, id(topic))
        loading = self.topics.get(topic.full_name)
        if loading is not None and loading.done() and not loading.exception() and loading.result() is topic:
            self.topics.pop(topic.full_name, None)

    def loaded_topic(self, name: TopicName) -> PersistentTopic | None:
        future = self.topics.get(str(name))
        if future is None or not future.done() or future.exception() is not None:
            return None
        return future.result()

    def loaded_topics(self) -> list[PersistentTopic]:
        return [f.result() for f in self.topics.values() if f.done() and f.exception() is None]

    async def close(self) -> None:
        """Cancels the loads under way and waits for them."""
        await cancel_and_wait(*self._loads)
