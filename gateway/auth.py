"""Authentication and authorization of the gateway's callers, decided by the brokers.

The gateway holds no keys and no permissions. With ``authentication_enabled`` every
``/v1`` request must carry ``Authorization: Bearer <token>`` (401 otherwise), and the
gateway forwards that token to a broker's admin API,
``GET /admin/v2/persistent/{topic}/permission-check?action=produce|consume``: the broker
authenticates it and applies exactly the authorization it applies to its own clients
(superusers, tenant admins, namespace and topic grants), answering 204, 401 or 403,
which the gateway passes on. Producing needs ``produce``; everything under a
subscription (pull, ack, nack, extend, events, create, delete, backlog) and a topic's
stats need ``consume``.

Data then flows over the gateway's own connections to the brokers, authenticated with
its service token (a role the brokers must let produce and consume wherever the
gateway's users may: a superuser, or one granted on the namespaces served). So the
caller's token decides *whether*, the service token only carries the bytes.

Answers are cached per (token digest, topic, action) for ``permission_cache_ms`` (2 s
by default), at most ``permission_cache_entries_max`` entries (the oldest go first): a
revoke reaches the gateway's callers within that time. Tokens are kept only as SHA-256
digests and never logged.
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
from common.topic_name import TopicName
from gateway.http_common import topic_of
from gateway.keys import SERVICE

log = logging.getLogger(__name__)

PRODUCE = "produce"
CONSUME = "consume"

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
                            action: str) -> None:
    """Asks a broker whether the bearer of ``authorization`` may ``action`` on ``topic``."""
    url = f"{admin_url}/admin/v2/{TopicName.parse(topic).rest_path}/permission-check"
    try:
        async with http.get(url, params={"action": action}, headers={"Authorization": authorization},
                            allow_redirects=False) as response:
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
        raise AuthenticationFailed("the broker refused the token")
    if status == 403:
        raise AuthorizationDenied(f"not allowed to {action} on {topic}")
    raise ServiceNotReady(f"the broker's permission check answered {status}")


def auth_middleware(enabled: bool, cache: PermissionCache):
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not enabled or not request.path.startswith("/v1/") or request.path == "/v1/openapi.json":
            return await handler(request)
        authorization = request.headers.get("Authorization", "")
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise AuthenticationFailed("authentication is required: send Authorization: Bearer <token>")
        action = action_of(request)
        if action is not None:
            topic = topic_of(request)
            key = (hashlib.sha256(credentials.strip().encode()).digest(), topic, action)
            now = time.monotonic()
            hit, error = cache.get(key, now)
            if not hit:
                service = request.app[SERVICE]
                assert service.http is not None
                try:
                    await check_with_broker(service.http, service.config.admin_url, authorization, topic, action)
                    error = None
                except (AuthenticationFailed, AuthorizationDenied) as refused:
                    error = refused
                cache.put(key, error, now)
            if error is not None:
                # A fresh instance each time (a cached one would pile up tracebacks).
                raise error_for_code(error.code, error.message)
        return await handler(request)

    return middleware
