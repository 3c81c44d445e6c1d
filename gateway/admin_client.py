"""The gateway's calls to a broker's admin API (``admin_url``), with the gateway's own
session (its service token on each request): one place that turns the broker's answers
and failures into catalogue errors."""

from __future__ import annotations

import json

import aiohttp

from common.errors import NotFound, OperationTimeout, ServiceNotReady, error_for_code


async def admin_call(http: aiohttp.ClientSession, admin_url: str, method: str, path: str) -> tuple[int, object]:
    """``method`` on ``admin_url`` + ``path``: (status, JSON or None). A 404 is returned
    for the caller to name; other errors the broker reports come back as their
    catalogue classes, an unreachable or silent broker as ServiceNotReady or
    OperationTimeout."""
    try:
        async with http.request(method, f"{admin_url}{path}") as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as error:
        raise ServiceNotReady(f"the broker's admin API ({admin_url}) cannot be reached: {error}") from None
    except (TimeoutError, aiohttp.ClientError) as error:
        raise OperationTimeout(f"the broker's admin API did not answer: {error!r}") from None
    document = None
    if text:
        try:
            document = json.loads(text)
        except ValueError:
            document = None
    if status >= 400 and status != 404:
        if isinstance(document, dict) and isinstance(document.get("code"), int):
            raise error_for_code(document["code"], str(document.get("reason") or document.get("message") or ""))
        raise ServiceNotReady(f"the broker's admin API answered {status}")
    return status, document


async def admin_entry(http: aiohttp.ClientSession, admin_url: str, path: str) -> tuple[dict[str, str], bytes] | None:
    """``GET`` of an admin path that answers a stored entry (the payload as the body, its
    metadata in X-Pulsar-* headers): (headers, body), or None when there is no entry
    there. A missing topic or subscription raises its catalogue error."""
    try:
        async with http.get(f"{admin_url}{path}") as response:
            body = await response.read()
            status = response.status
            headers = dict(response.headers.items())
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as error:
        raise ServiceNotReady(f"the broker's admin API ({admin_url}) cannot be reached: {error}") from None
    except (TimeoutError, aiohttp.ClientError) as error:
        raise OperationTimeout(f"the broker's admin API did not answer: {error!r}") from None
    if status < 400:
        return headers, body
    try:
        document = json.loads(body) if body else None
    except ValueError:
        document = None
    code = document.get("code") if isinstance(document, dict) else None
    if status == 404 and code == NotFound.code:
        return None                        # past the last entry
    if isinstance(code, int):
        raise error_for_code(code, str(document.get("reason") or document.get("message") or ""))
    raise ServiceNotReady(f"the broker's admin API answered {status}")
