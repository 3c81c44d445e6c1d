"""Admin REST for tenants, as Pulsar's ``/admin/v2/tenants`` paths:

    GET    /admin/v2/tenants              names of the tenants
    GET    /admin/v2/tenants/{tenant}     TenantInfo {"adminRoles": [...], "allowedClusters": [...]}
    PUT    /admin/v2/tenants/{tenant}     create (409 if it exists)
    POST   /admin/v2/tenants/{tenant}     update (404 if it does not exist)
    DELETE /admin/v2/tenants/{tenant}     delete (refused while it has namespaces)

As in Pulsar, a tenant must allow at least one cluster and only clusters that exist
(412 otherwise).
"""

from __future__ import annotations

import logging

from aiohttp import web

from broker.admin.common import json_body, no_content
from broker.service import BrokerService
from common.errors import InvalidArgument, PreconditionFailed
from metadata.policies import TenantInfo

log = logging.getLogger(__name__)


def add_routes(app: web.Application, service: BrokerService) -> None:
    resources = service.resources

    async def tenant_info_of(request: web.Request) -> TenantInfo:
        info = TenantInfo.from_json(await json_body(request, required=True))
        if not all(isinstance(c, str) for c in info.allowedClusters) or \
                not all(isinstance(r, str) for r in info.adminRoles):
            raise InvalidArgument("adminRoles and allowedClusters must be lists of names")
        if not info.allowedClusters:
            raise PreconditionFailed("a tenant must allow at least one cluster")
        known = set(await resources.clusters())
        missing = sorted(set(info.allowedClusters) - known)
        if missing:
            raise PreconditionFailed(f"clusters do not exist: {', '.join(missing)}")
        return info

    async def list_tenants(request: web.Request) -> web.Response:
        return web.json_response(sorted(await resources.tenants()))

    async def get_tenant(request: web.Request) -> web.Response:
        info = await resources.tenant(request.match_info["tenant"])
        return web.json_response({"adminRoles": info.adminRoles, "allowedClusters": info.allowedClusters})

    async def create_tenant(request: web.Request) -> web.Response:
        name = request.match_info["tenant"]
        await resources.create_tenant(name, await tenant_info_of(request))
        log.info("tenant created: tenant=%s", name)
        return no_content()

    async def update_tenant(request: web.Request) -> web.Response:
        name = request.match_info["tenant"]
        await resources.tenant(name)
        await resources.update_tenant(name, await tenant_info_of(request))
        log.info("tenant updated: tenant=%s", name)
        return no_content()

    async def delete_tenant(request: web.Request) -> web.Response:
        name = request.match_info["tenant"]
        await resources.delete_tenant(name)
        log.info("tenant deleted: tenant=%s", name)
        return no_content()

    app.router.add_get("/admin/v2/tenants", list_tenants)
    app.router.add_get("/admin/v2/tenants/{tenant}", get_tenant)
    app.router.add_put("/admin/v2/tenants/{tenant}", create_tenant)
    app.router.add_post("/admin/v2/tenants/{tenant}", update_tenant)
    app.router.add_delete("/admin/v2/tenants/{tenant}", delete_tenant)
