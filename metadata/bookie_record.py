"""The record a bookie keeps in etcd under ``/bookies/<bookie_id>`` (leased), and its
cookie under ``/cookies/<bookie_id>`` (not leased). JSON, so operators can read them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ledger.errors import MalformedFrame


@dataclass(frozen=True)
class BookieRecord:
    bookie_id: str
    address: str            # host:port of the gRPC service
    http_address: str       # host:port of /health and /metrics
    read_only: bool
    free_bytes: int
    total_bytes: int
    disk_usage_ratio: float
    version: str
    started_at_ms: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "BookieRecord":
        try:
            fields = json.loads(data)
            return cls(**{name: fields[name] for name in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError) as error:
            raise MalformedFrame(f"bad bookie record: {error}") from None


@dataclass(frozen=True)
class Cookie:
    """Ties a bookie id to the disks it was first started with. A bookie whose id has a
    cookie in etcd but whose directories have none lost its data (wiped or wrong
    disks); it must not rejoin as if it held its old entries."""

    bookie_id: str
    instance_id: str
    journal_dir: str
    ledger_dirs: list[str]

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Cookie":
        try:
            fields = json.loads(data)
            return cls(fields["bookie_id"], fields["instance_id"], fields["journal_dir"],
                       list(fields["ledger_dirs"]))
        except (ValueError, KeyError, TypeError) as error:
            raise MalformedFrame(f"bad cookie: {error}") from None
