"""Where a client whose topic was handed to another broker should reconnect. Pure.

A hand-over closes the bundle's producers and consumers (CLOSE_PRODUCER /
CLOSE_CONSUMER). Those commands may name the broker to reconnect to
(``assignedBrokerServiceUrl`` / ``assignedBrokerServiceUrlTls``, Pulsar's PIP-307); a
client that understands them (the official Python client 3.13 does) connects there at
once, without its reconnection back-off and without a lookup. The destination holds the
request until it owns the bundle, as it does for a client a lookup sent there.

The URL must be one the client can reach: the one a lookup would have answered. With
advertised listeners in the cluster, that is the destination's URL for the listener
the client names in its lookups, which the connection remembers; a connection that
never looked anything up names none, and then nothing is named (the client looks up,
as without this). Without listeners it is the destination's service URLs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Destination:
    service_url: str                                  # pulsar://host:port
    service_url_tls: str = ""                         # pulsar+ssl://host:port ("" without TLS)
    listeners: dict[str, str] = field(default_factory=dict)   # name -> pulsar:// URL

    def urls_for(self, listener_name: str) -> tuple[str, str] | None:
        """(URL, TLS URL or "") to name to a client that looked topics up through
        ``listener_name`` ("" if it never named one); None to name nothing."""
        if self.listeners:
            url = self.listeners.get(listener_name) if listener_name else None
            return (url, "") if url else None
        if listener_name:
            return None   # it asks for a listener nobody advertises: its lookups fail too
        return self.service_url, self.service_url_tls
