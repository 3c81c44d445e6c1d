"""Partitioned-topic admin calls whose partitions other brokers serve: the owner of each
such partition is asked at the partition's own path, and the answers are put together
here (as Pulsar's brokers do through their admin client).

Why: a partitioned topic's partitions fall into bundles that different brokers own. A
partition-level call served elsewhere is redirected (307) to its owner; a
partitioned-level call redirected to one partition's owner came back for the next
partition, and the client's redirects went round for ever once the partitions were
split between brokers.

How: ``partition_owners`` says who serves each partition (assigning a bundle nobody
owns, as a lookup does); ``PartitionCalls.call`` asks one owner with this broker's
own token when it has one (``--broker-client-token-file``, of a superuser role on the
others: the request was authorized here, as Pulsar's brokers call each other), else
with the caller's ``Authorization`` header (the owner authenticates and authorizes the
caller, as for a direct call; a caller known only by its client certificate has none
to pass on), over the owner's HTTPS URL when plain ports are off (its certificate
checked against this broker's trust store, not its host name: owners are reached at
advertised addresses, pod IPs in Kubernetes; this broker's certificate presented only
if it may serve as a client's, ``runtime/tls.py``'s ``peer_client_context``, built once
per broker and again when its files change); one session per admin request, at most
``CALLS_AT_ONCE_MAX`` partitions in flight, here and at other brokers together
(``bounded_gather``), each call bounded by ``PARTITION_CALL_TIMEOUT_S``; a partition (or subscription) that does
not exist there answers ``ABSENT``; any other failure is raised as the owner's error
(its catalogue code when it sent one, else its HTTP status). A partition-level path
converges on its owner, so a forwarded call that meets a moved bundle follows one more
redirect at most as far as aiohttp's limit.

Changes (``Outcomes``): a change fanned out is checked on every partition first where a
check exists (a subscription that exists already, clients attached), then applied to
every partition, going on past a partition that fails; the request then fails with the
first failure's error and names the partitions it was applied to, since a change
already made on other brokers is not undone (Pulsar's brokers answer the same way).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from typing import Awaitable, Callable, Iterable, TypeVar

import aiohttp
from aiohttp import web

from broker.service import BrokerService, OwnerInfo
from common.errors import MagnetarError, UnknownError, error_class_for_code, error_for_code
from common.topic_name import TopicName

# One partition's answer from another broker, at most this long.
PARTITION_CALL_TIMEOUT_S = 30.0
# Partitions one admin request changes or asks about at once (this broker's own steps
# and calls to other brokers together).
CALLS_AT_ONCE_MAX = 16
# The caller's headers passed on: its credentials, nothing else.
_FORWARDED_HEADERS = ("Authorization",)
_STATUS_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 409: web.HTTPConflict,
    412: web.HTTPPreconditionFailed, 429: web.HTTPTooManyRequests, 503: web.HTTPServiceUnavailable,
}


log = logging.getLogger(__name__)

T = TypeVar("T")


async def bounded_gather(steps: Iterable[Awaitable[T]]) -> list[T]:
    """Awaits ``steps`` (a partition's change here or a call to its owner), at most
    ``CALLS_AT_ONCE_MAX`` at once; their answers in order.
    The first step to fail stops the others (none outlives the request) and its
    exception is raised as itself."""
    semaphore = asyncio.Semaphore(CALLS_AT_ONCE_MAX)

    async def one(step: Awaitable[T]) -> T:
        async with semaphore:
            return await step

    pending = list(steps)
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(step)) for step in pending]
    except BaseExceptionGroup as failed:
        for step in pending:     # those the failure stopped before they began: not left unawaited
            if inspect.iscoroutine(step) and inspect.getcoroutinestate(step) == inspect.CORO_CREATED:
                step.close()
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


# What a call answers when the partition, or what it names on it, does not exist (404).
ABSENT = _Absent()


class _Failed:
    def __repr__(self) -> str:
        return "FAILED"


# What ``Outcomes.run`` answers for a step that failed (its error is kept).
FAILED = _Failed()


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
        # The request was authorized here: the other brokers are asked with this broker's
        # own token when it has one (a superuser there, as Pulsar's brokers call each
        # other), else with the caller's credentials.
        token = service.broker_client_token() if service.broker_client_token is not None else None
        self._headers = {"Authorization": f"Bearer {token}"} if token is not None else {
            header: request.headers[header] for header in _FORWARDED_HEADERS if header in request.headers}
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
        answer = await self.call("GET", owner, partition, suffix)
        return None if answer is ABSENT else answer

    async def call(self, method: str, owner: OwnerInfo, partition: TopicName, suffix: str = "", *,
                   body: object = None, query: dict[str, str] | None = None, path: str | None = None) -> object:
        """``<method> /admin/v2/<partition>[/<suffix>]`` (or ``path``, another path about
        ``partition``) of the broker serving ``partition`` (``body`` sent as JSON unless
        None): its JSON answer (None for an empty one), or ``ABSENT`` for a 404."""
        config = self._service.config
        if config.plain_ports_enabled and owner.web_service_url:
            base, ssl_context = owner.web_service_url, None
        else:
            if self._ssl_context is None:
                self._ssl_context = self._service.peer_tls.current()
            base, ssl_context = owner.web_service_url_tls, self._ssl_context
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PARTITION_CALL_TIMEOUT_S))
        url = f"{base}{path}" if path is not None else \
            f"{base}/admin/v2/{partition.rest_path}" + (f"/{suffix}" if suffix else "")
        counts = self._service.partition_calls
        try:
            async with self._session.request(method, url, headers=self._headers, ssl=ssl_context,
                                             json=body, params=query) as response:
                if response.status == 404:
                    counts["absent"] += 1
                    return ABSENT
                if response.status >= 400:
                    counts["refused"] += 1
                    raise await _owner_error(response, f"{partition} on {base}")
                text = await response.text()
                answer = None if not text.strip() else await response.json(content_type=None)
                counts["ok"] += 1
                return answer
        except (aiohttp.ClientError, asyncio.TimeoutError) as failure:
            counts["unreachable"] += 1
            log.warning("another broker not reachable for an admin call: partition=%s owner=%s error=%s: %s",
                        partition, base, type(failure).__name__, failure)
            raise web.HTTPBadGateway(reason=f"{partition} on {base}: {type(failure).__name__}: {failure}") from None
        except ValueError as failure:   # an answer that is not JSON
            counts["refused"] += 1
            raise web.HTTPBadGateway(reason=f"{partition} on {base}: not JSON: {failure}") from None


async def _owner_error(response: aiohttp.ClientResponse, where: str) -> Exception:
    """The owner's error as this broker raises it: the catalogue error its code names
    (with the owner's message), else an HTTP error of its status."""
    try:
        body = await response.json(content_type=None)
    except ValueError:
        body = (await response.text())[:500]
    reason = str(body.get("reason", body)) if isinstance(body, dict) else str(body)
    code = body.get("code") if isinstance(body, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and error_class_for_code(code) is not UnknownError:
        return error_for_code(code, f"{where}: {reason}")
    return _STATUS_ERRORS.get(response.status, web.HTTPBadGateway)(reason=f"{where}: {reason}")


def reason_of(error: Exception) -> str:
    if isinstance(error, MagnetarError):
        return error.message
    if isinstance(error, web.HTTPException):
        return error.reason
    return f"{type(error).__name__}: {error}"


class Outcomes:
    """What one change did on each partition it was sent to: applied, absent (the
    partition, or what the change names on it, does not exist there) or failed."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.applied: list[TopicName] = []
        self.absent: list[TopicName] = []
        self.failed: list[tuple[TopicName, Exception]] = []

    async def run(self, partition: TopicName, step: Awaitable[object]) -> object:
        """Awaits one partition's step and returns its answer (FAILED if it failed); a
        catalogue or HTTP error is kept, not raised, so the change goes on to the next
        partition."""
        try:
            answer = await step
        except (MagnetarError, web.HTTPException) as failure:
            self.failed.append((partition, failure))
            return FAILED
        (self.absent if answer is ABSENT else self.applied).append(partition)
        return answer

    def raise_failure(self) -> None:
        """Raises the first failure (as its own type), naming what was applied; nothing
        when every partition answered."""
        if not self.failed:
            return
        # Steps may finish in any order: name them by partition.
        partition, first = min(self.failed, key=lambda failed: failed[0].partition_index)
        applied = ", ".join(str(index) for index in sorted(p.partition_index for p in self.applied)) or "none"
        message = (f"{self.what}: failed on {len(self.failed)} partition(s), first {partition}: "
                   f"{reason_of(first)}; applied to partitions: {applied}")
        if isinstance(first, MagnetarError):
            raise error_for_code(first.code, message)
        assert isinstance(first, web.HTTPException)
        raise type(first)(reason=message.replace("\n", " "))


async def apply_to_partitions(remote: PartitionCalls, owners: list[tuple[TopicName, OwnerInfo]], what: str,
                              here: Callable[[TopicName], Awaitable[object]], method: str, suffix: str = "", *,
                              query: dict[str, str] | None = None) -> dict[TopicName, object]:
    """One change on every partition: ``here`` for this broker's, ``method`` on the
    partition path's ``suffix`` at the others' owners; at most ``CALLS_AT_ONCE_MAX``
    partitions at once, here and elsewhere together. Returns each answer that is not
    ABSENT, by partition; raises the first failure (``Outcomes``) after trying all."""
    outcomes = Outcomes(what)
    answers: dict[TopicName, object] = {}

    async def step(partition: TopicName, change: Awaitable[object]) -> None:
        answer = await outcomes.run(partition, change)
        if answer is not FAILED and answer is not ABSENT:
            answers[partition] = answer

    await bounded_gather(step(partition, here(partition) if owner.is_self
                              else remote.call(method, owner, partition, suffix, query=query))
                         for partition, owner in owners)
    outcomes.raise_failure()
    return {partition: answers[partition] for partition, _ in owners if partition in answers}
