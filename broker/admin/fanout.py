"""Partitioned-topic admin calls whose partitions other brokers serve: the owner of each
such partition is asked at the partition's own path, and the answers are put together
here (as Pulsar's brokers do through their admin client).

Why: a partitioned topic's partitions fall into bundles that different brokers own. A
partition-level call served elsewhere is redirected (307) to its owner; a
partitioned-level call redirected to one partition's owner came back for the next
partition, and the client's redirects went round for ever once the partitions were
split between brokers.

How: ``partition_owners`` says who serves each partition (assigning a bundle nobody
owns, as a lookup does); ``PartitionCalls.json`` asks one owner with the caller's
``Authorization`` header (the owner authenticates and authorizes the caller, as for a
direct call), over the owner's HTTPS URL and this broker's trust store when plain ports
are off; one session (and TLS context) per admin request, one partition at a time, each
call bounded by ``PARTITION_CALL_TIMEOUT_S``; a
partition that does not exist there answers None; any other failure is the caller's
error (the owner's status and reason). Forwarded calls are never redirected by this
module again (a partition-level path converges on its owner).
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
from aiohttp import web

from broker.service import BrokerService, OwnerInfo
from common.tls import client_context
from common.topic_name import TopicName

# One partition's answer from another broker, at most this long.
PARTITION_CALL_TIMEOUT_S = 30.0
# The caller's headers passed on: its credentials, nothing else.
_FORWARDED_HEADERS = ("Authorization",)
_STATUS_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 409: web.HTTPConflict,
    412: web.HTTPPreconditionFailed, 429: web.HTTPTooManyRequests, 503: web.HTTPServiceUnavailable,
}


async def partition_owners(service: BrokerService, name: TopicName, count: int) -> list[tuple[TopicName, OwnerInfo]]:
    """Each partition of ``name`` with the broker that serves it."""
    return [(name.partition(index), await service.owner_of(name.partition(index))) for index in range(count)]


def split_between_brokers(owners: list[tuple[TopicName, OwnerInfo]]) -> bool:
    """True when the partitions are not all served by one broker."""
    return len({owner.broker_id for _, owner in owners}) > 1


class PartitionCalls:
    """The calls one admin request makes to other brokers: one HTTP session and (with
    TLS) one client context for all of them, made at the first call, closed at the end
    (``async with``)."""

    def __init__(self, service: BrokerService, request: web.Request) -> None:
        self._service = service
        self._headers = {header: request.headers[header] for header in _FORWARDED_HEADERS
                         if header in request.headers}
        self._session: aiohttp.ClientSession | None = None
        self._ssl_context: ssl.SSLContext | None = None

    async def __aenter__(self) -> "PartitionCalls":
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def json(self, owner: OwnerInfo, partition: TopicName, suffix: str) -> object | None:
        """``GET /admin/v2/<partition>/<suffix>`` of the broker serving ``partition``:
        its JSON answer, or None if the partition does not exist there (404)."""
        config = self._service.config
        if config.plain_ports_enabled and owner.web_service_url:
            base, ssl_context = owner.web_service_url, None
        else:
            if self._ssl_context is None:
                self._ssl_context = client_context(config.tls)
            base, ssl_context = owner.web_service_url_tls, self._ssl_context
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PARTITION_CALL_TIMEOUT_S))
        url = f"{base}/admin/v2/{partition.rest_path}/{suffix}"
        try:
            async with self._session.get(url, headers=self._headers, ssl=ssl_context) as response:
                if response.status == 404:
                    return None
                if response.status >= 400:
                    reason = await _reason(response)
                    error = _STATUS_ERRORS.get(response.status, web.HTTPBadGateway)
                    raise error(reason=f"{partition} on {base}: {reason}")
                return await response.json()
        except (aiohttp.ClientError, asyncio.TimeoutError) as failure:
            raise web.HTTPBadGateway(reason=f"{partition} on {base}: {type(failure).__name__}: {failure}") from None


async def _reason(response: aiohttp.ClientResponse) -> str:
    try:
        body = await response.json()
        return str(body.get("reason", body)) if isinstance(body, dict) else str(body)
    except (aiohttp.ContentTypeError, ValueError):
        return (await response.text())[:500]
