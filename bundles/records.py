"""What the bundles layer keeps in etcd. JSON, readable by operators. Pure.

    /namespaces/<t>/<ns>/bundles          BundlesRecord (boundaries; changed by split, CAS)
    /bundle-owners/<t>/<ns>/<range>       OwnerRecord, under the owner broker's lease
    /bundle-assignments/<t>/<ns>/<range>  AssignmentRecord: who should take an unowned
                                          bundle (leased by whoever decided it)
    /bundle-transfers/<t>/<ns>/<range>    TransferRecord: the leader asks an owner to
                                          hand a bundle to another broker (leader lease)
    /brokers/<broker_id>                  LoadReport, under the broker's lease
    /leader                               LeaderRecord, under the leader's lease
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from common.errors import MalformedFrame
from metadata import json_record

if TYPE_CHECKING:
    from metadata.store import Record


@dataclass(frozen=True)
class BundlesRecord:
    boundaries: list[int]

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "BundlesRecord":
        return json_record.decode(cls, data, "bundles record")


OWNED = "owned"
RELEASING = "releasing"


@dataclass(frozen=True)
class OwnerRecord:
    broker_id: str
    service_url: str
    web_service_url: str
    state: str = OWNED          # OWNED, or RELEASING to ``to`` (a transfer under way)
    to: str = ""                # the destination broker id while releasing
    acquired_ms: int = 0

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "OwnerRecord":
        return json_record.decode(cls, data, "bundle owner record")


@dataclass(frozen=True)
class AssignmentRecord:
    broker_id: str
    reason: str = ""
    decided_by: str = ""
    decided_ms: int = 0
    # A hand-over's: the topics the previous owner had loaded, which the new owner loads
    # as soon as it takes the bundle, while their clients reconnect (at most
    # HANDOVER_TOPICS_MAX; empty from the leader and from older brokers).
    topics: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "AssignmentRecord":
        return json_record.decode(cls, data, "bundle assignment")


@dataclass(frozen=True)
class TransferRecord:
    """The leader asks ``source`` (the owner it saw) to hand a bundle to ``to``. Only
    ``source`` acts on it, whatever its mirror of the owner keys says (``release``
    checks the key in etcd): the watch that brings this record and the one that brings
    owner keys are separate streams, so the destination can see it after it has
    already taken the bundle, and the source before its own key. A record written
    before the field existed ("") is acted on by the owner the mirror shows, never by
    the destination."""
    to: str
    reason: str = ""
    decided_ms: int = 0
    source: str = ""

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "TransferRecord":
        return json_record.decode(cls, data, "bundle transfer")


@dataclass(frozen=True)
class LoadReport:
    broker_id: str
    service_url: str
    web_service_url: str
    cpu_fraction: float = 0.0           # of one core, over the last report interval
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    connections: int = 0
    topics: int = 0
    bundles: list[str] = field(default_factory=list)          # "t/ns/range"
    bundle_msg_rates: dict[str, float] = field(default_factory=dict)
    reported_ms: int = 0
    started_ms: int = 0
    # Advertised listeners: name -> pulsar:// URL (empty when the broker names none).
    listeners: dict[str, str] = field(default_factory=dict)
    # pulsar+ssl:// and https:// URLs of a broker with TLS ("" without).
    service_url_tls: str = ""
    web_service_url_tls: str = ""

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "LoadReport":
        return json_record.decode(cls, data, "load report")


@dataclass(frozen=True)
class LeaderRecord:
    broker_id: str
    web_service_url: str = ""
    service_url: str = ""
    elected_ms: int = 0

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "LeaderRecord":
        return json_record.decode(cls, data, "leader record")


def decode_reports(records: Iterable["Record"]) -> dict[str, LoadReport]:
    """broker id -> load report, from ``/brokers/...`` records (bad ones skipped: one
    broker's unreadable report must not stop decisions about the others)."""
    reports = {}
    for record in records:
        try:
            report = LoadReport.decode(record.value)
        except MalformedFrame:
            continue
        reports[report.broker_id] = report
    return reports
