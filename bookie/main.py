"""Wiring of ``magnetar bookie``: parse options into BookieConfig, start the bookie's
components in order (``BookieProcess``: metadata store, gRPC port, ops HTTP server,
storage, servicer, add socket, gRPC server, registration; runtime/lifecycle.py), run
the checkpointer, GC, disk monitor and journal under one TaskGroup until SIGTERM/SIGINT
(or a fatal journal error), then stop the components in reverse."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import grpc
from prometheus_client import CollectorRegistry

from bookie import disk_monitor
from bookie.config import (
    HTTP_PORT_OFFSET,
    MIB,
    BookieConfig,
    DiskConfig,
    GcConfig,
    JournalConfig,
    LedgerStorageConfig,
)
from bookie.gc import run_gc
from bookie.ledger_storage_disk import DiskLedgerStorage
from bookie.metrics import BookieMetrics
from bookie.node import BookieNode
from protocol.proto import bookie_pb2_grpc
from bookie.registration import Registration, check_cookie
from bookie.add_socket import AddSocketServer
from bookie.server import BookieServicer
from runtime.config_options import ConfigOption, add_config_options, config_overrides
from common.errors import MagnetarError
from common.version import __version__
from runtime.listen import bind_failure, probe_bind
from runtime.gc_pauses import freeze_startup_heap
from runtime.lifecycle import Component, LifecycleStack
from runtime.loop_monitor import LoopMonitor
from runtime.ops_http import add_ready_route, build_ops_app, start_ops_server
from runtime.tasks import stop_on_signals
from metadata import open_store
from metadata.etcd_tls import ETCD_TLS_OPTIONS, etcd_tls_from_args
from metadata.start_retry import while_unavailable
from metadata.store import MetadataStore
from metadata.bookie_record import BookieRecord
from bookie.security import BookieSecurityConfig, TokenInterceptor, server_credentials
from runtime.tls import CertificateReloader, TlsConfig, server_context

log = logging.getLogger(__name__)


# Every flag that sets a config field; the defaults are the dataclasses' own.
OPTIONS: list[ConfigOption] = [
    ConfigOption("--host", BookieConfig, "host", "address to listen on"),
    ConfigOption("--port", BookieConfig, "port", "gRPC port (0: any free port)"),
    ConfigOption("--add-socket-port", BookieConfig, "add_socket_port",
                 "the add socket: adds without gRPC for writers that choose it (0: any free port; -1: off)"),
    ConfigOption("--http-port", BookieConfig, "http_port",
                 "/health and /metrics (0: any free port)", type=int,
                 default_text=f"--port + {HTTP_PORT_OFFSET}, so 8001 for 3181; 0 with --port 0"),
    ConfigOption("--bookie-id", BookieConfig, "bookie_id", "the id registered in etcd",
                 default_text="the advertised address"),
    ConfigOption("--advertised-address", BookieConfig, "advertised_address",
                 "host:port writers and readers connect to (registered in etcd)", default_text="host:port"),
    ConfigOption("--registration-ttl-s", BookieConfig, "registration_ttl_s",
                 "a dead bookie disappears from writers' view this long after its last keep-alive"),
    ConfigOption("--disk-usage-threshold", DiskConfig, "usage_threshold",
                 "share of a disk in use past which the bookie turns read-only"),
    ConfigOption("--disk-usage-lwm-threshold", DiskConfig, "usage_lwm_threshold",
                 "writable again below this share", default_text="--disk-usage-threshold - 0.05, so 0.9"),
    ConfigOption("--disk-check-interval-s", DiskConfig, "check_interval_s"),
    ConfigOption("--gc-interval-s", GcConfig, "interval_s", "how often deleted ledgers are looked for"),
    ConfigOption("--compaction-live-ratio", GcConfig, "compaction_live_ratio_min",
                 "entry logs with less live data than this share are compacted"),
    ConfigOption("--flush-interval-s", LedgerStorageConfig, "flush_interval_s",
                 "the write cache is flushed to entry logs at least this often"),
    ConfigOption("--write-cache-mib", LedgerStorageConfig, "write_cache_bytes_max", unit=MIB),
    ConfigOption("--read-cache-mib", LedgerStorageConfig, "read_cache_bytes_max", unit=MIB),
    ConfigOption("--entry-log-mib", LedgerStorageConfig, "entry_log_bytes_max",
                 "entry logs rotate at this size", unit=MIB),
    ConfigOption("--journal-file-mib", JournalConfig, "file_bytes_max", "journal files rotate at this size",
                 unit=MIB),
    ConfigOption("--journal-group-mib", JournalConfig, "group_bytes_max",
                 "the most one journal write + fdatasync carries (must hold the largest entry)", unit=MIB),
    ConfigOption("--journal-preallocate-mib", JournalConfig, "preallocate_bytes",
                 "journal space is allocated ahead of the writes in steps of this size (0: files grow "
                 "with each write)", unit=MIB),
    ConfigOption("--journal-queue-mib", JournalConfig, "queue_bytes_max",
                 "adds queued for the journal beyond this wait (back-pressure to writers)", unit=MIB),
    # Security (bookie/security.py): service tokens on every RPC, TLS on the gRPC port.
    ConfigOption("--authentication-enabled", BookieSecurityConfig, "authentication_enabled",
                 "every RPC must carry a service token of an allowed role", switch_to=True),
    ConfigOption("--token-secret-key", BookieSecurityConfig, "token_secret_key", "HS256 secret key: file:///path"),
    ConfigOption("--token-public-key", BookieSecurityConfig, "token_public_key", "RS256 public key: file:///path"),
    ConfigOption("--allowed-roles", BookieSecurityConfig, "allowed_roles",
                 "comma-separated roles that may add and read (the brokers' service role)"),
    ConfigOption("--tls-cert-file", TlsConfig, "cert_file", "PEM certificate chain; turns TLS on"),
    ConfigOption("--tls-key-file", TlsConfig, "key_file"),
    ConfigOption("--tls-trust-certs-file", TlsConfig, "trust_certs_file", "CA certificates for client certificates"),
    ConfigOption("--tls-require-client-cert", TlsConfig, "require_client_cert",
                 "mutual TLS: refuse clients without a certificate from --tls-trust-certs-file", switch_to=True),
    ConfigOption("--group-wait-ms", JournalConfig, "group_wait_ms_max",
                 "how long an idle journal writer waits for more adds to share one write + fdatasync "
                 "(0: write as soon as the queue is drained)"),
    # TLS toward etcd (metadata/etcd_tls.py).
    *ETCD_TLS_OPTIONS,
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", required=True, help="etcd://host:port[,host:port...]")
    parser.add_argument("--journal-dir", required=True)
    parser.add_argument("--ledger-dir", action="append", required=True, dest="ledger_dirs",
                        help="a ledger (data) directory; repeat for several disks")
    add_config_options(parser, OPTIONS)


def config_from_args(args: argparse.Namespace) -> BookieConfig:
    """BookieConfig from the flags given; every other field keeps its dataclass default."""
    disk = config_overrides(args, OPTIONS, DiskConfig)
    if "usage_threshold" in disk and "usage_lwm_threshold" not in disk:
        threshold = disk["usage_threshold"]
        # Rounded: 0.95 - 0.05 is 0.8999999999999999 in binary, not DiskConfig's 0.9.
        disk["usage_lwm_threshold"] = round(max(threshold - 0.05, threshold / 2), 6)
    return BookieConfig(
        metadata_url=args.metadata,
        metadata_tls=etcd_tls_from_args(args),
        journal=JournalConfig(journal_dir=args.journal_dir, **config_overrides(args, OPTIONS, JournalConfig)),
        storage=LedgerStorageConfig(ledger_dirs=tuple(args.ledger_dirs),
                                    **config_overrides(args, OPTIONS, LedgerStorageConfig)),
        gc=GcConfig(**config_overrides(args, OPTIONS, GcConfig)),
        disk=DiskConfig(**disk),
        security=BookieSecurityConfig(**config_overrides(args, OPTIONS, BookieSecurityConfig),
                                      tls=TlsConfig(**config_overrides(args, OPTIONS, TlsConfig))),
        **config_overrides(args, OPTIONS, BookieConfig),
    )


def add_address_for(address: str, add_port: int) -> str:
    """The add socket's registered address: the host writers dial for gRPC (``address``:
    the advertised address when given, such as a pod's DNS name, so not the bound
    0.0.0.0) with the add socket's port."""
    return f"{address.rsplit(':', 1)[0]}:{add_port}"


async def _nothing_to_stop() -> None:
    """The servicer holds nothing of its own: the gRPC server and the node it serves
    stop as components of their own."""


class BookieProcess:
    """``magnetar bookie``: its start-up is a stack of named components (runtime/lifecycle.py),
    started in this order and stopped in reverse — the metadata store; the gRPC port (bound
    before anything else starts, so a port in use is reported before storage is opened);
    the ops HTTP server; storage (cookie check, journal replay, disk usage); the add
    socket; the gRPC server; the registration in etcd — then the background tasks run
    under one TaskGroup until SIGTERM/SIGINT or a fatal journal error."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.stopping = asyncio.Event()
        self.exit_code = 0
        self.add_address = ""
        # Set by the components as they start (see run).
        self.store: MetadataStore | None = None
        self.server: grpc.aio.Server | None = None
        self.tokens: TokenInterceptor | None = None
        self.address = ""
        self.bookie_id = ""
        self.registry = CollectorRegistry()
        self.http_address = ""
        self.node: BookieNode | None = None
        self.storage: DiskLedgerStorage | None = None
        self.directories: list[str] = []
        self.servicer: BookieServicer | None = None
        self.add_socket: AddSocketServer | None = None
        self.add_socket_tls = None
        self.registration: Registration | None = None
        self.started_at_ms = 0
        # Filled in once storage is open and the bookie registered; until then /health
        # answers 503 "starting" (journal replay may take a while).
        self._serving: dict[str, object] = {}
        self._runner = None
        self._grpc_started = False
        self._journal_task: asyncio.Task[None] | None = None
        self._stopping_orderly = False
        self.loop_monitor: LoopMonitor | None = None

    def _record(self, node: BookieNode, address: str, http_address: str, started_at_ms: int) -> BookieRecord:
        usage = node.disk_usage
        return BookieRecord(
            bookie_id=node.bookie_id, address=address, http_address=http_address, read_only=node.read_only,
            free_bytes=usage.free_bytes if usage else 0, total_bytes=usage.total_bytes if usage else 0,
            disk_usage_ratio=usage.ratio if usage else 0.0, version=__version__, started_at_ms=started_at_ms,
            add_address=self.add_address)

    async def run(self) -> int:
        log.info("bookie starting: config=%s", self.config)
        stack = LifecycleStack("bookie", [
            Component("metadata store", self._open_store, self._close_store),
            Component("gRPC port", self._bind_grpc_port, self._release_grpc_port),
            Component("ops HTTP", self._start_ops_http, self._stop_ops_http),
            Component("storage", self._open_storage, self._close_storage),
            Component("servicer", self._build_servicer, _nothing_to_stop),
            Component("add socket", self._start_add_socket, self._close_add_socket),
            Component("gRPC server", self._start_grpc, self._stop_grpc),
            Component("registration", self._register, self._unregister),
        ])
        await stack.start()
        node = self.node
        assert node is not None
        frozen = freeze_startup_heap()
        log.info("bookie listening: bookie_id=%s address=%s http_address=%s add_address=%s read_only=%s replayed=%d "
                 "frozen_objects=%d", self.bookie_id, self.address, self.http_address, self.add_address or "-",
                 node.read_only, node.replayed_records, frozen)
        try:
            await self._serve(stack)
        finally:
            await stack.stop()   # after a failure; nothing left to stop after an orderly stop
        log.info("bookie stopped: bookie_id=%s", self.bookie_id)
        return self.exit_code

    # --- components, in start order -----------------------------------------------------

    async def _open_store(self) -> None:
        config = self.config
        self.store = open_store(config.metadata_url, tls=config.metadata_tls)

    async def _close_store(self) -> None:
        assert self.store is not None
        await self.store.close()

    async def _bind_grpc_port(self) -> None:
        config = self.config
        # One token check for gRPC and the add socket: one key file watched, one cache.
        tokens = TokenInterceptor(config.security) if config.security.authentication_enabled else None
        self.tokens = tokens
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.grpc_message_bytes_max),
                ("grpc.max_send_message_length", config.grpc_message_bytes_max),
                ("grpc.so_reuseport", 0),
                # Clients ping every 10 s to notice dead bookies; without these the
                # server answers such pings on an idle stream with GOAWAY "too many
                # pings", breaking every add stream of a writer at once.
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
                ("grpc.http2.max_ping_strikes", 0),
            ],
            maximum_concurrent_rpcs=config.concurrent_rpcs_max,
            # Service tokens, checked before any servicer runs (bookie/security.py).
            interceptors=[tokens] if tokens is not None else None,
        )
        # Both ports are bound before anything else starts, so that a port in use is
        # reported (PortInUse, one line naming the flag) before storage is opened.
        # Probed first: grpc's own failure is a native log line and a RuntimeError that
        # does not say why; the probe finds the reason (a race after it still fails
        # cleanly below).
        refused = probe_bind(config.host, config.port) if config.port else None
        if refused is not None:
            raise bind_failure("--port", config.host, config.port, refused)
        try:
            if config.security.tls.enabled:
                port = server.add_secure_port(f"{config.host}:{config.port}",
                                              server_credentials(config.security.tls))
            else:
                port = server.add_insecure_port(f"{config.host}:{config.port}")
        except RuntimeError:   # grpc says only that binding failed
            port = 0
        if port == 0:
            raise bind_failure("--port", config.host, config.port, probe_bind(config.host, config.port))
        self.server = server
        listen_address = f"{config.host}:{port}"
        self.address = config.advertised_address or listen_address
        self.bookie_id = config.bookie_id or self.address

    async def _release_grpc_port(self) -> None:
        """A server that never started serving lets its port go (one that served was
        stopped, gracefully, by its own component)."""
        assert self.server is not None
        if not self._grpc_started:
            await self.server.stop(grace=None)

    async def _start_ops_http(self) -> None:
        config = self.config
        bookie_id, serving = self.bookie_id, self._serving

        async def health() -> tuple[bool, dict]:
            node_now, registration_now = serving.get("node"), serving.get("registration")
            if not isinstance(node_now, BookieNode) or not isinstance(registration_now, Registration):
                return False, {"bookie_id": bookie_id, "starting": True}
            ok = registration_now.registered and node_now.journal is not None and node_now.journal.failed is None
            return ok, {"bookie_id": bookie_id, "read_only": node_now.read_only,
                        "registered": registration_now.registered}

        async def ready() -> tuple[bool, dict]:
            # Readiness: registered (writers see it) and writable. A read-only bookie
            # still serves reads (it stays resolvable: the headless Service publishes
            # addresses that are not ready) but counts as unavailable for disruption
            # budgets, so no other bookie is drained while its disks are full.
            ok, details = await health()
            return ok and not details.get("read_only", True), details

        ops_app = build_ops_app(self.registry, health)
        add_ready_route(ops_app, ready)
        self._runner, http_port = await start_ops_server(ops_app, config.host, config.http_port,
                                                         flag="--http-port")
        self.http_address = f"{self.address.rsplit(':', 1)[0]}:{http_port}"

    async def _stop_ops_http(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _open_storage(self) -> None:
        config, store = self.config, self.store
        assert store is not None
        await while_unavailable("cookie check", lambda: check_cookie(
            store, self.bookie_id, config.journal.journal_dir, list(config.storage.ledger_dirs)))
        self.storage = DiskLedgerStorage(config.storage, read_threads=config.read_threads,
                                         fsync_enabled=config.journal.fsync_enabled)
        node = self.node = BookieNode(config, self.storage, self.bookie_id)
        try:
            await asyncio.to_thread(node.open)
            assert node.journal is not None
            self.directories = [config.journal.journal_dir, *config.storage.ledger_dirs]
            node.disk_usage = await asyncio.to_thread(disk_monitor.measure, self.directories)
            node.read_only = disk_monitor.decide_read_only(False, node.disk_usage.ratio,
                                                           config.disk.usage_threshold,
                                                           config.disk.usage_lwm_threshold)
        except BaseException:
            await self._close_storage()
            raise

    async def _close_storage(self) -> None:
        """After serving: the journal stops (its last group written; not after a task
        failed, which ended it), then a checkpoint unless the journal failed; then the
        storage closes. After a failed start: only the storage closes."""
        node, storage = self.node, self.storage
        assert node is not None and storage is not None
        try:
            if self._journal_task is not None:
                if self._stopping_orderly:
                    await node.close()
                    await self._journal_task
                if node.journal is not None and node.journal.failed is None:
                    await node.checkpoint()
            await storage.close()
        finally:
            if node.journal is not None:
                node.journal.close_file()

    async def _build_servicer(self) -> None:
        node, server = self.node, self.server
        assert node is not None and server is not None
        metrics = BookieMetrics(node, self.registry)
        self.loop_monitor = LoopMonitor(self.registry, "magnetar_bookie")
        self.servicer = BookieServicer(node, metrics)
        bookie_pb2_grpc.add_BookieServicer_to_server(self.servicer, server)

    async def _start_add_socket(self) -> None:
        config = self.config
        if config.add_socket_port < 0:
            return
        # TLS on the add socket: the gRPC port's certificate, kept in step with its files.
        self.add_socket_tls = server_context(config.security.tls) if config.security.tls.enabled else None
        tokens = self.tokens
        self.add_socket = AddSocketServer(
            self.servicer, message_bytes_max=config.grpc_message_bytes_max,
            token_check=tokens.check_token if tokens is not None else None,
            ssl_context=self.add_socket_tls)
        try:
            add_port = await self.add_socket.start(config.host, config.add_socket_port)
        except BaseException:
            await self.add_socket.close()
            raise
        self.add_address = add_address_for(self.address, add_port)

    async def _close_add_socket(self) -> None:
        if self.add_socket is not None:
            await self.add_socket.close()

    async def _start_grpc(self) -> None:
        assert self.server is not None and self.store is not None
        self.registration = Registration(self.store, self.config.registration_ttl_s)
        self._serving.update(node=self.node, registration=self.registration)
        self.started_at_ms = int(time.time() * 1000)
        await self.server.start()
        self._grpc_started = True

    async def _stop_grpc(self) -> None:
        assert self.server is not None
        await self.server.stop(grace=2.0)

    async def _register(self) -> None:
        assert self.registration is not None and self.node is not None
        await self.registration.register(self._record(self.node, self.address, self.http_address,
                                                      self.started_at_ms))

    async def _unregister(self) -> None:
        assert self.registration is not None
        try:
            await self.registration.unregister()
        except MagnetarError:
            pass

    # --- serving --------------------------------------------------------------------------

    async def _serve(self, stack: LifecycleStack) -> None:
        """The background tasks until told to stop; then they are cancelled and the
        components stopped (the journal's task ends when the storage stops it)."""
        config, node, registration, store, storage = (self.config, self.node, self.registration, self.store,
                                                      self.storage)
        assert node is not None and registration is not None and store is not None and storage is not None
        loop_monitor = self.loop_monitor
        assert loop_monitor is not None

        async def watch_journal() -> None:
            assert node.journal is not None
            await node.journal.run()
            if node.journal.failed is not None:
                log.error("journal failed, bookie stopping: error=%s", node.journal.failed)
                self.exit_code = 3
                self.stopping.set()

        async def watch_disks() -> None:
            while True:
                await asyncio.sleep(config.disk.check_interval_s)
                usage = await asyncio.to_thread(disk_monitor.measure, self.directories)
                node.disk_usage = usage
                published = registration.record
                checked = disk_monitor.check(usage, node.read_only,
                                             published.free_bytes if published is not None else None,
                                             config.disk.usage_threshold, config.disk.usage_lwm_threshold)
                if checked.flipped:
                    node.read_only = checked.read_only
                    log.warning("bookie %s: bookie_id=%s disk_usage_ratio=%.4f directory=%s",
                                "turned read-only" if checked.read_only else "writable again", self.bookie_id,
                                usage.ratio, usage.worst_directory)
                if checked.republish:   # the policy: bookie/disk_monitor.py
                    registration.update(self._record(node, self.address, self.http_address, self.started_at_ms))

        gc_trigger = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            self._journal_task = tasks.create_task(watch_journal())
            background = [
                tasks.create_task(node.run_checkpointer()),
                tasks.create_task(registration.run()),
                tasks.create_task(run_gc(store, storage, config.gc, gc_trigger, self.bookie_id)),
                tasks.create_task(watch_disks()),
                tasks.create_task(loop_monitor.run()),
            ]
            if self.add_socket_tls is not None:
                background.append(tasks.create_task(
                    CertificateReloader(config.security.tls, self.add_socket_tls).run()))
            await self.stopping.wait()
            log.info("bookie stopping: bookie_id=%s", self.bookie_id)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._stopping_orderly = True
            await stack.stop()


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    process = BookieProcess(config)

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
