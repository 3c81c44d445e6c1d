"""Admin REST for namespace bundles (Pulsar's paths, plus one Magnetar extension):

    GET /admin/v2/namespaces/{t}/{ns}/bundles                  {"boundaries": [...], "numBundles": n}
    GET /admin/v2/namespaces/{t}/{ns}/bundleOwners             {bundle: {"broker", "state", "to"}} (Magnetar)
    PUT /admin/v2/namespaces/{t}/{ns}/unload                   hand every bundle to other brokers
    PUT /admin/v2/namespaces/{t}/{ns}/{bundle}/unload[?destinationBroker={broker id}]
                                                               hand one bundle to another broker (that one)
    PUT /admin/v2/namespaces/{t}/{ns}/{bundle}/split[?unload=true]
                                                               split in two (and hand the upper half over)
    GET /admin/v2/brokers/{cluster}/{broker}/ownedNamespaces   bundles a broker owns

Unload and split run on the bundle's owner: asked elsewhere, the answer is a 307 to the
owner's admin address (what Pulsar does too).
"""

from __future__ import annotations

import json

from aiohttp import web

from broker.admin.common import redirect_base
from broker.admin.keys import SERVICE
from broker.service import BrokerService
from common.topic_name import NamespaceName
from bundles.hashing import BundleRange
from bundles.ownership import bundle_key
from bundles.records import OwnerRecord
from common.errors import PreconditionFailed
from metadata import keys

BASE = "/admin/v2/namespaces/{tenant}/{namespace}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


def namespace_of(request: web.Request) -> NamespaceName:
    return NamespaceName.parse(f"{request.match_info['tenant']}/{request.match_info['namespace']}")


def ownership(service: BrokerService):
    if service.ownership is None:
        raise PreconditionFailed("this broker runs without the bundles layer")
    return service.ownership


async def redirect_unless_owner(request: web.Request, namespace: NamespaceName, bundle: str) -> None:
    service = request.app[SERVICE]
    record = await service.store.get(keys.bundle_owner(str(namespace), bundle))
    if record is None:
        raise PreconditionFailed(f"bundle {bundle_key(str(namespace), bundle)} has no owner right now")
    owner = OwnerRecord.decode(record.value)
    if owner.broker_id != service.broker_id:
        base = redirect_base(request, owner.web_service_url, service.broker_tls_urls(owner.broker_id)[1])
        raise web.HTTPTemporaryRedirect(location=f"{base}{request.path_qs}")


def destination(service: BrokerService) -> str | None:
    if service.broker_reports is None:
        return None
    return ownership(service).handover_target(service.broker_reports)


def named_destination(service: BrokerService, request: web.Request) -> str | None:
    """Pulsar's ``destinationBroker``: a live broker's id (as bundleOwners names it),
    not this one; without it, the broker picks (``destination``)."""
    named = request.query.get("destinationBroker", "")
    if not named:
        return destination(service)
    if named == service.broker_id:
        raise PreconditionFailed(f"destinationBroker {named} is this broker, the bundle's owner")
    if service.broker_reports is None or service.broker_reports.get(keys.broker(named)) is None:
        raise PreconditionFailed(f"destinationBroker {named} is not a live broker")
    return named


@routes.get(f"{BASE}/bundles")
async def get_bundles(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    namespace = namespace_of(request)
    await service.resources.policies(namespace)
    bundles = await ownership(service).bundles_of(namespace)
    return web.json_response({"boundaries": [f"0x{min(b, 0xFFFFFFFF):08x}" for b in bundles.boundaries],
                              "numBundles": len(bundles.ranges)})


@routes.get(f"{BASE}/bundleOwners")
async def bundle_owners(request: web.Request) -> web.Response:
    """Fresh boundaries (another broker may have split a bundle), owners from this
    broker's watched mirror of the owner keys (no etcd read per bundle)."""
    service = request.app[SERVICE]
    namespace = namespace_of(request)
    await service.resources.policies(namespace)
    manager = ownership(service)
    bundles = await manager.bundles_of(namespace, refresh=True)
    owners = manager.owner_records()
    result = {}
    for bundle in bundles.ranges:
        owner = owners.get(bundle_key(str(namespace), bundle))
        result[bundle.name] = None if owner is None else {
            "broker": owner.broker_id, "state": owner.state, "to": owner.to or None}
    return web.json_response(result)


@routes.put(f"{BASE}/unload")
async def unload_namespace(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    namespace = namespace_of(request)
    await service.resources.policies(namespace)
    manager = ownership(service)
    mine = [b.rpartition("/")[2] for b in manager.serving() if b.rpartition("/")[0] == str(namespace)]
    for bundle in mine:
        await manager.release(str(namespace), bundle, to=destination(service), reason="admin unload")
    # Bundles owned elsewhere are unloaded by their owners' admin endpoints; this
    # broker reports what it handed over.
    return web.json_response({"unloaded": mine})


@routes.put(f"{BASE}/{{bundle}}/unload")
async def unload_bundle(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    namespace = namespace_of(request)
    bundle = BundleRange.parse(request.match_info["bundle"]).name
    await redirect_unless_owner(request, namespace, bundle)
    await ownership(service).release(str(namespace), bundle, to=named_destination(service, request),
                                     reason="admin unload")
    return web.Response(status=204)


@routes.put(f"{BASE}/{{bundle}}/split")
async def split_bundle(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    namespace = namespace_of(request)
    bundle = BundleRange.parse(request.match_info["bundle"]).name
    await redirect_unless_owner(request, namespace, bundle)
    low, high = await ownership(service).split(namespace, bundle)
    if request.query.get("unload", "false").lower() == "true":
        await ownership(service).release(str(namespace), high, to=destination(service), reason="split")
    return web.json_response({"bundles": [low, high]})


@routes.get("/admin/v2/brokers/{cluster}/{broker}/ownedNamespaces")
async def owned_namespaces(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    broker = request.match_info["broker"]
    owned = {}
    for bkey, owner in (service.ownership.owner_records().items() if service.ownership else []):
        if owner.broker_id == broker or owner.web_service_url.split("://", 1)[-1] == broker:
            owned[bkey] = {"broker_assignment": "shared", "is_controlled": False,
                           "is_active": owner.state == "owned"}
    return web.Response(text=json.dumps(owned), content_type="application/json")
