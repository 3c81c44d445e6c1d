"""Connections to brokers (one per broker, shared) and topic lookups with redirects.

Lookup (Pulsar's binary lookup): ask any broker of the service URL; a Redirect answer
names another broker to ask (with ``authoritative`` passed on), a Connect answer names
the broker serving the topic. At most ``lookup_redirects_max`` redirects. A topic's
partitions come from PARTITIONED_METADATA (0: not partitioned). The pool owns its
connections; ``close`` closes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging

from common.errors import ServiceNotReady
from protocol.codec import wrap
from protocol.proto import pulsar_api_pb2 as pb

from client.config import ClientConfig
from client.connection import ClientConnection, parse_address

log = logging.getLogger(__name__)
# Joins a proxy's address and the broker URL it pipes to in one connection key.
PROXIED = ">"


def service_addresses(service_url: str) -> list[str]:
    """``pulsar[+ssl]://host:port[,host:port...]`` → ["host:port", ...]; ValueError if not."""
    if not service_url.startswith(("pulsar://", "pulsar+ssl://")):
        raise ValueError(f"service URL {service_url!r} does not start with pulsar:// or pulsar+ssl://")
    addresses = []
    for part in service_url.removeprefix("pulsar+ssl://").removeprefix("pulsar://").rstrip("/").split(","):
        host, port = parse_address(part)
        addresses.append(f"{host}:{port}")
    return addresses


class BrokerPool:
    def __init__(self, service_url: str, config: ClientConfig) -> None:
        self.service_url = service_url
        # pulsar+ssl:// means TLS to every broker, lookups answered with TLS URLs.
        if service_url.startswith("pulsar+ssl://") and not config.tls_enabled:
            config = dataclasses.replace(config, tls_enabled=True)
        self.config = config
        self._service_addresses = service_addresses(service_url)
        self._next_service = itertools.cycle(self._service_addresses)
        self._connections: dict[str, ClientConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self.closed = False

    # --- connections ---------------------------------------------------------------------------

    async def connection(self, address: str) -> ClientConnection:
        """The shared connection to ``address`` (host:port), opened if needed.
        ``proxy-host:port>broker-url`` (what ``lookup`` returns behind a proxy) is a
        connection to the proxy piped to that broker."""
        if self.closed:
            raise ServiceNotReady("the client is closed")
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:
            connection = self._connections.get(address)
            if connection is None or connection.closed:
                physical, _, proxy_to = address.partition(PROXIED)
                connection = await ClientConnection.open(physical, self.config, proxy_to)
                self._connections[address] = connection
                log.debug("connected: address=%s server=%s", address, connection.server_version)
        return connection

    # --- discovery -------------------------------------------------------------------------------

    async def lookup(self, topic: str) -> str:
        """The address (host:port) of the broker serving ``topic``; behind a proxy
        (an answer with ``proxy_through_service_url``), the proxy's address and the
        owner's URL joined by PROXIED, as ``connection`` takes it."""
        address = next(self._next_service)
        authoritative = False
        for _ in range(self.config.lookup_redirects_max + 1):
            connection = await self.connection(address)
            request_id = connection.new_request_id()
            frame = await connection.request(wrap(pb.CommandLookupTopic(
                topic=topic, request_id=request_id, authoritative=authoritative)), request_id)
            answer = frame.command.lookupTopicResponse
            url = answer.brokerServiceUrlTls if self.config.tls_enabled else answer.brokerServiceUrl
            if answer.response == pb.CommandLookupTopicResponse.Connect:
                if answer.proxy_through_service_url:
                    return f"{address.partition(PROXIED)[0]}{PROXIED}{url}"
                host, port = parse_address(url)
                return f"{host}:{port}"
            host, port = parse_address(url)
            address = f"{host}:{port}"
            authoritative = answer.authoritative
        raise ServiceNotReady(f"lookup of {topic} took more than {self.config.lookup_redirects_max} redirects")

    async def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (0: not partitioned)."""
        connection = await self.connection(next(self._next_service))
        request_id = connection.new_request_id()
        frame = await connection.request(wrap(pb.CommandPartitionedTopicMetadata(
            topic=topic, request_id=request_id)), request_id)
        return frame.command.partitionMetadataResponse.partitions

    async def topics_of_namespace(self, namespace: str) -> list[str]:
        """The persistent topics of ``namespace`` (tenant/namespace), partitions by
        their partition names (GET_TOPICS_OF_NAMESPACE)."""
        connection = await self.connection(next(self._next_service))
        request_id = connection.new_request_id()
        frame = await connection.request(wrap(pb.CommandGetTopicsOfNamespace(
            request_id=request_id, namespace=namespace, mode=pb.CommandGetTopicsOfNamespace.PERSISTENT)), request_id)
        return list(frame.command.getTopicsOfNamespaceResponse.topics)

    async def connection_for(self, topic: str) -> ClientConnection:
        return await self.connection(await self.lookup(topic))

    def close(self) -> None:
        self.closed = True
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
