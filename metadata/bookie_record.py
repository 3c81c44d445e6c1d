"""The record a bookie keeps in etcd under ``/bookies/<bookie_id>`` (leased), and its
cookie under ``/cookies/<bookie_id>`` (not leased). JSON, so operators can read them."""

from __future__ import annotations

from dataclasses import dataclass

from metadata import json_record


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
    # host:port of the add socket (bookie/add_socket.py); empty when it is off (and in
    # records of bookies from before it).
    add_address: str = ""

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "BookieRecord":
        return json_record.decode(cls, data, "bookie record")


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
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "Cookie":
        return json_record.decode(cls, data, "cookie")
