"""Configuration of a bookie: one frozen dataclass per component, built once at start
by the wiring (bookie/main.py), validated here and passed down through constructors."""

from __future__ import annotations

from dataclasses import dataclass, field

from bookie.format import journal_add_record_bytes
from common.entry import ENTRY_BYTES_MAX_DEFAULT
from metadata.etcd_tls import EtcdTlsConfig
from common.errors import ConfigError
from bookie.security import BookieSecurityConfig

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# ENTRY_BYTES_MAX_DEFAULT (the largest entry a bookie accepts) is defined once, in
# common/entry.py, so that writers and bookies agree on it by default.


@dataclass(frozen=True)
class JournalConfig:
    journal_dir: str
    # A group is written with one write + fdatasync and holds at most this many bytes
    # of records (adds that queue during an fsync form the next groups under the same
    # bound). A large sequential write is near the disk's full bandwidth by 4 MiB; 8 MiB
    # also holds the largest entry (ENTRY_BYTES_MAX_DEFAULT, 5 MiB + 64 KiB) in one
    # group, which BookieConfig requires.
    group_bytes_max: int = 8 * MIB
    # How long an idle writer lingers after an add for more to join its group (unless
    # a full group is queued first). 0: write as soon as the queue is drained, which is
    # best for latency; under load groups grow with the fsync time anyway. BookKeeper
    # (journalMaxGroupWaitMSec) waits 2 ms to save fsyncs on disks with few IOPS.
    group_wait_ms_max: float = 0.0
    # Adds queued for the journal but not yet written; past this, adds wait (back-
    # pressure to the gRPC stream). 64 MiB absorbs a few fsyncs' worth at full speed.
    queue_bytes_max: int = 64 * MIB
    # Journal files rotate at this size; old ones go once a checkpoint passes them.
    file_bytes_max: int = 256 * MIB
    # Space is allocated ahead of the writes in steps of this many bytes (fallocate),
    # so that a group's fdatasync does not also commit the file's growth: 20-30 % off
    # a small write's fdatasync on this machine's ext4 (docs/performance.md, step 19).
    # BookKeeper's journalPreAllocSizeMB does the same with 16 MB. At most
    # file_bytes_max is used; 0: files grow with each write.
    preallocate_bytes: int = 16 * MIB
    # Disable only for benchmarks of the code path itself, never in production.
    fsync_enabled: bool = True

    def __post_init__(self) -> None:
        if not self.journal_dir:
            raise ConfigError("journal_dir must be set")
        if not 0 < self.group_bytes_max <= self.file_bytes_max:
            raise ConfigError("group_bytes_max must be in (0, file_bytes_max]")
        if not 0 <= self.group_wait_ms_max <= 1000:
            raise ConfigError("group_wait_ms_max must be in [0, 1000]")
        if self.queue_bytes_max < self.group_bytes_max:
            raise ConfigError("queue_bytes_max must be at least group_bytes_max")
        if self.file_bytes_max < 1 * MIB:
            raise ConfigError("file_bytes_max must be at least 1 MiB")
        if self.preallocate_bytes < 0:
            raise ConfigError("preallocate_bytes must be at least 0")


@dataclass(frozen=True)
class LedgerStorageConfig:
    ledger_dirs: tuple[str, ...]
    # Entries wait in the write cache (memory) until a flush writes them, sorted by
    # ledger, to the entry log. A flush starts at half this size or on the interval.
    write_cache_bytes_max: int = 256 * MIB
    flush_interval_s: float = 1.0
    # Entries recently read from the entry logs, for readers that read them again
    # (flushed entries are not copied in: the OS page cache holds what was just written).
    read_cache_bytes_max: int = 128 * MIB
    entry_log_bytes_max: int = 512 * MIB
    entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT
    # A read reply carries at most this many bytes (gRPC messages are capped at 64 MiB).
    read_response_bytes_max: int = 8 * MIB
    # An add that finds the write cache full waits this long for a flush, then fails
    # with Overloaded.
    write_cache_wait_s_max: float = 10.0

    def __post_init__(self) -> None:
        if not self.ledger_dirs:
            raise ConfigError("ledger_dirs must name at least one directory")
        if not 4 * KIB <= self.entry_bytes_max <= 64 * MIB:
            raise ConfigError("entry_bytes_max must be in [4 KiB, 64 MiB]")
        if not 0 < self.write_cache_wait_s_max <= 600:
            raise ConfigError("write_cache_wait_s_max must be in (0, 600]")
        if len(set(self.ledger_dirs)) != len(self.ledger_dirs):
            raise ConfigError("ledger_dirs must not repeat a directory")
        if self.write_cache_bytes_max < 2 * self.entry_bytes_max:
            raise ConfigError("write_cache_bytes_max must hold at least two maximal entries")
        if not 0.01 <= self.flush_interval_s <= 600:
            raise ConfigError("flush_interval_s must be in [0.01, 600]")
        if self.read_cache_bytes_max < 0:
            raise ConfigError("read_cache_bytes_max must not be negative")
        if self.entry_log_bytes_max < 4 * self.entry_bytes_max:
            raise ConfigError("entry_log_bytes_max must hold at least four maximal entries")
        if not 1 * MIB <= self.read_response_bytes_max <= 32 * MIB:
            raise ConfigError("read_response_bytes_max must be in [1 MiB, 32 MiB]")


@dataclass(frozen=True)
class GcConfig:
    # How often deleted ledgers are looked for in metadata.
    interval_s: float = 60.0
    # Entry logs whose live bytes fall below this share of their size are compacted.
    compaction_live_ratio_min: float = 0.5
    # Compaction copies at most this many bytes per GC round (bounds the IO it steals).
    compaction_bytes_per_round_max: int = 1 * GIB

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 86_400:
            raise ConfigError("gc interval_s must be in [0.05, 86400]")
        if not 0.0 <= self.compaction_live_ratio_min < 1.0:
            raise ConfigError("compaction_live_ratio_min must be in [0, 1)")
        if self.compaction_bytes_per_round_max < 1 * MIB:
            raise ConfigError("compaction_bytes_per_round_max must be at least 1 MiB")


@dataclass(frozen=True)
class DiskConfig:
    # Past this share of a disk in use the bookie turns read-only (BookKeeper's
    # diskUsageThreshold default is 0.95)...
    usage_threshold: float = 0.95
    # ... and it turns writable again below this one (the low water mark).
    usage_lwm_threshold: float = 0.90
    check_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 < self.usage_threshold <= 1.0:
            raise ConfigError("usage_threshold must be in (0, 1]")
        if not 0.0 < self.usage_lwm_threshold <= self.usage_threshold:
            raise ConfigError("usage_lwm_threshold must be in (0, usage_threshold]")
        if not 0.05 <= self.check_interval_s <= 3600:
            raise ConfigError("disk check_interval_s must be in [0.05, 3600]")


# A bookie's default ops HTTP port is its gRPC port plus this: 3181 -> 8001.
HTTP_PORT_OFFSET = 8001 - 3181


def derived_http_port(port: int) -> int:
    """The default ops HTTP port of a bookie on gRPC ``port`` (0, any, stays 0)."""
    return port + HTTP_PORT_OFFSET if port else 0


@dataclass(frozen=True)
class BookieConfig:
    metadata_url: str
    journal: JournalConfig
    storage: LedgerStorageConfig
    gc: GcConfig = field(default_factory=GcConfig)
    disk: DiskConfig = field(default_factory=DiskConfig)
    # TLS toward etcd (metadata/etcd_tls.py; --etcd-tls-* flags).
    metadata_tls: EtcdTlsConfig = field(default_factory=EtcdTlsConfig)
    host: str = "127.0.0.1"
    port: int = 3181
    # The ops HTTP port (/health, /metrics). None: derived from the gRPC port, port +
    # HTTP_PORT_OFFSET (3181 -> 8001, 3182 -> 8002: the standalone's layout), so
    # bookies started on one host with distinct --port values never collide on it;
    # with port 0 (any free port) it is 0 too. Set after construction.
    http_port: int | None = None
    # The id under which the bookie registers; default its address (advertised_address,
    # else "host:port").
    bookie_id: str = ""
    # The host:port writers and readers connect to, registered in etcd; default
    # "host:port". Needed when the bookie listens on 0.0.0.0 (a container) and is
    # reached by a stable name (a StatefulSet pod's DNS name).
    advertised_address: str = ""
    # Lease on the registration: a dead bookie disappears from writers' view this long
    # after its last keep-alive.
    registration_ttl_s: int = 10
    # Parallel disk reads (each on its own thread with its own index connection).
    read_threads: int = 4
    # Concurrent gRPC streams and calls a bookie serves before refusing new ones.
    concurrent_rpcs_max: int = 1024
    grpc_message_bytes_max: int = 64 * MIB
    # Service tokens on every RPC and TLS on the gRPC port (bookie/security.py); off.
    security: BookieSecurityConfig = field(default_factory=BookieSecurityConfig)
    # The add socket (bookie/add_socket.py): adds without gRPC, on this port (0: any free
    # port; -1: off), registered for writers that choose it. Same security as gRPC.
    add_socket_port: int = -1

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("port must be in [0, 65535]")
        if self.http_port is None:
            object.__setattr__(self, "http_port", derived_http_port(self.port))
        assert self.http_port is not None
        if not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http_port must be in [0, 65535] (it defaults to port + {HTTP_PORT_OFFSET}: "
                              f"give --http-port with --port {self.port})")
        if not -1 <= self.add_socket_port <= 65535:
            raise ConfigError("add_socket_port must be in [-1, 65535] (-1: off)")
        if not 2 <= self.registration_ttl_s <= 600:
            raise ConfigError("registration_ttl_s must be in [2, 600]")
        if not 1 <= self.read_threads <= 64:
            raise ConfigError("read_threads must be in [1, 64]")
        if not 1 <= self.concurrent_rpcs_max <= 100_000:
            raise ConfigError("concurrent_rpcs_max must be in [1, 100000]")
        if self.grpc_message_bytes_max < 2 * self.storage.entry_bytes_max:
            raise ConfigError("grpc_message_bytes_max must hold at least two maximal entries")
        if self.grpc_message_bytes_max < self.storage.read_response_bytes_max + self.storage.entry_bytes_max:
            raise ConfigError("grpc_message_bytes_max must exceed read_response_bytes_max by an entry")
        if self.journal.group_bytes_max < journal_add_record_bytes(self.storage.entry_bytes_max):
            # Else the largest add would be a group of its own, past the bound.
            raise ConfigError("journal group_bytes_max must hold the journal record of an entry of "
                              "entry_bytes_max")
