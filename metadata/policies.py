"""Records for tenants, namespaces and partitioned topics, as kept in etcd. JSON, with
the field names of Pulsar's admin API so the REST layer passes them through.

    /tenants/<tenant>                            TenantInfo
    /namespaces/<tenant>/<ns>/policies           NamespacePolicies
    /partitioned-topics/<tenant>/<ns>/<topic>    {"partitions": N}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from ledger.errors import InvalidArgument, MalformedFrame


def _from_doc(cls, doc: object, what: str):
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    known = {f.name for f in fields(cls)}
    values = {k: v for k, v in doc.items() if k in known}
    try:
        return cls(**values)
    except TypeError as error:
        raise InvalidArgument(f"bad {what}: {error}") from None


@dataclass
class TenantInfo:
    adminRoles: list[str] = field(default_factory=list)
    allowedClusters: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, doc: object) -> "TenantInfo":
        info = _from_doc(cls, doc, "tenant info")
        if not isinstance(info.adminRoles, list) or not isinstance(info.allowedClusters, list):
            raise InvalidArgument("adminRoles and allowedClusters must be lists")
        return info

    @classmethod
    def decode(cls, data: bytes) -> "TenantInfo":
        try:
            return cls.from_json(json.loads(data))
        except (ValueError, InvalidArgument) as error:
            raise MalformedFrame(f"bad tenant record: {error}") from None


@dataclass
class RetentionPolicies:
    """How long / how much acknowledged data is kept (-1: without limit, 0: none)."""

    retentionTimeInMinutes: int = 0
    retentionSizeInMB: int = 0


@dataclass
class PersistencePolicies:
    bookkeeperEnsemble: int = 2
    bookkeeperWriteQuorum: int = 2
    bookkeeperAckQuorum: int = 2
    managedLedgerMaxMarkDeleteRate: float = 0.0


@dataclass
class NamespacePolicies:
    retention_policies: dict | None = None
    persistence: dict | None = None
    deduplicationEnabled: bool | None = None
    message_ttl_in_seconds: int | None = None
    backlog_quota_map: dict = field(default_factory=dict)
    autoTopicCreationOverride: dict | None = None
    bundles: dict | None = None
    # Magnetar: subscriptions in this namespace that run in broadcast mode (every
    # consumer gets every message, each keeps its own cursor); see subscriptions/.
    broadcast_subscriptions: list[str] = field(default_factory=list)
    subscription_expiration_time_minutes: int = 0

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "NamespacePolicies":
        try:
            return _from_doc(cls, json.loads(data), "namespace policies")
        except (ValueError, InvalidArgument) as error:
            raise MalformedFrame(f"bad namespace policies: {error}") from None

    def retention(self) -> RetentionPolicies:
        return _from_doc(RetentionPolicies, self.retention_policies or {}, "retention policies")

    def persistence_policies(self, default: PersistencePolicies) -> PersistencePolicies:
        if not self.persistence:
            return default
        return _from_doc(PersistencePolicies, self.persistence, "persistence policies")

    def allows_auto_topic_creation(self, broker_default: bool) -> bool:
        override = self.autoTopicCreationOverride
        if isinstance(override, dict) and "allowAutoTopicCreation" in override:
            return bool(override["allowAutoTopicCreation"])
        return broker_default
