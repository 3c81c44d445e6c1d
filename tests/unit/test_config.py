"""Configuration objects (bookie/config.py, ledger/config.py).

What it proves: the defaults are valid; every invalid value or inconsistent pair of
values raises ConfigError whose message names the offending field (an operator must be
able to find the line to fix); and fields that have no check yet still reject values
that would make the component unusable (zero or negative sizes, counts and waits).

How: a table of (config class, keyword overrides, field the message must name).
"""

from __future__ import annotations

import math

import pytest

from bookie.config import (
    MIB,
    BookieConfig,
    DiskConfig,
    GcConfig,
    JournalConfig,
    LedgerStorageConfig,
)
from ledger.config import LedgerClientConfig
from common.errors import ConfigError


def _journal(**overrides) -> JournalConfig:
    return JournalConfig(**{"journal_dir": "/j", **overrides})


def _storage(**overrides) -> LedgerStorageConfig:
    return LedgerStorageConfig(**{"ledger_dirs": ("/d1",), **overrides})


def _bookie(**overrides) -> BookieConfig:
    storage = overrides.pop("storage", None) or _storage()
    return BookieConfig(**{"metadata_url": "etcd://127.0.0.1:2379/m", "journal": _journal(),
                           "storage": storage, **overrides})


def test_defaults_are_valid():
    """Every config builds with only its required fields."""
    _journal()
    _storage()
    GcConfig()
    DiskConfig()
    _bookie()
    LedgerClientConfig()


def test_small_but_consistent_values_are_accepted():
    """The smallest consistent settings (as tests and benchmarks use) are valid."""
    _journal(group_bytes_max=1, queue_bytes_max=1, file_bytes_max=MIB, group_wait_ms_max=0)
    _storage(ledger_dirs=("/a", "/b"), entry_bytes_max=4096, write_cache_bytes_max=8192,
             entry_log_bytes_max=16384, read_cache_bytes_max=0, flush_interval_s=0.01)
    DiskConfig(usage_threshold=0.5, usage_lwm_threshold=0.5)
    GcConfig(compaction_live_ratio_min=0.0)


NAN = math.nan

INVALID = [
    # JournalConfig
    (_journal, {"journal_dir": ""}, "journal_dir"),
    (_journal, {"group_bytes_max": 0}, "group_bytes_max"),
    (_journal, {"group_bytes_max": -1}, "group_bytes_max"),
    (_journal, {"group_bytes_max": 2 * MIB, "file_bytes_max": MIB}, "group_bytes_max"),
    (_journal, {"group_wait_ms_max": -0.1}, "group_wait_ms_max"),
    (_journal, {"group_wait_ms_max": 1001}, "group_wait_ms_max"),
    (_journal, {"group_wait_ms_max": NAN}, "group_wait_ms_max"),
    (_journal, {"queue_bytes_max": MIB, "group_bytes_max": 2 * MIB, "file_bytes_max": 4 * MIB},
     "queue_bytes_max"),
    (_journal, {"file_bytes_max": MIB - 1, "group_bytes_max": 1024}, "file_bytes_max"),
    # LedgerStorageConfig
    (_storage, {"ledger_dirs": ()}, "ledger_dirs"),
    (_storage, {"ledger_dirs": ("/a", "/a")}, "ledger_dirs"),
    (_storage, {"write_cache_bytes_max": 2 * 4096 - 1, "entry_bytes_max": 4096}, "write_cache_bytes_max"),
    (_storage, {"flush_interval_s": 0.0}, "flush_interval_s"),
    (_storage, {"flush_interval_s": 601}, "flush_interval_s"),
    (_storage, {"flush_interval_s": NAN}, "flush_interval_s"),
    (_storage, {"read_cache_bytes_max": -1}, "read_cache_bytes_max"),
    (_storage, {"entry_log_bytes_max": 4 * 4096 - 1, "entry_bytes_max": 4096, "write_cache_bytes_max": MIB},
     "entry_log_bytes_max"),
    (_storage, {"read_response_bytes_max": MIB - 1}, "read_response_bytes_max"),
    (_storage, {"read_response_bytes_max": 32 * MIB + 1}, "read_response_bytes_max"),
    # GcConfig
    (GcConfig, {"interval_s": 0.0}, "interval_s"),
    (GcConfig, {"interval_s": 86_401}, "interval_s"),
    (GcConfig, {"compaction_live_ratio_min": 1.0}, "compaction_live_ratio_min"),
    (GcConfig, {"compaction_live_ratio_min": -0.1}, "compaction_live_ratio_min"),
    (GcConfig, {"compaction_live_ratio_min": NAN}, "compaction_live_ratio_min"),
    # DiskConfig
    (DiskConfig, {"usage_threshold": 0.0}, "usage_threshold"),
    (DiskConfig, {"usage_threshold": 1.01}, "usage_threshold"),
    (DiskConfig, {"usage_threshold": 0.9, "usage_lwm_threshold": 0.95}, "usage_lwm_threshold"),
    (DiskConfig, {"usage_lwm_threshold": 0.0}, "usage_lwm_threshold"),
    (DiskConfig, {"check_interval_s": 0.0}, "check_interval_s"),
    (DiskConfig, {"check_interval_s": 3601}, "check_interval_s"),
    # BookieConfig
    (_bookie, {"port": -1}, "port"),
    (_bookie, {"port": 65536}, "port"),
    (_bookie, {"http_port": 70000}, "http_port"),
    (_bookie, {"registration_ttl_s": 1}, "registration_ttl_s"),
    (_bookie, {"registration_ttl_s": 601}, "registration_ttl_s"),
    (_bookie, {"read_threads": 0}, "read_threads"),
    (_bookie, {"read_threads": 65}, "read_threads"),
    (_bookie, {"grpc_message_bytes_max": 8 * MIB}, "grpc_message_bytes_max"),
    (_bookie, {"grpc_message_bytes_max": 12 * MIB}, "grpc_message_bytes_max"),   # < 8 MiB reply + 5 MiB entry
    # LedgerClientConfig
    (LedgerClientConfig, {"add_timeout_s": 0}, "add_timeout_s"),
    (LedgerClientConfig, {"read_timeout_s": 601}, "read_timeout_s"),
    (LedgerClientConfig, {"control_timeout_s": -1}, "control_timeout_s"),
    (LedgerClientConfig, {"control_timeout_s": NAN}, "control_timeout_s"),
    (LedgerClientConfig, {"batch_entries_max": 0}, "batch_entries_max"),
    (LedgerClientConfig, {"batch_entries_max": 10_001}, "batch_entries_max"),
    (LedgerClientConfig, {"batch_bytes_max": 32 * MIB + 1}, "batch_bytes_max"),
    (LedgerClientConfig, {"pending_adds_max": 0}, "pending_adds_max"),
    (LedgerClientConfig, {"pending_bytes_max": MIB - 1}, "pending_bytes_max"),
    (LedgerClientConfig, {"metadata_attempts_max": 0}, "metadata_attempts_max"),
    (LedgerClientConfig, {"metadata_attempts_max": 1001}, "metadata_attempts_max"),
]


def _case_id(case) -> str:
    factory, overrides, _field = case
    name = getattr(factory, "__name__", str(factory)).lstrip("_")
    return f"{name}-" + "-".join(f"{k}={v}" for k, v in overrides.items())


@pytest.mark.parametrize("factory, overrides, field", INVALID, ids=[_case_id(c) for c in INVALID])
def test_invalid_values_raise_config_error_naming_the_field(factory, overrides, field):
    """Each bad setting raises ConfigError, and the message names the field."""
    with pytest.raises(ConfigError) as caught:
        factory(**overrides)
    assert field in str(caught.value)


# Fields without a check today. Each value below makes the component unusable or
# unbounded, so the config must refuse it at start-up rather than fail at run time.
UNCHECKED = [
    # An entry has a 44-byte header: a limit below it refuses every add.
    (_storage, {"entry_bytes_max": 0}, "entry_bytes_max"),
    # A negative read-ahead is meaningless.
    # A non-positive wait fails every add that meets a full write cache at once.
    (_storage, {"write_cache_wait_s_max": -1.0}, "write_cache_wait_s_max"),
    # grpc's maximum_concurrent_rpcs=0 refuses every call.
    (_bookie, {"concurrent_rpcs_max": 0}, "concurrent_rpcs_max"),
    # Compaction with a budget of 0 bytes never reclaims anything.
    (GcConfig, {"compaction_bytes_per_round_max": 0}, "compaction_bytes_per_round_max"),
    # A reader asking for 0 entries (or 0 bytes) per call never makes progress.
    (LedgerClientConfig, {"read_batch_entries_max": 0}, "read_batch_entries_max"),
    (LedgerClientConfig, {"read_response_bytes_max": 0}, "read_response_bytes_max"),
    # A batch of at most 0 bytes cannot carry an entry.
    (LedgerClientConfig, {"batch_bytes_max": 0}, "batch_bytes_max"),
]


@pytest.mark.parametrize("factory, overrides, field", UNCHECKED, ids=[_case_id(c) for c in UNCHECKED])
def test_unusable_values_of_unchecked_fields_are_refused(factory, overrides, field):
    """Zero or negative sizes, counts and waits are refused with ConfigError naming the
    field (the style guide: bad operator input raises ConfigError naming the field)."""
    with pytest.raises(ConfigError) as caught:
        factory(**overrides)
    assert field in str(caught.value)


def test_configs_are_frozen():
    """Config objects are built once and passed down; nobody changes them later."""
    config = _journal()
    with pytest.raises(AttributeError):
        config.group_bytes_max = 1  # type: ignore[misc]
