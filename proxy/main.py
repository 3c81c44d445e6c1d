"""Wiring of ``magnetar proxy``: the front door for clients outside the cluster.

It listens for Pulsar's binary protocol (``--port``, and ``--tls-port`` with a
certificate), finds the brokers through etcd (``--metadata``, the brokers' registrations
under ``/brokers/``), forwards lookups to them answering ``proxy_through_service_url``,
and pipes each client connection that names a registered broker
(``CommandConnect.proxy_to_broker_url``) to that broker. It holds no topic state: any
number of proxies can run side by side behind one name. ``/health``, ``/live`` and
``/metrics`` on ``--http-port``. docs/proxy.md says more.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from prometheus_client import CollectorRegistry

from runtime.listen import bind_failure
from runtime.loop_monitor import LoopMonitor
from runtime.ops_http import build_ops_app, start_ops_server
from runtime.tasks import cancel_and_wait, stop_on_signals
from runtime.tls import TlsConfig, client_context, server_context
from metadata import open_store
from metadata.etcd_tls import add_etcd_tls_arguments, etcd_tls_from_args
from proxy.auth import ProxyAuthConfig, ProxyAuthenticator
from proxy.brokers import BrokerDirectory
from proxy.config import ProxyConfig
from proxy.connection import ClientSide
from proxy.http_forward import add_forward_routes
from proxy.metrics import ProxyMetrics
from proxy.server import ProxyServer

log = logging.getLogger(__name__)

DEFAULTS = ProxyConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata", default=DEFAULTS.metadata_url, help="etcd URL with the cluster's root")
    add_etcd_tls_arguments(parser)
    parser.add_argument("--host", default=DEFAULTS.host, help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULTS.port, help="Pulsar protocol port (0: any free port)")
    parser.add_argument("--tls-port", type=int, default=-1,
                        help="Pulsar protocol over TLS port (-1: none; needs --tls-cert-file)")
    parser.add_argument("--tls-cert-file", default="", help="PEM certificate the proxy presents to clients")
    parser.add_argument("--tls-key-file", default="", help="PEM private key of --tls-cert-file")
    parser.add_argument("--http-port", type=int, default=DEFAULTS.http_port,
                        help="/health, /live and /metrics (0: any free port)")
    parser.add_argument("--connections-max", type=int, default=DEFAULTS.connections_max)
    parser.add_argument("--frame-bytes-max", type=int, default=DEFAULTS.frame_bytes_max,
                        help="largest frame the proxy itself reads (CONNECT, lookups)")
    parser.add_argument("--handshake-timeout-s", type=float, default=DEFAULTS.handshake_timeout_s)
    parser.add_argument("--buffer-bytes-max", type=int, default=DEFAULTS.buffer_bytes_max,
                        help="bytes buffered towards one side before reading the other pauses")
    parser.add_argument("--lookup-timeout-s", type=float, default=DEFAULTS.lookup_timeout_s)
    parser.add_argument("--broker-tls", action="store_true",
                        help="reach brokers on their pulsar+ssl:// addresses (lookups included)")
    parser.add_argument("--broker-tls-trust-certs-file", default="", help="CA of the brokers' certificates")
    parser.add_argument("--authentication-enabled", action="store_true",
                        help="authenticate clients (token method) and name them to brokers as original_principal")
    parser.add_argument("--token-secret-key", default="", help="the brokers' token secret key (file:///path or data:)")
    parser.add_argument("--token-public-key", default="", help="the brokers' token public key (file:///path or data:)")
    parser.add_argument("--broker-token-file", default="",
                        help="the proxy's own token for brokers: a role in their --proxy-roles")
    parser.add_argument("--forward-auth-data", action="store_true",
                        help="also pass the client's credential to brokers (original_auth_data)")


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    return ProxyConfig(metadata_url=args.metadata, host=args.host, port=args.port, http_port=args.http_port,
                       connections_max=args.connections_max, frame_bytes_max=args.frame_bytes_max,
                       handshake_timeout_s=args.handshake_timeout_s, buffer_bytes_max=args.buffer_bytes_max,
                       lookup_timeout_s=args.lookup_timeout_s, broker_tls_only=args.broker_tls,
                       broker_tls_trust_certs_file=args.broker_tls_trust_certs_file)


class ProxyProcess:
    def __init__(self, config: ProxyConfig, args: argparse.Namespace) -> None:
        self.config = config
        self.args = args
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        config, args = self.config, self.args
        loop = asyncio.get_running_loop()
        registry = CollectorRegistry()
        metrics = ProxyMetrics(registry)
        store = open_store(config.metadata_url, tls=etcd_tls_from_args(args))
        brokers = BrokerDirectory(store)
        await brokers.start()
        broker_context = client_context(TlsConfig(trust_certs_file=config.broker_tls_trust_certs_file)) \
            if config.broker_tls_only or config.broker_tls_trust_certs_file else None
        auth = ProxyAuthenticator(ProxyAuthConfig(
            authentication_enabled=args.authentication_enabled, token_secret_key=args.token_secret_key,
            token_public_key=args.token_public_key, broker_token_file=args.broker_token_file,
            forward_auth_data=args.forward_auth_data))
        server = ProxyServer(config, brokers, metrics, broker_tls_context=broker_context, auth=auth)

        async def health() -> tuple[bool, dict]:
            count = brokers.count()
            return count > 0, {"brokers": count, "connections": len(server.connections)}

        app = build_ops_app(registry, health)
        add_forward_routes(app, brokers, metrics)
        runner, http_port = await start_ops_server(app, config.host, config.http_port)
        listeners = []
        try:
            plain = await loop.create_server(lambda: ClientSide(server), config.host, config.port)
        except OSError as error:
            await runner.cleanup()
            raise bind_failure("--port", config.host, config.port, error) from None
        listeners.append(plain)
        port = plain.sockets[0].getsockname()[1]
        tls_url = "-"
        if args.tls_port >= 0:
            context = server_context(TlsConfig(cert_file=args.tls_cert_file, key_file=args.tls_key_file))
            try:
                secure = await loop.create_server(lambda: ClientSide(server), config.host, args.tls_port,
                                                  ssl=context)
            except OSError as error:
                plain.close()
                await runner.cleanup()
                raise bind_failure("--tls-port", config.host, args.tls_port, error) from None
            listeners.append(secure)
            tls_url = f"pulsar+ssl://{config.host}:{secure.sockets[0].getsockname()[1]}"
        monitor = loop.create_task(LoopMonitor(registry, "magnetar_proxy").run(), name="loop monitor")
        log.info("proxy listening: service_url=pulsar://%s:%d service_url_tls=%s http_url=http://%s:%d brokers=%d",
                 config.host, port, tls_url, config.host, http_port, brokers.count())
        log.info("proxy config: %s", config)
        try:
            await self.stopping.wait()
        finally:
            log.info("proxy stopping: connections=%d", len(server.connections))
            for listener in listeners:
                listener.close()
            server.close()
            await cancel_and_wait(monitor)
            await brokers.close()
            await store.close()
            await runner.cleanup()
            log.info("proxy stopped")
        return 0


def main(args: argparse.Namespace) -> int:
    process = ProxyProcess(config_from_args(args), args)

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
