"""Admin REST for clusters, as Pulsar's ``/admin/v2/clusters`` paths:

    GET    /admin/v2/clusters               names of the clusters
    GET    /admin/v2/clusters/{cluster}     ClusterData (serviceUrl, brokerServiceUrl, ...)
    PUT    /admin/v2/clusters/{cluster}     create (409 if it exists)
    POST   /admin/v2/clusters/{cluster}     update (404 if it does not exist)
    DELETE /admin/v2/clusters/{cluster}     delete (412 while a tenant allows it)

ClusterData keeps the fields of Pulsar's that Magnetar knows; others are ignored.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from broker.admin.common import json_body, no_content
from broker.admin.keys import SERVICE
from common.topic_name import validate_name_part
from common.errors import AlreadyExists, InvalidArgument, MetadataKeyExists, PreconditionFailed
from metadata import keys

log = logging.getLogger(__name__)

_STRING_FIELDS = ("serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls", "proxyServiceUrl",
                  "proxyProtocol")
_BOOL_FIELDS = ("brokerClientTlsEnabled", "tlsAllowInsecureConnection")


def cluster_data_of(doc: object) -> dict:
    """A ClusterData request body, checked field by field."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InvalidArgument("cluster data must be a JSON object")
    data: dict = {}
    for field in _STRING_FIELDS:
        value = doc.get(field)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidArgument(f"{field} must be a string")
            data[field] = value
    for field in _BOOL_FIELDS:
        value = doc.get(field)
        if value is not None:
            if not isinstance(value, bool):
                raise InvalidArgument(f"{field} must be true or false")
            data[field] = value
    peers = doc.get("peerClusterNames")
    if peers is not None:
        if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
            raise InvalidArgument("peerClusterNames must be a list of names")
        data["peerClusterNames"] = sorted(set(peers))
    return data


def cluster_data_json(data: dict) -> dict:
    return {**{field: "" for field in _STRING_FIELDS[:4]}, **data}

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get("/admin/v2/clusters")
async def list_clusters(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    return web.json_response(sorted(await resources.clusters()))


@routes.get("/admin/v2/clusters/{cluster}")
async def get_cluster(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    return web.json_response(cluster_data_json(await resources.cluster(request.match_info["cluster"])))


@routes.put("/admin/v2/clusters/{cluster}")
async def create_cluster(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = request.match_info["cluster"]
    validate_name_part(name, "cluster")
    data = cluster_data_of(await json_body(request, required=False))
    try:
        await service.store.create(keys.cluster(name), json.dumps(data).encode())
    except MetadataKeyExists:
        raise AlreadyExists(f"cluster {name} already exists") from None
    log.info("cluster created: cluster=%s", name)
    return no_content()


@routes.post("/admin/v2/clusters/{cluster}")
async def update_cluster(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    name = request.match_info["cluster"]
    data = cluster_data_of(await json_body(request, required=True))
    await resources.cluster(name)
    await resources.put_cluster(name, data)
    log.info("cluster updated: cluster=%s", name)
    return no_content()


@routes.delete("/admin/v2/clusters/{cluster}")
async def delete_cluster(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    name = request.match_info["cluster"]
    await resources.cluster(name)
    for tenant in await resources.tenants():
        if name in (await resources.tenant(tenant)).allowedClusters:
            raise PreconditionFailed(f"cluster {name} is still allowed for tenant {tenant}")
    await resources.delete_cluster(name)
    log.info("cluster deleted: cluster=%s", name)
    return no_content()
