"""The client's one config object. Every limit the client keeps is a field here, with
its unit in its name and where its default comes from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from common.errors import ConfigError
from protocol.codec import FRAME_BYTES_MAX_DEFAULT


# The reconnection bound of the project's own services (the gateway, the Spark source
# and sink): they make another producer or consumer, or fail the task, when one fails.
SERVICE_RECONNECT_ATTEMPTS_MAX = 10
# Failed reconnection attempts are logged at INFO for the first few, then one in this
# many (a broker down for an hour is about 700 attempts at the 5 s cap).
RECONNECT_LOG_EVERY = 10


@dataclass(frozen=True)
class ClientConfig:
    # A TCP connect plus CONNECT/CONNECTED on loopback takes a millisecond; across a
    # datacenter tens. Ten seconds is the official clients' connection timeout.
    connect_timeout_ms: int = 10_000
    # One request/response round trip (LOOKUP, PRODUCER, SUBSCRIBE, SEEK...): the
    # official clients' operation timeout is 30 s; a topic load may wait on etcd and on
    # a ledger recovery.
    operation_timeout_ms: int = 30_000
    # PING after this long without traffic; no traffic for twice as long closes the
    # connection (the official clients ping every 30 s).
    keepalive_interval_s: float = 30.0
    # Pulsar's 5 MiB message limit plus 10 KiB of command and metadata.
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    # Redirects one lookup may follow (the official clients allow 20).
    lookup_redirects_max: int = 20
    # Requests awaiting an answer on one connection; past it a request fails at once
    # with TooManyRequests instead of queueing without bound.
    pending_requests_max: int = 1_000
    # Reconnection of a producer or consumer after CLOSE_PRODUCER / CLOSE_CONSUMER (topic
    # unloaded, broker stopping) or a lost connection, with an exponential back-off
    # between attempts. None: attempts never stop until the producer or consumer is
    # closed, as in the official clients (each user call is bounded by its own timeout
    # instead). A number: after that many failed attempts in a row it fails for good,
    # for an owner that makes another one (the gateway and the Spark source take
    # SERVICE_RECONNECT_ATTEMPTS_MAX: ten attempts from 100 ms doubling to 5 s cover
    # about 25 s, more than a broker's bundle handover, whose lease TTL is 10 s).
    reconnect_attempts_max: int | None = None
    reconnect_backoff_ms_min: int = 100
    reconnect_backoff_ms_max: int = 5_000
    # Messages one producer may have sent and not yet had receipts for. Past it a send
    # fails at once with TooManyRequests (the caller backs off): the official clients'
    # maxPendingMessages is 1,000 per producer; batches count by their messages, so
    # this allows 100 batches of 100.
    producer_pending_messages_max: int = 10_000
    # The batches the gateway builds: Pulsar's batchingMaxMessages (1,000) and a 5 MiB
    # message limit (one entry), less room for metadata.
    batch_messages_max: int = 1_000
    batch_bytes_max: int = 5 * 1024 * 1024 - 64 * 1024
    # A token sent in CONNECT (auth method "token") to brokers with authentication on;
    # empty: no credentials. Kept out of repr, so it is never logged.
    auth_token: str = field(default="", repr=False)
    # Where the token comes from when it can change (a file read again when renewed):
    # asked at every CONNECT and every AUTH_CHALLENGE; takes the place of auth_token.
    auth_token_source: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    # Basic authentication (auth method "basic", Pulsar's AuthenticationBasic): the
    # "user:password" the broker checks against its password file. Kept out of repr.
    auth_basic: str = field(default="", repr=False)
    # TLS toward brokers (a pulsar+ssl:// service URL turns it on): the CA file that
    # signs the brokers' certificates ("" : the system's trust store).
    tls_enabled: bool = False
    tls_trust_certs_file: str = ""
    # Whether the broker's certificate must name the host dialled. Off is what Pulsar's
    # clients do by default (tlsHostnameVerificationEnable=false): the chain is still
    # verified against the CA, but a lookup's answer (a broker pod's IP in Kubernetes)
    # need not be in the certificate.
    tls_hostname_verification: bool = True
    # Mutual TLS: this client's certificate chain and key (PEM). With them the client
    # also authenticates with method "tls" (the broker takes the role from the
    # certificate's common name) unless a token or basic credentials are given.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # Batch entries split once for every subscription of a topic read through one
    # connection (client/split_cache.py): the splits kept per connection, by count,
    # bytes and age. 64 entries cover subscriptions up to 64 entries apart (64,000
    # messages of 1,000-message batches); 16 MiB is about 25 full 256-byte batches of
    # 1,000 (each kept with its payload copies). 0 entries: nothing is shared.
    split_cache_entries_max: int = 64
    split_cache_bytes_max: int = 16 * 1024 * 1024
    split_cache_age_max_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("connect_timeout_ms", "operation_timeout_ms", "lookup_redirects_max", "pending_requests_max",
                     "reconnect_backoff_ms_min", "producer_pending_messages_max",
                     "batch_messages_max", "batch_bytes_max"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.reconnect_attempts_max is not None and self.reconnect_attempts_max <= 0:
            raise ConfigError("reconnect_attempts_max must be > 0 (or None: without end)")
        if self.split_cache_entries_max < 0:
            raise ConfigError("split_cache_entries_max must be >= 0 (0: batches are not shared)")
        if self.split_cache_bytes_max <= 0 or self.split_cache_age_max_s <= 0:
            raise ConfigError("split_cache_bytes_max and split_cache_age_max_s must be > 0")
        if self.keepalive_interval_s <= 0:
            raise ConfigError("keepalive_interval_s must be > 0")
        if not self.reconnect_backoff_ms_min <= self.reconnect_backoff_ms_max:
            raise ConfigError("reconnect_backoff_ms_min must be <= reconnect_backoff_ms_max")
        if self.frame_bytes_max < 64 * 1024:
            raise ConfigError("frame_bytes_max must be >= 64 KiB")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file go together")
        if self.auth_basic and ":" not in self.auth_basic:
            raise ConfigError("auth_basic must be user:password")
        if self.batch_bytes_max >= self.frame_bytes_max:
            raise ConfigError("batch_bytes_max must be < frame_bytes_max")

    @property
    def operation_timeout_s(self) -> float:
        return self.operation_timeout_ms / 1000

    @property
    def connect_timeout_s(self) -> float:
        return self.connect_timeout_ms / 1000

    def reconnect_attempts_left(self, attempt: int) -> bool:
        """Whether attempt ``attempt`` (0-based) of one reconnection may be made."""
        return self.reconnect_attempts_max is None or attempt < self.reconnect_attempts_max

    def backoff_s(self, attempt: int) -> float:
        """The wait before reconnection attempt ``attempt`` (0-based)."""
        assert attempt >= 0, attempt
        return min(self.reconnect_backoff_ms_min * (2 ** min(attempt, 30)), self.reconnect_backoff_ms_max) / 1000

    def backoff_jittered_s(self, attempt: int, fraction: float) -> float:
        """``backoff_s(attempt)`` spread by ``fraction`` (a uniform draw in [0, 1), the
        caller's): between 50 % and 100 % of it, so clients that lost the same broker
        do not all come back in the same millisecond."""
        assert 0.0 <= fraction <= 1.0, fraction
        return self.backoff_s(attempt) * (0.5 + 0.5 * fraction)
