"""The gateway's calls to a broker's admin API (``admin_url``), with the gateway's own
session (its service token on each request): one place that turns the broker's answers
and failures into catalogue errors."""

from __future__ import annotations

import json

import aiohttp

from common.errors import NotFound, OperationTimeout, ServiceNotReady, error_for_code


async def _fetch(http: aiohttp.ClientSession, admin_url: str, method: str, path: str,
                 ) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); an unreachable or silent broker raises ServiceNotReady
    or OperationTimeout."""
    try:
        async with http.request(method, f"{admin_url}{path}") as response:
            return response.status, dict(response.headers.items()), await response.read()
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as error:
        raise ServiceNotReady(f"the broker's admin API ({admin_url}) cannot be reached: {error}") from None
    except (TimeoutError, aiohttp.ClientError) as error:
        raise OperationTimeout(f"the broker's admin API did not answer: {error!r}") from None


def _json(body: bytes) -> object:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _failure(status: int, document: object) -> Exception:
    """The error a failed answer stands for: its catalogue class when it names one."""
    if isinstance(document, dict) and isinstance(document.get("code"), int):
        return error_for_code(document["code"], str(document.get("reason") or document.get("message") or ""))
    return ServiceNotReady(f"the broker's admin API answered {status}")


async def admin_call(http: aiohttp.ClientSession, admin_url: str, method: str, path: str) -> tuple[int, object]:
    """``method`` on ``admin_url`` + ``path``: (status, JSON or None). A 404 is returned
    for the caller to name; other errors the broker reports come back as their
    catalogue classes."""
    status, _, body = await _fetch(http, admin_url, method, path)
    document = _json(body)
    if status >= 400 and status != 404:
        raise _failure(status, document)
    return status, document


async def admin_entry(http: aiohttp.ClientSession, admin_url: str, path: str) -> tuple[dict[str, str], bytes] | None:
    """``GET`` of an admin path that answers a stored entry (protocol/admin_entry.py):
    (headers, body), or None when there is no entry there. A missing topic or
    subscription raises its catalogue error."""
    status, headers, body = await _fetch(http, admin_url, "GET", path)
    if status < 400:
        return headers, body
    document = _json(body)
    if status == 404 and isinstance(document, dict) and document.get("code") == NotFound.code:
        return None                        # past the last entry
    raise _failure(status, document)
