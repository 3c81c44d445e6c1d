"""Authentication and authorization of the gateway's callers, decided by the brokers.

The gateway holds no keys and no permissions. With ``authentication_enabled`` every
``/v1`` request must carry credentials of one of the gateway's
``authentication_providers`` (401 otherwise), which a broker checks on the admin API,
``GET /admin/v2/persistent/{topic}/permission-check?action=produce|consume``. The
broker authenticates them and applies exactly the authorization it applies to its own
clients (superusers, tenant admins, namespace and topic grants), answering 204, 401 or
403, which the gateway passes on:

| provider | the caller sends | the gateway asks the broker with |
|---|---|---|
| ``token`` | ``Authorization: Bearer <jwt>`` | the same header |
| ``basic`` | ``Authorization: Basic <base64 user:password>`` | the same header |
| ``tls`` | a client certificate (HTTPS with ``tls.trust_certs_file``) | its service token and ``X-Original-Principal: <certificate CN>`` (the gateway's role must be one of the brokers' ``--proxy-roles``) |

Producing needs ``produce``; everything under a subscription (pull, ack, nack, extend,
events, create, delete, backlog) and a topic's stats need ``consume``.

Data then flows over the gateway's own connections to the brokers, authenticated with
its service token (a role the brokers must let produce and consume wherever the
gateway's users may: a superuser, or one granted on the namespaces served). So the
caller's credentials decide *whether*, the service token only carries the bytes.

Answers are cached per (credential digest, topic, action) for ``permission_cache_ms``
(2 s by default), at most ``permission_cache_entries_max`` entries (the oldest go
first): a revoke reaches the gateway's callers within that time. Credentials are kept
only as SHA-256 digests and never logged.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from typing import Awaitable, Callable

import aiohttp
from aiohttp import web

from common.errors import (
    AuthenticationFailed,
    AuthorizationDenied,
    MagnetarError,
    OperationTimeout,
    ServiceNotReady,
    error_for_code,
)
from runtime.tls import certificate_common_name
from common.topic_name import TopicName
from gateway.http_common import topic_of
from gateway.keys import SERVICE

log = logging.getLogger(__name__)

PRODUCE = "produce"
CONSUME = "consume"
# The providers (auth method names, as the brokers' --authentication-providers).
TOKEN = "token"
BASIC = "basic"
TLS = "tls"
PROVIDERS = (TOKEN, BASIC, TLS)
# The header a proxy names its caller's role with (Pulsar's proxies use the same).
ORIGINAL_PRINCIPAL_HEADER = "X-Original-Principal"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def action_of(request: web.Request) -> str | None:
    """The permission a request needs (None: no topic in its path, nothing to check)."""
    if "topic" not in request.match_info:
        return None
    if "subscription" in request.match_info or request.path.endswith("/stats"):
        return CONSUME
    return PRODUCE


class PermissionCache:
    """(token digest, topic, action) -> (error or None, expires at), bounded, oldest out."""

    def __init__(self, ttl_ms: int, entries_max: int) -> None:
        assert ttl_ms > 0 and entries_max > 0
        self.ttl_s = ttl_ms / 1000
        self.entries_max = entries_max
        self._entries: OrderedDict[tuple[bytes, str, str], tuple[MagnetarError | None, float]] = OrderedDict()

    def get(self, key: tuple[bytes, str, str], now: float) -> tuple[bool, MagnetarError | None]:
        found = self._entries.get(key)
        if found is None or found[1] <= now:
            self._entries.pop(key, None)
            return False, None
        return True, found[0]

    def put(self, key: tuple[bytes, str, str], error: MagnetarError | None, now: float) -> None:
        self._entries[key] = (error, now + self.ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > self.entries_max:
            self._entries.popitem(last=False)
        assert len(self._entries) <= self.entries_max


async def check_with_broker(http: aiohttp.ClientSession, admin_url: str, authorization: str, topic: str,
                            action: str, original_principal: str | None = None) -> None:
    """Asks a broker whether the bearer of ``authorization`` (or, for a proxy's
    service token, ``original_principal``) may ``action`` on ``topic``."""
    url = f"{admin_url}/admin/v2/{TopicName.parse(topic).rest_path}/permission-check"
    headers = {"Authorization": authorization}
    if original_principal is not None:
        headers[ORIGINAL_PRINCIPAL_HEADER] = original_principal
    try:
        async with http.get(url, params={"action": action}, headers=headers, allow_redirects=False) as response:
            status = response.status
            document = await response.json(content_type=None) if status >= 400 else None
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as error:
        raise ServiceNotReady(f"the broker's admin API ({admin_url}) cannot be reached: {error}") from None
    except (TimeoutError, aiohttp.ClientError, ValueError) as error:
        raise OperationTimeout(f"the broker's permission check did not answer: {type(error).__name__}") from None
    if status < 300:
        return
    if isinstance(document, dict) and isinstance(document.get("code"), int):
        raise error_for_code(document["code"], str(document.get("reason") or ""))
    if status == 401:
        raise AuthenticationFailed("the broker refused the credentials")
    if status == 403:
        raise AuthorizationDenied(f"not allowed to {action} on {topic}")
    raise ServiceNotReady(f"the broker's permission check answered {status}")


def caller_of(request: web.Request, providers: frozenset[str], service_token: str
              ) -> tuple[bytes, str, str | None]:
    """(cache digest, Authorization header for the broker, original principal or None)
    of a request's credentials; AuthenticationFailed when it has none the gateway takes."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if authorization:
        method = {"bearer": TOKEN, "basic": BASIC}.get(scheme.lower())
        if method is None or not credentials:
            raise AuthenticationFailed("the Authorization header must be 'Bearer <token>' or 'Basic <base64>'")
        if method not in providers:
            raise AuthenticationFailed(f"{scheme} credentials are not accepted here "
                                       f"(providers: {', '.join(sorted(providers))})")
        return hashlib.sha256(f"{method}\0{credentials}".encode()).digest(), f"{scheme} {credentials}", None
    if TLS in providers:
        transport = request.transport
        role = certificate_common_name(transport.get_extra_info("peercert") if transport is not None else None)
        if role is not None:
            return hashlib.sha256(f"{TLS}\0{role}".encode()).digest(), f"Bearer {service_token}", role
    raise AuthenticationFailed("authentication is required: send Authorization: Bearer <token> or Basic "
                               "credentials" + (", or a client certificate" if TLS in providers else ""))


def auth_middleware(enabled: bool, cache: PermissionCache, providers: frozenset[str] = frozenset({"token"}),
                    service_token: Callable[[], str] = lambda: ""):
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not enabled or not request.path.startswith("/v1/") or request.path == "/v1/openapi.json":
            return await handler(request)
        digest, authorization, original_principal = caller_of(request, providers, service_token())
        action = action_of(request)
        if action is not None:
            topic = topic_of(request)
            key = (digest, topic, action)
            now = time.monotonic()
            hit, error = cache.get(key, now)
            if not hit:
                service = request.app[SERVICE]
                assert service.http is not None
                try:
                    await check_with_broker(service.http, service.config.admin_url, authorization, topic, action,
                                            original_principal)
                    error = None
                except (AuthenticationFailed, AuthorizationDenied) as refused:
                    error = refused
                cache.put(key, error, now)
            if error is not None:
                # A fresh instance each time (a cached one would pile up tracebacks).
                raise error_for_code(error.code, error.message)
        return await handler(request)

    return middleware
