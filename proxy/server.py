"""What every client connection of one proxy shares: the live brokers, the lookup
links to them, the metrics and the limits."""

from __future__ import annotations

import logging
import ssl

from protocol.codec import Frame
from protocol.proto import pulsar_api_pb2 as pb
from proxy.auth import ProxyAuthenticator
from proxy.brokers import BrokerDirectory
from proxy.config import ProxyConfig
from proxy.metrics import ProxyMetrics
from proxy.upstream import LinkPool, UpstreamGone

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
        # The proxy's own links, for clients it does not authenticate: one per broker,
        # shared by them all, CONNECTed with the proxy's token if it has one.
        self._shared = LinkPool(connect_fields=self._own_fields, tls_context=broker_tls_context,
                                timeout_s=config.handshake_timeout_s, frame_bytes_max=config.frame_bytes_max,
                                pending_max=config.pending_lookups_max, links_max=1 << 16)

    def _own_fields(self) -> dict:
        credentials = self.auth.own_credentials()
        if credentials is None:
            return {}
        return {"auth_method_name": credentials[0], "auth_data": credentials[1]}

    def client_links(self, client) -> LinkPool:
        """The links of one authenticated client connection (closed with it): their
        CONNECT carries the proxy's token and names ``client()`` (``original_principal``,
        ``original_auth_method``, and ``original_auth_data`` with --forward-auth-data: its
        latest credential), so brokers authorize the client's role for everything asked
        over them."""
        gauge = self.metrics.client_links
        return LinkPool(connect_fields=lambda: self.auth.connect_fields_for(client()),
                        tls_context=self.broker_tls_context, timeout_s=self.config.handshake_timeout_s,
                        frame_bytes_max=self.config.frame_bytes_max, pending_max=self.config.pending_lookups_max,
                        links_max=self.config.client_links_max, idle_s=self.config.client_link_idle_s,
                        on_count=lambda delta: gauge.inc(delta))

    async def forward(self, command: pb.BaseCommand, pool: LinkPool | None = None) -> Frame:
        """A lookup-phase request answered by a live broker over ``pool``'s links (the
        shared ones if None), tried on up to ``lookup_attempts_max`` brokers: first one
        the pool already has a link to, then others at random. UpstreamGone /
        TimeoutError if none answered."""
        pool = pool or self._shared
        tls = self.broker_tls_context is not None and self.config.broker_tls_only
        tried: set[str] = set()
        last: Exception = UpstreamGone("no broker is registered")
        for _ in range(self.config.lookup_attempts_max):
            address = None
            for key in pool.live():
                known = self.brokers.resolve(key)
                if known is not None and known.tls == tls and known.broker_id not in tried:
                    address = known
                    break
            if address is None:
                address = self.brokers.pick(exclude=tried, tls=tls)
            if address is None:
                break
            tried.add(address.broker_id)
            try:
                link = await pool.get(f"{address.host}:{address.port}", address.host, address.port, address.tls)
                return await link.forward(command, self.config.lookup_timeout_s)
            except (UpstreamGone, TimeoutError) as error:
                log.info("lookup not answered, next broker: broker=%s error=%s", address.broker_id,
                         error or "timed out")
                last = error
        raise last

    def close(self) -> None:
        self._shared.close()
        for connection in list(self.connections):
            connection.close()
