"""Wiring of ``magnetar broker``: options → BrokerConfig; the metadata store, ledger
client and broker service; the binary-protocol server and the HTTP server (admin REST,
lookups, /health, /metrics); run until SIGTERM/SIGINT, then close every topic (clients
are told to reconnect elsewhere) and stop."""

from __future__ import annotations

import argparse
import asyncio
import logging
from dataclasses import replace

from prometheus_client import CollectorRegistry

from broker.admin.app import build_admin_app
from broker.config import BrokerConfig
from broker.connection import ServerConnection
from broker.managed_ledger import ManagedLedgerConfig
from broker.metrics import BrokerMetrics
from broker.service import BrokerService
from bundles.config import BundlesConfig
from bundles.leader import Leader
from bundles.load import LoadReporter
from bundles.ownership import BrokerIdentity, OwnershipManager
from ledger.client import LedgerClient
from ledger.config import LedgerClientConfig
from common.loop_monitor import LoopMonitor
from common.ops_http import start_ops_server
from common.tasks import TaskSet, cancel_and_wait, stop_on_signals
from metadata import keys, open_store
from metadata.prefix_cache import PrefixCache

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


class BrokerProcess:
    def __init__(self, config: BrokerConfig, bundles_config: BundlesConfig) -> None:
        self.config = config
        self.bundles_config = bundles_config
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        config = self.config
        store = open_store(config.metadata_url)
        ledger_client = LedgerClient(store, LedgerClientConfig())
        await ledger_client.start()
        loop = asyncio.get_running_loop()
        # Bind both ports first: the advertised addresses need the real port numbers.
        server = await loop.create_server(lambda: ServerConnection(service), config.host, config.port,
                                          reuse_address=True, start_serving=False)
        port = server.sockets[0].getsockname()[1]
        config = replace(config, port=port)
        service = BrokerService(config, store, ledger_client)
        service.resources.default_bundles = self.bundles_config.default_bundles
        registry = CollectorRegistry()
        metrics = BrokerMetrics(service, registry)
        loop_monitor = LoopMonitor(registry, "magnetar_broker")
        # The loop monitor and the load reporter: cancelled and awaited at shutdown.
        background = TaskSet("broker process")
        background.spawn(loop_monitor.run(), name="loop-monitor")
        app = build_admin_app(service, registry)
        runner, http_port = await start_ops_server(app, config.host, config.http_port)
        config = replace(config, http_port=http_port)
        service.config = config
        identity = BrokerIdentity(service.broker_id, config.service_url, config.web_service_url)
        brokers = PrefixCache(store, keys.BROKERS)
        await brokers.start()
        ownership = OwnershipManager(store, self.bundles_config, identity,
                                     loaded_topics=service.loaded_topic_names, close_topics=service.close_topics)
        await ownership.start()
        service.ownership = ownership
        service.broker_reports = brokers
        reporter = LoadReporter(store, self.bundles_config, ownership, lambda: _counters(service))
        await reporter.publish()   # the leader must know this broker before assigning to it
        leader = Leader(store, self.bundles_config, identity, lambda: ownership.lease, brokers)
        service.leader = leader
        await leader.start()
        reporter_task = background.spawn(reporter.run(), name="load-reporter")
        await service.start()
        await server.start_serving()
        log.info("broker listening: broker_id=%s service_url=%s web_service_url=%s",
                 service.broker_id, config.service_url, config.web_service_url)
        try:
            await self.stopping.wait()
        finally:
            log.info("broker stopping: broker_id=%s", service.broker_id)
            # Hand every bundle to another broker first, so clients move without errors.
            await leader.step_down()
            await ownership.release_all(lambda _bundle: ownership.handover_target(brokers))
            await cancel_and_wait(reporter_task)
            await leader.close()
            if ownership.lease is not None:
                await store.revoke_lease(ownership.lease)
            await ownership.close()
            await brokers.close()
            server.close()
            await service.close()
            for connection in list(service.connections):
                connection.close()
            await server.wait_closed()
            await runner.cleanup()
            await background.close()
            del metrics
            await ledger_client.close()
            await store.close()
            log.info("broker stopped: broker_id=%s", service.broker_id)
        return 0


def _counters(service: BrokerService) -> tuple[dict[str, tuple[int, int]], int]:
    topics = {}
    for topic in service.loaded_topics():
        out = sum(s.dispatcher.messages_dispatched for s in topic.subscriptions.values())
        topics[topic.full_name] = (topic.messages_in, out)
    return topics, len(service.connections)


def main(args: argparse.Namespace) -> int:
    process = BrokerProcess(config_from_args(args), bundles_config_from_args(args))

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
