"""The gateway's aiohttp application factory (``init_app``): the service, the routes,
the middlewares (one per concern: metrics, the in-flight limit, errors), ``/health`` and
``/metrics``, the OpenAPI document built from the routes, and the service's lifecycle
(``cleanup_ctx``: started with the app, its background tasks owned by one task that is
cancelled and awaited before the service closes). Tests build the same app."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from aiohttp import web
from prometheus_client import CollectorRegistry

from runtime.ops_http import add_ops_routes
from runtime.tasks import cancel_and_wait
from gateway import openapi
from gateway.auth import PermissionCache, auth_middleware
from gateway.config import GatewayConfig
from gateway.errors import errors_middleware, limits_middleware
from gateway.keys import OPENAPI, SERVICE
from gateway.metrics import register_gateway_metrics
from gateway.receipts import ReceiptKeys
from gateway.routes import add_routes
from gateway.service import GatewayService


def default_config(**overrides) -> GatewayConfig:
    """The config with every default (and a throwaway key): what the checked-in OpenAPI
    document describes."""
    keys = ReceiptKeys("standalone", {"default": b"0" * 32}, "default")
    return GatewayConfig(service_url="pulsar://127.0.0.1:6650", receipt_keys=keys, **overrides)


def init_app(config: GatewayConfig, *, issuer_url: str = "", registry: CollectorRegistry | None = None
             ) -> web.Application:
    service = GatewayService(config, issuer_url or config.advertised_url or f"http://{config.host}:{config.port}")
    registry = registry if registry is not None else CollectorRegistry()
    app = web.Application(client_max_size=config.body_bytes_max, middlewares=[
        register_gateway_metrics(service, registry),
        limits_middleware(config.requests_in_flight_max, config.retry_after_s, service.requests_in_flight),
        errors_middleware(config.retry_after_s),
        # Inside the errors middleware: a refused caller gets the usual error document.
        auth_middleware(config.authentication_enabled,
                        PermissionCache(config.permission_cache_ms, config.permission_cache_entries_max),
                        frozenset(config.providers), service.service_token),
    ])
    app[SERVICE] = service
    add_routes(app)

    async def health() -> tuple[bool, dict]:
        return not service.stopping, {"instance": service.instance_name, "leases": service.consumers.leases}

    add_ops_routes(app, registry, health)
    app[OPENAPI] = openapi.build(app, config)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    await service.start()
    background = asyncio.get_running_loop().create_task(service.run(), name="gateway background")
    yield
    service.stopping = True
    await cancel_and_wait(background)
    await service.close()
