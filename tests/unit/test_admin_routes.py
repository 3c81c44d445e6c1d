"""The broker's admin route table (broker/admin/routes.py).

Every resource module holds its routes as a module-level aiohttp ``RouteTableDef``
(handlers find the broker in ``request.app[keys.SERVICE]``), and no route is shadowed:
aiohttp tries routes in the order they were added, so a pattern added before a fixed
path it also matches (``/brokers/{cluster}`` before ``/brokers/health``) would take
that path's requests.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry

from broker.admin import routes as admin_routes
from broker.admin.app import build_admin_app
from broker.service import BrokerService
from metadata.memory_store import MemoryStore
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_service import broker_config

# What a path variable stands for when a route's own path is tried against the routes
# added before it (no fixed path segment of the API is spelled like this).
_SAMPLE_SEGMENT = "sample-segment-7"


def _sample_path(route: web.AbstractRoute) -> str:
    info = route.resource.get_info()
    if "path" in info:
        return info["path"]
    formatter = info["formatter"]
    names = [part[1:-1] for part in formatter.split("/") if part.startswith("{") and part.endswith("}")]
    return formatter.format(**dict.fromkeys(names, _SAMPLE_SEGMENT))


def _matches(route: web.AbstractRoute, path: str) -> bool:
    info = route.resource.get_info()
    if "path" in info:
        return info["path"] == path
    if "pattern" in info:
        return info["pattern"].fullmatch(path) is not None
    return False   # static directories and the like: none in this app


def shadowed_routes(app: web.Application) -> list[tuple[str, str, str]]:
    """(method, path, the earlier route's path) for each route an earlier one takes."""
    found = []
    routes = [r for r in app.router.routes() if r.resource is not None]
    for index, route in enumerate(routes):
        path = _sample_path(route)
        for earlier in routes[:index]:
            if earlier.method in (route.method, "*") and _matches(earlier, path):
                found.append((route.method, route.resource.canonical, earlier.resource.canonical))
                break
    return found


def test_the_shadow_check_finds_a_pattern_added_before_a_fixed_path():
    app = web.Application()

    async def handler(_request: web.Request) -> web.Response:
        return web.Response()

    app.router.add_get("/brokers/{cluster}", handler)
    app.router.add_get("/brokers/health", handler)
    app.router.add_get("/tenants/health", handler)
    app.router.add_get("/tenants/{tenant}", handler)
    assert shadowed_routes(app) == [("HEAD", "/brokers/health", "/brokers/{cluster}"),
                                    ("GET", "/brokers/health", "/brokers/{cluster}")]


def test_no_admin_route_is_shadowed_by_one_added_before_it():
    async def build() -> web.Application:
        service = BrokerService(broker_config(), MemoryStore(), FakeLedgerClient())
        return build_admin_app(service, CollectorRegistry())

    app = asyncio.run(build())
    assert len(app.router.routes()) > 200
    assert shadowed_routes(app) == []


def test_each_resource_module_is_a_module_level_route_table():
    modules = [value for name, value in vars(admin_routes).items()
               if hasattr(value, "__name__") and value.__name__.startswith("broker.admin.")
               and name not in ("keys",)]
    assert len(modules) >= 19
    for module in modules:
        assert isinstance(module.routes, web.RouteTableDef), module.__name__
        assert len(module.routes) > 0, module.__name__
        assert not hasattr(module, "add_routes"), f"{module.__name__} still registers closures"
