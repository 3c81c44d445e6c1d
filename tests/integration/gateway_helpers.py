"""Helpers the gateway's integration tests share: a module cluster (etcd, 3 bookies, a
broker, two gateways) and a small HTTP client of the gateway's API."""

from __future__ import annotations

import asyncio
import base64
import ssl
import uuid
from dataclasses import dataclass

import aiohttp

from tests.cluster import Cluster


async def round_trip_over_https(gateway_url: str, ca_file: str, token: str, topic: str, payload: str) -> None:
    """Through a gateway serving HTTPS (its CA in ``ca_file``) with ``token``: a
    subscription, a produce and a pull of that message; then a produce without
    credentials is refused with 401."""
    context = ssl.create_default_context(cafile=ca_file)
    topic_url = f"{gateway_url}/v1/topics/persistent/public/default/{topic}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                     headers={"Authorization": f"Bearer {token}"}) as session:
        async with session.put(f"{topic_url}/subscriptions/s", json={"initial_position": "earliest"}) as response:
            assert response.status in (200, 201), await response.text()
        async with session.post(f"{topic_url}/message", json={"payload": payload}) as response:
            assert response.status == 200, await response.text()
        async with session.post(f"{topic_url}/subscriptions/s/pull", json={"max_messages": 1, "wait_ms": 10_000}) \
                as response:
            document = await response.json()
            assert [m["payload"] for m in document["messages"]] == [payload], document
        async with session.post(f"{topic_url}/message", json={"payload": "x"}, headers={"Authorization": ""}) \
                as response:
            assert response.status == 401


def new_topic_path(prefix: str) -> tuple[str, str]:
    """(the topic's full name, its path under /v1/topics/)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return f"persistent://public/default/{name}", f"persistent/public/default/{name}"


@dataclass
class Gateway:
    """The API of one gateway instance, over one aiohttp session."""

    url: str
    session: aiohttp.ClientSession

    def topic_url(self, path: str) -> str:
        return f"{self.url}/v1/topics/{path}"

    async def call(self, method: str, url: str, json_body=None, *, data: bytes | None = None,
                   expect: int | None = 200) -> tuple[int, dict]:
        kwargs = {"json": json_body} if data is None else {"data": data}
        async with self.session.request(method, url, **kwargs) as response:
            document = await response.json(content_type=None)
            if expect is not None:
                assert response.status == expect, (response.status, document)
            return response.status, document

    async def produce(self, path: str, messages: list[dict]) -> list[str]:
        _, document = await self.call("POST", f"{self.topic_url(path)}/messages", {"messages": messages})
        assert all(result["status"] == "stored" for result in document["results"]), document
        return [result["message_id"] for result in document["results"]]

    async def subscribe(self, path: str, subscription: str, **spec) -> dict:
        _, document = await self.call("PUT", f"{self.topic_url(path)}/subscriptions/{subscription}",
                                      {"initial_position": "earliest", **spec})
        return document

    async def pull(self, path: str, subscription: str, **spec) -> list[dict]:
        _, document = await self.call("POST", f"{self.topic_url(path)}/subscriptions/{subscription}/pull", spec)
        return document["messages"]

    async def settle(self, path: str, subscription: str, operation: str, receipts: list[str], **extra) -> list[dict]:
        _, document = await self.call("POST", f"{self.topic_url(path)}/subscriptions/{subscription}/{operation}",
                                      {"receipts": receipts, **extra})
        return document["results"]

    async def ack(self, path: str, subscription: str, messages: list[dict]) -> None:
        if not messages:
            return
        results = await self.settle(path, subscription, "ack", [m["receipt"] for m in messages])
        assert all(result["status"] == "acked" for result in results), results


def payload_bytes(message: dict) -> bytes:
    if message["encoding"] == "base64":
        return base64.b64decode(message["payload"])
    return message["payload"].encode()


async def start_gateway_cluster(cluster: Cluster, gateways: int = 2) -> None:
    await cluster.start_bookies(3)
    await cluster.start_brokers(1)
    await cluster.start_gateways(gateways, extra_args=["--body-mib-max", "1", "--ready-hold-ms", "1000"])


async def drain(gateway: Gateway, path: str, subscription: str, *, idle_s: float = 1.5, max_messages: int = 100,
                **spec) -> list[dict]:
    """Pulls and acks until a pull of ``idle_s`` brings nothing; returns what came."""
    seen: list[dict] = []
    while True:
        messages = await gateway.pull(path, subscription, max_messages=max_messages, wait_ms=int(idle_s * 1000),
                                      **spec)
        if not messages:
            return seen
        seen.extend(messages)
        await gateway.ack(path, subscription, messages)


async def gather_workers(*coroutines):
    return await asyncio.gather(*coroutines)
