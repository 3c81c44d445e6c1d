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

A client reads the field of its own scheme: ``...Tls`` when its socket is TLS. A client
whose socket is TLS while its connection reached this broker in plain text sits behind a
hop that ends TLS — a proxy (proxy/): it only names the URL back to its service URL
(``proxy_to_broker_url``), and the proxy pipes by what the address is. For it, a
destination without a TLS listener is named by its plain URL in the TLS field too (as
the proxy does for lookup answers); without that it got no URL and looked the topic up
after its back-off. A client on a TLS connection of this broker gets only real TLS URLs.
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

    def urls_for_connection(self, listener_name: str, over_tls: bool) -> tuple[str, str] | None:
        """``urls_for``, for a client connection that reached this broker over TLS or
        not: one that did not is named the plain URL in the TLS field when the
        destination has no TLS listener (its client may sit behind a TLS proxy)."""
        urls = self.urls_for(listener_name)
        if urls is None or over_tls or urls[1]:
            return urls
        return urls[0], urls[0]


def connection_over_tls(connection) -> bool:
    """Whether a client connection reached this broker over TLS (its transport's SSL
    object; a connection without a transport counts as plain)."""
    transport = getattr(connection, "transport", None)
    return transport is not None and transport.get_extra_info("ssl_object") is not None
