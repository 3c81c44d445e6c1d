"""Records for tenants, namespaces and partitioned topics, as kept in etcd. JSON, with
the field names of Pulsar's admin API so the REST layer passes them through.

    /tenants/<tenant>                            TenantInfo
    /namespaces/<tenant>/<ns>/policies           NamespacePolicies
    /partitioned-topics/<tenant>/<ns>/<topic>    {"partitions": N}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.errors import InvalidArgument
from metadata import json_record


@dataclass
class TenantInfo:
    adminRoles: list[str] = field(default_factory=list)
    allowedClusters: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.adminRoles, list) or not isinstance(self.allowedClusters, list):
            raise InvalidArgument("adminRoles and allowedClusters must be lists")

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def from_json(cls, doc: object) -> "TenantInfo":
        return json_record.from_doc(cls, doc, "tenant info")

    @classmethod
    def decode(cls, data: bytes) -> "TenantInfo":
        return json_record.decode(cls, data, "tenant record")


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
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "NamespacePolicies":
        return json_record.decode(cls, data, "namespace policies")

    def retention(self) -> RetentionPolicies:
        return json_record.from_doc(RetentionPolicies, self.retention_policies or {}, "retention policies")

    def persistence_policies(self, default: PersistencePolicies) -> PersistencePolicies:
        if not self.persistence:
            return default
        return json_record.from_doc(PersistencePolicies, self.persistence, "persistence policies")

    def allows_auto_topic_creation(self, broker_default: bool) -> bool:
        override = self.autoTopicCreationOverride
        if isinstance(override, dict) and "allowAutoTopicCreation" in override:
            return bool(override["allowAutoTopicCreation"])
        return broker_default
