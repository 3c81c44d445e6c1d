"""Wiring of ``magnetar gateway``: options and environment → GatewayConfig; the HTTP
listener bound first (receipts carry this instance's URL, which needs the real port);
the app; the event-loop monitor; run until SIGTERM/SIGINT, then stop accepting, let
requests in progress finish (bounded), close the broker consumers (the broker
redelivers what they held) and producers.

The cluster secret that signs receipts comes from ``--receipt-secret-file`` or the
environment variable MAGNETAR_GATEWAY_SECRET (``kid:secret[,kid:secret...]``; the first
signs, all verify), never from a command-line value (it would show in ``ps``). Every
gateway of a cluster needs the same secret. Without one, a random secret is made: fine
for one gateway, but its receipts die with it and no other instance accepts them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys

from aiohttp import web
from prometheus_client import CollectorRegistry

from common.errors import ConfigError
from runtime.listen import bind_failure
from runtime.loop_monitor import LoopMonitor
from runtime.ops_http import bind_listener
from runtime.tasks import cancel_and_wait, stop_on_signals
from runtime.tls import CertificateReloader, TlsConfig, server_context
from gateway import openapi
from gateway.app import default_config, init_app
from gateway.config import GatewayConfig
from gateway.keys import SERVICE
from gateway.processes import Workers, announce_ready, bind_shared, settle_url
from gateway.receipts import ReceiptKeys

log = logging.getLogger(__name__)

SECRET_ENV = "MAGNETAR_GATEWAY_SECRET"
# The gateway's own token for brokers with authentication on.
TOKEN_ENV = "MAGNETAR_GATEWAY_TOKEN"
# Requests in progress get this long to finish at shutdown (long polls end sooner:
# they see the service stopping).
SHUTDOWN_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-url", default="pulsar://127.0.0.1:6650", help="the brokers (Pulsar protocol)")
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080",
                        help="a broker's HTTP address, for topic stats and subscription deletes")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="HTTP port (0: any)")
    parser.add_argument("--advertised-url", default="",
                        help="how other gateway instances reach this one (default http://host:port)")
    parser.add_argument("--processes", type=int, default=1,
                        help="gateway processes serving --port (SO_REUSEPORT), each with its own settle address")
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", default="standalone", help="the cluster name receipts are bound to")
    parser.add_argument("--receipt-secret-file", default="",
                        help=f"file holding kid:secret[,kid:secret...] (else ${SECRET_ENV})")
    parser.add_argument("--lease-ms-default", type=int, default=30_000)
    parser.add_argument("--leases-per-subscription-max", type=int, default=10_000)
    parser.add_argument("--ready-hold-ms", type=int, default=2_000)
    parser.add_argument("--metrics-subscriptions-max", type=int, default=GatewayConfig.metrics_subscriptions_max,
                        help="subscriptions with /metrics series of their own (the rest share _other)")
    parser.add_argument("--read-ahead-messages", type=int, default=500,
                        help="at most this many messages asked of the broker beyond what waiting pulls want, "
                             "never more than pulls took over the last half of --ready-hold-ms (not leased; "
                             "unused ones go back after --ready-hold-ms without counting a delivery); 0: none")
    parser.add_argument("--body-mib-max", type=int, default=8)
    parser.add_argument("--requests-in-flight-max", type=int, default=4_096)
    parser.add_argument("--authentication-enabled", action="store_true",
                        help="callers must present credentials (--authentication-providers); brokers check "
                             "their permissions")
    parser.add_argument("--authentication-providers", default="token",
                        help="comma-separated: token (Bearer), basic (Basic), tls (client certificate CN, "
                             "with --tls-trust-certs-file; the service token's role must be a broker proxy role)")
    parser.add_argument("--tls-trust-certs-file", default="",
                        help="CA of client certificates (HTTPS asks callers for one; the tls provider)")
    parser.add_argument("--service-token-file", default="",
                        help=f"the gateway's own token for brokers with authentication on (or ${TOKEN_ENV})")
    parser.add_argument("--tls-cert-file", default="", help="PEM certificate: serve HTTPS (reloaded on change)")
    parser.add_argument("--tls-key-file", default="", help="PEM private key of --tls-cert-file")
    parser.add_argument("--broker-tls-trust-certs-file", default="",
                        help="the brokers' CA, for a pulsar+ssl:// service URL and an https:// admin URL")
    parser.add_argument("--no-broker-tls-hostname-verification", dest="broker_tls_hostname_verification",
                        action="store_false",
                        help="accept a broker certificate signed by the CA that does not name the host dialled "
                             "(lookups answer brokers' pod IPs; Pulsar clients' default)")
    parser.add_argument("--print-openapi", action="store_true",
                        help="print the OpenAPI document (default settings) and exit")


def receipt_keys_from(args: argparse.Namespace) -> ReceiptKeys:
    text = ""
    if args.receipt_secret_file:
        try:
            with open(args.receipt_secret_file, encoding="utf-8") as handle:
                text = handle.read().strip()
        except OSError as error:
            raise ConfigError(f"receipt_secret_file: {error}") from None
    else:
        text = os.environ.get(SECRET_ENV, "").strip()
    if not text:
        log.warning("no receipt secret given (--receipt-secret-file or $%s): using a random one; receipts are "
                    "valid at this instance only and die with it", SECRET_ENV)
        text = f"random:{secrets.token_hex(32)}"
    return ReceiptKeys.parse(args.cluster, text)


def service_token_from(args: argparse.Namespace) -> str:
    """The gateway's own token: from --service-token-file, else $MAGNETAR_GATEWAY_TOKEN
    (never a command-line value: ps shows those)."""
    if args.service_token_file:
        try:
            with open(args.service_token_file, encoding="ascii") as handle:
                return handle.read().strip()
        except OSError as error:
            raise ConfigError(f"service_token_file: {error.strerror}") from None
    return os.environ.get(TOKEN_ENV, "").strip()


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    leases = args.leases_per_subscription_max
    return GatewayConfig(
        service_url=args.service_url, admin_url=args.admin_url.rstrip("/"), receipt_keys=receipt_keys_from(args),
        host=args.host, port=args.port, advertised_url=args.advertised_url.rstrip("/"),
        processes=args.processes, reuse_port=args.reuse_port,
        lease_ms_default=args.lease_ms_default, leases_per_subscription_max=leases,
        # A pull or a stream never asks for more than the leases allow.
        pull_messages_max=min(GatewayConfig.pull_messages_max, max(leases, 1)),
        sse_credits_max=min(GatewayConfig.sse_credits_max, max(leases, 1)),
        ready_hold_ms=args.ready_hold_ms, metrics_subscriptions_max=args.metrics_subscriptions_max,
        read_ahead_messages=args.read_ahead_messages, body_bytes_max=args.body_mib_max * 1024 * 1024,
        requests_in_flight_max=args.requests_in_flight_max,
        authentication_enabled=args.authentication_enabled, service_token=service_token_from(args),
        service_token_file=args.service_token_file,
        authentication_providers=args.authentication_providers,
        tls=TlsConfig(cert_file=args.tls_cert_file, key_file=args.tls_key_file,
                      trust_certs_file=args.tls_trust_certs_file),
        broker_tls_trust_certs_file=args.broker_tls_trust_certs_file,
        broker_tls_hostname_verification=args.broker_tls_hostname_verification)


class GatewayProcess:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        config = self.config
        # Bound first: a port in use is one line naming its flag (PortInUse), and the
        # receipts this instance issues carry its URL, which needs the real port.
        shared = config.processes > 1 or config.reuse_port
        try:
            listener = bind_shared(config.host, config.port) if shared else bind_listener(config.host, config.port)
        except OSError as error:
            raise bind_failure("--port", config.host, config.port, error) from None
        port = listener.getsockname()[1]
        scheme = "https" if config.tls.enabled else "http"
        issuer_url = config.advertised_url or f"{scheme}://{config.host}:{port}"
        settle_listener = None
        if shared:
            # Receipts name this process by an address of its own (gateway/processes.py).
            settle_listener = bind_listener(config.host, 0)
            issuer_url = settle_url(issuer_url, settle_listener.getsockname()[1])
        workers = Workers(config.processes - 1, port) if config.processes > 1 else None
        tls_context = server_context(config.tls) if config.tls.enabled else None
        registry = CollectorRegistry()
        app = init_app(config, issuer_url=issuer_url, registry=registry)
        service = app[SERVICE]
        loop_monitor = LoopMonitor(registry, "magnetar_gateway")
        monitor = asyncio.get_running_loop().create_task(loop_monitor.run(), name="loop monitor")
        # handler_cancellation: a long poll whose client went away is cancelled, so
        # what it had collected goes to the next pull at once.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        await web.SockSite(runner, listener, ssl_context=tls_context).start()
        if settle_listener is not None:
            await web.SockSite(runner, settle_listener, ssl_context=tls_context).start()
        watcher = None
        announce_ready()
        if workers is not None:
            await workers.start()
            watcher = asyncio.get_running_loop().create_task(workers.watch(self.stopping), name="workers")
        reloader = asyncio.get_running_loop().create_task(CertificateReloader(config.tls, tls_context).run(),
                                                          name="tls reload") if tls_context else None
        public_url = (config.advertised_url or f"{scheme}://{config.host}:{port}") if shared else issuer_url
        log.info("gateway listening: url=%s instance=%s settle_url=%s service_url=%s cluster=%s", public_url,
                 service.instance_name, issuer_url, config.service_url, config.receipt_keys.cluster)
        log.info("gateway config: %s", {name: value for name, value in vars(config).items()
                                        if name not in ("receipt_keys", "service_token")})
        code = 0
        try:
            if watcher is not None:
                code = await watcher
            else:
                await self.stopping.wait()
        finally:
            if workers is not None:
                await workers.stop(SHUTDOWN_TIMEOUT_S)
            log.info("gateway stopping: instance=%s", service.instance_name)
            service.stopping = True
            await cancel_and_wait(monitor)
            if reloader is not None:
                await cancel_and_wait(reloader)
            await runner.cleanup()
            log.info("gateway stopped: instance=%s", service.instance_name)
        return code


def main(args: argparse.Namespace) -> int:
    if args.print_openapi:
        config = default_config()
        json.dump(openapi.build(init_app(config), config), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    process = GatewayProcess(config_from_args(args))

    async def run() -> int:
        stop_on_signals(process.stopping)
        return await process.run()

    return asyncio.run(run())
