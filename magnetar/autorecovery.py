"""``magnetar autorecovery``: an auditor candidate plus a replication worker, with
/health, /live, /ready and /metrics.

    magnetar autorecovery --metadata etcd://127.0.0.1:2379 --http-port 8010

Run one or more anywhere (their own processes rather than threads inside the bookies,
so that re-replication scales and fails apart from the storage nodes, restarts without
touching a bookie, and is one Kubernetes Deployment with probes of its own). Exactly
one of them is the auditor at a time (elected through etcd); all of them replicate.
The auditor also runs the ledger collector (managed_ledger/ledger_gc.py): orphan ledgers of
topics, deleted after a grace period. It lives here rather than in a broker task
because this election already exists, the process already holds a ledger client and
reads every ledger's metadata each audit, and its passes then cost the brokers'
serving loop nothing; the collector's safety does not rest on the election (each
delete is one guarded etcd transaction), only its efficiency does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import uuid

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from runtime.config_options import ConfigOption, add_config_options, config_overrides
from runtime.ops_http import HealthCheck, add_ready_route, build_ops_app, start_ops_server
from runtime.tasks import stop_on_signals
from managed_ledger.ledger_gc import LedgerCollector, LedgerGcConfig
from ledger.auditor import Auditor
from ledger.client import LedgerClient
from ledger.config import BOOKIE_CLIENT_SECURITY_OPTIONS, AutoRecoveryConfig, LedgerClientConfig, bookie_client_security
from ledger.replication import ReplicationWorker
from metadata import open_store
from metadata.etcd_tls import add_etcd_tls_arguments, etcd_tls_from_args

log = logging.getLogger(__name__)

OPTIONS: list[ConfigOption] = [
    ConfigOption("--grace-period-s", AutoRecoveryConfig, "grace_period_s",
                 "a bookie unregistered this long is gone and its fragments are re-replicated"),
    ConfigOption("--audit-interval-s", AutoRecoveryConfig, "audit_interval_s"),
    ConfigOption("--worker-interval-s", AutoRecoveryConfig, "worker_interval_s"),
    ConfigOption("--lease-ttl-s", AutoRecoveryConfig, "lease_ttl_s",
                 "a dead auditor or worker is replaced this long after it died"),
    ConfigOption("--rate-bytes-per-s", AutoRecoveryConfig, "rate_bytes_per_s",
                 "re-replication bytes per second per worker"),
    # The ledger collector (managed_ledger/ledger_gc.py), run by the elected auditor.
    ConfigOption("--no-ledger-gc", LedgerGcConfig, "enabled", "never collect orphan ledgers", switch_to=False),
    ConfigOption("--ledger-gc-grace-s", LedgerGcConfig, "grace_s",
                 "a ledger no topic references is deleted once older than this"),
    ConfigOption("--ledger-gc-interval-s", LedgerGcConfig, "interval_s"),
    ConfigOption("--ledger-gc-ledgers-per-pass-max", LedgerGcConfig, "ledgers_per_pass_max"),
    ConfigOption("--ledger-gc-call-timeout-s", LedgerGcConfig, "call_timeout_s"),
    # Bookies with authentication on refuse adds and reads without a service token;
    # bookies serving TLS need --bookie-tls (and a client certificate when they require one).
    *BOOKIE_CLIENT_SECURITY_OPTIONS,
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", required=True, help="etcd://host:port[,host:port...]")
    add_etcd_tls_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address of /health, /live, /ready and /metrics")
    parser.add_argument("--http-port", type=int, default=8010,
                        help="/health, /live, /ready and /metrics (0: any free port)")
    parser.add_argument("--id", default="", help="this process's id (default: host-pid-random)")
    add_config_options(parser, OPTIONS)


def ledger_config_from_args(args: argparse.Namespace) -> LedgerClientConfig:
    return LedgerClientConfig(**bookie_client_security(args))


class _Collector:
    """Exposes the auditor's last round and the worker's counters at scrape time."""

    def __init__(self, auditor: Auditor, worker: ReplicationWorker, collector: LedgerCollector) -> None:
        self._auditor = auditor
        self._worker = worker
        self._collector = collector

    def collect(self):
        result = self._auditor.last_result if self._auditor.elected else None
        ledgers = GaugeMetricFamily("magnetar_autorecovery_under_replicated_ledgers",
                                    "closed ledgers with a fragment on a gone or decommissioning bookie "
                                    "(reported by the auditor)")
        fragments = GaugeMetricFamily("magnetar_autorecovery_under_replicated_fragments",
                                      "fragments on a gone or decommissioning bookie (reported by the auditor)")
        if result is not None:
            ledgers.add_metric([], result.under_replicated_ledgers)
            fragments.add_metric([], result.under_replicated_fragments)
        yield ledgers
        yield fragments
        auditor = GaugeMetricFamily("magnetar_autorecovery_auditor", "1 while this process is the auditor")
        auditor.add_metric([], 1 if self._auditor.elected else 0)
        yield auditor
        stats = self._worker.stats
        for name, value, text in (
            ("bytes_rereplicated", stats.bytes_replicated, "bytes copied to replacement bookies"),
            ("entries_rereplicated", stats.entries_replicated, "entries copied to replacement bookies"),
            ("fragments_rereplicated", stats.fragments_replicated, "ensemble swaps made"),
            ("replication_failures", stats.failures, "ledgers whose re-replication failed (retried)"),
        ):
            counter = CounterMetricFamily(f"magnetar_autorecovery_{name}", text)
            counter.add_metric([], value)
            yield counter
        gc = self._collector.stats
        for name, value, text in (
            ("ledgers_collected", gc.ledgers_collected, "orphan ledgers deleted by the ledger collector"),
            ("ledgers_examined", gc.ledgers_examined, "ledgers the ledger collector looked at"),
            ("deletes_refused", gc.deletes_refused,
             "collector deletes refused by their transaction (a reference appeared meanwhile)"),
            ("read_failures", gc.read_failures, "ledgers or owners the collector could not read (kept)"),
            ("passes", gc.passes, "ledger collector passes"),
        ):
            counter = CounterMetricFamily(f"magnetar_autorecovery_ledger_gc_{name}", text)
            counter.add_metric([], value)
            yield counter
        duration = GaugeMetricFamily("magnetar_autorecovery_ledger_gc_pass_duration_seconds",
                                     "how long the ledger collector's last pass took")
        duration.add_metric([], gc.last_pass_s)
        yield duration


def build_app(registry: CollectorRegistry, health: HealthCheck, ready: HealthCheck) -> web.Application:
    """The HTTP endpoint: /health and /live (the process answers), /ready (its ledger
    client started: it reads the bookies' registry from etcd and can audit and copy;
    503 before and while stopping), /metrics."""
    app = build_ops_app(registry, health)
    add_ready_route(app, ready)
    return app


async def _run(args: argparse.Namespace) -> int:
    config = AutoRecoveryConfig(**config_overrides(args, OPTIONS, AutoRecoveryConfig))
    process_id = args.id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    stopping = asyncio.Event()
    stop_on_signals(stopping)
    store = open_store(args.metadata, tls=etcd_tls_from_args(args))
    client = LedgerClient(store, ledger_config_from_args(args))
    auditor = Auditor(store, config, process_id)
    worker = ReplicationWorker(client.context, config, process_id)
    collector = LedgerCollector(store, client, LedgerGcConfig(**config_overrides(args, OPTIONS, LedgerGcConfig)))
    registry = CollectorRegistry()
    registry.register(_Collector(auditor, worker, collector))
    up = Gauge("magnetar_autorecovery_up", "1 while serving", registry=registry)

    async def health() -> tuple[bool, dict]:
        return True, {"id": process_id, "auditor": auditor.elected, "audit_rounds": auditor.rounds}

    started = False

    async def ready() -> tuple[bool, dict]:
        if not started or stopping.is_set():
            return False, {"id": process_id, "reason": "stopping" if stopping.is_set() else "starting"}
        return True, {"id": process_id, "auditor": auditor.elected}

    runner, http_port = await start_ops_server(build_app(registry, health, ready), args.host, args.http_port)
    try:
        await client.start()
        started = True
        up.set(1)
        log.info("autorecovery listening: id=%s http_address=%s:%d grace_period_s=%s",
                 process_id, args.host, http_port, config.grace_period_s)
        async with asyncio.TaskGroup() as tasks:
            running = [tasks.create_task(auditor.run()), tasks.create_task(worker.run()),
                       tasks.create_task(collector.run(lambda: auditor.elected))]
            await stopping.wait()
            log.info("autorecovery stopping: id=%s", process_id)
            for task in running:
                task.cancel()
    finally:
        await client.close()
        await runner.cleanup()
        await store.close()
    return 0


def main(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
