"""Configuration of the ledger client (used by brokers and the shell)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from runtime.config_options import ConfigOption, config_overrides
from common.entry import ENTRY_BYTES_MAX_DEFAULT
from common.errors import ConfigError
from runtime.tls import TlsConfig

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class BookieTlsConfig(TlsConfig):
    """TLS toward bookies, as a client: trust_certs_file is the bookies' CA; cert_file
    and key_file this client's certificate for mutual TLS. (Its own class, so that
    command-line options can tell it from a server's TlsConfig.)"""


@dataclass(frozen=True)
class LedgerClientConfig:
    # A bookie that has not answered an add for this long is replaced (ensemble
    # change). BookKeeper's addEntryTimeout default is 5 s.
    add_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    # A bookie that failed an add is chosen last for new ensembles and replacements for
    # this long (ledger/quarantine.py; BookKeeper's bookieQuarantineTimeSeconds). 0: off.
    bookie_quarantine_s: float = 60.0
    # Fence, last-add-confirmed and info calls.
    control_timeout_s: float = 5.0
    # Adds pending for one bookie are coalesced into one stream message of at most
    # this many entries / bytes (measured: 16-128 entries per message lift a gRPC
    # stream from ~7k to 100-200k adds/s; see docs/architecture.md, "Batch on the wire").
    batch_entries_max: int = 512
    batch_bytes_max: int = 4 * MIB
    # Adds a write handle lets be in flight before add() waits (back-pressure).
    pending_adds_max: int = 10_000
    pending_bytes_max: int = 64 * MIB
    # Entries asked of one bookie per read call, and the byte cap of its reply.
    read_batch_entries_max: int = 1_000
    read_response_bytes_max: int = 8 * MIB
    # Compare-and-swap retries on ledger metadata before giving up.
    metadata_attempts_max: int = 16
    grpc_message_bytes_max: int = 64 * MIB
    # The largest encoded entry (payload + header) a write handle submits; set it to
    # the bookies' entry_bytes_max (a larger entry fails with EntryTooLarge at once).
    entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT
    # Security toward bookies (bookie/security.py): TLS on the channels (the bookies'
    # CA in bookie_tls.trust_certs_file; a client certificate for mutual TLS) and a
    # service token sent on every RPC. Never logged.
    bookie_tls_enabled: bool = False
    bookie_tls: "BookieTlsConfig" = field(default_factory=lambda: BookieTlsConfig())
    # A file holding the service token (read when a bookie's channel is made).
    bookie_auth_token_file: str = ""
    # How adds travel: "grpc" (AddEntries) or "socket" (the bookie's add socket,
    # bookie/add_socket.py, where the bookie registered one; gRPC otherwise).
    add_transport: str = "grpc"

    def __post_init__(self) -> None:
        for name in ("add_timeout_s", "read_timeout_s", "control_timeout_s"):
            if not 0 < getattr(self, name) <= 600:
                raise ConfigError(f"{name} must be in (0, 600]")
        if not 0 <= self.bookie_quarantine_s <= 3_600:
            raise ConfigError("bookie_quarantine_s must be in [0, 3600]")
        if not 1 <= self.batch_entries_max <= 10_000:
            raise ConfigError("batch_entries_max must be in [1, 10000]")
        if not 64 * 1024 <= self.batch_bytes_max <= self.grpc_message_bytes_max // 2:
            raise ConfigError("batch_bytes_max must be in [64 KiB, grpc_message_bytes_max / 2]")
        if not 1 <= self.read_batch_entries_max <= 100_000:
            raise ConfigError("read_batch_entries_max must be in [1, 100000]")
        if not 64 * 1024 <= self.read_response_bytes_max <= self.grpc_message_bytes_max // 2:
            raise ConfigError("read_response_bytes_max must be in [64 KiB, grpc_message_bytes_max / 2]")
        if self.pending_adds_max < 1 or self.pending_bytes_max < MIB:
            raise ConfigError("pending_adds_max must be >= 1 and pending_bytes_max >= 1 MiB")
        if not 1 <= self.metadata_attempts_max <= 1000:
            raise ConfigError("metadata_attempts_max must be in [1, 1000]")
        if not 4 * KIB <= self.entry_bytes_max <= self.grpc_message_bytes_max // 2:
            raise ConfigError("entry_bytes_max must be in [4 KiB, grpc_message_bytes_max / 2]")
        if self.add_transport not in ("grpc", "socket"):
            raise ConfigError("add_transport must be grpc or socket")


# The ledger client's flags toward secured bookies (bookie/security.py), the same for
# every process with a ledger client: brokers, `magnetar autorecovery`, `magnetar shell`
# (a process without them could not reach bookies that serve only TLS).
BOOKIE_CLIENT_SECURITY_OPTIONS = [
    ConfigOption("--bookie-tls", LedgerClientConfig, "bookie_tls_enabled", "TLS on the channels to bookies",
                 switch_to=True),
    ConfigOption("--bookie-tls-trust-certs-file", BookieTlsConfig, "trust_certs_file", "the bookies' CA"),
    ConfigOption("--bookie-tls-cert-file", BookieTlsConfig, "cert_file",
                 "this process's certificate (bookies that require client certificates)"),
    ConfigOption("--bookie-tls-key-file", BookieTlsConfig, "key_file"),
    ConfigOption("--bookie-auth-token-file", LedgerClientConfig, "bookie_auth_token_file",
                 "a file holding the service token sent to bookies (one of their --allowed-roles)"),
    # Not security, but every process with a ledger client takes it too.
    ConfigOption("--bookie-add-transport", LedgerClientConfig, "add_transport",
                 "grpc, or socket: adds on the bookies' add sockets where they have one (docs/performance.md)"),
]


def bookie_client_security(args: argparse.Namespace) -> dict[str, Any]:
    """The LedgerClientConfig fields that BOOKIE_CLIENT_SECURITY_OPTIONS set from ``args``."""
    return {**config_overrides(args, BOOKIE_CLIENT_SECURITY_OPTIONS, LedgerClientConfig),
            "bookie_tls": BookieTlsConfig(**config_overrides(args, BOOKIE_CLIENT_SECURITY_OPTIONS, BookieTlsConfig))}


@dataclass(frozen=True)
class AutoRecoveryConfig:
    """The auditor and replication workers (``magnetar autorecovery``)."""

    # A bookie unregistered for this long is gone for good and its fragments are
    # re-replicated. Long enough to ride out a restart or a short etcd partition
    # (a restart re-registers within seconds); BookKeeper's default delay is 0 s with a
    # 30 s lostBookieRecoveryDelay commonly configured.
    grace_period_s: float = 30.0
    # The auditor looks at every ledger this often.
    audit_interval_s: float = 5.0
    # An idle worker looks for under-replicated ledgers this often.
    worker_interval_s: float = 1.0
    # The auditor's election key and each worker's ledger locks live under a lease of
    # this TTL: a dead auditor or worker is replaced this long after it died.
    lease_ttl_s: int = 10
    # Re-replication copies at most this many bytes per second per worker, so that it
    # cannot starve client traffic on the bookies (BookKeeper's
    # replicationRateByBytes plays the same part).
    rate_bytes_per_s: int = 32 * MIB
    # Entries read from a source and written to the target per step.
    copy_batch_entries: int = 256
    # Compare-and-swap attempts for one ensemble swap.
    swap_attempts_max: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.grace_period_s <= 86_400:
            raise ConfigError("grace_period_s must be in [0, 86400]")
        for name in ("audit_interval_s", "worker_interval_s"):
            if not 0 < getattr(self, name) <= 3_600:
                raise ConfigError(f"{name} must be in (0, 3600]")
        if not 2 <= self.lease_ttl_s <= 600:
            raise ConfigError("lease_ttl_s must be in [2, 600]")
        if not 64 * KIB <= self.rate_bytes_per_s <= 10 * 1024 * MIB:
            raise ConfigError("rate_bytes_per_s must be in [64 KiB, 10 GiB]")
        if not 1 <= self.copy_batch_entries <= 10_000:
            raise ConfigError("copy_batch_entries must be in [1, 10000]")
        if not 1 <= self.swap_attempts_max <= 1000:
            raise ConfigError("swap_attempts_max must be in [1, 1000]")
