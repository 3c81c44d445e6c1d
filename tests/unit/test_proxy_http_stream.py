"""The proxy's HTTP forwarding passes a broker's answer on as it arrives
(proxy/http_forward.py), against a real aiohttp server on loopback standing in for the
broker's web service and the proxy's real forwarding routes in front of it.

Proves that: the caller reads the first part of an answer while the broker has not sent
the rest (a proxy reading the answer whole would wait for the end, which here never
comes before the caller's read: the test would time out); a large answer arrives whole
and byte for byte, with the broker's Content-Type and Content-Length; an answer the
broker breaks off midway reaches the caller as a truncated one (a payload error), never
as a complete answer, and is counted as "unavailable".
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from proxy.http_forward import STREAM_CHUNK_BYTES, add_forward_routes
from proxy.metrics import ProxyMetrics

BIG = os.urandom(8 * 1024 * 1024 + 17)


class _Brokers:
    """The one broker the proxy knows (what proxy/brokers.py reads from etcd)."""

    def __init__(self, url: str) -> None:
        self._url = url

    def web_urls(self) -> list[str]:
        return [self._url]


@pytest.fixture
async def broker():
    first_read = asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        # Sends a first chunk, then the rest only once the caller has read the first.
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(b"a" * STREAM_CHUNK_BYTES)
        await asyncio.wait_for(first_read.wait(), 20)
        await response.write(b"b" * STREAM_CHUNK_BYTES)
        await response.write_eof()
        return response

    async def big(_request: web.Request) -> web.Response:
        return web.Response(body=BIG, content_type="application/octet-stream")

    async def broken(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 10 * STREAM_CHUNK_BYTES
        await response.prepare(request)
        await response.write(b"c" * STREAM_CHUNK_BYTES)
        await asyncio.sleep(0.05)
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_get("/admin/v2/held", held)
    app.router.add_get("/admin/v2/big", big)
    app.router.add_get("/admin/v2/broken", broken)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server, first_read
    await server.close()


@pytest.fixture
async def proxy(broker):
    server, _ = broker
    metrics = ProxyMetrics(CollectorRegistry())
    app = web.Application()
    add_forward_routes(app, _Brokers(str(server.make_url("/")).rstrip("/")), metrics)
    proxy_server = TestServer(app, host="127.0.0.1")
    await proxy_server.start_server()
    yield proxy_server, metrics
    await proxy_server.close()


async def test_first_part_reaches_the_caller_before_the_broker_sent_the_rest(broker, proxy):
    _, first_read = broker
    proxy_server, _ = proxy
    async with aiohttp.ClientSession() as session, \
            session.get(proxy_server.make_url("/admin/v2/held")) as answer:
        assert answer.status == 200
        first = await asyncio.wait_for(answer.content.readexactly(STREAM_CHUNK_BYTES), 10)
        assert first == b"a" * STREAM_CHUNK_BYTES
        first_read.set()
        assert await asyncio.wait_for(answer.read(), 10) == b"b" * STREAM_CHUNK_BYTES


async def test_a_large_answer_arrives_whole_with_its_headers(proxy):
    proxy_server, metrics = proxy
    async with aiohttp.ClientSession() as session, \
            session.get(proxy_server.make_url("/admin/v2/big")) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"] == "application/octet-stream"
        assert answer.content_length == len(BIG)
        assert await answer.read() == BIG
    assert metrics.http.labels("ok")._value.get() == 1


async def test_an_answer_broken_off_reaches_the_caller_truncated(proxy):
    proxy_server, metrics = proxy
    async with aiohttp.ClientSession() as session, \
            session.get(proxy_server.make_url("/admin/v2/broken")) as answer:
        assert answer.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await answer.read()
    assert metrics.http.labels("unavailable")._value.get() == 1
    assert metrics.http.labels("ok")._value.get() == 0
