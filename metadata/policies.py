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


ARCHIVE_COMPRESSIONS = ("none", "lz4", "zstd")
# Rows per record batch of an archive file: bounded so a reader (a broker serving a
# backlog, a Spark task) holds one batch of a few MiB at a time; 1..1,048,576.
ARCHIVE_BATCH_ROWS_MAX = 1 << 20


@dataclass
class OffloadPolicies:
    """When a namespace's closed ledgers are archived as Arrow files (docs/archive.md),
    in the shape of Pulsar's OffloadPolicies (same field names where Pulsar has them):

    - a closed ledger is archived once the topic's bookie-held size passes
      ``managedLedgerOffloadThresholdInBytes`` (oldest ledgers first, until it is back
      under) or once it was closed ``managedLedgerOffloadThresholdInSeconds`` ago; -1
      turns a trigger off, 0 archives every closed ledger at once;
    - its bookie copy is deleted ``managedLedgerOffloadDeletionLagInMillis`` after the
      archive file was verified and recorded (Pulsar's default: 4 hours);
    - Magnetar's own fields: where (``managedLedgerOffloadLocation``, an fsspec URL; ""
      means the broker's ``--archive-url``), the Arrow buffer compression
      (``archiveCompression``), the rows per record batch (``archiveBatchRows``), and
      the archive's own retention of files whose ledgers left the topic
      (``archiveRetentionTimeInMinutes`` / ``archiveRetentionSizeInMB``; -1: no limit).
    """

    managedLedgerOffloadDriver: str = "arrow"
    managedLedgerOffloadLocation: str = ""
    managedLedgerOffloadThresholdInBytes: int = -1
    managedLedgerOffloadThresholdInSeconds: int = -1
    managedLedgerOffloadDeletionLagInMillis: int = 4 * 3600 * 1000
    archiveCompression: str = "none"
    archiveBatchRows: int = 8192
    archiveRetentionTimeInMinutes: int = -1
    archiveRetentionSizeInMB: int = -1

    def __post_init__(self) -> None:
        if self.managedLedgerOffloadDriver != "arrow":
            raise InvalidArgument("managedLedgerOffloadDriver must be \"arrow\" (Magnetar archives as Arrow IPC)")
        if not isinstance(self.managedLedgerOffloadLocation, str):
            raise InvalidArgument("managedLedgerOffloadLocation must be a URL string")
        for name in ("managedLedgerOffloadThresholdInBytes", "managedLedgerOffloadThresholdInSeconds",
                     "archiveRetentionTimeInMinutes", "archiveRetentionSizeInMB"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise InvalidArgument(f"{name} must be an integer >= -1")
        lag = self.managedLedgerOffloadDeletionLagInMillis
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise InvalidArgument("managedLedgerOffloadDeletionLagInMillis must be an integer >= 0")
        if self.archiveCompression not in ARCHIVE_COMPRESSIONS:
            raise InvalidArgument(f"archiveCompression must be one of {', '.join(ARCHIVE_COMPRESSIONS)}")
        rows = self.archiveBatchRows
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= ARCHIVE_BATCH_ROWS_MAX:
            raise InvalidArgument(f"archiveBatchRows must be an integer in [1, {ARCHIVE_BATCH_ROWS_MAX}]")

    @property
    def enabled(self) -> bool:
        """True when some trigger archives ledgers without an operator asking."""
        return self.managedLedgerOffloadThresholdInBytes >= 0 or self.managedLedgerOffloadThresholdInSeconds >= 0


@dataclass
class NamespacePolicies:
    retention_policies: dict | None = None
    persistence: dict | None = None
    deduplicationEnabled: bool | None = None
    message_ttl_in_seconds: int | None = None
    # Schema compatibility strategy (broker/schema_compatibility.py); None: FULL.
    schema_compatibility_strategy: str | None = None
    backlog_quota_map: dict = field(default_factory=dict)
    autoTopicCreationOverride: dict | None = None
    bundles: dict | None = None
    # Magnetar: subscriptions in this namespace that run in broadcast mode (every
    # consumer gets every message, each keeps its own cursor); see subscriptions/.
    broadcast_subscriptions: list[str] = field(default_factory=list)
    # Durable subscriptions without a consumer for this long are deleted
    # (broker/inactivity.py); 0 or None: the broker's default.
    subscription_expiration_time_minutes: int | None = 0
    # Pulsar's InactiveTopicPolicies {"inactiveTopicDeleteMode", "maxInactiveDurationSeconds",
    # "deleteWhileInactive"}; None: the broker's settings.
    inactive_topic_policies: dict | None = None
    # Rate limits of each topic, by cluster as Pulsar keeps them: {cluster: PublishRate}
    # and {cluster: DispatchRate} (broker/rate_limits.py, broker/admin/rates.py).
    publishMaxMessageRate: dict | None = None
    topicDispatchRate: dict | None = None
    # Each subscription's own dispatch rate limit, {cluster: DispatchRate} (Pulsar's
    # subscriptionDispatchRate), beside the topic's shared one.
    subscriptionDispatchRate: dict | None = None
    # Automatic compaction: a topic is compacted once more than this many bytes were
    # written since its last compaction (Pulsar's compaction_threshold); None or 0: off.
    compaction_threshold: int | None = None
    # The archive policy (OffloadPolicies' fields); None: ledgers are not archived.
    offload_policies: dict | None = None
    # Who may produce and consume (Pulsar's AuthPolicies): namespace_auth is
    # {role: ["produce", "consume"]} for the whole namespace, destination_auth
    # {topic: {role: [...]}} for one topic; read by broker/authorization.py.
    auth_policies: dict = field(default_factory=lambda: {"namespace_auth": {}, "destination_auth": {},
                                                         "subscription_auth_roles": {}})
    # Producers and consumers one topic may have (Pulsar's max_producers_per_topic and
    # max_consumers_per_topic); None or 0: the broker's producers_per_topic_max /
    # consumers_per_topic_max, which also bound any value set here.
    max_producers_per_topic: int | None = None
    max_consumers_per_topic: int | None = None
    # Producers must encrypt their messages (Pulsar's encryption_required): a PRODUCER
    # that does not announce encryption is refused.
    encryption_required: bool | None = None

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

    def offload(self) -> OffloadPolicies | None:
        if self.offload_policies is None:
            return None
        return json_record.from_doc(OffloadPolicies, self.offload_policies, "offload policies")

    def granted_actions(self, role: str, topic: str | None = None) -> frozenset[str]:
        """The actions ("produce", "consume") granted to ``role`` on the namespace, plus
        those granted on ``topic`` (a full topic name) when given."""
        auth = self.auth_policies if isinstance(self.auth_policies, dict) else {}
        actions: set[str] = set()
        namespace_auth = auth.get("namespace_auth")
        if isinstance(namespace_auth, dict) and isinstance(namespace_auth.get(role), list):
            actions.update(a for a in namespace_auth[role] if isinstance(a, str))
        destination_auth = auth.get("destination_auth")
        if topic is not None and isinstance(destination_auth, dict):
            grants = destination_auth.get(topic)
            if isinstance(grants, dict) and isinstance(grants.get(role), list):
                actions.update(a for a in grants[role] if isinstance(a, str))
        return frozenset(actions)

    def allows_auto_topic_creation(self, broker_default: bool) -> bool:
        override = self.autoTopicCreationOverride
        if isinstance(override, dict) and "allowAutoTopicCreation" in override:
            return bool(override["allowAutoTopicCreation"])
        return broker_default


@dataclass
class TopicPolicies:
    """A topic's own policies (Pulsar's topic-level policies), kept in etcd under
    ``/topic-policies/<topic>`` (a partitioned topic's apply to all its partitions).
    Each field set here overrides the namespace's field of the same meaning; None (or,
    for the backlog quotas, a type not in the map) leaves the namespace's in force. The
    field names are NamespacePolicies' where the meaning is the same, so the effective
    policies of a topic are its namespace's with these laid over (broker/topic_policies.py).
    """

    retention_policies: dict | None = None
    message_ttl_in_seconds: int | None = None
    backlog_quota_map: dict = field(default_factory=dict)
    deduplicationEnabled: bool | None = None
    compaction_threshold: int | None = None
    max_producers_per_topic: int | None = None
    max_consumers_per_topic: int | None = None
    schema_compatibility_strategy: str | None = None
    # Ensemble and quorums of the topic's new ledgers (read at the topic's next load).
    persistence: dict | None = None
    # Rate limits, {cluster: rate} as the namespace's: laid over the namespace's per
    # cluster (a topic's rate for one cluster leaves the namespace's for the others).
    publishMaxMessageRate: dict | None = None
    topicDispatchRate: dict | None = None
    subscriptionDispatchRate: dict | None = None

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "TopicPolicies":
        return json_record.decode(cls, data, "topic policies")

    def is_empty(self) -> bool:
        return self == TopicPolicies()
