"""The broker service: the topics this broker serves, and the lookups, partition
metadata and namespace listings clients ask for.

Topics load on first use, one load per topic however many ask (broker/topic_loading.py).
Other brokers' URLs come from their load reports (broker/broker_directory.py).
Ownership: ``owner_of`` says which broker serves a topic: the owner of the topic's
bundle, from the bundles layer (bundles/ownership.py); a topic loads here only once
this broker serves its bundle. The service builds its bundles parts itself from a
``BundlesConfig`` (ownership under the broker's lease, the leader candidate, the load
reporter and the watch of other brokers' reports); without one (tests of the service
alone) the broker owns everything.

Lifecycle: ``start`` joins the cluster (ownership lease, first load report, leader
candidacy) and creates the default tenant and namespace; ``hand_over`` gives every
bundle to other brokers (SIGTERM: clients move without errors); ``close`` stops
everything the service started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from broker import policy_enforcement, policy_watch
from broker.inactivity import InactivitySweeper
from broker.archiver import Archiver
from broker.archiver_config import ArchiverConfig
from broker.authentication import Authenticator
from broker.authorization import Authorizer
from broker.config import BrokerConfig
from managed_ledger.managed_ledger import ManagedLedger
from broker.publish_limits import Limit, PendingSends, PublishLimits, ReadGate
from broker.broker_directory import BrokerDirectory
from broker.redirect import connection_over_tls
from broker.resources import Resources
from broker.schema_compatibility import DEFAULT_STRATEGY
from broker.schemas import SchemaRegistry
from broker.stats_history import StatsHistory
from broker.transaction_coordinator import TransactionCoordinators
from broker.transaction_peers import TransactionPeers
from broker.topic import PersistentTopic
from broker.topic_list_watchers import TopicListWatchers
from broker.topic_loading import TopicLoader
from broker.topic_upkeep import TopicUpkeep
from bundles.config import BundlesConfig
from bundles.leader import Leader
from bundles.load import LoadReporter
from bundles.ownership import BrokerIdentity, BundleOwner, OwnershipManager
from metadata import keys
from metadata.prefix_cache import PrefixCache
from common.topic_name import DEFAULT_NAMESPACE, DEFAULT_TENANT, NamespaceName, TopicName
from ledger.client import LedgerClient
from common.entry_cache import EntryCache
from common.errors import (
    AlreadyExists,
    MagnetarError,
    MetadataKeyExists,
    NamespaceNotFound,
    PreconditionFailed,
    ServiceNotReady,
    TopicNotFound,
)
from runtime.tasks import TaskSet
from runtime.tls import PeerClientContexts
from runtime.tokens import TokenFile
from metadata.policies import NamespacePolicies, TenantInfo
from metadata.store import MetadataStore

log = logging.getLogger(__name__)



def _log_publish_blocked(gate: ReadGate, scope: PendingSends) -> None:
    """Once per episode: the first connection a full scope stops reading."""
    log.warning("publishes paused, not reading from publishers until pending sends drain: scope=%s name=%s "
                "pending_sends=%d pending_bytes=%d connection=%s", scope.kind, scope.name, scope.sends,
                scope.size_bytes, gate.scope.name)


# What became of an admin call on a partition another broker serves (metrics).
PARTITION_CALL_OUTCOMES = ("ok", "absent", "refused", "unreachable")


@dataclass(frozen=True)
class OwnerInfo:
    broker_id: str
    service_url: str          # pulsar://host:port
    web_service_url: str      # http://host:port
    is_self: bool
    service_url_tls: str = ""       # pulsar+ssl://host:port ("" without TLS)
    web_service_url_tls: str = ""   # https://host:port


class TopicOwnership(Protocol):
    """What the service asks of the bundles layer about one topic (OwnershipManager)."""

    async def owner_of(self, topic: TopicName, broker_urls: Callable[[str], tuple[str, str] | None]) -> BundleOwner: ...

    async def ensure_serving(self, topic: TopicName) -> None: ...

    async def is_serving(self, topic: TopicName) -> bool: ...


class BrokerService:
    def __init__(self, config: BrokerConfig, store: MetadataStore, ledger_client: LedgerClient, *,
                 bundles_config: BundlesConfig | None = None, topic_ownership: TopicOwnership | None = None,
                 on_publish_latency: Callable[[float], None] | None = None,
                 archiver_config: ArchiverConfig | None = None) -> None:
        """``config`` carries the ports the broker listens on (bound before, so that the
        URLs it advertises are final). With ``bundles_config`` the service builds and
        runs its bundles parts; without, it owns every topic, or asks
        ``topic_ownership`` (tests). ``on_publish_latency`` is told the seconds from each
        SEND's arrival to its receipt (the metrics' histogram)."""
        assert bundles_config is None or topic_ownership is None, "one source of ownership"
        config.check_entries_fit(ledger_client.config.entry_bytes_max)
        self.config = config
        self.store = store
        self.ledger_client = ledger_client
        self.bundles_config = bundles_config
        self.resources = Resources(store, default_bundles=(bundles_config or BundlesConfig()).default_bundles)
        self.topic_list_watchers = TopicListWatchers(store, config.topic_list_watchers_per_connection_max)
        # Who a client is and what its role may do (both pass everything when off).
        self.authenticator = Authenticator(config.auth)
        self.authorizer = Authorizer(config.auth, self.resources)
        # What this broker presents to the others for an admin request's calls on their
        # partitions (broker/admin/fanout.py): the token in that file as it is now, or
        # None (the caller's own credentials go on). Read at start: a missing file fails it.
        self.broker_client_token: Callable[[], str] | None = (
            TokenFile(config.auth.broker_client_token_file).current if config.auth.broker_client_token_file else None)
        # The TLS context of those calls over HTTPS (built at the first, kept until the
        # certificate files change).
        self.peer_tls = PeerClientContexts(config.tls)
        # Set by a grant or revoke through this broker: the permission loop checks every
        # connection at once instead of at its next interval.
        self._recheck_permissions = asyncio.Event()
        self.cache = EntryCache(config.entry_cache_bytes_max)
        # The topics served here, loaded on first use (broker/topic_loading.py).
        self.topic_loader = TopicLoader(self)
        # Admin calls this broker made on partitions other brokers serve, by outcome
        # (broker/admin/fanout.py: ok, absent, refused, unreachable), since start.
        self.partition_calls: dict[str, int] = dict.fromkeys(PARTITION_CALL_OUTCOMES, 0)
        # The retention loop, the archiver and the load reporter: cancelled and awaited
        # by hand_over or close.
        self._background = TaskSet("broker service")
        self.broker_id = config.effective_broker_id
        self.started_at = time.time()
        self.shutting_down = False
        # Set when the hand-over of bundles starts (SIGTERM): from then on the broker
        # takes no bundles, and /ready says so.
        self.handing_over = False
        self._hand_over_task: asyncio.Future[None] | None = None   # owned: close awaits it
        self.connections: set = set()
        # Open connections per client IP address (connections_per_address_max).
        self._connections_by_address: dict[str, int] = {}
        self._refusing_connections = False   # an episode of refusals was logged
        self.on_publish_latency = on_publish_latency
        # Set by the wiring once the binary protocol accepts connections; /health is
        # 503 until then.
        self.serving = False
        # Bounds on sends accepted and not yet answered (connection, topic, broker).
        ratio = config.pending_sends_resume_ratio
        self.publish_limits = PublishLimits(
            connection=Limit(config.pending_sends_per_connection_max, config.pending_send_bytes_per_broker_max, ratio),
            topic=Limit(config.pending_sends_per_topic_max, config.pending_send_bytes_per_topic_max, ratio),
            broker=Limit(config.pending_sends_per_broker_max, config.pending_send_bytes_per_broker_max, ratio),
            on_blocked=_log_publish_blocked)
        # The bundles layer: who owns a topic, the leader candidacy, this broker's load
        # reports and the watch of every broker's (for the addresses of other brokers).
        self.ownership: OwnershipManager | None = None
        self.broker_reports: PrefixCache | None = None
        self.leader: Leader | None = None
        self._reporter: LoadReporter | None = None
        if bundles_config is not None:
            identity = BrokerIdentity(self.broker_id, config.service_url, config.web_service_url,
                                      listeners=tuple(sorted(config.listeners.items())),
                                      service_url_tls=config.service_url_tls,
                                      web_service_url_tls=config.web_service_url_tls)
            self.broker_reports = PrefixCache(store, keys.BROKERS)
            self.ownership = OwnershipManager(store, bundles_config, identity,
                                              loaded_topics=self.loaded_topic_names, close_topics=self.close_topics,
                                              preload_topics=self.preload_topics,
                                              on_fence=self.abort_connections if config.fence_aborts_connections
                                              else None)
            topic_ownership = ownership = self.ownership
            self.leader = Leader(store, bundles_config, identity, lambda: ownership.lease, self.broker_reports)
            self._reporter = LoadReporter(store, bundles_config, ownership, self.load_counters)
        self.topic_ownership = topic_ownership
        # This broker's URLs and the others' (broker/broker_directory.py).
        self.directory = BrokerDirectory(config, self.broker_reports)
        # The archive (broker/archiver.py): archives closed ledgers per the namespaces'
        # offload policies and serves ledgers whose bookie copy is gone.
        self.schemas = SchemaRegistry(store)
        # What message TTL and backlog quotas did (shown in /metrics).
        self.policy_counters = policy_enforcement.PolicyCounters()
        # Retention, policies, the dispatcher watch and history over the loaded topics
        # (broker/topic_upkeep.py).
        self.upkeep = TopicUpkeep(self)
        # Subscription expiry and inactive-topic deletion (broker/inactivity.py).
        self.inactivity = InactivitySweeper(self)
        # What the console draws over time, bounded (broker/stats_history.py).
        self.stats_history = StatsHistory(config.stats_history_limits)
        self.archiver = Archiver(archiver_config or ArchiverConfig(), store, ledger_client, self.resources.policies)
        # Transaction coordinators served here, and the connections on which they tell
        # other brokers' topics the outcome (broker/transaction_coordinator.py).
        self.transactions = TransactionCoordinators(self) if config.transactions_enabled else None
        self.transaction_peers = TransactionPeers(config.transaction_end_timeout_s, token=self.broker_client_token,
                                                  tls=self.peer_tls.current if config.tls.cert_file else None)

    def broker_urls(self, broker_id: str) -> tuple[str, str] | None:
        return self.directory.broker_urls(broker_id)

    def broker_listeners(self, broker_id: str) -> dict[str, str] | None:
        return self.directory.broker_listeners(broker_id)

    def broker_tls_urls(self, broker_id: str) -> tuple[str, str]:
        return self.directory.broker_tls_urls(broker_id)

    async def owner_of(self, topic: TopicName) -> OwnerInfo:
        if self.topic_ownership is None:
            return OwnerInfo(self.broker_id, self.config.service_url, self.config.web_service_url, True,
                             self.config.service_url_tls, self.config.web_service_url_tls)
        owner = await self.topic_ownership.owner_of(topic, self.broker_urls)
        return OwnerInfo(owner.broker_id, owner.service_url, owner.web_service_url, owner.is_self,
                         *self.broker_tls_urls(owner.broker_id))

    async def ensure_serving(self, topic: TopicName) -> None:
        """Returns once this broker serves the topic's bundle (may wait for a transfer
        or assignment to complete); NotOwner or ServiceNotReady otherwise."""
        if self.topic_ownership is not None:
            await self.topic_ownership.ensure_serving(topic)

    async def close_topics(self, names: list[TopicName], reason: str, destination: str | None = None) -> None:
        """Closes loaded topics. Their clients reconnect and look them up again, or, for
        a hand-over to ``destination`` (a broker id) whose URLs are known, go straight
        there (broker/redirect.py)."""
        topics = [t for t in (self.loaded_topic(n) for n in names) if t is not None]
        if not topics:
            return
        target = self.directory.destination(destination) if destination else None
        redirect = None if target is None else (
            lambda connection: target.urls_for_connection(getattr(connection, "listener_name", ""),
                                                          connection_over_tls(connection)))
        log.info("closing topics: count=%d reason=%s redirect_to=%s", len(topics), reason,
                 target.service_url if target is not None else "-")
        await asyncio.gather(*(t.close(disconnect_clients=True, redirect=redirect) for t in topics),
                             return_exceptions=True)

    def abort_connections(self) -> None:
        """Resets every client connection (the broker fenced itself): a client cut off
        from us by a partition gets a reset for its first packet after the heal and
        looks its topics up again, rather than waiting for close frames queued behind
        TCP's backed-off retransmissions. Nothing is served here any more anyway."""
        connections = list(self.connections)
        log.warning("fenced: aborting client connections: count=%d", len(connections))
        for connection in connections:
            connection.abort()

    # --- topics (broker/topic_loading.py) ---------------------------------------------------

    def preload_topics(self, names: list[str]) -> None:
        self.topic_loader.preload_topics(names)

    async def get_topic(self, name: TopicName, *, create: bool) -> PersistentTopic:
        return await self.topic_loader.get_topic(name, create=create)

    def loaded_topic(self, name: TopicName) -> PersistentTopic | None:
        return self.topic_loader.loaded_topic(name)

    def loaded_topics(self) -> list[PersistentTopic]:
        return self.topic_loader.loaded_topics()

    def loaded_topic_names(self) -> list[TopicName]:
        return self.topic_loader.loaded_topic_names()

    def load_counters(self) -> tuple[dict[str, tuple[int, int]], int]:
        """({topic: (messages in, messages dispatched)}, connections): the load report's input."""
        topics = {}
        for topic in self.loaded_topics():
            out = sum(s.dispatcher.messages_dispatched for s in topic.subscriptions.values())
            topics[topic.full_name] = (topic.messages_in, out)
        return topics, len(self.connections)

    async def start(self) -> None:
        """Joins the cluster (bundles layer), then creates the cluster record, the
        ``public`` tenant and ``public/default`` namespace if missing (what Pulsar
        standalone starts with)."""
        if self.ownership is not None:
            assert self.broker_reports is not None and self.leader is not None and self._reporter is not None
            await self.broker_reports.start()
            await self.ownership.start()
            await self._reporter.publish()   # the leader must know this broker before assigning to it
            await self.leader.start()
            self._background.spawn(self._reporter.run(), name="load reporter")
        await self.resources.ensure_cluster(self.config.cluster, self.config.service_url,
                                            self.config.web_service_url)
        try:
            await self.resources.create_tenant(DEFAULT_TENANT, TenantInfo(allowedClusters=[self.config.cluster]))
        except AlreadyExists:
            pass
        try:
            await self.resources.create_namespace(NamespaceName(DEFAULT_TENANT, DEFAULT_NAMESPACE))
        except AlreadyExists:
            pass
        if self.transactions is not None:
            await self.transactions.start()
            self._background.spawn(self.transactions.run_sweeps(), name="transaction timeouts")
        self._background.spawn(self.upkeep.run_retention(), name="retention")
        self._background.spawn(self.upkeep.run_policies(), name="policies")
        # Policy changes applied when they happen (a set-deduplication at once).
        self._background.spawn(policy_watch.follow(self.resources.store, self.resources, self.loaded_topics,
                                                   self.apply_rate_limits_soon), name="policy watch")
        self._background.spawn(policy_watch.follow_topic_policies(self.resources.store, self.resources.topic_policies,
                                                                  self.apply_rate_limits_soon),
                               name="topic policy watch")
        self._background.spawn(self.upkeep.run_dispatch_watch(), name="dispatch watch")
        if self.authenticator.enabled:
            self._background.spawn(self._run_permission_checks(), name="permission checks")
        self._background.spawn(self.archiver.run(self.loaded_topics), name="archiver")
        self._background.spawn(self.inactivity.run(), name="inactivity")
        self._background.spawn(self.upkeep.run_stats_history(), name="stats history")

    def apply_rate_limits_soon(self) -> None:
        """A namespace's or topic's rate limits changed here: the policy loop applies them now."""
        self.upkeep.apply_rate_limits_soon()

    def apply_rate_limits(self, topic: PersistentTopic, policies: NamespacePolicies) -> None:
        self.upkeep.apply_rate_limits(topic, policies)

    async def check_producer_quota(self, topic: PersistentTopic) -> None:
        """Refuses a new producer while a producer-blocking backlog quota is exceeded."""
        policies = await self.resources.effective_policies(topic.name)
        topic.backlog_size_quota = policy_enforcement.size_quota(policies)
        if policies.backlog_quota_map:
            await policy_enforcement.check_producer_allowed(topic, policies, self.policy_counters)
    def admit_connection(self, address: str) -> str | None:
        """Counts a new connection from ``address``; the reason it must be refused (then
        it is not counted), or None."""
        config = self.config
        reason = None
        if len(self.connections) >= config.connections_max:
            reason = f"{len(self.connections)} connections open, the most allowed (connections_max)"
        elif self._connections_by_address.get(address, 0) >= config.connections_per_address_max:
            reason = (f"{self._connections_by_address[address]} connections from {address}, the most allowed "
                      "(connections_per_address_max)")
        if reason is not None:
            if not self._refusing_connections:
                self._refusing_connections = True
                log.warning("refusing connections: address=%s reason=%s", address, reason)
            return reason
        self._refusing_connections = False
        self._connections_by_address[address] = self._connections_by_address.get(address, 0) + 1
        return None

    def release_connection(self, address: str) -> None:
        count = self._connections_by_address.get(address, 0)
        assert count > 0, address
        if count == 1:
            del self._connections_by_address[address]
        else:
            self._connections_by_address[address] = count - 1

    def recheck_permissions_now(self) -> None:
        """A permission changed here: check every connection's producers and consumers now."""
        self._recheck_permissions.set()

    async def _run_permission_checks(self) -> None:
        """Every ``permission_check_interval_s`` (or at once after a change through this
        broker), each connection drops what its role may no longer do and closes once
        its token has expired. One task for the broker, whatever the connections."""
        interval = self.config.auth.permission_check_interval_s
        while not self.shutting_down:
            try:
                async with asyncio.timeout(interval):
                    await self._recheck_permissions.wait()
            except TimeoutError:
                pass
            self._recheck_permissions.clear()
            for connection in list(self.connections):
                try:
                    await connection.recheck_permissions()
                except MagnetarError as error:
                    log.warning("permission check failed: peer=%s error=%s", connection.peer, error)

    async def create_topic(self, name: TopicName) -> PersistentTopic:
        """Creates a non-partitioned topic (or a partition) whatever the namespace's
        auto-creation policy: AlreadyExists if it (or a partitioned topic of that name)
        exists. The empty managed-ledger record is created atomically, then loaded."""
        await self.resources.policies(name.namespace_name)
        if await self.resources.partitions(name) > 0:
            raise AlreadyExists(f"{name} exists as a partitioned topic")
        if name.is_partition:
            parent_count = await self.resources.partitions(name.partitioned_parent)
            if parent_count > 0 and name.partition_index >= parent_count:
                raise PreconditionFailed(f"{name.partitioned_parent} has {parent_count} partitions, "
                                         f"so {name} cannot be created")
        try:
            await ManagedLedger.create_record(self.store, name)
        except MetadataKeyExists:
            raise AlreadyExists(f"topic {name} already exists") from None
        log.info("topic created: topic=%s", name)
        return await self.get_topic(name, create=False)

    async def topic_exists(self, name: TopicName) -> bool:
        from metadata import keys

        if self.loaded_topic(name) is not None:
            return True
        return await self.store.get(keys.managed_ledger(name.key_path)) is not None

    async def unload_topic(self, name: TopicName) -> bool:
        topic = self.loaded_topic(name)
        if topic is None:
            return False
        await topic.close(disconnect_clients=True)
        return True

    async def delete_topic(self, name: TopicName, *, force: bool) -> None:
        topic = await self.get_topic(name, create=False)
        await topic.delete(force=force)   # closing it took it off self.topics
        await self.archiver.topic_deleted(name)
        if not name.is_partition:
            await self.resources.topic_policies.delete(name)   # a partition's are its parent's

    async def schema_strategy(self, name: TopicName) -> str:
        """The namespace's schema compatibility strategy (FULL when unset)."""
        policies = await self.resources.effective_policies(name)
        return policies.schema_compatibility_strategy or DEFAULT_STRATEGY

    async def deduplication_enabled(self, name: TopicName) -> bool:
        """The namespace policy ``deduplication`` (off when unset)."""
        policies = await self.resources.effective_policies(name)
        return bool(policies.deduplicationEnabled)

    async def is_broadcast(self, name: TopicName, subscription: str, consumer_metadata: dict[str, str]) -> bool:
        """A subscription is broadcast when its namespace's policy lists it, or when the
        consumer asks for it with the ``magnetar.subscription.mode=broadcast`` property."""
        from broker.topic import BROADCAST_PROPERTY

        if consumer_metadata.get(BROADCAST_PROPERTY, "").lower() == "broadcast":
            return True
        policies = await self.resources.effective_policies(name)
        return subscription in policies.broadcast_subscriptions

    # --- lookups ---------------------------------------------------------------------------

    async def partitioned_metadata(self, name: TopicName) -> int:
        """Partition count (0: not partitioned). Auto-creation creates non-partitioned
        topics, like Pulsar standalone; a missing namespace is TopicNotFound."""
        await self._check_namespace(name)
        return await self.resources.partitions(name)

    async def _check_namespace(self, name: TopicName) -> None:
        try:
            await self.resources.policies(name.namespace_name)
        except NamespaceNotFound:
            raise TopicNotFound(f"topic {name}: namespace {name.namespace_name} does not exist") from None

    async def lookup(self, name: TopicName, listener_name: str = "") -> OwnerInfo:
        """The topic's owner; with ``listener_name``, its URL is that advertised
        listener's (ServiceNotReady if the owner advertises no such listener, as
        Pulsar answers)."""
        await self._check_namespace(name)
        owner = await self.owner_of(name)
        if not listener_name:
            return owner
        listeners = self.broker_listeners(owner.broker_id) or {}
        url = listeners.get(listener_name)
        if url is None:
            raise ServiceNotReady(f"broker {owner.broker_id} has no advertised listener named {listener_name!r}")
        return OwnerInfo(owner.broker_id, url, owner.web_service_url, owner.is_self)

    async def topics_of_namespace(self, namespace: NamespaceName) -> list[str]:
        await self.resources.policies(namespace)
        names = set(await self.resources.topics(namespace))
        for topic in self.loaded_topics():
            if topic.name.namespace_name == namespace:
                names.add(topic.full_name)
        return sorted(names)

    # --- shutdown -----------------------------------------------------------------------------

    async def hand_over(self) -> None:
        """Gives every bundle this broker owns to another broker (the least loaded), so
        its clients move without errors; then leaves the leader election and revokes
        the ownership lease. For an orderly shutdown, before ``close``. Done once: a
        second call (a preStop drain, then SIGTERM) waits for the first; the work goes
        on if a caller is cancelled (a drain request cut off), and ``close`` awaits it."""
        self.handing_over = True
        if self._hand_over_task is None:
            self._hand_over_task = asyncio.ensure_future(self._hand_over())
        await asyncio.shield(self._hand_over_task)

    async def _hand_over(self) -> None:
        if self.ownership is None:
            return
        assert self.leader is not None and self.broker_reports is not None
        ownership, reports = self.ownership, self.broker_reports
        await self.leader.step_down()
        ownership.stop_taking()
        # First out of the load reports (the reporter stopped, its report deleted): no
        # broker hands a bundle to this one and the leader assigns it none (brokers
        # drained together would otherwise hand bundles to each other).
        await self._background.close()
        try:
            await self.store.delete(keys.broker(self.broker_id))
        except MagnetarError as error:
            log.warning("deleting the load report before the hand-over failed: broker_id=%s error=%s",
                        self.broker_id, error)
        await ownership.release_all(lambda _bundle: ownership.handover_target(reports))
        await self.leader.close()
        await ownership.retire()

    def readiness(self) -> tuple[bool, dict]:
        """Whether this broker owns bundles or can be given some (a Kubernetes readiness
        probe, /ready): serving the binary protocol, not stopping or handing over, its
        ownership lease held and confirmed (not fenced), and its load report in etcd,
        so the leader may assign bundles to it."""
        details: dict = {"broker_id": self.broker_id, "serving": self.serving,
                         "handing_over": self.handing_over}
        if not self.serving or self.shutting_down or self.handing_over:
            return False, details
        if self.ownership is None:   # no bundles layer: it serves every topic itself
            return True, details
        assert self.broker_reports is not None
        lease = self.ownership.lease
        details["fenced"] = self.ownership.fenced
        details["bundles_owned"] = len(self.ownership.serving())
        reported = self.broker_reports.get(keys.broker(self.broker_id)) is not None
        details["load_reported"] = reported
        ok = lease is not None and not lease.is_lost and not self.ownership.fenced and reported
        return ok, details

    async def close(self) -> None:
        self.shutting_down = True
        if self._hand_over_task is not None:
            await asyncio.gather(self._hand_over_task, return_exceptions=True)
        await self._background.close()
        await self.topic_loader.close()
        if self.transactions is not None:
            await self.transactions.close()
        await self.transaction_peers.close()
        if self.leader is not None:
            await self.leader.close()
        if self.ownership is not None:
            await self.ownership.close()
        if self.broker_reports is not None:
            await self.broker_reports.close()
        await self.topic_list_watchers.close()
        topics = self.loaded_topics()
        await asyncio.gather(*(t.close(disconnect_clients=True) for t in topics), return_exceptions=True)
        self.topic_loader.topics.clear()
        await self.archiver.close()
