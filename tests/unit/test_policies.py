"""Namespace and tenant policies: the stored records (metadata/policies.py) and the
request-body codec that checks them (broker/admin/policy_codec.py).

What it proves: records survive encode/decode unchanged and encode deterministically;
decoding tolerates fields it does not know (a newer broker's) by dropping them, and
turns every kind of corrupt bytes into MalformedFrame and nothing else; the accessors
apply defaults as documented. The codec accepts exactly the documented shapes, fills
documented defaults, drops unknown fields, and refuses wrong types, out-of-range values
and broken relationships (E >= Qw >= Qa) with InvalidArgument naming the field, so a
bad request body is a 400, never a 500.

How: tables of (body, stored value) and of bad bodies.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from broker.admin import policy_codec
from broker.admin.policy_codec import (
    BROADCAST_SUBSCRIPTIONS_MAX,
    INT32_MAX,
    INT64_MAX,
    QUORUM_SIZE_MAX,
    SUBSCRIPTION_NAME_BYTES_MAX,
)
from common.errors import InvalidArgument, MalformedFrame, NotSupported
from metadata.policies import NamespacePolicies, PersistencePolicies, RetentionPolicies, TenantInfo

# --- stored records ---------------------------------------------------------------------------

FULL_POLICIES = NamespacePolicies(
    retention_policies={"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
    persistence={"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2,
                 "managedLedgerMaxMarkDeleteRate": 1.5},
    deduplicationEnabled=True,
    message_ttl_in_seconds=3600,
    backlog_quota_map={"destination_storage": {"limit": 10, "limitSize": 10, "limitTime": -1,
                                               "policy": "producer_exception"}},
    autoTopicCreationOverride={"allowAutoTopicCreation": False, "topicType": "non-partitioned"},
    bundles={"numBundles": 8},
    broadcast_subscriptions=["audit", "mirror"],
    subscription_expiration_time_minutes=30,
)


@pytest.mark.parametrize("policies", [NamespacePolicies(), FULL_POLICIES], ids=["default", "full"])
def test_namespace_policies_round_trip(policies: NamespacePolicies):
    """decode(encode(p)) == p, and encoding is canonical (sorted keys), so equal
    policies are equal bytes (compare-and-swap writers never see spurious changes)."""
    data = policies.encode()
    assert NamespacePolicies.decode(data) == policies
    assert NamespacePolicies.decode(data).encode() == data
    assert list(json.loads(data)) == sorted(json.loads(data))


def test_namespace_policies_use_pulsars_field_names():
    """The REST layer passes the record through, so the JSON keys are Pulsar's."""
    doc = json.loads(FULL_POLICIES.encode())
    for name in ("retention_policies", "persistence", "deduplicationEnabled", "message_ttl_in_seconds",
                 "backlog_quota_map", "autoTopicCreationOverride", "bundles"):
        assert name in doc


def test_decode_drops_unknown_fields_and_keeps_known_ones():
    """A record written by a newer broker (or by Pulsar) with extra fields still
    decodes: the known fields are kept, the unknown ones are dropped (so they do not
    survive a read-modify-write by this version)."""
    doc = json.loads(FULL_POLICIES.encode())
    doc.update({"replication_clusters": ["c1"], "some_future_field": {"x": 1}})
    decoded = NamespacePolicies.decode(json.dumps(doc).encode())
    assert decoded == FULL_POLICIES
    assert "some_future_field" not in json.loads(decoded.encode())


def test_decode_fills_missing_fields_with_defaults():
    """A record that predates a field decodes with that field's default."""
    decoded = NamespacePolicies.decode(b'{"message_ttl_in_seconds": 5}')
    assert decoded == NamespacePolicies(message_ttl_in_seconds=5)
    assert NamespacePolicies.decode(b"{}") == NamespacePolicies()


@pytest.mark.parametrize("data", [
    b"", b"{", b"not json", b"[]", b"null", b"42", b'"policies"', b"\xff\xfe\x00", b'{"a": }',
])
def test_corrupt_namespace_policies_raise_malformed_frame_only(data: bytes):
    """Bad JSON, a non-object or bad UTF-8: MalformedFrame, naming the record."""
    with pytest.raises(MalformedFrame, match="namespace policies"):
        NamespacePolicies.decode(data)


def test_tenant_info_round_trip_and_validation():
    """TenantInfo round-trips, drops unknown fields, and refuses non-list roles or clusters."""
    info = TenantInfo(adminRoles=["admin"], allowedClusters=["c1", "c2"])
    assert TenantInfo.decode(info.encode()) == info
    assert TenantInfo.decode(TenantInfo().encode()) == TenantInfo()
    assert TenantInfo.from_json({"allowedClusters": ["c1"], "unknown": 1}) == TenantInfo([], ["c1"])
    for doc in ({"adminRoles": "admin"}, {"allowedClusters": {"c1": True}}, [], "x", None):
        with pytest.raises(InvalidArgument):
            TenantInfo.from_json(doc)
    for data in (b"", b"[1]", b'{"adminRoles": 5}', b"\xff"):
        with pytest.raises(MalformedFrame, match="tenant"):
            TenantInfo.decode(data)


def test_retention_accessor_defaults_to_nothing_kept():
    """No retention policy means 0 minutes and 0 MB; a set one is read as stored."""
    assert NamespacePolicies().retention() == RetentionPolicies(0, 0)
    policies = NamespacePolicies(retention_policies={"retentionTimeInMinutes": -1, "retentionSizeInMB": 512})
    assert policies.retention() == RetentionPolicies(retentionTimeInMinutes=-1, retentionSizeInMB=512)


def test_persistence_accessor_falls_back_to_the_broker_default():
    """No (or an empty) persistence policy gives the broker's default object itself."""
    broker_default = PersistencePolicies(3, 3, 2, 0.0)
    assert NamespacePolicies().persistence_policies(broker_default) is broker_default
    assert NamespacePolicies(persistence={}).persistence_policies(broker_default) is broker_default
    own = NamespacePolicies(persistence={"bookkeeperEnsemble": 5, "bookkeeperWriteQuorum": 3,
                                         "bookkeeperAckQuorum": 2, "managedLedgerMaxMarkDeleteRate": 0.5})
    assert own.persistence_policies(broker_default) == PersistencePolicies(5, 3, 2, 0.5)


@pytest.mark.parametrize("override, broker_default, expected", [
    (None, True, True),
    (None, False, False),
    ({}, True, True),                                    # an override without the flag
    ({"allowAutoTopicCreation": False}, True, False),
    ({"allowAutoTopicCreation": True}, False, True),
])
def test_auto_topic_creation_override_beats_the_broker_default(override, broker_default: bool, expected: bool):
    """The namespace's flag wins when set; otherwise the broker's default applies."""
    policies = NamespacePolicies(autoTopicCreationOverride=override)
    assert policies.allows_auto_topic_creation(broker_default) is expected


# --- request bodies ---------------------------------------------------------------------------

@pytest.mark.parametrize("body, stored", [
    ({}, {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}),
    ({"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}, {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}),
    ({"retentionTimeInMinutes": INT32_MAX, "retentionSizeInMB": INT64_MAX},
     {"retentionTimeInMinutes": INT32_MAX, "retentionSizeInMB": INT64_MAX}),
    ({"retentionTimeInMinutes": 10, "unknown": "dropped"}, {"retentionTimeInMinutes": 10, "retentionSizeInMB": 0}),
])
def test_retention_bodies(body: dict, stored: dict):
    """Accepted retention bodies and the value stored for each (defaults filled, unknown fields dropped)."""
    assert policy_codec.retention_of(body) == stored


@pytest.mark.parametrize("body, field", [
    ({"retentionTimeInMinutes": -2}, "retentionTimeInMinutes"),
    ({"retentionTimeInMinutes": INT32_MAX + 1}, "retentionTimeInMinutes"),
    ({"retentionTimeInMinutes": "60"}, "retentionTimeInMinutes"),
    ({"retentionTimeInMinutes": 1.5}, "retentionTimeInMinutes"),
    ({"retentionTimeInMinutes": True}, "retentionTimeInMinutes"),    # JSON true is not a number
    ({"retentionSizeInMB": None}, "retentionSizeInMB"),
    ({"retentionSizeInMB": INT64_MAX + 1}, "retentionSizeInMB"),
    ([], "retention policies"),
    ("60", "retention policies"),
])
def test_bad_retention_bodies_name_the_field(body, field: str):
    """Wrong types and out-of-range values are InvalidArgument naming the field."""
    with pytest.raises(InvalidArgument, match=field):
        policy_codec.retention_of(body)


def test_deduplication_takes_a_json_boolean_only():
    """Only JSON true/false; 1, "true" and null are refused."""
    assert policy_codec.deduplication_of(True) is True
    assert policy_codec.deduplication_of(False) is False
    for bad in (1, 0, "true", None, {"enabled": True}):
        with pytest.raises(InvalidArgument, match="deduplication"):
            policy_codec.deduplication_of(bad)


def test_message_ttl_bounds_and_types():
    """0..INT32_MAX seconds as a JSON integer; anything else is refused."""
    assert policy_codec.message_ttl_of(0) == 0
    assert policy_codec.message_ttl_of(INT32_MAX) == INT32_MAX
    for bad in (-1, INT32_MAX + 1, 1.5, True, "10", None):
        with pytest.raises(InvalidArgument, match="TTL"):
            policy_codec.message_ttl_of(bad)


def test_persistence_defaults_and_types():
    """Missing fields take PersistencePolicies' defaults; the rate is stored as a float."""
    assert policy_codec.persistence_of({}) == {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2,
                                               "bookkeeperAckQuorum": 2, "managedLedgerMaxMarkDeleteRate": 0.0}
    stored = policy_codec.persistence_of({"bookkeeperEnsemble": 5, "bookkeeperWriteQuorum": 3,
                                          "bookkeeperAckQuorum": 1, "managedLedgerMaxMarkDeleteRate": 2,
                                          "unknown": True})
    assert stored == {"bookkeeperEnsemble": 5, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 1,
                      "managedLedgerMaxMarkDeleteRate": 2.0}
    assert isinstance(stored["managedLedgerMaxMarkDeleteRate"], float)
    assert PersistencePolicies(**stored) == PersistencePolicies(5, 3, 1, 2.0)


@pytest.mark.parametrize("body, message", [
    ({"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2}, "bookkeeperEnsemble >="),
    ({"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 3}, "bookkeeperEnsemble >="),
    ({"bookkeeperEnsemble": 0}, "bookkeeperEnsemble"),
    ({"bookkeeperEnsemble": QUORUM_SIZE_MAX + 1}, "bookkeeperEnsemble"),
    ({"bookkeeperWriteQuorum": "2"}, "bookkeeperWriteQuorum"),
    ({"bookkeeperAckQuorum": 0}, "bookkeeperAckQuorum"),
    ({"bookkeeperAckQuorum": 1.0}, "bookkeeperAckQuorum"),
    ({"managedLedgerMaxMarkDeleteRate": -0.1}, "managedLedgerMaxMarkDeleteRate"),
    ({"managedLedgerMaxMarkDeleteRate": True}, "managedLedgerMaxMarkDeleteRate"),
    ({"managedLedgerMaxMarkDeleteRate": "1"}, "managedLedgerMaxMarkDeleteRate"),
    (None, "persistence policies"),
])
def test_bad_persistence_bodies(body, message: str):
    """Broken E >= Qw >= Qa, out-of-range quorums and bad rates are refused, naming the fault."""
    with pytest.raises(InvalidArgument, match=message):
        policy_codec.persistence_of(body)


def test_persistence_accepts_the_largest_quorums():
    """QUORUM_SIZE_MAX itself is allowed for all three quorums."""
    top = {"bookkeeperEnsemble": QUORUM_SIZE_MAX, "bookkeeperWriteQuorum": QUORUM_SIZE_MAX,
           "bookkeeperAckQuorum": QUORUM_SIZE_MAX}
    assert policy_codec.persistence_of(top)["bookkeeperAckQuorum"] == QUORUM_SIZE_MAX


def test_backlog_quota_types():
    """A missing or empty type means destination_storage; unknown types are refused."""
    assert policy_codec.backlog_quota_type_of(None) == "destination_storage"
    assert policy_codec.backlog_quota_type_of("") == "destination_storage"
    assert policy_codec.backlog_quota_type_of("message_age") == "message_age"
    with pytest.raises(InvalidArgument, match="backlogQuotaType"):
        policy_codec.backlog_quota_type_of("bogus")


@pytest.mark.parametrize("body, stored", [
    ({}, {"limit": -1, "limitSize": -1, "limitTime": -1, "policy": "producer_request_hold"}),
    ({"limit": 100}, {"limit": 100, "limitSize": 100, "limitTime": -1, "policy": "producer_request_hold"}),
    ({"limit": 100, "limitSize": 200}, {"limit": 200, "limitSize": 200, "limitTime": -1,
                                        "policy": "producer_request_hold"}),
    ({"limitSize": 5, "limitTime": 60, "policy": "consumer_backlog_eviction"},
     {"limit": 5, "limitSize": 5, "limitTime": 60, "policy": "consumer_backlog_eviction"}),
])
def test_backlog_quota_bodies(body: dict, stored: dict):
    """``limitSize`` wins over its old name ``limit``; both are stored, so clients of
    either vintage read it."""
    assert policy_codec.backlog_quota_of(body) == stored


@pytest.mark.parametrize("body, message", [
    ({"limitSize": -2}, "limitSize"),
    ({"limit": "big"}, "limitSize"),
    ({"limitTime": INT32_MAX + 1}, "limitTime"),
    ({"policy": "drop_everything"}, "policy"),
    ({"policy": None}, "policy"),
    ([1], "backlog quota"),
])
def test_bad_backlog_quota_bodies(body, message: str):
    """Bad sizes, times, policies and non-object bodies are refused, naming the field."""
    with pytest.raises(InvalidArgument, match=message):
        policy_codec.backlog_quota_of(body)


def test_auto_topic_creation_bodies():
    """The flag must be a boolean; partitioned auto-creation is NotSupported, not stored."""
    assert policy_codec.auto_topic_creation_of({"allowAutoTopicCreation": True}) == \
        {"allowAutoTopicCreation": True, "topicType": "non-partitioned"}
    assert policy_codec.auto_topic_creation_of(
        {"allowAutoTopicCreation": False, "topicType": "non-partitioned", "defaultNumPartitions": None}) == \
        {"allowAutoTopicCreation": False, "topicType": "non-partitioned"}
    for bad, message in (({}, "allowAutoTopicCreation"), ({"allowAutoTopicCreation": "yes"}, "allowAutoTopicCreation"),
                         ({"allowAutoTopicCreation": True, "topicType": "weird"}, "topicType"),
                         ({"allowAutoTopicCreation": True, "defaultNumPartitions": 3}, "defaultNumPartitions"),
                         (True, "auto topic creation")):
        with pytest.raises(InvalidArgument, match=message):
            policy_codec.auto_topic_creation_of(bad)
    # Partitioned auto-creation is refused plainly (501), not stored and ignored.
    with pytest.raises(NotSupported):
        policy_codec.auto_topic_creation_of({"allowAutoTopicCreation": True, "topicType": "partitioned"})


def test_subscription_names():
    """Non-empty strings up to SUBSCRIPTION_NAME_BYTES_MAX bytes without control characters."""
    assert policy_codec.subscription_name_of("audit") == "audit"
    assert policy_codec.subscription_name_of("with space/and:é") == "with space/and:é"
    longest = "x" * SUBSCRIPTION_NAME_BYTES_MAX
    assert policy_codec.subscription_name_of(longest) == longest
    too_long_in_bytes = "é" * (SUBSCRIPTION_NAME_BYTES_MAX // 2 + 1)   # few characters, too many bytes
    for bad in ("", None, 5, ["a"], longest + "x", too_long_in_bytes, "tab\there", "nul\x00"):
        with pytest.raises(InvalidArgument, match="subscription name"):
            policy_codec.subscription_name_of(bad)


def test_namespace_creation_body_absent_or_empty_gives_defaults():
    """No body or {} gives default policies; a non-object body is refused."""
    assert policy_codec.namespace_policies_of(None) == NamespacePolicies()
    assert policy_codec.namespace_policies_of({}) == NamespacePolicies()
    for bad in ([], "policies", 3):
        with pytest.raises(InvalidArgument, match="namespace policies"):
            policy_codec.namespace_policies_of(bad)


def test_namespace_creation_body_checks_each_field_and_round_trips():
    """A full Pulsar Policies body: every field is checked by its own endpoint's codec,
    nulls and unknown fields are ignored, broadcast subscriptions are de-duplicated
    and sorted, and the result survives the store's encode/decode."""
    body = {
        "retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
        "persistence": {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3, "bookkeeperAckQuorum": 2,
                        "managedLedgerMaxMarkDeleteRate": 1.5},
        "deduplicationEnabled": True,
        "message_ttl_in_seconds": 3600,
        "backlog_quota_map": {"destination_storage": {"limitSize": 10, "policy": "producer_exception"}},
        "autoTopicCreationOverride": {"allowAutoTopicCreation": False},
        "bundles": {"numBundles": 8},
        "broadcast_subscriptions": ["mirror", "audit", "mirror"],
        "replication_clusters": ["standalone"],       # Pulsar's, not kept by Magnetar
        "subscription_auth_mode": None,
    }
    policies = policy_codec.namespace_policies_of(body)
    assert policies == dataclasses.replace(FULL_POLICIES, subscription_expiration_time_minutes=0)
    assert NamespacePolicies.decode(policies.encode()) == policies
    nulls = {name: None for name in body}
    assert policy_codec.namespace_policies_of(nulls) == NamespacePolicies()


@pytest.mark.parametrize("body, message", [
    ({"retention_policies": {"retentionTimeInMinutes": "x"}}, "retentionTimeInMinutes"),
    ({"persistence": {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2}}, "bookkeeperEnsemble >="),
    ({"deduplicationEnabled": "yes"}, "deduplication"),
    ({"message_ttl_in_seconds": -5}, "TTL"),
    ({"autoTopicCreationOverride": {"allowAutoTopicCreation": 1}}, "allowAutoTopicCreation"),
    ({"backlog_quota_map": {"bogus_type": {}}}, "backlogQuotaType"),
    ({"backlog_quota_map": {"destination_storage": {"policy": "nope"}}}, "policy"),
    ({"backlog_quota_map": ["destination_storage"]}, "backlog_quota_map"),
    ({"bundles": 8}, "bundles"),
    ({"broadcast_subscriptions": "audit"}, "broadcast_subscriptions"),
    ({"broadcast_subscriptions": ["ok", ""]}, "subscription name"),
    ({"broadcast_subscriptions": [f"s{i}" for i in range(BROADCAST_SUBSCRIPTIONS_MAX + 1)]},
     "broadcast_subscriptions"),
])
def test_bad_namespace_creation_bodies(body: dict, message: str):
    """A bad field anywhere in the creation body refuses the whole body, naming the field."""
    with pytest.raises(InvalidArgument, match=message):
        policy_codec.namespace_policies_of(body)


def test_broadcast_subscriptions_up_to_the_limit_are_accepted():
    """Exactly BROADCAST_SUBSCRIPTIONS_MAX names pass, stored sorted."""
    names = [f"s{i:04d}" for i in range(BROADCAST_SUBSCRIPTIONS_MAX)]
    policies = policy_codec.namespace_policies_of({"broadcast_subscriptions": list(reversed(names))})
    assert policies.broadcast_subscriptions == names


@pytest.mark.parametrize("num_bundles", ["8", 2.5, True, -1, [8], {"n": 8}, 1025])
def test_bad_bundle_counts_are_refused_at_the_request(num_bundles):
    """``bundles.numBundles`` is turned into that many hash ranges when the namespace is
    created; a string, fraction, boolean or out-of-range count must be a 400 naming the
    field here, not a ValueError (500) or a silently truncated count later."""
    with pytest.raises(InvalidArgument, match="numBundles"):
        policy_codec.namespace_policies_of({"bundles": {"numBundles": num_bundles}})


@pytest.mark.parametrize("num_bundles", [1, 4, 1024, 0, None])
def test_good_bundle_counts_are_kept(num_bundles):
    """1..1024 ranges; 0 or null means "the broker's default", as before."""
    policies = policy_codec.namespace_policies_of({"bundles": {"numBundles": num_bundles}})
    assert policies.bundles == {"numBundles": num_bundles}


def test_namespace_creation_body_takes_grants_and_encryption_required():
    """A creation body as Pulsar's setup scripts send it: ``auth_policies`` grants
    (checked as the permission endpoints check them) and ``encryption_required``; fields
    Magnetar does not keep (``replication_clusters``) are ignored."""
    from broker.admin.policy_codec import namespace_policies_of

    policies = namespace_policies_of({
        "auth_policies": {"namespace_auth": {"anonymous": ["produce", "consume", "produce"]},
                          "destination_auth": {"persistent://t/ns/x": {"app": ["consume"]}}},
        "encryption_required": True, "replication_clusters": ["standalone"]})
    assert policies.encryption_required is True
    assert policies.granted_actions("anonymous") == {"produce", "consume"}
    assert policies.granted_actions("app", "persistent://t/ns/x") == {"consume"}
    assert policies.auth_policies["namespace_auth"] == {"anonymous": ["consume", "produce"]}
    for bad, message in (({"auth_policies": {"namespace_auth": {"r": ["fly"]}}}, "unknown actions"),
                         ({"auth_policies": {"namespace_auth": {"r": "produce"}}}, "list of strings"),
                         ({"auth_policies": {"namespace_auth": {"": ["produce"]}}}, "role name"),
                         ({"auth_policies": []}, "JSON object"),
                         ({"encryption_required": "yes"}, "true or false")):
        with pytest.raises(InvalidArgument, match=message):
            namespace_policies_of(bad)
