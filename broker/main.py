"""Wiring of ``magnetar broker``: options → BrokerConfig; the metadata store, ledger
client and broker service; the binary-protocol server and the HTTP server (admin REST,
lookups, /health, /metrics); run until SIGTERM/SIGINT, then close every topic (clients
are told to reconnect elsewhere) and stop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import ssl
from dataclasses import replace

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

from broker.admin.app import build_admin_app
from broker.archiver_config import STEPS as ARCHIVE_STEPS
from broker.archiver_config import ArchiverConfig
from managed_ledger.compaction import PAUSE_POINTS as COMPACTION_PAUSE_POINTS
from broker.authentication import AuthConfig
from broker.config import HTTP_PORT_OFFSET, BrokerConfig
from broker.connection import ServerConnection
from managed_ledger.managed_ledger import ManagedLedgerConfig
from broker.metrics import BROKER_STAGES, register_broker_metrics
from broker.service import BrokerService
from bundles.config import BundlesConfig
from runtime.config_options import ConfigOption, add_config_options, config_overrides
from common.histograms import LATENCY_BUCKETS_S, LatencyStages
from runtime.listen import bind_failure
from runtime.gc_pauses import freeze_startup_heap
from runtime.loop_monitor import LoopMonitor
from common.errors import PortInUse
from runtime.ops_http import bind_listener
from runtime.tls import CertificateReloader, TlsConfig, server_context
from runtime.tasks import TaskSet, stop_on_signals
from ledger.client import LedgerClient
from ledger.config import BOOKIE_CLIENT_SECURITY_OPTIONS, LedgerClientConfig, bookie_client_security
from metadata import open_store
from metadata.etcd_tls import ETCD_TLS_OPTIONS, etcd_tls_from_args

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# Every flag that sets a config field; the defaults are the dataclasses' own.
OPTIONS: list[ConfigOption] = [
    ConfigOption("--cluster", BrokerConfig, "cluster"),
    ConfigOption("--host", BrokerConfig, "host", "address to listen on"),
    ConfigOption("--port", BrokerConfig, "port", "Pulsar binary protocol port (0: any free port)"),
    ConfigOption("--http-port", BrokerConfig, "http_port", "admin REST, lookups, /health and /metrics "
                 "(0: any free port)", type=int,
                 default_text=f"--port + {HTTP_PORT_OFFSET}, so 8080 for 6650; 0 with --port 0"),
    ConfigOption("--broker-id", BrokerConfig, "broker_id", default_text="host:port"),
    ConfigOption("--advertised-address", BrokerConfig, "advertised_address",
                 "host:port clients are sent to by lookups (its HTTP URL takes the same host)",
                 default_text="host:port"),
    ConfigOption("--ensemble-size", ManagedLedgerConfig, "ensemble_size", "bookies per ledger (E)"),
    ConfigOption("--write-quorum", ManagedLedgerConfig, "write_quorum_size", "copies of each entry (Qw)"),
    ConfigOption("--ack-quorum", ManagedLedgerConfig, "ack_quorum_size", "copies acknowledged before a receipt (Qa)"),
    ConfigOption("--ledger-max-entries", ManagedLedgerConfig, "ledger_entries_max", "roll over past this"),
    ConfigOption("--ledger-max-mib", ManagedLedgerConfig, "ledger_bytes_max", "roll over past this", unit=MIB),
    ConfigOption("--ledger-max-age-s", ManagedLedgerConfig, "ledger_age_s_max", "roll over past this"),
    ConfigOption("--lazy-ledgers", ManagedLedgerConfig, "ledger_on_open",
                 "create a topic's ledger at its first publish, not when it loads (idle topics hold no open "
                 "ledger, so a bundle of them moves without ledger recovery)", switch_to=False),
    ConfigOption("--entry-cache-mib", BrokerConfig, "entry_cache_bytes_max", "tailing reads' cache", unit=MIB),
    ConfigOption("--cursor-flush-interval-s", BrokerConfig, "cursor_flush_interval_s",
                 "acknowledgements are persisted this often"),
    ConfigOption("--dispatch-entries-max", BrokerConfig, "dispatch_entries_max",
                 "entries read from storage per dispatch round of a subscription"),
    ConfigOption("--dispatch-mib-max", BrokerConfig, "dispatch_bytes_max",
                 "bytes (MiB) read per dispatch round of a subscription", unit=MIB),
    ConfigOption("--unacked-per-consumer-max", BrokerConfig, "unacked_per_consumer_max",
                 "messages a shared or key-shared consumer may hold unacknowledged before it gets no more "
                 "(Pulsar's maxUnackedMessagesPerConsumer)"),
    ConfigOption("--delayed-delivery-entries-max", BrokerConfig, "delayed_delivery_entries_max",
                 "delayed messages a shared subscription tracks in memory; past it they overflow to the topic"),
    ConfigOption("--pending-sends-per-connection-max", BrokerConfig, "pending_sends_per_connection_max",
                 "unanswered sends past which a connection is not read (Pulsar's "
                 "maxPendingPublishRequestsPerConnection)"),
    ConfigOption("--pending-sends-per-topic-max", BrokerConfig, "pending_sends_per_topic_max",
                 "unanswered sends of one topic past which its publishers are not read"),
    ConfigOption("--pending-send-mib-per-topic-max", BrokerConfig, "pending_send_bytes_per_topic_max",
                 "unanswered send bytes (MiB) of one topic past which its publishers are not read", unit=MIB),
    ConfigOption("--pending-sends-per-broker-max", BrokerConfig, "pending_sends_per_broker_max",
                 "unanswered sends of the whole broker past which publishers are not read"),
    ConfigOption("--pending-send-mib-per-broker-max", BrokerConfig, "pending_send_bytes_per_broker_max",
                 "unanswered send bytes (MiB) of the whole broker past which publishers are not read "
                 "(Pulsar's maxMessagePublishBufferSizeInMB)", unit=MIB),
    ConfigOption("--pending-sends-resume-ratio", BrokerConfig, "pending_sends_resume_ratio",
                 "a paused publisher is read again once each bound it hit is down to this share"),
    ConfigOption("--keepalive-interval-s", BrokerConfig, "keepalive_interval_s"),
    ConfigOption("--fence-keeps-connections", BrokerConfig, "fence_aborts_connections",
                 "on a self-fence close the topics but leave client connections open instead of resetting "
                 "them (the former behaviour; for measurements)", switch_to=False),
    ConfigOption("--connect-timeout-s", BrokerConfig, "connect_timeout_s",
                 "a connection must finish its TLS handshake and CONNECT within this"),
    ConfigOption("--frame-timeout-s", BrokerConfig, "frame_timeout_s",
                 "a frame once begun must arrive whole within this (slow senders are closed)"),
    ConfigOption("--http-body-bytes-max", BrokerConfig, "http_body_bytes_max",
                 "largest admin API request body (413 past it)"),
    ConfigOption("--connections-max", BrokerConfig, "connections_max", "client connections in total"),
    ConfigOption("--connections-per-address-max", BrokerConfig, "connections_per_address_max",
                 "client connections from one IP address"),
    ConfigOption("--producers-per-topic-max", BrokerConfig, "producers_per_topic_max"),
    ConfigOption("--consumers-per-topic-max", BrokerConfig, "consumers_per_topic_max"),
    ConfigOption("--max-message-size", BrokerConfig, "max_message_size", "bytes, announced to clients"),
    ConfigOption("--no-auto-topic-creation", BrokerConfig, "allow_auto_topic_creation",
                 "refuse producers and consumers of topics that do not exist", switch_to=False),
    ConfigOption("--retention-check-interval-s", BrokerConfig, "retention_check_interval_s"),
    ConfigOption("--no-transactions", BrokerConfig, "transactions_enabled",
                 "refuse the transaction commands (docs/transactions.md)", switch_to=False),
    ConfigOption("--transaction-coordinators", BrokerConfig, "transaction_coordinators",
                 "partitions of pulsar/system/transaction_coordinator_assign, fixed when it is first made"),
    ConfigOption("--transaction-sweep-interval-s", BrokerConfig, "transaction_sweep_interval_s",
                 "how often timed-out transactions are looked for and aborted"),
    ConfigOption("--advertised-listeners", BrokerConfig, "advertised_listeners",
                 "named listeners, name:pulsar://host:port[,...] (Pulsar's advertisedListeners)"),
    ConfigOption("--policy-check-interval-s", BrokerConfig, "policy_check_interval_s",
                 "how often message TTL and backlog quotas are applied"),
    ConfigOption("--no-topic-level-metrics", BrokerConfig, "metrics_topic_level",
                 "write per-namespace aggregates instead of per-topic series in /metrics (Pulsar's "
                 "exposeTopicLevelMetricsInPrometheus=false)", switch_to=False),
    ConfigOption("--metrics-topics-max", BrokerConfig, "metrics_topics_max",
                 "topics with series of their own in /metrics; the rest are folded into namespace series"),
    ConfigOption("--metrics-subscriptions-max", BrokerConfig, "metrics_subscriptions_max",
                 "subscriptions with series of their own in /metrics"),
    ConfigOption("--stats-history-interval-s", BrokerConfig, "stats_history_interval_s",
                 "how often the console's history samples the loaded topics (broker/stats_history.py)"),
    ConfigOption("--stats-history-window-s", BrokerConfig, "stats_history_window_s",
                 "how long the console's history keeps samples"),
    ConfigOption("--stats-history-topics-max", BrokerConfig, "stats_history_topics_max",
                 "topics with a history (past it, those with the largest backlog)"),
    ConfigOption("--stats-history-subscriptions-max", BrokerConfig, "stats_history_subscriptions_max",
                 "subscriptions with a history (past it, those with the largest backlog)"),
    ConfigOption("--subscription-expiration-time-minutes", BrokerConfig, "subscription_expiration_time_minutes",
                 "delete durable subscriptions without a consumer for this long, where the namespace sets no "
                 "time of its own (0: never)"),
    ConfigOption("--delete-inactive-topics", BrokerConfig, "delete_inactive_topics_enabled",
                 "delete topics without producers and subscriptions after --delete-inactive-topics-max-inactive-s, "
                 "where the namespace's inactive topic policies do not say otherwise", switch_to=True),
    ConfigOption("--delete-inactive-topics-max-inactive-s", BrokerConfig, "delete_inactive_topics_max_inactive_s"),
    ConfigOption("--delete-inactive-topics-mode", BrokerConfig, "delete_inactive_topics_mode",
                 "delete_when_no_subscriptions or delete_when_subscriptions_caught_up"),
    ConfigOption("--delete-inactive-partitioned-metadata", BrokerConfig, "delete_inactive_partitioned_metadata",
                 "delete a partitioned topic once the inactive topic policy deleted its last partition",
                 switch_to=True),
    ConfigOption("--inactivity-check-interval-s", BrokerConfig, "inactivity_check_interval_s",
                 "how often inactive subscriptions and topics are looked for"),
    # Security (broker/authentication.py, broker/authorization.py): off by default.
    ConfigOption("--authentication-enabled", AuthConfig, "authentication_enabled",
                 "clients must present credentials of one of --authentication-providers",
                 switch_to=True),
    ConfigOption("--authentication-providers", AuthConfig, "authentication_providers",
                 "comma-separated providers accepted at once: token, tls (client certificate CN; needs "
                 "--tls-trust-certs-file), basic (needs --basic-auth-file)"),
    ConfigOption("--basic-auth-file", AuthConfig, "basic_auth_file",
                 "htpasswd file of the basic provider (bcrypt hashes, htpasswd -B): a path or file:///path"),
    ConfigOption("--proxy-roles", AuthConfig, "proxy_roles",
                 "comma-separated roles that may ask a permission check for another role (the gateway's)"),
    ConfigOption("--authorization-enabled", AuthConfig, "authorization_enabled",
                 "check roles against superusers, tenant admins and namespace permissions", switch_to=True),
    ConfigOption("--superuser-roles", AuthConfig, "superuser_roles", "comma-separated roles that may do everything"),
    ConfigOption("--token-secret-key", AuthConfig, "token_secret_key",
                 "HS256 secret key: file:///path (prefer a file: a command line is visible to ps)"),
    ConfigOption("--token-public-key", AuthConfig, "token_public_key", "RS256 public key: file:///path"),
    ConfigOption("--anonymous-role", AuthConfig, "anonymous_role",
                 "role of clients presenting no credentials (empty: refuse them)"),
    ConfigOption("--broker-client-token-file", AuthConfig, "broker_client_token_file",
                 "a file holding the token (of a superuser role) this broker presents to other brokers for "
                 "an admin request's calls on the partitions they serve; empty: the caller's own is passed on"),
    ConfigOption("--permission-check-interval-s", AuthConfig, "permission_check_interval_s",
                 "how often connected producers and consumers are checked against current permissions"),
    # TLS (runtime/tls.py): pulsar+ssl:// and HTTPS beside (or instead of) the plain ports.
    ConfigOption("--tls-cert-file", TlsConfig, "cert_file", "PEM certificate chain; turns TLS on"),
    ConfigOption("--tls-key-file", TlsConfig, "key_file", "PEM private key of the certificate"),
    ConfigOption("--tls-trust-certs-file", TlsConfig, "trust_certs_file", "CA certificates for client certificates"),
    ConfigOption("--tls-require-client-cert", TlsConfig, "require_client_cert",
                 "refuse TLS clients without a certificate from --tls-trust-certs-file", switch_to=True),
    ConfigOption("--tls-reload-check-s", TlsConfig, "reload_check_s", "how often certificate files are checked"),
    ConfigOption("--tls-port", BrokerConfig, "tls_port", "pulsar+ssl:// port, with a certificate (0: any free port)"),
    ConfigOption("--http-tls-port", BrokerConfig, "http_tls_port", "HTTPS port, with a certificate (0: any free port)"),
    ConfigOption("--no-plain-ports", BrokerConfig, "plain_ports_enabled",
                 "listen only on the TLS ports", switch_to=False),
    # Toward the bookies (bookie/security.py): TLS and a service token.
    *BOOKIE_CLIENT_SECURITY_OPTIONS,
    ConfigOption("--lease-ttl-s", BundlesConfig, "lease_ttl_s", "a dead broker's bundles move after this"),
    ConfigOption("--load-report-interval-s", BundlesConfig, "report_interval_s"),
    ConfigOption("--leader-interval-s", BundlesConfig, "leader_interval_s"),
    ConfigOption("--shedding-threshold", BundlesConfig, "shedding_threshold"),
    ConfigOption("--no-shedding", BundlesConfig, "shedding_enabled", "never move bundles off loaded brokers",
                 switch_to=False),
    ConfigOption("--shedding-cooldown-s", BundlesConfig, "shedding_cooldown_s"),
    ConfigOption("--default-bundles", BundlesConfig, "default_bundles", "bundles of a new namespace"),
    # The archive (docs/archive.md): where closed ledgers go when a namespace's offload
    # policy names no location, and how the archiver works.
    ConfigOption("--archive-url", ArchiverConfig, "location_url",
                 "archive location (a directory or fsspec URL) for namespaces whose offload policy names none"),
    ConfigOption("--archive-endpoint-url", ArchiverConfig, "endpoint_url",
                 "an S3-compatible store's endpoint for s3:// archive locations (default: "
                 "MAGNETAR_ARCHIVE_ENDPOINT_URL, else AWS); credentials come from the AWS environment "
                 "variables or credentials file, never a flag"),
    ConfigOption("--archive-check-interval-s", ArchiverConfig, "check_interval_s"),
    ConfigOption("--archive-file-mib", ArchiverConfig, "file_bytes_max", "bytes of a ledger per archive file",
                 unit=MIB),
    ConfigOption("--archive-threads", ArchiverConfig, "threads", "worker threads for Arrow encoding and archive file IO"),
    ConfigOption("--archive-read-cache-mib", ArchiverConfig, "read_cache_bytes_max", unit=MIB),
    ConfigOption("--archive-read-ahead-batches", ArchiverConfig, "read_ahead_batches"),
    ConfigOption("--archive-orphan-grace-s", ArchiverConfig, "orphan_grace_s",
                 "files no manifest names are deleted once older than this"),
    ConfigOption("--archive-gc-interval-s", ArchiverConfig, "gc_interval_s",
                 "how often each topic's archive directory is checked for orphans"),
    # TLS toward etcd (metadata/etcd_tls.py).
    *ETCD_TLS_OPTIONS,
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", required=True, help="etcd://host:port[,host:port...]")
    add_config_options(parser, OPTIONS)
    parser.add_argument("--archive-pause-at", default="", choices=["", *ARCHIVE_STEPS],
                        help=argparse.SUPPRESS)   # tests only: stop at an archive step for a kill -9
    parser.add_argument("--compaction-pause-at", default="", choices=["", *COMPACTION_PAUSE_POINTS],
                        help=argparse.SUPPRESS)   # tests only: stop a compaction run for a kill -9


def bundles_config_from_args(args: argparse.Namespace) -> BundlesConfig:
    return BundlesConfig(**config_overrides(args, OPTIONS, BundlesConfig))


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    """BrokerConfig from the flags given; every other field keeps its dataclass default."""
    return BrokerConfig(metadata_url=args.metadata, metadata_tls=etcd_tls_from_args(args),
                        managed_ledger=ManagedLedgerConfig(**config_overrides(args, OPTIONS, ManagedLedgerConfig)),
                        auth=AuthConfig(**config_overrides(args, OPTIONS, AuthConfig)),
                        tls=TlsConfig(**config_overrides(args, OPTIONS, TlsConfig)),
                        compaction_pause_at=args.compaction_pause_at,
                        **config_overrides(args, OPTIONS, BrokerConfig))


def ledger_config_from_args(args: argparse.Namespace) -> LedgerClientConfig:
    return LedgerClientConfig(**bookie_client_security(args))


def archiver_config_from_args(args: argparse.Namespace) -> ArchiverConfig:
    return ArchiverConfig(**config_overrides(args, OPTIONS, ArchiverConfig), pause_at_step=args.archive_pause_at)


class BrokerProcess:
    def __init__(self, config: BrokerConfig, bundles_config: BundlesConfig,
                 archiver_config: ArchiverConfig | None = None, ledger_config: LedgerClientConfig | None = None) -> None:
        self.ledger_config = ledger_config or LedgerClientConfig()
        self.config = config
        self.bundles_config = bundles_config
        self.archiver_config = archiver_config or ArchiverConfig()
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        config = self.config
        loop = asyncio.get_running_loop()
        # Every port first, before anything else starts: a port in use is reported as
        # one line naming its flag (PortInUse), and the URLs the broker advertises need
        # the real port numbers (the service is built once with them).
        tls_context = server_context(config.tls) if config.tls.enabled else None
        servers: list[asyncio.Server] = []
        http_listeners: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        ports: dict[str, int] = {}

        async def bind_binary(field: str, flag: str, context: ssl.SSLContext | None) -> None:
            port = getattr(config, field)
            try:
                # A TLS handshake must finish within the CONNECT deadline (slow-loris).
                server = await loop.create_server(
                    lambda: ServerConnection(service), config.host, port, reuse_address=True, start_serving=False,
                    ssl=context, ssl_handshake_timeout=config.connect_timeout_s if context else None)
            except OSError as error:
                raise bind_failure(flag, config.host, port, error) from None
            servers.append(server)
            ports[field] = server.sockets[0].getsockname()[1]

        def bind_http(field: str, flag: str, context: ssl.SSLContext | None) -> None:
            port = getattr(config, field)
            try:
                listener = bind_listener(config.host, port)
            except OSError as error:
                raise bind_failure(flag, config.host, port, error) from None
            http_listeners.append((listener, context))
            ports[field] = listener.getsockname()[1]

        try:
            if config.plain_ports_enabled:
                await bind_binary("port", "--port", None)
                bind_http("http_port", "--http-port", None)
            if tls_context is not None:
                await bind_binary("tls_port", "--tls-port", tls_context)
                bind_http("http_tls_port", "--http-tls-port", tls_context)
        except PortInUse:
            for server in servers:
                server.close()
            for listener, _ in http_listeners:
                listener.close()
            raise
        config = replace(config, **ports)
        log.info("broker config: %s", config)
        store = open_store(config.metadata_url, tls=config.metadata_tls)
        ledger_client = LedgerClient(store, self.ledger_config, stages=LatencyStages(BROKER_STAGES))
        await ledger_client.start()
        registry = CollectorRegistry()
        publish_latency = Histogram("magnetar_broker_publish_latency_seconds",
                                    "From a SEND's arrival to its receipt (storage included)",
                                    buckets=LATENCY_BUCKETS_S, registry=registry)
        service = BrokerService(config, store, ledger_client, bundles_config=self.bundles_config,
                                on_publish_latency=publish_latency.observe, archiver_config=self.archiver_config)
        topic_series = register_broker_metrics(service, registry)
        # The loop monitor: cancelled and awaited at shutdown.
        background = TaskSet("broker process")
        background.spawn(LoopMonitor(registry, "magnetar_broker").run(), name="loop-monitor")
        runner = web.AppRunner(build_admin_app(service, registry, extra_metrics=topic_series),
                            access_log=None)
        await runner.setup()
        for listener, context in http_listeners:
            await web.SockSite(runner, listener, ssl_context=context).start()
        if tls_context is not None:
            # New certificates are picked up by new handshakes, without a restart.
            background.spawn(CertificateReloader(config.tls, tls_context).run(), name="tls-reload")
        await service.start()
        for server in servers:
            await server.start_serving()
        service.serving = True
        frozen = freeze_startup_heap()
        log.info("broker listening: broker_id=%s service_url=%s web_service_url=%s service_url_tls=%s "
                 "web_service_url_tls=%s frozen_objects=%d", service.broker_id, config.service_url,
                 config.web_service_url, config.service_url_tls or "-", config.web_service_url_tls or "-", frozen)
        try:
            await self.stopping.wait()
        finally:
            log.info("broker stopping: broker_id=%s", service.broker_id)
            # Hand every bundle to another broker first, so clients move without errors.
            await service.hand_over()
            for server in servers:
                server.close()
            await service.close()
            for connection in list(service.connections):
                connection.close()
            for server in servers:
                await server.wait_closed()
            await runner.cleanup()
            await background.close()
            await ledger_client.close()
            await store.close()
            log.info("broker stopped: broker_id=%s", service.broker_id)
        return 0


def main(args: argparse.Namespace) -> int:
    process = BrokerProcess(config_from_args(args), bundles_config_from_args(args), archiver_config_from_args(args),
                            ledger_config_from_args(args))

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
