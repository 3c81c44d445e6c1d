"""Request bodies of namespace policies, decoded and checked into the JSON shapes
NamespacePolicies stores (Pulsar's field names). Pure: each function takes the decoded
JSON of a request body and returns the value to store, or raises InvalidArgument (400)
naming the field at fault.
"""

from __future__ import annotations

import re
from dataclasses import asdict

from broker.admin.common import integer
from common.errors import InvalidArgument, NotSupported
from metadata import json_record
from metadata.policies import NamespacePolicies, OffloadPolicies, PersistencePolicies

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# A sanity bound on bookkeeper quorums: a ledger striped over more bookies than this is
# a typo, not a plan (Pulsar bounds them with its managedLedgerMax* broker settings).
QUORUM_SIZE_MAX = 16
# Pulsar's backlog quota types and retention policies, as its JSON spells them.
BACKLOG_QUOTA_TYPES = ("destination_storage", "message_age")
BACKLOG_QUOTA_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")
TOPIC_TYPES = ("non-partitioned", "partitioned")
# Subscription names are bounded like topic names (topic_name.NAME_BYTES_MAX).
SUBSCRIPTION_NAME_BYTES_MAX = 1024
# Broadcast subscriptions listed per namespace: the list lives in the namespace's
# policies record in etcd, whose values must stay well under etcd's 1.5 MiB.
BROADCAST_SUBSCRIPTIONS_MAX = 1000
# Bundles a namespace may be created with: the bound bundles.hashing.default_boundaries
# enforces when the namespace's ranges are made.
BUNDLES_MAX = 1024
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f]")


def _object(doc: object, what: str) -> dict:
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    return doc


def retention_of(doc: object) -> dict:
    """RetentionPolicies: minutes and megabytes kept after acknowledgement (-1: no
    limit, 0: none)."""
    doc = _object(doc, "retention policies")
    return {
        "retentionTimeInMinutes": integer(doc.get("retentionTimeInMinutes", 0), "retentionTimeInMinutes",
                                          minimum=-1, maximum=INT32_MAX),
        "retentionSizeInMB": integer(doc.get("retentionSizeInMB", 0), "retentionSizeInMB",
                                     minimum=-1, maximum=INT64_MAX),
    }


def offload_policies_of(doc: object) -> dict:
    """OffloadPolicies (metadata/policies.py): Pulsar's field names plus Magnetar's
    archive fields; unknown fields (Pulsar's bucket, region...) are dropped, bad values
    are refused naming the field."""
    policies = json_record.from_doc(OffloadPolicies, _object(doc, "offload policies"), "offload policies")
    return asdict(policies)


def deduplication_of(doc: object) -> bool:
    if not isinstance(doc, bool):
        raise InvalidArgument("deduplication must be true or false")
    return doc


# Grants in a namespace creation's auth_policies, as the permission endpoints bound them
# (broker/admin/permissions.py: 10,000 per namespace or topic, role names of 256 bytes).
GRANTS_MAX = 10_000
ROLE_BYTES_MAX = 256


def _grants_of(doc: object, what: str) -> dict[str, list[str]]:
    from broker.authorization import ACTIONS

    grants = _object(doc, what)
    if len(grants) > GRANTS_MAX:
        raise InvalidArgument(f"{what} has more than {GRANTS_MAX} roles")
    checked: dict[str, list[str]] = {}
    for role, actions in grants.items():
        if not role or len(role.encode()) > ROLE_BYTES_MAX:
            raise InvalidArgument(f"{what}: a role name must have 1 to {ROLE_BYTES_MAX} bytes")
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise InvalidArgument(f"{what}: the actions of {role!r} must be a list of strings")
        unknown = sorted(set(actions) - ACTIONS)
        if unknown:
            raise InvalidArgument(f"{what}: unknown actions {unknown}; known: {sorted(ACTIONS)}")
        checked[role] = sorted(set(actions))
    return checked


def auth_policies_of(doc: object) -> dict:
    """AuthPolicies in a namespace creation's body (Pulsar's setup scripts create a
    namespace with its grants this way): ``namespace_auth`` {role: actions} and
    ``destination_auth`` {topic: {role: actions}}, checked as the permission endpoints
    check a grant."""
    doc = _object(doc, "auth_policies")
    destinations = _object(doc.get("destination_auth") or {}, "destination_auth")
    if len(destinations) > GRANTS_MAX:
        raise InvalidArgument(f"destination_auth has more than {GRANTS_MAX} topics")
    return {"namespace_auth": _grants_of(doc.get("namespace_auth") or {}, "namespace_auth"),
            "destination_auth": {str(topic): _grants_of(grants, f"destination_auth of {topic}")
                                 for topic, grants in destinations.items()},
            "subscription_auth_roles": {}}


def encryption_required_of(doc: object) -> bool:
    if not isinstance(doc, bool):
        raise InvalidArgument("encryptionRequired must be true or false")
    return doc


def schema_compatibility_strategy_of(doc: object) -> str:
    from broker.schema_compatibility import STRATEGIES

    if not isinstance(doc, str) or doc.upper() not in STRATEGIES:
        raise InvalidArgument(f"schema compatibility strategy must be one of {', '.join(STRATEGIES)}")
    return doc.upper()


def compaction_threshold_of(doc: object) -> int:
    return integer(doc, "compaction threshold in bytes", minimum=0, maximum=2**63 - 1)


# A per-topic producer or consumer limit: Pulsar takes any int; the broker's own bound
# (producers_per_topic_max / consumers_per_topic_max, at most 1,000,000) caps what is
# enforced anyway.
CLIENTS_PER_TOPIC_MAX = 1_000_000


def clients_per_topic_of(doc: object) -> int:
    """maxProducers / maxConsumers (per topic): 0 leaves the next level's limit in force."""
    return integer(doc, "the limit per topic", minimum=0, maximum=CLIENTS_PER_TOPIC_MAX)


def message_ttl_of(doc: object) -> int:
    return integer(doc, "message TTL in seconds", minimum=0, maximum=INT32_MAX)


def persistence_of(doc: object) -> dict:
    """PersistencePolicies: ensemble, write quorum and ack quorum with E >= Qw >= Qa >= 1."""
    doc = _object(doc, "persistence policies")
    default = PersistencePolicies()
    ensemble = integer(doc.get("bookkeeperEnsemble", default.bookkeeperEnsemble), "bookkeeperEnsemble",
                       minimum=1, maximum=QUORUM_SIZE_MAX)
    write_quorum = integer(doc.get("bookkeeperWriteQuorum", default.bookkeeperWriteQuorum), "bookkeeperWriteQuorum",
                           minimum=1, maximum=QUORUM_SIZE_MAX)
    ack_quorum = integer(doc.get("bookkeeperAckQuorum", default.bookkeeperAckQuorum), "bookkeeperAckQuorum",
                         minimum=1, maximum=QUORUM_SIZE_MAX)
    if not ensemble >= write_quorum >= ack_quorum:
        raise InvalidArgument("persistence must satisfy bookkeeperEnsemble >= bookkeeperWriteQuorum "
                              ">= bookkeeperAckQuorum")
    rate = doc.get("managedLedgerMaxMarkDeleteRate", default.managedLedgerMaxMarkDeleteRate)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
        raise InvalidArgument("managedLedgerMaxMarkDeleteRate must be a number >= 0")
    return {"bookkeeperEnsemble": ensemble, "bookkeeperWriteQuorum": write_quorum,
            "bookkeeperAckQuorum": ack_quorum, "managedLedgerMaxMarkDeleteRate": float(rate)}


def backlog_quota_type_of(text: str | None) -> str:
    quota_type = text or "destination_storage"
    if quota_type not in BACKLOG_QUOTA_TYPES:
        raise InvalidArgument(f"backlogQuotaType must be one of {', '.join(BACKLOG_QUOTA_TYPES)}")
    return quota_type


def backlog_quota_of(doc: object) -> dict:
    """BacklogQuota: ``limitSize`` bytes (``limit`` is its old name), ``limitTime``
    seconds (-1: no limit) and the policy applied past them."""
    doc = _object(doc, "backlog quota")
    size = doc.get("limitSize", doc.get("limit", -1))
    limit_size = integer(size, "limitSize", minimum=-1, maximum=INT64_MAX)
    limit_time = integer(doc.get("limitTime", -1), "limitTime", minimum=-1, maximum=INT32_MAX)
    policy = doc.get("policy", "producer_request_hold")
    if policy not in BACKLOG_QUOTA_POLICIES:
        raise InvalidArgument(f"backlog quota policy must be one of {', '.join(BACKLOG_QUOTA_POLICIES)}")
    return {"limit": limit_size, "limitSize": limit_size, "limitTime": limit_time, "policy": policy}


def auto_topic_creation_of(doc: object) -> dict:
    """AutoTopicCreationOverride. The broker auto-creates non-partitioned topics only,
    so asking for partitioned ones is refused rather than stored and ignored."""
    doc = _object(doc, "auto topic creation override")
    allow = doc.get("allowAutoTopicCreation")
    if not isinstance(allow, bool):
        raise InvalidArgument("allowAutoTopicCreation must be true or false")
    topic_type = doc.get("topicType", "non-partitioned")
    if topic_type not in TOPIC_TYPES:
        raise InvalidArgument(f"topicType must be one of {', '.join(TOPIC_TYPES)}")
    if topic_type == "partitioned":
        raise NotSupported("auto-creation of partitioned topics is not supported: topicType must be non-partitioned")
    if doc.get("defaultNumPartitions") is not None:
        raise InvalidArgument("defaultNumPartitions applies to partitioned topics only")
    return {"allowAutoTopicCreation": allow, "topicType": topic_type}


def bundles_of(doc: object) -> dict:
    """BundlesData: ``numBundles`` equal hash ranges (0 or null: the broker's default)."""
    doc = _object(doc, "bundles")
    if doc.get("numBundles") is not None:
        integer(doc["numBundles"], "numBundles", minimum=0, maximum=BUNDLES_MAX)
    return doc


def subscription_name_of(doc: object) -> str:
    if not isinstance(doc, str) or not doc:
        raise InvalidArgument("a subscription name must be a non-empty JSON string")
    if len(doc.encode()) > SUBSCRIPTION_NAME_BYTES_MAX or _CONTROL_CHARACTERS.search(doc):
        raise InvalidArgument(f"bad subscription name {doc!r}")
    return doc


def namespace_policies_of(doc: object) -> NamespacePolicies:
    """The optional body of a namespace creation: Policies, each field checked as its
    own endpoint checks it; fields Magnetar does not keep are ignored."""
    policies = NamespacePolicies()
    if doc is None:
        return policies
    doc = _object(doc, "namespace policies")
    if doc.get("retention_policies") is not None:
        policies.retention_policies = retention_of(doc["retention_policies"])
    if doc.get("persistence") is not None:
        policies.persistence = persistence_of(doc["persistence"])
    if doc.get("deduplicationEnabled") is not None:
        policies.deduplicationEnabled = deduplication_of(doc["deduplicationEnabled"])
    if doc.get("encryption_required") is not None:
        policies.encryption_required = encryption_required_of(doc["encryption_required"])
    if doc.get("auth_policies") is not None:
        policies.auth_policies = auth_policies_of(doc["auth_policies"])
    if doc.get("message_ttl_in_seconds") is not None:
        policies.message_ttl_in_seconds = message_ttl_of(doc["message_ttl_in_seconds"])
    if doc.get("autoTopicCreationOverride") is not None:
        policies.autoTopicCreationOverride = auto_topic_creation_of(doc["autoTopicCreationOverride"])
    quotas = doc.get("backlog_quota_map")
    if quotas is not None:
        policies.backlog_quota_map = {backlog_quota_type_of(k): backlog_quota_of(v)
                                      for k, v in _object(quotas, "backlog_quota_map").items()}
    if doc.get("bundles") is not None:
        policies.bundles = bundles_of(doc["bundles"])
    broadcast = doc.get("broadcast_subscriptions")
    if broadcast is not None:
        if not isinstance(broadcast, list) or len(broadcast) > BROADCAST_SUBSCRIPTIONS_MAX:
            raise InvalidArgument(f"broadcast_subscriptions must be a list of at most "
                                  f"{BROADCAST_SUBSCRIPTIONS_MAX} names")
        policies.broadcast_subscriptions = sorted({subscription_name_of(name) for name in broadcast})
    return policies
