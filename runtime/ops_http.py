"""The operations HTTP endpoint every server exposes: ``/health`` (200 when the
process is serving, 503 with the reason when not), ``/live`` (200 while the process
answers at all: a liveness probe) and ``/metrics`` (Prometheus text format from the
process's own registry). Brokers and bookies add ``/ready`` (add_ready_route). Servers
may add routes of their own."""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from runtime.listen import bind_failure

log = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[tuple[bool, dict]]]


# aiohttp's own default request body limit; servers with a config field pass theirs.
BODY_BYTES_MAX_DEFAULT = 1024 * 1024


# Text a server writes into /metrics itself (Prometheus text format), after the
# registry's: for series too many for prometheus_client's generic writer (the broker's
# per-topic series). Called first, so the registry's collectors see what it did.
ExtraMetrics = Callable[[], bytes]


def build_ops_app(registry: CollectorRegistry, health: HealthCheck, *,
                  body_bytes_max: int = BODY_BYTES_MAX_DEFAULT, extra_metrics: ExtraMetrics | None = None,
                  ) -> web.Application:
    """The app with /health and /metrics; request bodies over ``body_bytes_max`` are
    refused with 413 before a handler runs."""
    app = web.Application(client_max_size=body_bytes_max)
    add_ops_routes(app, registry, health, extra_metrics=extra_metrics)
    return app


def add_ops_routes(app: web.Application, registry: CollectorRegistry, health: HealthCheck, *,
                   extra_metrics: ExtraMetrics | None = None) -> None:
    """Adds ``/health`` and ``/metrics`` to an application that serves more (the gateway)."""
    async def health_handler(_request: web.Request) -> web.Response:
        ok, details = await health()
        return web.json_response({"status": "ok" if ok else "unavailable", **details}, status=200 if ok else 503)

    async def metrics_handler(_request: web.Request) -> web.Response:
        extra = extra_metrics() if extra_metrics is not None else b""
        body = generate_latest(registry) + extra
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def live_handler(_request: web.Request) -> web.Response:
        # Liveness: the event loop answers. Not /health, which is 503 while a bookie
        # replays its journal or is cut off from etcd: restarting it would not help.
        return web.json_response({"status": "alive"})

    app.router.add_get("/health", health_handler)
    app.router.add_get("/live", live_handler)
    app.router.add_get("/metrics", metrics_handler)


def add_ready_route(app: web.Application, ready: HealthCheck) -> None:
    """Adds ``/ready``: 200 when the process should get work (a Kubernetes readiness probe),
    503 with the reason when not; ``/health`` stays the liveness answer (alive, serving)."""
    async def ready_handler(_request: web.Request) -> web.Response:
        ok, details = await ready()
        return web.json_response({"status": "ready" if ok else "unavailable", **details}, status=200 if ok else 503)

    app.router.add_get("/ready", ready_handler)


async def start_ops_server(app: web.Application, host: str, port: int,
                           flag: str = "--http-port", *, ssl_context: ssl.SSLContext | None = None,
                           ) -> tuple[web.AppRunner, int]:
    """Starts the app (over HTTPS with ``ssl_context``); returns the runner (to clean up)
    and the bound port. A port that cannot be bound raises PortInUse naming ``flag``
    (the runner is cleaned up)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise bind_failure(flag, host, port, error) from None
    # The runner's one site listens on (host, port), port 0 included: ask what it bound.
    assert runner.addresses, "the ops site started but listens nowhere"
    bound_port = runner.addresses[0][1]
    assert port in (0, bound_port), (port, bound_port)
    return runner, bound_port


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port), port 0 meaning any free port. Bound before
    the server that will use it is built, so its real port is known up front (a broker
    advertises its HTTP URL in what it builds). OSError if the port is taken."""
    return socket.create_server((host, port), reuse_port=False)


async def start_ops_server_on(app: web.Application, listener: socket.socket) -> web.AppRunner:
    """Starts the app on an already bound socket; returns the runner (to clean up)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, listener).start()
    return runner
