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

from aiohttp import web
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
    parser.add_argument("--tls-trust-certs-file", default="",
                        help="CA of clients' certificates on the TLS ports (a verified one may authenticate: tls)")
    parser.add_argument("--tls-require-client-cert", action="store_true",
                        help="refuse TLS clients without a certificate of --tls-trust-certs-file")
    parser.add_argument("--http-port", type=int, default=DEFAULTS.http_port,
                        help="/health, /live, /metrics and the forwarded admin REST (0: any free port)")
    parser.add_argument("--http-tls-port", type=int, default=-1,
                        help="the same over HTTPS with --tls-cert-file (-1: none)")
    parser.add_argument("--no-plain-ports", action="store_true",
                        help="--port and --http-port do not listen: clients only on --tls-port and --http-tls-port")
    parser.add_argument("--connections-max", type=int, default=DEFAULTS.connections_max)
    parser.add_argument("--frame-bytes-max", type=int, default=DEFAULTS.frame_bytes_max,
                        help="largest frame the proxy itself reads (CONNECT, lookups)")
    parser.add_argument("--handshake-timeout-s", type=float, default=DEFAULTS.handshake_timeout_s)
    parser.add_argument("--buffer-bytes-max", type=int, default=DEFAULTS.buffer_bytes_max,
                        help="bytes buffered towards one side before reading the other pauses")
    parser.add_argument("--lookup-timeout-s", type=float, default=DEFAULTS.lookup_timeout_s)
    parser.add_argument("--client-links-max", type=int, default=DEFAULTS.client_links_max,
                        help="an authenticated client's connections to brokers for its lookups (each names it)")
    parser.add_argument("--client-link-idle-s", type=float, default=DEFAULTS.client_link_idle_s,
                        help="such a connection is closed after this long without a request")
    parser.add_argument("--broker-tls", action="store_true",
                        help="reach brokers on their pulsar+ssl:// addresses (lookups included)")
    parser.add_argument("--broker-tls-trust-certs-file", default="", help="CA of the brokers' certificates")
    parser.add_argument("--no-broker-tls-hostname-verification", dest="broker_tls_hostname_verification",
                        action="store_false",
                        help="check brokers' certificates against the CA only, not their host names (brokers "
                             "advertise pod IPs in Kubernetes, which a certificate made once cannot name)")
    parser.add_argument("--authentication-enabled", action="store_true",
                        help="authenticate clients and name them to brokers as original_principal")
    parser.add_argument("--authentication-providers", default="token",
                        help="methods accepted from clients, comma-separated: token, basic, tls")
    parser.add_argument("--basic-auth-file", default="",
                        help="htpasswd file of the basic method (bcrypt hashes, the brokers' format)")
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
                       lookup_timeout_s=args.lookup_timeout_s, client_links_max=args.client_links_max,
                       client_link_idle_s=args.client_link_idle_s, broker_tls_only=args.broker_tls,
                       broker_tls_trust_certs_file=args.broker_tls_trust_certs_file,
                       broker_tls_hostname_verification=args.broker_tls_hostname_verification,
                       plain_ports_enabled=not args.no_plain_ports, tls_port=args.tls_port,
                       http_tls_port=args.http_tls_port, tls=TlsConfig(
                           cert_file=args.tls_cert_file, key_file=args.tls_key_file,
                           trust_certs_file=args.tls_trust_certs_file,
                           require_client_cert=args.tls_require_client_cert))


def auth_config_from_args(args: argparse.Namespace) -> ProxyAuthConfig:
    return ProxyAuthConfig(authentication_enabled=args.authentication_enabled,
                           authentication_providers=args.authentication_providers,
                           token_secret_key=args.token_secret_key, token_public_key=args.token_public_key,
                           basic_auth_file=args.basic_auth_file, broker_token_file=args.broker_token_file,
                           forward_auth_data=args.forward_auth_data)


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
        broker_context = client_context(TlsConfig(trust_certs_file=config.broker_tls_trust_certs_file),
                                         verify_hostname=config.broker_tls_hostname_verification) \
            if config.broker_tls_only or config.broker_tls_trust_certs_file else None
        auth = ProxyAuthenticator(auth_config_from_args(args))
        server = ProxyServer(config, brokers, metrics, broker_tls_context=broker_context, auth=auth)

        async def health() -> tuple[bool, dict]:
            count = brokers.count()
            return count > 0, {"brokers": count, "connections": len(server.connections)}

        app = build_ops_app(registry, health)
        add_forward_routes(app, brokers, metrics, tls_context=broker_context, auth=auth)
        client_tls = server_context(config.tls) if config.tls.enabled else None
        runners: list[web.AppRunner] = []
        listeners: list[asyncio.AbstractServer] = []
        urls: dict[str, str] = {}

        async def cleanup() -> None:
            for listener in listeners:
                listener.close()
            for runner in runners:
                await runner.cleanup()

        try:
            # The HTTP ports first: one app, served plain and over HTTPS alike.
            for flag, port, context in (("--http-port", config.http_port if config.plain_ports_enabled else -1,
                                         None),
                                        ("--http-tls-port", config.http_tls_port, client_tls)):
                if port < 0:
                    continue
                runner, bound = await start_ops_server(app, config.host, port, flag=flag, ssl_context=context)
                runners.append(runner)
                urls[flag] = f"{'https' if context else 'http'}://{config.host}:{bound}"
            for flag, port, context, scheme in (
                    ("--port", config.port if config.plain_ports_enabled else -1, None, "pulsar"),
                    ("--tls-port", config.tls_port, client_tls, "pulsar+ssl")):
                if port < 0:
                    continue
                try:
                    listener = await loop.create_server(lambda: ClientSide(server), config.host, port, ssl=context)
                except OSError as error:
                    raise bind_failure(flag, config.host, port, error) from None
                listeners.append(listener)
                urls[flag] = f"{scheme}://{config.host}:{listener.sockets[0].getsockname()[1]}"
        except BaseException:
            await cleanup()
            raise
        monitor = loop.create_task(LoopMonitor(registry, "magnetar_proxy").run(), name="loop monitor")
        log.info("proxy listening: service_url=%s service_url_tls=%s http_url=%s https_url=%s brokers=%d",
                 urls.get("--port", "-"), urls.get("--tls-port", "-"), urls.get("--http-port", "-"),
                 urls.get("--http-tls-port", "-"), brokers.count())
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
            for runner in runners:
                await runner.cleanup()
            log.info("proxy stopped")
        return 0


def main(args: argparse.Namespace) -> int:
    process = ProxyProcess(config_from_args(args), args)

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
