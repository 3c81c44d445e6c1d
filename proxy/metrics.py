"""The proxy's Prometheus series (``/metrics`` on its HTTP port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Gauge("magnetar_proxy_connections_open", "Client connections open now", ["phase"],
                                 registry=registry)
        self.connections_total = Counter("magnetar_proxy_connections_accepted", "Client connections accepted",
                                         registry=registry)
        self.refused = Counter("magnetar_proxy_refused_total", "Client connections refused or ended by the proxy",
                               ["reason"], registry=registry)
        self.bytes = Counter("magnetar_proxy_bytes_total", "Bytes piped between clients and brokers",
                             ["direction"], registry=registry)
        self.lookups = Counter("magnetar_proxy_lookups_total", "Lookup-phase requests forwarded to a broker",
                               ["command", "outcome"], registry=registry)
        self.http = Counter("magnetar_proxy_http_requests_total", "Admin and lookup HTTP requests forwarded",
                            ["outcome"], registry=registry)
        self.paused = Counter("magnetar_proxy_read_pauses_total",
                              "Times reading one side paused because the other side's buffer was full",
                              ["side"], registry=registry)
        self.client_links = Gauge("magnetar_proxy_client_links_open",
                                  "Connections to brokers open for authenticated clients' lookups (each names its "
                                  "client)", registry=registry)
        for phase in ("handshake", "lookup", "piped"):
            self.connections.labels(phase)
        # The piped bytes' two children, looked up once: counted on every chunk piped.
        self.bytes_client_to_broker = self.bytes.labels("client_to_broker")
        self.bytes_broker_to_client = self.bytes.labels("broker_to_client")
