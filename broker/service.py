"""The broker service: the topics this broker serves, and the lookups, partition
metadata and namespace listings clients ask for.

Topics load on first use (a producer, consumer, lookup or admin call). Concurrent
first uses share one load: its future is registered before anything is awaited, and
the load runs as the service's task, so a caller going away (its client disconnected)
does not cancel it for the others. A topic that is closing is loaded again only once
its close has finished (two managed ledgers of one topic would fence each other).
A topic is auto-created when its namespace exists and allows it (on by default, as in
Pulsar standalone); otherwise the caller gets TopicNotFound.
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
from broker import rate_limits
from broker.inactivity import InactivitySweeper
from broker.archiver import Archiver, ArchiverConfig
from broker.authentication import Authenticator
from broker.authorization import Authorizer
from broker.config import BrokerConfig
from managed_ledger.managed_ledger import ManagedLedger, ManagedLedgerConfig
from broker.publish_limits import Limit, PendingSends, PublishLimits, ReadGate
from broker.redirect import Destination
from broker.resources import Resources
from broker.schema_compatibility import DEFAULT_STRATEGY
from broker.schemas import SchemaRegistry
from broker.stats_history import StatsHistory, read_topics
from broker.transaction_coordinator import TransactionCoordinators
from broker.transaction_peers import TransactionPeers
from broker.topic import PersistentTopic
from broker.topic_list_watchers import TopicListWatchers
from bundles.config import BundlesConfig
from bundles.leader import Leader
from bundles.load import LoadReporter
from bundles.ownership import BrokerIdentity, BundleOwner, OwnershipManager
from bundles.records import LoadReport
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
    NotAllowed,
    PreconditionFailed,
    ServiceNotReady,
    TenantNotFound,
    TopicNotFound,
)
from runtime.tasks import TaskSet, cancel_and_wait
from runtime.tls import PeerClientContexts
from runtime.tokens import TokenFile
from metadata.policies import NamespacePolicies, PersistencePolicies, TenantInfo
from metadata.store import MetadataStore

log = logging.getLogger(__name__)

# Times one get_topic call starts over after finding the topic closing (each time a
# close and a load complete in between; more means the topic flaps, e.g. its bundle
# moves back and forth, and the caller is better told to retry).
_TOPIC_LOAD_ATTEMPTS_MAX = 4
# Topics of a bundle just handed over that load at once (ServerConnection's loads, for
# the clients that come back, are not counted against it).
PRELOADS_CONCURRENT_MAX = 8


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
        self._policies_changed = asyncio.Event()
        self.cache = EntryCache(config.entry_cache_bytes_max)
        self.topics: dict[str, asyncio.Future[PersistentTopic]] = {}
        # One task per topic being loaded (each catches and hands on its own failure):
        # cancelled and awaited by close, after the background tasks.
        self._loads: set[asyncio.Task[None]] = set()
        # Loads in progress that may create their topic (see get_topic).
        self._creating_loads: set[asyncio.Future] = set()
        self.topics_preloaded = 0
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
        # The dispatcher invariant since start (check_dispatchers): stalls found, and the
        # longest wait with backlog and permits seen, in seconds.
        self.dispatch_stalls = 0
        self.dispatch_wait_s_max = 0.0
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
        # The archive (broker/archiver.py): archives closed ledgers per the namespaces'
        # offload policies and serves ledgers whose bookie copy is gone.
        self.schemas = SchemaRegistry(store)
        # What message TTL and backlog quotas did (shown in /metrics).
        self.policy_counters = policy_enforcement.PolicyCounters()
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
        """(service URL, web service URL) of a live broker, from its load report."""
        if broker_id == self.broker_id:
            return self.config.service_url, self.config.web_service_url
        if self.broker_reports is None:
            return None
        record = self.broker_reports.get(keys.broker(broker_id))
        if record is None:
            return None
        report = LoadReport.decode(record.value)
        return report.service_url, report.web_service_url

    def broker_listeners(self, broker_id: str) -> dict[str, str] | None:
        """A live broker's advertised listeners (name -> pulsar:// URL), from its load
        report; None if it is not known."""
        if broker_id == self.broker_id:
            return self.config.listeners
        if self.broker_reports is None:
            return None
        record = self.broker_reports.get(keys.broker(broker_id))
        return LoadReport.decode(record.value).listeners if record is not None else None
    def broker_tls_urls(self, broker_id: str) -> tuple[str, str]:
        """(pulsar+ssl:// URL, https:// URL) of a live broker, ("", "") without TLS."""
        if broker_id == self.broker_id:
            return self.config.service_url_tls, self.config.web_service_url_tls
        record = self.broker_reports.get(keys.broker(broker_id)) if self.broker_reports is not None else None
        if record is None:
            return "", ""
        report = LoadReport.decode(record.value)
        return report.service_url_tls, report.web_service_url_tls

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
        target = self._destination(destination) if destination else None
        redirect = None if target is None else (
            lambda connection: target.urls_for(getattr(connection, "listener_name", "")))
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

    def _destination(self, broker_id: str) -> Destination | None:
        """The URLs a hand-over to ``broker_id`` sends clients to; None if the broker is
        not known (no load report): its clients look the topics up instead."""
        if broker_id == self.broker_id:
            return None
        urls = self.broker_urls(broker_id)
        if urls is None:
            return None
        return Destination(urls[0], self.broker_tls_urls(broker_id)[0], dict(self.broker_listeners(broker_id) or {}))

    def preload_topics(self, names: list[str]) -> None:
        """Starts loading the topics a bundle's previous owner had loaded (named by the
        hand-over), ``PRELOADS_CONCURRENT_MAX`` at a time, so that their clients,
        reconnecting meanwhile, find them loaded or join their loads. Existing topics
        only; a name that fails is left to its clients. Owned like the loads."""
        if self.shutting_down or not names:
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
        self._background.spawn(self._run_retention(), name="retention")
        self._background.spawn(self._run_policies(), name="policies")
        # Policy changes applied when they happen (a set-deduplication at once).
        self._background.spawn(policy_watch.follow(self.resources.store, self.resources, self.loaded_topics,
                                                   self.apply_rate_limits_soon), name="policy watch")
        self._background.spawn(policy_watch.follow_topic_policies(self.resources.store, self.resources.topic_policies,
                                                                  self.apply_rate_limits_soon),
                               name="topic policy watch")
        self._background.spawn(self._run_dispatch_watch(), name="dispatch watch")
        if self.authenticator.enabled:
            self._background.spawn(self._run_permission_checks(), name="permission checks")
        self._background.spawn(self.archiver.run(self.loaded_topics), name="archiver")
        self._background.spawn(self.inactivity.run(), name="inactivity")
        self._background.spawn(self._run_stats_history(), name="stats history")

    async def _run_dispatch_watch(self) -> None:
        """Checks the dispatcher invariant of every loaded subscription on an interval
        (subscriptions/dispatch_watch.py): a stall is counted, logged and woken."""
        while not self.shutting_down:
            await asyncio.sleep(self.config.dispatch_watch_interval_s)
            self.check_dispatchers(time.monotonic())

    def check_dispatchers(self, now_s: float) -> int:
        """One pass of the dispatcher invariant; returns the stalls it found."""
        stalls = 0
        for topic in self.loaded_topics():
            for subscription in list(topic.subscriptions.values()):
                dispatcher = subscription.dispatcher
                if not subscription.consumers and dispatcher.watch.resting:
                    # Nothing to watch (no consumer, no wait under way): 100,000 idle
                    # subscriptions made this pass, 4 times a second, most of an idle
                    # broker's CPU (bench/topics_scale.py). Skipping cannot make a stall
                    # up: a wait starts afresh at the first sample after a consumer came.
                    continue
                dispatcher.watch.bound_s = self.config.dispatch_stall_bound_s
                if dispatcher.check_progress(now_s):
                    stalls += 1
                self.dispatch_wait_s_max = max(self.dispatch_wait_s_max, dispatcher.watch.wait_s_max)
        self.dispatch_stalls += stalls
        return stalls

    async def _run_stats_history(self) -> None:
        """Samples the loaded topics for the console's history (one synchronous pass)."""
        while not self.shutting_down:
            await asyncio.sleep(self.config.stats_history_interval_s)
            self.stats_history.sample(read_topics(self.loaded_topics()), time.time() * 1000, time.monotonic())

    async def _run_retention(self) -> None:
        """Trims consumed ledgers of every loaded topic, per its namespace's policy."""
        while not self.shutting_down:
            await asyncio.sleep(self.config.retention_check_interval_s)
            for topic in self.loaded_topics():
                try:
                    policies = await self.resources.effective_policies(topic.name)
                    if not policies.deduplicationEnabled and not topic.closing:
                        # A snapshot left from when it was on holds entries: let it go.
                        await topic.set_deduplication(False)
                    retention = policies.retention()
                    await topic.trim_ledgers(retention.retentionTimeInMinutes, retention.retentionSizeInMB,
                                             await self.archiver.retention_gate(topic))
                except MagnetarError as error:
                    log.warning("retention check failed: topic=%s error=%s", topic.full_name, error)

    async def _run_policies(self) -> None:
        """Applies message TTL, backlog quotas, the compaction threshold and the rate
        limits to the loaded topics whose namespace sets them
        (broker/policy_enforcement.py, broker/rate_limits.py); at once after a policy
        change through this broker's admin API (apply_rate_limits_soon)."""
        while not self.shutting_down:
            try:
                async with asyncio.timeout(self.config.policy_check_interval_s):
                    await self._policies_changed.wait()
            except TimeoutError:
                pass
            self._policies_changed.clear()
            for topic in self.loaded_topics():
                if topic.closing:
                    continue
                try:
                    policies = await self.resources.effective_policies(topic.name)
                    self.apply_rate_limits(topic, policies)
                    topic.backlog_size_quota = policy_enforcement.size_quota(policies)
                    if policy_enforcement.has_time_policies(policies):
                        await policy_enforcement.enforce(topic, policies, self.policy_counters)
                    if topic.compact_past(policies.compaction_threshold or 0):
                        self.policy_counters.compactions_started += 1
                except MagnetarError as error:
                    log.warning("policy check failed: topic=%s error=%s", topic.full_name, error)

    def apply_rate_limits_soon(self) -> None:
        """A namespace's or topic's rate limits changed here: the policy loop applies them now."""
        self._policies_changed.set()

    def apply_rate_limits(self, topic: PersistentTopic, policies: NamespacePolicies) -> None:
        """Sets the topic's publish, dispatch and per-subscription dispatch rate limits
        from its effective policies (the topic's over its namespace's; this cluster's
        entries); a limit that did not change keeps its buckets."""
        limits = rate_limits.topic_rate_limits(policies, self.config.cluster)
        publish = limits.publish
        current = topic.publish_rate.limit if topic.publish_rate is not None else None
        if publish != current:
            if topic.publish_rate is not None:
                topic.publish_rate.close()
            topic.publish_rate = rate_limits.PublishRateScope(topic.full_name, publish, self.publish_limits) \
                if publish is not None else None
            log.info("publish rate limit set: topic=%s limit=%s", topic.full_name, publish)
        dispatch = limits.dispatch
        current = topic.dispatch_throttle.limit if topic.dispatch_throttle is not None else None
        per_subscription = limits.per_subscription
        current_per_subscription = topic.subscription_throttles.limit \
            if topic.subscription_throttles is not None else None
        if dispatch != current or per_subscription != current_per_subscription:
            relative = any(limit is not None and limit.relative for limit in (dispatch, per_subscription))
            topic.publish_window = (topic.publish_window or rate_limits.PublishWindow()) if relative else None
            published = topic.publish_window
            throttle = topic.dispatch_throttle if dispatch == current else \
                rate_limits.DispatchRateThrottle(dispatch, published=published) if dispatch is not None else None
            topic.set_dispatch_throttle(throttle, rate_limits.SubscriptionDispatchRates(
                per_subscription, throttle, published=published) if per_subscription is not None else None)
            log.info("dispatch rate limits set: topic=%s limit=%s per_subscription=%s", topic.full_name, dispatch,
                     per_subscription)

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

    # --- topics ---------------------------------------------------------------------------

    async def _ledger_config(self, namespace: NamespaceName, policies: NamespacePolicies) -> ManagedLedgerConfig:
        base = self.config.managed_ledger
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
            if self.shutting_down:
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
            await self.ensure_serving(name)
            topic = await self._load_topic(name, create=create)
            if self.topic_ownership is not None and not await self.topic_ownership.is_serving(name):
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
            policies = await self.resources.effective_policies(name, fresh=True)
        except NamespaceNotFound:
            try:
                await self.resources.tenant(name.tenant)
            except TenantNotFound:
                raise TopicNotFound(f"topic {name}: tenant {name.tenant} does not exist") from None
            raise TopicNotFound(f"topic {name}: namespace {namespace} does not exist") from None
        if create and name.is_partition is False and await self.resources.partitions(name) > 0:
            raise NotAllowed(f"{name} is a partitioned topic: use its partitions")
        may_create = create and policies.allows_auto_topic_creation(self.config.allow_auto_topic_creation)
        if name.is_partition and create:
            # A partition of an existing partitioned topic may always be created, and
            # a -partition-N name never otherwise (as the admin API refuses it): a
            # client still connected to a partitioned topic deleted by force must not
            # bring one of its partitions back as a topic of its own.
            parent_partitions = await self.resources.partitions(name.partitioned_parent)
            may_create = name.partition_index < parent_partitions
        archive = await self.archiver.open_topic(name)
        ledger = ManagedLedger(name, self.store, self.ledger_client, self.cache,
                               await self._ledger_config(namespace, policies), archive=archive)
        try:
            await ledger.open(create_if_missing=may_create)
        except BaseException:
            self.archiver.close_topic(name, archive)
            raise
        topic = PersistentTopic(name, ledger, self.store, self.config, self.ledger_client)
        topic.on_closed = self._on_topic_closed
        self.apply_rate_limits(topic, policies)
        try:
            await topic.load_subscriptions()
        except MagnetarError:
            # The subscriptions loaded before the failure have dispatchers (tasks) of
            # their own: closed here, not left pending for the garbage collector.
            for subscription in list(topic.subscriptions.values()):
                await subscription.close()
            await ledger.close()
            self.archiver.close_topic(name, archive)
            raise
        if self.transactions is not None:
            try:
                await topic.transactions.recover()
            except MagnetarError:
                for subscription in list(topic.subscriptions.values()):
                    await subscription.close()
                await ledger.close()
                self.archiver.close_topic(name, archive)
                raise
        log.info("topic loaded: topic=%s ledgers=%d last_confirmed=%s subscriptions=%d", name,
                 len(ledger.ledger_ids()), ledger.last_confirmed, len(topic.subscriptions))
        return topic

    def _on_topic_closed(self, topic: PersistentTopic) -> None:
        self.archiver.close_topic(topic.name, topic.ledger.archive)
        self.stats_history.drop(topic.full_name, id(topic))
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
        await cancel_and_wait(*self._loads)
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
        self.topics.clear()
        await self.archiver.close()
