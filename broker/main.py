"""Wiring of ``magnetar broker``: options → BrokerConfig; the metadata store, ledger
client and broker service; the binary-protocol server and the HTTP server (admin REST,
lookups, /health, /metrics); run until SIGTERM/SIGINT, then close every topic (clients
are told to reconnect elsewhere) and stop."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import replace

from prometheus_client import CollectorRegistry, Histogram

from broker.admin.app import build_admin_app
from broker.archiver import STEPS as ARCHIVE_STEPS
from broker.archiver import ArchiverConfig
from broker.config import BrokerConfig
from broker.connection import ServerConnection
from broker.managed_ledger import ManagedLedgerConfig
from broker.metrics import register_broker_metrics
from broker.service import BrokerService
from bundles.config import BundlesConfig
from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from common.loop_monitor import LoopMonitor
from common.histograms import LATENCY_BUCKETS_S
from common.ops_http import bind_listener, start_ops_server_on
from common.tasks import cancel_and_wait, stop_on_signals
from metadata import open_store

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", required=True, help="etcd://host:port[,host:port...]")
    parser.add_argument("--cluster", default="standalone")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6650, help="binary protocol port (0: any)")
    parser.add_argument("--http-port", type=int, default=8080, help="admin REST and /metrics (0: any)")
    parser.add_argument("--broker-id", default="")
    parser.add_argument("--ensemble-size", type=int, default=2)
    parser.add_argument("--write-quorum", type=int, default=2)
    parser.add_argument("--ack-quorum", type=int, default=2)
    parser.add_argument("--ledger-max-entries", type=int, default=50_000)
    parser.add_argument("--ledger-max-mib", type=int, default=2048)
    parser.add_argument("--ledger-max-age-s", type=float, default=4 * 3600.0)
    parser.add_argument("--entry-cache-mib", type=int, default=512)
    parser.add_argument("--cursor-flush-interval-s", type=float, default=1.0)
    parser.add_argument("--dispatch-entries-max", type=int, default=100,
                        help="entries read from storage per dispatch round of a subscription")
    parser.add_argument("--dispatch-mib-max", type=int, default=4,
                        help="bytes (MiB) read per dispatch round of a subscription")
    parser.add_argument("--keepalive-interval-s", type=float, default=30.0)
    parser.add_argument("--max-message-size", type=int, default=5 * 1024 * 1024)
    parser.add_argument("--no-auto-topic-creation", action="store_true")
    parser.add_argument("--retention-check-interval-s", type=float, default=5.0)
    parser.add_argument("--lease-ttl-s", type=int, default=10, help="a dead broker's bundles move after this")
    parser.add_argument("--load-report-interval-s", type=float, default=5.0)
    parser.add_argument("--leader-interval-s", type=float, default=1.0)
    parser.add_argument("--shedding-threshold", type=float, default=0.25)
    parser.add_argument("--no-shedding", action="store_true")
    parser.add_argument("--shedding-cooldown-s", type=float, default=30.0)
    parser.add_argument("--default-bundles", type=int, default=4)
    # The archive (docs/archive.md): where closed ledgers go when a namespace's offload
    # policy names no location, and how the archiver works.
    parser.add_argument("--archive-url", default="",
                        help="archive location (a directory or fsspec URL) for namespaces whose offload policy "
                             "names none")
    parser.add_argument("--archive-check-interval-s", type=float, default=5.0)
    parser.add_argument("--archive-file-mib", type=int, default=128, help="bytes of a ledger per archive file")
    parser.add_argument("--archive-threads", type=int, default=2,
                        help="worker threads for Arrow encoding and archive file IO")
    parser.add_argument("--archive-read-cache-mib", type=int, default=128)
    parser.add_argument("--archive-read-ahead-batches", type=int, default=2)
    parser.add_argument("--archive-orphan-grace-s", type=float, default=3600.0,
                        help="files no manifest names are deleted once older than this")
    parser.add_argument("--archive-gc-interval-s", type=float, default=300.0,
                        help="how often each topic's archive directory is checked for orphans")
    parser.add_argument("--archive-pause-at", default="", choices=["", *ARCHIVE_STEPS],
                        help=argparse.SUPPRESS)   # tests only: stop at an archive step for a kill -9


def bundles_config_from_args(args: argparse.Namespace) -> BundlesConfig:
    return BundlesConfig(lease_ttl_s=args.lease_ttl_s, report_interval_s=args.load_report_interval_s,
                         leader_interval_s=args.leader_interval_s, shedding_enabled=not args.no_shedding,
                         shedding_threshold=args.shedding_threshold, shedding_cooldown_s=args.shedding_cooldown_s,
                         default_bundles=args.default_bundles)


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    return BrokerConfig(
        metadata_url=args.metadata, cluster=args.cluster, host=args.host, port=args.port,
        http_port=args.http_port, broker_id=args.broker_id,
        managed_ledger=ManagedLedgerConfig(
            ensemble_size=args.ensemble_size, write_quorum_size=args.write_quorum, ack_quorum_size=args.ack_quorum,
            ledger_entries_max=args.ledger_max_entries, ledger_bytes_max=args.ledger_max_mib * 1024 * 1024,
            ledger_age_s_max=args.ledger_max_age_s),
        entry_cache_bytes_max=args.entry_cache_mib * 1024 * 1024,
        cursor_flush_interval_s=args.cursor_flush_interval_s,
        dispatch_entries_max=args.dispatch_entries_max,
        dispatch_bytes_max=args.dispatch_mib_max * 1024 * 1024,
        keepalive_interval_s=args.keepalive_interval_s,
        max_message_size=args.max_message_size,
        allow_auto_topic_creation=not args.no_auto_topic_creation,
        retention_check_interval_s=args.retention_check_interval_s,
    )


def archiver_config_from_args(args: argparse.Namespace) -> ArchiverConfig:
    return ArchiverConfig(location_url=args.archive_url, check_interval_s=args.archive_check_interval_s,
                          file_bytes_max=args.archive_file_mib * 1024 * 1024, threads=args.archive_threads,
                          read_cache_bytes_max=args.archive_read_cache_mib * 1024 * 1024,
                          read_ahead_batches=args.archive_read_ahead_batches,
                          orphan_grace_s=args.archive_orphan_grace_s, gc_interval_s=args.archive_gc_interval_s,
                          pause_at_step=args.archive_pause_at)


class BrokerProcess:
    def __init__(self, config: BrokerConfig, bundles_config: BundlesConfig,
                 archiver_config: ArchiverConfig | None = None) -> None:
        self.config = config
        self.bundles_config = bundles_config
        self.archiver_config = archiver_config or ArchiverConfig()
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        config = self.config
        loop = asyncio.get_running_loop()
        # Bind both ports first: the URLs the broker advertises need the real port
        # numbers, and the service is built once with them.
        server = await loop.create_server(lambda: ServerConnection(service), config.host, config.port,
                                          reuse_address=True, start_serving=False)
        http_listener = bind_listener(config.host, config.http_port)
        config = replace(config, port=server.sockets[0].getsockname()[1],
                         http_port=http_listener.getsockname()[1])
        store = open_store(config.metadata_url)
        ledger_client = LedgerClient(store, LedgerClientConfig())
        await ledger_client.start()
        registry = CollectorRegistry()
        publish_latency = Histogram("magnetar_broker_publish_latency_seconds",
                                    "From a SEND's arrival to its receipt (storage included)",
                                    buckets=LATENCY_BUCKETS_S, registry=registry)
        service = BrokerService(config, store, ledger_client, bundles_config=self.bundles_config,
                                on_publish_latency=publish_latency.observe, archiver_config=self.archiver_config)
        register_broker_metrics(service, registry)
        loop_monitor = LoopMonitor(registry, "magnetar_broker")
        monitor_task = loop.create_task(loop_monitor.run())
        runner = await start_ops_server_on(build_admin_app(service, registry), http_listener)
        await service.start()
        await server.start_serving()
        log.info("broker listening: broker_id=%s service_url=%s web_service_url=%s",
                 service.broker_id, config.service_url, config.web_service_url)
        try:
            await self.stopping.wait()
        finally:
            log.info("broker stopping: broker_id=%s", service.broker_id)
            await cancel_and_wait(monitor_task)
            # Hand every bundle to another broker first, so clients move without errors.
            await service.hand_over()
            server.close()
            await service.close()
            for connection in list(service.connections):
                connection.close()
            await server.wait_closed()
            await runner.cleanup()
            await ledger_client.close()
            await store.close()
            log.info("broker stopped: broker_id=%s", service.broker_id)
        return 0


def main(args: argparse.Namespace) -> int:
    process = BrokerProcess(config_from_args(args), bundles_config_from_args(args), archiver_config_from_args(args))

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
