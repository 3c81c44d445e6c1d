"""The gateway's one error table (gateway/errors.py) and its middlewares.

What it proves: every catalogue error answers with a 4xx or 5xx JSON document
{code, error, message, retriable}; limits answer 413 (LimitExceeded) and 429
(TooManyRequests, with Retry-After); retriable 503s carry Retry-After; a broker
failure rated 500 answers 502 (never 500); a crash in a handler is the only 500; the
in-flight limit answers 429.
How: the middlewares on a small aiohttp app with handlers that raise.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common import errors
from gateway.errors import error_document, errors_middleware, limits_middleware, status_of


def all_errors() -> list[type[errors.MagnetarError]]:
    found, pending = [], [errors.MagnetarError]
    while pending:
        cls = pending.pop()
        if cls.__module__ == errors.__name__:   # the catalogue's own (subclasses elsewhere share codes)
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", all_errors(), ids=lambda cls: cls.__name__)
def test_every_catalogue_error_has_a_status_that_is_not_500(cls):
    status = status_of(errors.error_for_code(cls.code, "m"))
    assert 400 <= status < 600 and status != 500
    document = error_document(errors.error_for_code(cls.code, "m"))
    assert document == {"code": cls.code, "error": cls.__name__, "message": "m", "retriable": cls.retriable}


def test_limits_are_413_and_429():
    assert status_of(errors.LimitExceeded("body bytes", 2, 1)) == 413
    assert status_of(errors.TooManyRequests("x")) == 429
    assert status_of(errors.LeaseExpired("x")) == 410
    assert status_of(errors.BrokerError("x")) == 502


async def test_middlewares_answer_json_with_retry_after():
    async def raise_error(request: web.Request) -> web.Response:
        raise {"limit": errors.LimitExceeded("messages", 5, 3), "busy": errors.TooManyRequests("busy"),
               "down": errors.ServiceNotReady("down"), "bug": RuntimeError("bug")}[request.match_info["kind"]]

    gate = asyncio.Event()

    async def slow(_request: web.Request) -> web.Response:
        await gate.wait()
        return web.json_response({})

    counter = [0]
    app = web.Application(middlewares=[limits_middleware(1, 3, counter), errors_middleware(3)])
    app.router.add_get("/raise/{kind}", raise_error)
    app.router.add_get("/slow", slow)
    async with TestClient(TestServer(app)) as client:
        expected = {"limit": (413, None), "busy": (429, "3"), "down": (503, "3"), "bug": (500, None)}
        for kind, (status, retry_after) in expected.items():
            response = await client.get(f"/raise/{kind}")
            assert response.status == status, kind
            assert response.headers.get("Retry-After") == retry_after, kind
            document = await response.json()
            assert set(document) == {"code", "error", "message", "retriable"}
        slow_request = asyncio.ensure_future(client.get("/slow"))
        while counter[0] == 0:
            await asyncio.sleep(0.01)
        refused = await client.get("/raise/limit")
        assert refused.status == 429 and refused.headers["Retry-After"] == "3"
        gate.set()
        assert (await slow_request).status == 200
        method = await client.post("/slow")
        assert method.status == 405 and (await method.json())["code"] == errors.InvalidArgument.code
