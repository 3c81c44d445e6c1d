"""Configuration of a broker, built once by the wiring (broker/main.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.codec import FRAME_PADDING_BYTES, MAX_MESSAGE_SIZE_DEFAULT
from broker.authentication import AuthConfig
from broker.stats_history import HistoryLimits
from managed_ledger.managed_ledger import ManagedLedgerConfig
from common.entry import ENTRY_HEADER_SIZE
from common.errors import ConfigError
from runtime.tls import TlsConfig
from metadata.etcd_tls import EtcdTlsConfig

MIB = 1024 * 1024


# A broker's default HTTP port is its binary-protocol port plus this: 6650 -> 8080.
HTTP_PORT_OFFSET = 8080 - 6650


def derived_http_port(port: int) -> int:
    """The default HTTP port of a broker on binary ``port`` (0, any, stays 0)."""
    return port + HTTP_PORT_OFFSET if port else 0


# Listeners named per broker: at most this many (Pulsar deployments name a handful).
LISTENERS_MAX = 16


def parse_listeners(text: str) -> dict[str, str]:
    """``name:pulsar://host:port,...`` -> {name: URL}; ConfigError when malformed."""
    listeners: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, url = item.partition(":")
        if not name or not (url.startswith("pulsar://") or url.startswith("pulsar+ssl://")):
            raise ConfigError(f"advertised_listeners: {item!r} is not name:pulsar://host:port")
        if name in listeners:
            raise ConfigError(f"advertised_listeners: listener {name!r} is named twice")
        listeners[name] = url
    if len(listeners) > LISTENERS_MAX:
        raise ConfigError(f"advertised_listeners: at most {LISTENERS_MAX} listeners")
    return listeners


@dataclass(frozen=True)
class BrokerConfig:
    metadata_url: str
    # TLS toward etcd (metadata/etcd_tls.py; --etcd-tls-* flags).
    metadata_tls: EtcdTlsConfig = field(default_factory=EtcdTlsConfig)
    cluster: str = "standalone"
    host: str = "127.0.0.1"
    port: int = 6650
    # Admin REST, lookups, /health and /metrics. None: derived from the binary port,
    # port + HTTP_PORT_OFFSET (6650 -> 8080, 6651 -> 8081: the standalone's layout), so
    # brokers started on one host with distinct --port values never collide on it; with
    # port 0 (any free port) it is 0 too. Set after construction.
    http_port: int | None = None
    # The address clients are told to connect to (lookups); default host:port.
    advertised_address: str = ""
    # Named listeners, Pulsar's advertisedListeners: "name:pulsar://host:port,..." A
    # client that names a listener (listener_name) is told that listener's URL; one
    # naming a listener this broker lacks is refused.
    advertised_listeners: str = ""
    broker_id: str = ""
    managed_ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    # Authentication and authorization (broker/authentication.py); off by default.
    auth: AuthConfig = field(default_factory=AuthConfig)
    # TLS (runtime/tls.py): with a certificate the broker also listens on tls_port
    # (pulsar+ssl://, Pulsar's 6651) and http_tls_port (HTTPS, Pulsar's 8443); with
    # plain_ports_enabled off it listens only there, and advertises only TLS URLs.
    tls: TlsConfig = field(default_factory=TlsConfig)
    tls_port: int = 6651
    http_tls_port: int = 8443
    plain_ports_enabled: bool = True
    # Largest message (payload frame) a client may send; announced in CONNECTED.
    max_message_size: int = MAX_MESSAGE_SIZE_DEFAULT
    # Back-pressure on publishers (broker/publish_limits.py): sends accepted and not yet
    # answered are bounded per connection, per topic and per broker; a connection whose
    # send reaches a bound is not read again until each bound it hit drained to
    # pending_sends_resume_ratio of itself. No send is ever refused for a bound.
    # Per connection, in sends (Pulsar's maxPendingPublishRequestsPerConnection, 1,000).
    pending_sends_per_connection_max: int = 1000
    # Per topic: what one write handle of the ledger client lets be in flight
    # (LedgerClientConfig.pending_adds_max / pending_bytes_max), which the managed
    # ledger's submit_nowait does not wait for.
    pending_sends_per_topic_max: int = 10_000
    pending_send_bytes_per_topic_max: int = 64 * MIB
    # Per broker (Pulsar's maxMessagePublishBufferSizeInMB, by default half the broker's
    # direct memory): payloads are held about twice until stored (the payload, and the
    # encoded entry being sent to the bookies), so 256 MiB bounds ~512 MiB of memory.
    pending_sends_per_broker_max: int = 100_000
    pending_send_bytes_per_broker_max: int = 256 * MIB
    # A paused connection is read again once every bound it hit is down to this share of
    # itself (Pulsar resumes at half), so reading does not flap at the bound.
    pending_sends_resume_ratio: float = 0.5
    # Requests a connection may have in progress (lookups, producer and consumer
    # creation, seeks...); past it they are refused with TooManyRequests. Pulsar bounds
    # pending lookups per broker at 50,000 (maxConcurrentLookupRequest); a well-behaved
    # client has a few per producer or consumer, so 1,000 per connection leaves room
    # for large clients while one misbehaving client cannot queue unbounded work.
    pending_requests_per_connection_max: int = 1000
    # Topic-list watchers (WATCH_TOPIC_LIST) a connection may hold. A pattern consumer
    # holds one per namespace it watches, so a client rarely has more than a few; the
    # bound keeps one client from making the broker mirror many namespaces.
    topic_list_watchers_per_connection_max: int = 100
    # Limits against abuse (errors: ConnectionLimit, retriable). A connection must send
    # a CONNECT (and finish a TLS handshake) within connect_timeout_s, and a frame once
    # begun must arrive whole within frame_timeout_s (slow-loris); otherwise it is
    # closed. Pulsar leaves these unbounded by default (brokerMaxConnections and
    # brokerMaxConnectionsPerIp 0); these bounds are far above what one client host
    # needs (the official clients open one connection per broker) and stop one peer
    # from taking every descriptor.
    connect_timeout_s: float = 10.0
    # Request bodies of the admin API (413 past it): policies and tenant records are a
    # few KiB; etcd refuses values over 1.5 MiB anyway. aiohttp's default.
    http_body_bytes_max: int = 1 * MIB
    frame_timeout_s: float = 30.0
    connections_max: int = 20_000
    connections_per_address_max: int = 1_000
    # Producers and consumers attached to one topic (Pulsar's maxProducersPerTopic and
    # maxConsumersPerTopic, unbounded there by default).
    producers_per_topic_max: int = 10_000
    consumers_per_topic_max: int = 10_000
    # Keep-alive: PING after this long without traffic; close after twice that.
    keepalive_interval_s: float = 30.0
    # When the broker fences itself (its ownership lease unconfirmed, bundles/ownership.py)
    # it aborts every client connection (the socket dropped, no close frames): after a
    # partition heals, the client's first packet is answered with a reset and it looks its
    # topics up again at once, instead of waiting behind backed-off retransmissions for
    # close frames on a connection left open.
    # False keeps the connections open and closes only the topics (the former behaviour,
    # kept to measure against: bench/owner_isolation.py).
    fence_aborts_connections: bool = True
    # Broker-wide entry cache for tailing reads (Pulsar's default is 1/5 of direct memory).
    entry_cache_bytes_max: int = 512 * MIB
    # Entries read from the ledger per dispatch round, and the bytes they may total.
    dispatch_entries_max: int = 100
    dispatch_bytes_max: int = 4 * MIB
    # The dispatcher invariant (subscriptions/dispatch_watch.py): every loaded
    # subscription is checked this often, and one with a consumer with permits and
    # backlog that starts no read for longer than the bound counts as a stall and is
    # woken. The bound is the (none waits more than 1 s); checking 4 times per
    # bound keeps the measured waits within a quarter of it, for a walk over the loaded
    # subscriptions that costs microseconds each.
    dispatch_stall_bound_s: float = 1.0
    dispatch_watch_interval_s: float = 0.25
    # Cursor state is flushed this often (acknowledgements within one interval before
    # a crash may be redelivered).
    cursor_flush_interval_s: float = 1.0
    allow_auto_topic_creation: bool = True
    # Connection write buffer high/low water marks (flow control toward consumers).
    write_buffer_high_bytes: int = 8 * MIB
    write_buffer_low_bytes: int = 2 * MIB
    # Redelivery counters kept per subscription (for dead-letter policies).
    redelivery_counts_max: int = 100_000
    # A shared or key-shared consumer holding this many unacknowledged messages gets no
    # more until it acknowledges some (Pulsar's maxUnackedMessagesPerConsumer, 50,000).
    unacked_per_consumer_max: int = 50_000
    # Delayed messages (deliver_after / deliver_at) a shared or key-shared subscription
    # tracks in memory; past it further delayed messages stay in the topic as a range
    # of positions read again when there is room or they are due
    # (subscriptions/delayed_overflow.py). 24 bytes an entry: 1,000,000 take about
    # 25 MiB (bench/delayed_delivery_bench.py).
    delayed_delivery_entries_max: int = 1_000_000
    lookup_timeout_s: float = 30.0
    # How often loaded topics are checked for ledgers retention lets go.
    retention_check_interval_s: float = 5.0
    # How often message TTL and backlog quotas are applied to loaded topics (Pulsar
    # checks every 5 min and 60 s; a check costs a few reads per topic with a policy).
    policy_check_interval_s: float = 5.0
    # Tests only (hidden --compaction-pause-at): a compaction stops at this point of
    # its run and waits for ever, so that a test can kill -9 the broker there
    # (managed_ledger/compaction.py PAUSE_POINTS).
    compaction_pause_at: str = ""
    # Transactions (docs/transactions.md). Coordinators: partitions of
    # pulsar/system/transaction_coordinator_assign (Pulsar's default is 16; one serves a
    # small cluster, and the count is fixed when the assign topic is first created).
    transactions_enabled: bool = True
    transaction_coordinators: int = 4
    # Open transactions a coordinator keeps (each an etcd record of a few hundred bytes).
    transactions_per_coordinator_max: int = 10_000
    # A timed-out transaction is aborted within this interval after its deadline.
    transaction_sweep_interval_s: float = 1.0
    # END_TXN waits this long for every participant to be told; past it the client is
    # answered ServiceNotReady and the outcome is still carried out.
    transaction_end_timeout_s: float = 30.0
    # Per topic: transactions open at once, and aborted ones remembered until their
    # entries are trimmed (an id and a position each).
    transactions_open_per_topic_max: int = 10_000
    transactions_aborted_per_topic_max: int = 100_000
    # Per-topic Prometheus series (broker/topic_metrics.py). metrics_topic_level is
    # Pulsar's exposeTopicLevelMetricsInPrometheus (true there too): off, topics are
    # folded into one series per namespace. At most metrics_topics_max topics get series
    # of their own (the rest are folded per namespace, counted in
    # magnetar_broker_metrics_topics_folded): 1,000 topics are 15,000 samples with their
    # subscriptions, about 2 MB of /metrics; writing them for 10,000 loaded topics took
    # 0.12 s in-process (bench/metrics_bench.py measures whole scrapes).
    # Subscription series (6 each) stop at metrics_subscriptions_max.
    metrics_topic_level: bool = True
    metrics_topics_max: int = 1000
    metrics_subscriptions_max: int = 5000
    # The console's history (broker/stats_history.py): a sample of every loaded topic
    # each stats_history_interval_s, kept stats_history_window_s; at most
    # stats_history_topics_max topics and stats_history_subscriptions_max subscriptions
    # (those with the largest backlog past the bounds). At the defaults (360 samples) the
    # samples take at most 7.2 MB + 8.6 MB.
    stats_history_interval_s: float = 10.0
    stats_history_window_s: float = 3600.0
    stats_history_topics_max: int = 500
    stats_history_subscriptions_max: int = 1000
    # Cleaning up (broker/inactivity.py). A durable subscription with no consumer for
    # this many minutes is deleted, unless its namespace sets its own
    # subscription_expiration_time_minutes (Pulsar's subscriptionExpirationTimeMinutes,
    # whose default 0 means never, as here; fractions of a minute are for tests).
    subscription_expiration_time_minutes: float = 0.0
    # Topics with no producer and no subscription (or, in mode
    # delete_when_subscriptions_caught_up, none with a backlog or a consumer) are deleted
    # after delete_inactive_topics_max_inactive_s, unless their namespace's
    # inactive_topic_policies says otherwise (Pulsar's brokerDeleteInactiveTopicsEnabled,
    # ...MaxInactiveDurationSeconds, ...Mode). Off by default, unlike Pulsar (on, 60 s):
    # deleting data is opt-in here.
    delete_inactive_topics_enabled: bool = False
    delete_inactive_topics_max_inactive_s: float = 60.0
    delete_inactive_topics_mode: str = "delete_when_no_subscriptions"
    # A partition is deleted as any topic is (a client that comes back re-creates it
    # while its partitioned topic exists). With this on, the partitioned topic itself
    # (its metadata) goes once the sweep deleted its last partition (Pulsar's
    # brokerDeleteInactivePartitionedTopicMetadataEnabled, off by default there too).
    delete_inactive_partitioned_metadata: bool = False
    # How often the sweep runs (Pulsar's brokerDeleteInactiveTopicsFrequencySeconds, 60,
    # and subscriptionExpiryCheckIntervalInMinutes, 5): a topic or subscription goes at
    # most this long after its time.
    inactivity_check_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("port must be in [0, 65535]")
        if self.http_port is None:
            object.__setattr__(self, "http_port", derived_http_port(self.port))
        assert self.http_port is not None
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http_port must be in [0, 65535] (it defaults to port + {HTTP_PORT_OFFSET}: "
                              f"give --http-port with --port {self.port})")
        if not (0 <= self.tls_port <= 65535 and 0 <= self.http_tls_port <= 65535):
            raise ConfigError("tls_port and http_tls_port must be in [0, 65535]")
        if not self.plain_ports_enabled and not self.tls.enabled:
            raise ConfigError("plain_ports_enabled off needs TLS (a tls cert_file and key_file)")
        if self.auth.authentication_enabled and "tls" in self.auth.providers and not self.tls.trust_certs_file:
            raise ConfigError("the tls authentication provider needs TLS with trust_certs_file "
                              "(the CA that signs client certificates)")
        if not 1024 <= self.max_message_size <= 64 * MIB:
            raise ConfigError("max_message_size must be in [1 KiB, 64 MiB]")
        if not 1 <= self.pending_sends_per_connection_max <= 1_000_000:
            raise ConfigError("pending_sends_per_connection_max must be in [1, 1000000]")
        if not 1 <= self.pending_sends_per_topic_max <= self.pending_sends_per_broker_max:
            raise ConfigError("pending_sends_per_topic_max must be in [1, pending_sends_per_broker_max]")
        if not 1 <= self.pending_sends_per_broker_max <= 10_000_000:
            raise ConfigError("pending_sends_per_broker_max must be in [1, 10000000]")
        if not MIB <= self.pending_send_bytes_per_topic_max <= self.pending_send_bytes_per_broker_max:
            raise ConfigError("pending_send_bytes_per_topic_max must be in [1 MiB, pending_send_bytes_per_broker_max]")
        if self.pending_send_bytes_per_broker_max > 64 * 1024 * MIB:
            raise ConfigError("pending_send_bytes_per_broker_max must be at most 64 GiB")
        if not 0.0 <= self.pending_sends_resume_ratio < 1.0:
            raise ConfigError("pending_sends_resume_ratio must be in [0, 1)")
        if not 1 <= self.pending_requests_per_connection_max <= 1_000_000:
            raise ConfigError("pending_requests_per_connection_max must be in [1, 1000000]")
        if not 1 <= self.topic_list_watchers_per_connection_max <= 10_000:
            raise ConfigError("topic_list_watchers_per_connection_max must be in [1, 10000]")
        if not 1024 <= self.http_body_bytes_max <= 64 * MIB:
            raise ConfigError("http_body_bytes_max must be in [1 KiB, 64 MiB]")
        if not 0.1 <= self.connect_timeout_s <= 600:
            raise ConfigError("connect_timeout_s must be in [0.1, 600]")
        if not 0.1 <= self.frame_timeout_s <= 3600:
            raise ConfigError("frame_timeout_s must be in [0.1, 3600]")
        if not 1 <= self.connections_per_address_max <= self.connections_max <= 1_000_000:
            raise ConfigError("need 1 <= connections_per_address_max <= connections_max <= 1000000")
        if not 1 <= self.producers_per_topic_max <= 1_000_000:
            raise ConfigError("producers_per_topic_max must be in [1, 1000000]")
        if not 1 <= self.consumers_per_topic_max <= 1_000_000:
            raise ConfigError("consumers_per_topic_max must be in [1, 1000000]")
        if not 1.0 <= self.keepalive_interval_s <= 3600:
            raise ConfigError("keepalive_interval_s must be in [1, 3600]")
        if self.entry_cache_bytes_max < 0:
            raise ConfigError("entry_cache_bytes_max must not be negative")
        if not 0 < self.dispatch_watch_interval_s <= self.dispatch_stall_bound_s <= 600:
            raise ConfigError("dispatch_watch_interval_s must be in (0, dispatch_stall_bound_s], "
                              "and dispatch_stall_bound_s at most 600")
        if not 1 <= self.dispatch_entries_max <= 10_000:
            raise ConfigError("dispatch_entries_max must be in [1, 10000]")
        if not 0.01 <= self.cursor_flush_interval_s <= 60:
            raise ConfigError("cursor_flush_interval_s must be in [0.01, 60]")
        if not 1 <= self.transaction_coordinators <= 256:
            raise ConfigError("transaction_coordinators must be in [1, 256]")
        if not 0.05 <= self.transaction_sweep_interval_s <= 60:
            raise ConfigError("transaction_sweep_interval_s must be in [0.05, 60]")
        if not 1 <= self.transaction_end_timeout_s <= 600:
            raise ConfigError("transaction_end_timeout_s must be in [1, 600]")
        if not 1 <= self.transactions_per_coordinator_max <= 1_000_000:
            raise ConfigError("transactions_per_coordinator_max must be in [1, 1000000]")
        if not 1 <= self.transactions_open_per_topic_max <= 1_000_000:
            raise ConfigError("transactions_open_per_topic_max must be in [1, 1000000]")
        if not 1 <= self.transactions_aborted_per_topic_max <= 10_000_000:
            raise ConfigError("transactions_aborted_per_topic_max must be in [1, 10000000]")
        parse_listeners(self.advertised_listeners)   # raises ConfigError when malformed
        if not 0.05 <= self.policy_check_interval_s <= 3600:
            raise ConfigError("policy_check_interval_s must be in [0.05, 3600]")
        if not 0.05 <= self.retention_check_interval_s <= 3600:
            raise ConfigError("retention_check_interval_s must be in [0.05, 3600]")
        if not 1 <= self.unacked_per_consumer_max <= 10_000_000:
            raise ConfigError("unacked_per_consumer_max must be in [1, 10000000]")
        if not 1 <= self.delayed_delivery_entries_max <= 10_000_000:
            raise ConfigError("delayed_delivery_entries_max must be in [1, 10000000]")
        if not 0 <= self.subscription_expiration_time_minutes <= 2**31 - 1:
            raise ConfigError("subscription_expiration_time_minutes must be in [0, 2147483647] (0: never)")
        if not 1 <= self.delete_inactive_topics_max_inactive_s <= 2**31 - 1:
            raise ConfigError("delete_inactive_topics_max_inactive_s must be in [1, 2147483647]")
        if self.delete_inactive_topics_mode not in ("delete_when_no_subscriptions",
                                                    "delete_when_subscriptions_caught_up"):
            raise ConfigError("delete_inactive_topics_mode must be delete_when_no_subscriptions or "
                              "delete_when_subscriptions_caught_up")
        if not 0.05 <= self.inactivity_check_interval_s <= 3600:
            raise ConfigError("inactivity_check_interval_s must be in [0.05, 3600]")
        if not 0 <= self.metrics_topics_max <= 1_000_000:
            raise ConfigError("metrics_topics_max must be in [0, 1000000]")
        if not 0 <= self.metrics_subscriptions_max <= 10_000_000:
            raise ConfigError("metrics_subscriptions_max must be in [0, 10000000]")
        self.stats_history_limits   # raises ConfigError when out of bounds
        if not 0 < self.write_buffer_low_bytes < self.write_buffer_high_bytes:
            raise ConfigError("write_buffer_low_bytes must be in (0, write_buffer_high_bytes)")

    @property
    def stats_history_limits(self) -> HistoryLimits:
        return HistoryLimits(self.stats_history_interval_s, self.stats_history_window_s,
                             self.stats_history_topics_max, self.stats_history_subscriptions_max)

    @property
    def listeners(self) -> dict[str, str]:
        return parse_listeners(self.advertised_listeners)

    @property
    def frame_bytes_max(self) -> int:
        return self.max_message_size + FRAME_PADDING_BYTES

    @property
    def effective_broker_id(self) -> str:
        """The broker's id: the configured one, or host:port."""
        return self.broker_id or f"{self.host}:{self.port}"

    def check_entries_fit(self, entry_bytes_max: int) -> None:
        """ConfigError unless the largest entry a producer can make fits the ledger
        client's entry limit (``entry_bytes_max``, header included). An entry is one
        SEND's stored payload, which the frame limit bounds (frame_bytes_max covers
        max_message_size plus the command and metadata), plus the entry header. A
        mismatch would make every maximum-size message fail at storage instead of
        being refused by the client, which checks the max_message_size it is told."""
        entry_bytes_needed = self.frame_bytes_max + ENTRY_HEADER_SIZE
        if entry_bytes_needed > entry_bytes_max:
            raise ConfigError(f"max_message_size {self.max_message_size} needs ledger entries of up to "
                              f"{entry_bytes_needed} bytes, above the ledger client's entry_bytes_max "
                              f"{entry_bytes_max}")

    @property
    def service_url(self) -> str:
        """The binary-protocol URL clients are sent to: the plain one, or the TLS one
        when the plain ports are off."""
        if not self.plain_ports_enabled:
            return self.service_url_tls
        return f"pulsar://{self.advertised_address or f'{self.host}:{self.port}'}"

    @property
    def web_service_url(self) -> str:
        if not self.plain_ports_enabled:
            return self.web_service_url_tls
        return f"http://{self._advertised_host}:{self.http_port}"

    @property
    def _advertised_host(self) -> str:
        return (self.advertised_address or self.host).rsplit(":", 1)[0] if self.advertised_address else self.host

    @property
    def service_url_tls(self) -> str:
        return f"pulsar+ssl://{self._advertised_host}:{self.tls_port}" if self.tls.enabled else ""

    @property
    def web_service_url_tls(self) -> str:
        return f"https://{self._advertised_host}:{self.http_tls_port}" if self.tls.enabled else ""
