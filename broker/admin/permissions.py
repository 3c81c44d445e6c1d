"""Authentication and authorization of the broker's HTTP API, and Pulsar's permission
endpoints.

Every request under ``/admin/`` and ``/lookup/`` is authenticated when authentication
is on (``Authorization: Bearer <token>`` or ``Basic <base64 user:password>``, or the
verified client certificate of an HTTPS request: broker/authentication.py; 401 without
valid credentials) and then authorized by what its path names (403 for a role that may
not):

    /lookup/v2/topic/...                          produce or consume on the topic
    GET  .../{topic}/partitions                   produce or consume on the topic (the
                                                  clients' HTTP lookup asks it first)
    GET  .../{topic}/permission-check?action=A    the caller's own permission A (Magnetar:
                                                  the gateway asks it with its caller's
                                                  credentials, or for the role it names)
    GET  /admin/v2/tenants/{tenant}               tenant admin
    other /admin/v2/tenants paths                 superuser (create, change, delete, list)
    any other path naming a tenant                tenant admin (namespaces, policies,
                                                  permissions, topics, subscriptions, bundles)
    everything else under /admin/                 superuser (clusters, brokers, bookies)

A proxy role (``--proxy-roles``) may name the role it acts for in ``X-Original-Principal``
(the gateway and the proxy do, for callers they authenticated by client certificate):
the request is then authorized for that role. Any other role naming one gets 403.

``/health`` and ``/metrics`` stay open (probes; no secrets are in the metrics).

Permissions (Pulsar's paths; the body of a grant is the list of actions):

    GET    /admin/v2/namespaces/{tenant}/{ns}/permissions           {role: [actions]}
    POST   /admin/v2/namespaces/{tenant}/{ns}/permissions/{role}    body ["produce", "consume"]
    DELETE /admin/v2/namespaces/{tenant}/{ns}/permissions/{role}
    GET    /admin/v2/persistent/{tenant}/{ns}/{topic}/permissions   {role: [actions]} (topic grants)
    POST   /admin/v2/persistent/{tenant}/{ns}/{topic}/permissions/{role}
    DELETE /admin/v2/persistent/{tenant}/{ns}/{topic}/permissions/{role}

A grant or revoke acts at once on this broker (its producers and consumers are checked
again; those whose role lost the permission are closed) and within
``permission_check_interval_s`` plus the policies' cache time on other brokers.
"""

from __future__ import annotations

import logging

from aiohttp import web

from broker.admin.common import json_body, namespace_of, no_content, topic_of
from broker.authorization import ACTIONS, CONSUME, PRODUCE
from broker.admin.keys import SERVICE
from broker.service import BrokerService
from common.errors import AuthorizationDenied, InvalidArgument, NotFound
from metadata.policies import NamespacePolicies

log = logging.getLogger(__name__)

# Grants per namespace or topic: the policies record lives in etcd (values <= 1.5 MiB);
# ten thousand roles of ~100 bytes each stay far below that.
GRANTS_PER_RESOURCE_MAX = 10_000
ROLE_NAME_BYTES_MAX = 256

_OPEN_PATHS = frozenset({"/health", "/metrics"})
# The role a proxy asks about (Pulsar's proxies send the same header name).
ORIGINAL_PRINCIPAL_HEADER = "X-Original-Principal"
# The authenticated role of a request (None: authentication off), set by the middleware.
ROLE_KEY = web.RequestKey("magnetar.role", object)


def _role_of(request: web.Request) -> str | None:
    return request.get(ROLE_KEY)


async def _authorize(service: BrokerService, request: web.Request, role: str | None) -> None:
    authorizer = service.authorizer
    if not authorizer.enabled:
        return
    path = request.path
    info = request.match_info
    tenant = info.get("tenant")
    if path.startswith("/lookup/"):
        await authorizer.check_lookup(role, topic_of(request))
        return
    if "topic" in info and request.method == "GET" and path.endswith("/partitions"):
        await authorizer.check_lookup(role, topic_of(request))
        return
    if "topic" in info and path.endswith("/permission-check"):
        return   # answers about the caller's own role (the handler checks)
    if path.startswith("/admin/v2/tenants"):
        if tenant is not None and request.method == "GET":
            await authorizer.check_tenant_admin(role, tenant)
        else:
            authorizer.check_superuser(role)
        return
    if tenant is not None:
        await authorizer.check_tenant_admin(role, tenant)
        return
    authorizer.check_superuser(role)


def _original_principal(service: BrokerService, request: web.Request, role: str | None, original: str) -> str:
    """The role a proxy acts for: the gateway asking a topic's permission-check for a
    caller it authenticated by client certificate, or the proxy forwarding an admin or
    lookup request of a caller it authenticated so (proxy/http_forward.py). Only a proxy
    role may name one (as on the binary protocol's ``original_principal``); the request
    is then authorized for the role named, never for the proxy's."""
    if role is None or role not in service.config.auth.proxies:
        raise AuthorizationDenied(f"only a proxy role may ask for another role ({ORIGINAL_PRINCIPAL_HEADER})")
    if not original or len(original.encode()) > ROLE_NAME_BYTES_MAX:
        raise InvalidArgument(f"a role name must have 1 to {ROLE_NAME_BYTES_MAX} bytes")
    return original


def auth_middleware(service: BrokerService):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path in _OPEN_PATHS or not (request.path.startswith("/admin/")
                                               or request.path.startswith("/lookup/")):
            return await handler(request)
        role = None
        if service.authenticator.enabled:
            transport = request.transport
            certificate = transport.get_extra_info("peercert") if transport is not None else None
            identity = await service.authenticator.authenticate_http(request.headers.get("Authorization"),
                                                                     certificate)
            role = identity.role
        original = request.headers.get(ORIGINAL_PRINCIPAL_HEADER)
        if original is not None:
            role = _original_principal(service, request, role, original)
        request[ROLE_KEY] = role
        await _authorize(service, request, role)
        return await handler(request)

    return middleware


def _actions_of(doc: object) -> list[str]:
    if not isinstance(doc, list) or not all(isinstance(a, str) for a in doc):
        raise InvalidArgument("a grant's body must be a JSON list of actions, e.g. [\"produce\", \"consume\"]")
    unknown = sorted(set(doc) - ACTIONS)
    if unknown:
        raise InvalidArgument(f"unknown actions {unknown}; known: {sorted(ACTIONS)}")
    return sorted(set(doc))


def _role_from_path(request: web.Request) -> str:
    role = request.match_info["role"]
    if not role or len(role.encode()) > ROLE_NAME_BYTES_MAX:
        raise InvalidArgument(f"a role name must have 1 to {ROLE_NAME_BYTES_MAX} bytes")
    return role


def _auth_of(policies: NamespacePolicies) -> dict:
    auth = policies.auth_policies if isinstance(policies.auth_policies, dict) else {}
    for name in ("namespace_auth", "destination_auth", "subscription_auth_roles"):
        if not isinstance(auth.get(name), dict):
            auth[name] = {}
    policies.auth_policies = auth
    return auth

NAMESPACE_PATH = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"
TOPIC_PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get(NAMESPACE_PATH)
async def namespace_permissions(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    policies = await resources.policies(namespace_of(request), fresh=True)
    return web.json_response(_auth_of(policies)["namespace_auth"])


@routes.post(f"{NAMESPACE_PATH}/{{role}}")
async def grant_namespace(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    role = _role_from_path(request)
    actions = _actions_of(await json_body(request, required=True))

    def grant(policies: NamespacePolicies) -> None:
        grants = _auth_of(policies)["namespace_auth"]
        if role not in grants and len(grants) >= GRANTS_PER_RESOURCE_MAX:
            raise InvalidArgument(f"namespace {namespace} has {GRANTS_PER_RESOURCE_MAX} roles granted already")
        grants[role] = actions

    await resources.update_policies(namespace, grant)
    log.info("permission granted: namespace=%s role=%s actions=%s", namespace, role, ",".join(actions))
    service.recheck_permissions_now()
    return no_content()


@routes.delete(f"{NAMESPACE_PATH}/{{role}}")
async def revoke_namespace(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    role = _role_from_path(request)

    def revoke(policies: NamespacePolicies) -> None:
        grants = _auth_of(policies)["namespace_auth"]
        if role not in grants:
            raise NotFound(f"role {role} has no permissions on namespace {namespace}")
        del grants[role]

    await resources.update_policies(namespace, revoke)
    log.info("permission revoked: namespace=%s role=%s", namespace, role)
    service.recheck_permissions_now()
    return no_content()


@routes.get(f"{TOPIC_PATH}/permissions")
async def topic_permissions(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    topic = topic_of(request)
    policies = await resources.policies(topic.namespace_name, fresh=True)
    return web.json_response(_auth_of(policies)["destination_auth"].get(str(topic), {}))


@routes.post(f"{TOPIC_PATH}/permissions/{{role}}")
async def grant_topic(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    topic = topic_of(request)
    role = _role_from_path(request)
    actions = _actions_of(await json_body(request, required=True))

    def grant(policies: NamespacePolicies) -> None:
        by_topic = _auth_of(policies)["destination_auth"]
        if str(topic) not in by_topic and len(by_topic) >= GRANTS_PER_RESOURCE_MAX:
            raise InvalidArgument(f"namespace {topic.namespace_name} has {GRANTS_PER_RESOURCE_MAX} topics "
                                  "with grants already")
        grants = by_topic.setdefault(str(topic), {})
        if role not in grants and len(grants) >= GRANTS_PER_RESOURCE_MAX:
            raise InvalidArgument(f"topic {topic} has {GRANTS_PER_RESOURCE_MAX} roles granted already")
        grants[role] = actions

    await resources.update_policies(topic.namespace_name, grant)
    log.info("permission granted: topic=%s role=%s actions=%s", topic, role, ",".join(actions))
    service.recheck_permissions_now()
    return no_content()


@routes.delete(f"{TOPIC_PATH}/permissions/{{role}}")
async def revoke_topic(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    topic = topic_of(request)
    role = _role_from_path(request)

    def revoke(policies: NamespacePolicies) -> None:
        grants = _auth_of(policies)["destination_auth"].get(str(topic), {})
        if role not in grants:
            raise NotFound(f"role {role} has no permissions on topic {topic}")
        del grants[role]
        if not grants:
            policies.auth_policies["destination_auth"].pop(str(topic), None)

    await resources.update_policies(topic.namespace_name, revoke)
    log.info("permission revoked: topic=%s role=%s", topic, role)
    service.recheck_permissions_now()
    return no_content()


@routes.get(f"{TOPIC_PATH}/permission-check")
async def permission_check(request: web.Request) -> web.Response:
    """204 when the caller's role may do ``action`` on the topic, 403 otherwise."""
    service = request.app[SERVICE]
    action = request.query.get("action", "")
    if action not in (PRODUCE, CONSUME):
        raise InvalidArgument("action must be produce or consume")
    await service.authorizer.check(_role_of(request), topic_of(request), action)
    return no_content()
