"""The broker's aiohttp application: assembles the admin routes, the lookup routes,
/health and /metrics, and turns Magnetar errors into JSON error responses (the status
from the error catalogue, body ``{"reason": ..., "code": ...}`` as Pulsar's clients
read it)."""

from __future__ import annotations

import json
from typing import Callable
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from broker.service import BrokerService
from common.errors import BrokerError, InvalidArgument, MagnetarError, NotFound
from runtime.ops_http import add_ready_route, build_ops_app

log = logging.getLogger(__name__)


def error_response(error: MagnetarError) -> web.Response:
    return web.json_response({"reason": error.message, "code": error.code, "error": type(error).__name__},
                             status=error.http_status)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    """Every error answers JSON. Magnetar errors carry their status; the router's own
    answers (no such path: 404, no such method: 405) and crashes are dressed the same
    way. Redirects (a topic served elsewhere) pass through."""
    try:
        return await handler(request)
    except MagnetarError as error:
        return error_response(error)
    except json.JSONDecodeError as error:
        return error_response(InvalidArgument(f"request body is not JSON: {error}"))
    except web.HTTPNotFound:
        return error_response(NotFound(f"no such path: {request.method} {request.path}"))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        # 405 and the like: the router decided, there is no catalogue error behind it.
        return web.json_response({"reason": f"{error.reason}: {request.method} {request.path}",
                                  "code": None, "error": type(error).__name__}, status=error.status,
                                 headers={k: v for k, v in error.headers.items() if k == "Allow"})
    except Exception as error:
        log.exception("admin request failed: method=%s path=%s", request.method, request.path)
        return error_response(BrokerError(f"internal error: {type(error).__name__}: {error}"))


def build_admin_app(service: BrokerService, registry: CollectorRegistry, *,
                    extra_metrics: Callable[[], bytes] | None = None) -> web.Application:
    async def health() -> tuple[bool, dict]:
        # Ready once the binary protocol accepts connections (the HTTP server starts
        # first), until shutdown begins: what the standalone and probes wait for.
        return service.serving and not service.shutting_down, {"broker_id": service.broker_id,
                                                                "serving": service.serving}

    app = build_ops_app(registry, health, body_bytes_max=service.config.http_body_bytes_max,
                        extra_metrics=extra_metrics)

    async def ready() -> tuple[bool, dict]:
        # Readiness (Kubernetes): owns bundles or can be given some; /health is liveness.
        return service.readiness()

    add_ready_route(app, ready)
    app.middlewares.append(errors_middleware)
    # Inside the errors middleware: a refused request answers JSON 401 / 403 like any error.
    from broker.admin.permissions import auth_middleware

    app.middlewares.append(auth_middleware(service))
    # Inside auth: the console's requests for topics other brokers serve are answered
    # through this broker (a browser cannot follow the 307 to another origin).
    from broker.admin.forward import forward_middleware

    app.middlewares.append(forward_middleware(service))
    from broker.admin import routes

    routes.add_routes(app, service)
    return app
