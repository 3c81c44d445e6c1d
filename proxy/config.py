"""What one proxy process is told: where etcd is, where to listen, and its limits."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError
from protocol.codec import FRAME_BYTES_MAX_DEFAULT
from runtime.tls import TlsConfig


@dataclass(frozen=True)
class ProxyConfig:
    metadata_url: str = "etcd://127.0.0.1:2379/magnetar/standalone"
    host: str = "127.0.0.1"
    port: int = 6650
    http_port: int = 8082
    # The URL clients are told to come back to (the lookup answers keep the owner's URL
    # as the logical address; the client connects physically to its service URL).
    advertised_url: str = ""
    # Client connections open at once; past it a new one is closed at once.
    connections_max: int = 10_000
    # A frame the proxy itself reads (CONNECT and the lookup-phase commands). Frames
    # piped to a broker are the broker's to limit.
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    # CONNECT must arrive, and the broker's handshake complete, within this.
    handshake_timeout_s: float = 10.0
    # Bytes written to one side and not yet sent before reading from the other pauses.
    buffer_bytes_max: int = 1024 * 1024
    # One forwarded lookup's round trip to a broker.
    lookup_timeout_s: float = 30.0
    # Lookup-phase requests of one client waiting on brokers at once.
    pending_lookups_max: int = 1_000
    # An authenticated client's lookup-phase requests go over links to brokers that name
    # that client (closed with its connection): at most this many per client connection,
    # each closed after this long without a request.
    client_links_max: int = 2
    client_link_idle_s: float = 60.0
    # Brokers one lookup is tried on before it fails (a broker may have just died).
    lookup_attempts_max: int = 3
    # TLS towards brokers: lookups and piped connections use the brokers' pulsar+ssl://
    # addresses, verified against this CA (a client naming a plain address is still
    # piped in plain).
    broker_tls_only: bool = False
    broker_tls_trust_certs_file: str = ""
    # Brokers' certificates checked against their host names too (off in Kubernetes,
    # where brokers advertise pod IPs: the CA is still checked).
    broker_tls_hostname_verification: bool = True
    # False: ``port`` and ``http_port`` do not listen (clients on the TLS ports only).
    plain_ports_enabled: bool = True
    # The binary protocol over TLS and the HTTP port over HTTPS (-1: none); both use ``tls``.
    tls_port: int = -1
    http_tls_port: int = -1
    # The certificate presented to clients; a CA to verify clients' certificates with
    # (tls authentication), required or not.
    tls: TlsConfig = TlsConfig()

    def __post_init__(self) -> None:
        if self.connections_max < 1:
            raise ConfigError("connections_max must be at least 1")
        if not 1024 <= self.frame_bytes_max <= 64 * 1024 * 1024:
            raise ConfigError("frame_bytes_max must be in [1 KiB, 64 MiB]")
        if not 0.1 <= self.handshake_timeout_s <= 600:
            raise ConfigError("handshake_timeout_s must be in [0.1, 600]")
        if not 4096 <= self.buffer_bytes_max <= 256 * 1024 * 1024:
            raise ConfigError("buffer_bytes_max must be in [4 KiB, 256 MiB]")
        if (self.tls_port >= 0 or self.http_tls_port >= 0) and not self.tls.enabled:
            raise ConfigError("tls_port and http_tls_port need a TLS certificate (--tls-cert-file, --tls-key-file)")
        if not self.plain_ports_enabled and self.tls_port < 0:
            raise ConfigError("with the plain ports off (--no-plain-ports), tls_port must be set: clients need a port")
        if self.client_links_max < 1 or not 1 <= self.client_link_idle_s <= 86_400:
            raise ConfigError("client_links_max must be at least 1 and client_link_idle_s in [1, 86400]")
        if self.pending_lookups_max < 1 or self.lookup_attempts_max < 1:
            raise ConfigError("pending_lookups_max and lookup_attempts_max must be at least 1")
