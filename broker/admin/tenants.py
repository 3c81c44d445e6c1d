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
from broker.admin.keys import SERVICE
from common.errors import InvalidArgument, PreconditionFailed
from metadata.policies import TenantInfo

log = logging.getLogger(__name__)

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


async def tenant_info_of(request: web.Request) -> TenantInfo:
    service = request.app[SERVICE]
    resources = service.resources
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


@routes.get("/admin/v2/tenants")
async def list_tenants(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    return web.json_response(sorted(await resources.tenants()))


@routes.get("/admin/v2/tenants/{tenant}")
async def get_tenant(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    info = await resources.tenant(request.match_info["tenant"])
    return web.json_response({"adminRoles": info.adminRoles, "allowedClusters": info.allowedClusters})


@routes.put("/admin/v2/tenants/{tenant}")
async def create_tenant(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    name = request.match_info["tenant"]
    await resources.create_tenant(name, await tenant_info_of(request))
    log.info("tenant created: tenant=%s", name)
    return no_content()


@routes.post("/admin/v2/tenants/{tenant}")
async def update_tenant(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    name = request.match_info["tenant"]
    await resources.tenant(name)
    await resources.update_tenant(name, await tenant_info_of(request))
    log.info("tenant updated: tenant=%s", name)
    return no_content()


@routes.delete("/admin/v2/tenants/{tenant}")
async def delete_tenant(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    name = request.match_info["tenant"]
    await resources.delete_tenant(name)
    log.info("tenant deleted: tenant=%s", name)
    return no_content()
