"""The archiver's configuration (broker/archiver.py): where the archive is, the bounds of
an archive in progress (slice size, reads, threads, cache) and the orphan collection's
timing; and the named crash points tests stop the broker at."""

from __future__ import annotations

from dataclasses import dataclass

from archive.writer import WriterConfig
from common.errors import ConfigError

MIB = 1024 * 1024
# The named points of an archive where a test may stop the broker (pause_at_step).
# "mid-rename" is reached on object stores only, where a rename is a copy then a delete:
# between the two (a local rename is one atomic step).
STEPS = ("before-rename", "mid-rename", "after-rename", "before-manifest", "before-bookie-delete")


@dataclass(frozen=True)
class ArchiverConfig:
    # The archive location when the namespace policy names none ("": none; then a
    # policy must name one). Standalone passes data/standalone/archive.
    location_url: str = ""
    # An S3-compatible store's endpoint ("": MAGNETAR_ARCHIVE_ENDPOINT_URL, else AWS).
    # Its credentials come from botocore's chain (environment, credentials file), never here.
    endpoint_url: str = ""
    check_interval_s: float = 5.0
    # One slice (file) of a ledger is built in memory before it is written: this bounds it.
    file_bytes_max: int = 128 * MIB
    batch_bytes_max: int = 16 * MIB
    # Entries asked of the bookies per read while archiving (the ledger client splits
    # them per bookie); 512 entries of 1 KiB to 128 KiB is 0.5 to 64 MiB.
    read_entries_max: int = 512
    # Worker threads for Arrow encoding, file writes and reads (the bounded executor).
    threads: int = 2
    # Rebuilt entries of archived ledgers kept for readers, and batches read ahead.
    read_cache_bytes_max: int = 128 * MIB
    read_ahead_batches: int = 2
    # Files no manifest names are deleted once older than this: longer than any
    # archive write takes (a slice is written in seconds), so another broker's write in
    # progress is never taken for an orphan.
    orphan_grace_s: float = 3600.0
    # How often a topic's archive directory is listed for orphans (a LIST request on an
    # object store: not on every pass).
    gc_interval_s: float = 300.0
    # Tests only: stop at this step (one of STEPS) for a kill -9.
    pause_at_step: str = ""

    def __post_init__(self) -> None:
        if not 0.05 <= self.check_interval_s <= 3600:
            raise ConfigError("archive check_interval_s must be in [0.05, 3600]")
        if not 1 <= self.read_entries_max <= 10_000:
            raise ConfigError("archive read_entries_max must be in [1, 10000]")
        if not 1 <= self.threads <= 64:
            raise ConfigError("archive threads must be in [1, 64]")
        if not MIB <= self.read_cache_bytes_max <= 64 * 1024 * MIB:
            raise ConfigError("archive read_cache_bytes_max must be in [1 MiB, 64 GiB]")
        if not 0 <= self.read_ahead_batches <= 64:
            raise ConfigError("archive read_ahead_batches must be in [0, 64]")
        if not 0 <= self.orphan_grace_s <= 30 * 86400:
            raise ConfigError("archive orphan_grace_s must be in [0, 30 days]")
        if not 0.05 <= self.gc_interval_s <= 86400:
            raise ConfigError("archive gc_interval_s must be in [0.05, 86400]")
        if self.pause_at_step and self.pause_at_step not in STEPS:
            raise ConfigError(f"archive pause_at_step must be one of {', '.join(STEPS)}")
        WriterConfig(batch_bytes_max=self.batch_bytes_max, file_bytes_max=self.file_bytes_max)
