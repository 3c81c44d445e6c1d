"""What every client connection of one proxy shares: the live brokers, the lookup
links to them, the metrics and the limits."""

from __future__ import annotations

import asyncio
import logging
import ssl

from protocol.codec import Frame
from protocol.proto import pulsar_api_pb2 as pb
from proxy.auth import ProxyAuthenticator
from proxy.brokers import BrokerAddress, BrokerDirectory
from proxy.config import ProxyConfig
from proxy.metrics import ProxyMetrics
from proxy.upstream import BrokerLink, UpstreamGone

log = logging.getLogger(__name__)


class ProxyServer:
    def __init__(self, config: ProxyConfig, brokers: BrokerDirectory, metrics: ProxyMetrics, *,
                 broker_tls_context: ssl.SSLContext | None = None, auth: ProxyAuthenticator) -> None:
        self.config = config
        self.auth = auth
        self.brokers = brokers
        self.metrics = metrics
        self.broker_tls_context = broker_tls_context
        self.connections: set = set()
        self._links: dict[str, BrokerLink] = {}
        self._opening: dict[str, asyncio.Future[BrokerLink]] = {}

    async def _link(self, address: BrokerAddress) -> BrokerLink:
        key = f"{address.host}:{address.port}"
        link = self._links.get(key)
        if link is not None and not link.closed:
            return link
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(BrokerLink.open(
                key, address.host, address.port, context=self.broker_tls_context if address.tls else None,
                timeout_s=self.config.handshake_timeout_s, frame_bytes_max=self.config.frame_bytes_max,
                pending_max=self.config.pending_lookups_max, auth=self.auth.own_credentials()))
            self._opening[key] = opening
            opening.add_done_callback(lambda _f: self._opening.pop(key, None))
        link = await asyncio.shield(opening)
        self._links[key] = link
        return link

    async def forward(self, command: pb.BaseCommand) -> Frame:
        """A lookup-phase request answered by a live broker, tried on up to
        ``lookup_attempts_max`` of them. UpstreamGone / TimeoutError if none answered."""
        tried: set[str] = set()
        last: Exception = UpstreamGone("no broker is registered")
        for _ in range(self.config.lookup_attempts_max):
            address = self.brokers.pick(exclude=tried, tls=self.broker_tls_context is not None
                                        and self.config.broker_tls_only)
            if address is None:
                break
            tried.add(address.broker_id)
            try:
                link = await self._link(address)
                return await link.forward(command, self.config.lookup_timeout_s)
            except (UpstreamGone, TimeoutError) as error:
                log.info("lookup not answered, next broker: broker=%s error=%s", address.broker_id,
                         error or "timed out")
                last = error
        raise last

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        for connection in list(self.connections):
            connection.close()
