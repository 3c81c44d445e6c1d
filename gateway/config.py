"""The gateway's one config object, built once by ``magnetar gateway`` (gateway/main.py)
from its options and the environment, validated here, and passed down. Every limit the
gateway enforces is a field, with its unit in its name and the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.errors import ConfigError
from runtime.tls import TlsConfig
from gateway.receipts import ReceiptKeys

MIB = 1024 * 1024


@dataclass(frozen=True)
class GatewayConfig:
    service_url: str
    receipt_keys: ReceiptKeys
    # The broker's HTTP address, for the admin passthroughs (topic stats, backlog).
    admin_url: str = "http://127.0.0.1:8080"
    host: str = "127.0.0.1"
    port: int = 8081
    # Where other gateway instances reach this one (receipts carry it, so a nack or an
    # extension made through another instance reaches the one holding the lease).
    # Empty: http://{host}:{port} once the port is bound.
    advertised_url: str = ""
    # Processes serving the port (gateway/processes.py): more than 1 binds it with
    # SO_REUSEPORT and gives each process a settle address of its own (the advertised
    # URL's host, a free port) for the receipts it issues. reuse_port: this process is
    # one of them, started by the first.
    processes: int = 1
    reuse_port: bool = False
    # Bytes of one request body. A batch of 1,000 messages of 4 KiB in base64 is about
    # 5.5 MiB; Pulsar's largest message (5 MiB) in base64 is 6.7 MiB.
    body_bytes_max: int = 8 * MIB
    # Messages in one produce request: Pulsar's batchingMaxMessages.
    batch_messages_max: int = 1_000
    # Payload bytes of one message, decoded: Pulsar's 5 MiB message limit less room for
    # the metadata of the entry around it.
    message_bytes_max: int = 5 * MIB - 64 * 1024
    # One line of a streaming (NDJSON) produce.
    stream_line_bytes_max: int = 7 * MIB
    # Messages one pull may return.
    pull_messages_max: int = 1_000
    # How long a long poll may wait: SQS allows 20 s; a little more for slow links.
    wait_ms_max: int = 30_000
    lease_ms_default: int = 30_000
    lease_ms_min: int = 100
    # SQS's longest visibility timeout.
    lease_ms_max: int = 12 * 3600 * 1000
    # Messages one gateway consumer (one subscription, or one named consumer or member
    # of it) holds leased, deferred or being written: the leases in flight per
    # subscription. Past it pulls answer 429. Pulsar stops dispatching to a consumer at
    # 50,000 unacknowledged (maxUnackedMessagesPerConsumer); a fifth of that keeps the
    # gateway's memory for held messages near 10,000 x message size.
    leases_per_subscription_max: int = 10_000
    # A message that arrived after the pull that asked for it gave up (or a batch's
    # remainder) waits this long for the next pull, without a lease, then goes back to
    # the subscription for others.
    ready_hold_ms: int = 2_000
    # Read-ahead: while pulls are waiting, a gateway consumer asks the broker for up to
    # this many messages beyond what they want, so the next pull finds them here instead
    # of paying a broker round trip. It adapts: never more than pulls took over the last
    # half of ready_hold_ms, so occasional pulls read ahead nothing. What is read ahead is
    # not leased: it waits under the ready_hold_ms rule above like any message no pull
    # took, then goes back to the subscription marked unused, which the broker does not
    # count as a delivery (delivery_attempt and max_deliveries are unchanged). Shared,
    # key-shared and broadcast only (exclusive and failover give back by rewinding).
    read_ahead_messages: int = 500
    # A message with a deliver-at time is held until then, at most this long (then it
    # goes back to the subscription and comes round again).
    deferral_ms_max: int = 3_600_000
    # How often leases are checked for expiry: the precision of a lease's end.
    lease_tick_ms: int = 50
    # Subscriptions with /metrics series of their own (magnetar_gateway_subscription_*);
    # later ones share the series labelled _other (gateway/subscription_counts.py). Six
    # series each: 1,000 subscriptions are 6,000 series.
    metrics_subscriptions_max: int = 1000
    # A gateway consumer nobody pulled from for this long, holding nothing, is closed.
    consumer_idle_ms: int = 60_000
    producer_idle_ms: int = 300_000
    # Broker producers and consumers this gateway keeps open at once.
    producers_max: int = 1_000
    consumers_max: int = 1_000
    # Requests handled at once (long polls included); past it: 429. aiohttp itself
    # keeps no such bound.
    requests_in_flight_max: int = 4_096
    # A produce waits this long for the broker's receipt (the official clients' send
    # timeout), then answers 504 (retriable; the message may or may not be stored).
    produce_timeout_ms: int = 30_000
    # A nack or extension forwarded to the gateway instance holding the lease.
    forward_timeout_ms: int = 5_000
    # Settle operations forwarded at once (in the background, for acks).
    forwards_in_flight_max: int = 256
    # Server-sent events: credits one stream may hold (leased and unsettled messages)
    # and the keep-alive comment interval.
    sse_credits_max: int = 1_000
    sse_keepalive_ms: int = 15_000
    # The Retry-After of a 429 or 503.
    retry_after_s: int = 1
    # Security (gateway/auth.py). Callers must present credentials of one of the
    # providers, which a broker checks for the permission each request needs.
    authentication_enabled: bool = False
    # Comma-separated, as the brokers' --authentication-providers: token (Bearer), basic
    # (Basic), tls (a client certificate verified against tls.trust_certs_file; its CN
    # is the role, checked through the service token, whose role must be a proxy role).
    authentication_providers: str = "token"
    # The gateway's own token, for its connections to brokers and its admin requests
    # (empty: none, for brokers without authentication). Never logged or shown.
    service_token: str = field(default="", repr=False)
    # The file service_token was read from (--service-token-file), read again when it
    # changes: a renewed token is used without a restart (new connections, answers to a
    # broker's AUTH_CHALLENGE, admin requests). Empty: service_token is fixed.
    service_token_file: str = ""
    # A broker's answer to a permission check is reused this long: a revoke reaches the
    # gateway's callers within it. Bounded to this many (token, topic, action) entries.
    permission_cache_ms: int = 2_000
    permission_cache_entries_max: int = 10_000
    # HTTPS (runtime/tls.py): with a certificate the gateway serves only HTTPS, the
    # certificate read again when its files change.
    tls: TlsConfig = field(default_factory=TlsConfig)
    # The CA of the brokers' certificates, for a pulsar+ssl:// service URL and an
    # https:// admin URL ("": the system's trust store).
    broker_tls_trust_certs_file: str = ""
    # Whether the brokers' certificates must name the host dialled (off: the chain is
    # still checked against the CA; lookups send the gateway to brokers' pod IPs, which
    # a certificate made once cannot name).
    broker_tls_hostname_verification: bool = True

    def __post_init__(self) -> None:
        if not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise ConfigError("service_url must be pulsar://host:port[,host:port...] or pulsar+ssl://...")
        if not self.admin_url.startswith(("http://", "https://")):
            raise ConfigError("admin_url must be an http(s):// URL")
        if not 0 <= self.port < 65536:
            raise ConfigError("port must be in [0, 65535]")
        for name in ("body_bytes_max", "batch_messages_max", "message_bytes_max", "stream_line_bytes_max",
                     "pull_messages_max", "wait_ms_max", "lease_ms_default", "lease_ms_min", "lease_ms_max",
                     "leases_per_subscription_max", "ready_hold_ms", "deferral_ms_max", "lease_tick_ms",
                     "consumer_idle_ms", "producer_idle_ms", "producers_max", "consumers_max",
                     "requests_in_flight_max", "produce_timeout_ms", "forward_timeout_ms", "forwards_in_flight_max",
                     "sse_credits_max", "sse_keepalive_ms", "retry_after_s", "permission_cache_ms",
                     "permission_cache_entries_max", "metrics_subscriptions_max"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        unknown = sorted(set(self.providers) - {"token", "basic", "tls"})
        if unknown or not self.providers:
            raise ConfigError(f"authentication_providers must name some of token, basic, tls (unknown: {unknown})")
        if self.authentication_enabled and "tls" in self.providers:
            if not self.tls.enabled or not self.tls.trust_certs_file:
                raise ConfigError("the tls provider needs HTTPS with tls.trust_certs_file (the CA of client "
                                  "certificates)")
            if not self.service_token:
                raise ConfigError("the tls provider needs a service token (of a role the brokers list in "
                                  "--proxy-roles)")
        if not 1 <= self.processes <= 64:
            raise ConfigError("processes must be in [1, 64]")
        if not self.lease_ms_min <= self.lease_ms_default <= self.lease_ms_max:
            raise ConfigError("lease_ms_default must be in [lease_ms_min, lease_ms_max]")
        if self.wait_ms_max < 20_000:
            raise ConfigError("wait_ms_max must be >= 20000 (long polls of 20 s are promised)")
        if self.pull_messages_max > self.leases_per_subscription_max:
            raise ConfigError("pull_messages_max must be <= leases_per_subscription_max")
        if self.read_ahead_messages < 0:
            raise ConfigError("read_ahead_messages must be >= 0 (it is bounded by the leases' room)")
        if self.lease_tick_ms >= self.lease_ms_min:
            raise ConfigError("lease_tick_ms must be < lease_ms_min")
        if self.sse_credits_max > self.leases_per_subscription_max:
            raise ConfigError("sse_credits_max must be <= leases_per_subscription_max")

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name.strip() for name in self.authentication_providers.split(",")
                                   if name.strip()))
