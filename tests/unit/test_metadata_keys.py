"""The metadata key layout (metadata/keys.py).

What it proves: no top-level prefix is a prefix of another (so a prefix listing or
watch of one kind never sees another kind, the bare "/leader" key included); ledger
keys sort in numeric order and parse back; names that hold '/', '%', spaces or other
special characters stay inside their own key segment (topics through
TopicName.key_path, subscriptions through keys.cursor); the listing prefixes of a
topic or namespace match exactly its own keys, so topic "a" never sees the cursors of
topic "a-b", and namespace "ns" never lists the topics of "ns-2"; bundle keys split back
into (namespace, bundle name).

How: small families of look-alike names, checked pairwise.
"""

from __future__ import annotations

import itertools
from urllib.parse import unquote

import pytest

from common.topic_name import TopicName
from bundles.hashing import Bundles, default_boundaries
from metadata import keys

TOP_LEVEL = [keys.BOOKIES, keys.LEDGERS, keys.LEDGER_ID_COUNTER, keys.COOKIES, keys.TENANTS, keys.NAMESPACES,
             keys.PARTITIONED_TOPICS, keys.MANAGED_LEDGERS, keys.CURSORS, keys.CLUSTERS, keys.BROKERS,
             keys.BUNDLE_OWNERS, keys.BUNDLE_ASSIGNMENTS, keys.BUNDLE_TRANSFERS, keys.LEADER, keys.TOPIC_ACTIVITY]


def test_top_level_prefixes_never_overlap():
    """Each kind of key lives under its own prefix; none starts another (the leader
    cache watches the bare "/leader" as a prefix, so this matters for it too)."""
    assert len(set(TOP_LEVEL)) == len(TOP_LEVEL)
    for first, second in itertools.permutations(TOP_LEVEL, 2):
        assert not second.startswith(first), (first, second)
    for prefix in TOP_LEVEL:
        assert prefix.startswith("/")


def test_every_key_lands_under_its_own_prefix_only():
    """A sample key of each kind starts with its prefix and with no other."""
    topic = TopicName.parse("persistent://t/ns/topic")
    samples = {
        keys.BOOKIES: keys.bookie("bookie-1:3181"),
        keys.LEDGERS: keys.ledger(42),
        keys.COOKIES: keys.cookie("bookie-1:3181"),
        keys.TENANTS: keys.tenant("t"),
        keys.NAMESPACES: keys.namespace_policies("t", "ns"),
        keys.PARTITIONED_TOPICS: keys.partitioned_topic("t", "ns", "topic"),
        keys.MANAGED_LEDGERS: keys.managed_ledger(topic.key_path),
        keys.CURSORS: keys.cursor(topic.key_path, "sub"),
        keys.TOPIC_ACTIVITY: keys.topic_activity(topic.key_path),
        keys.CLUSTERS: keys.cluster("standalone"),
        keys.BROKERS: keys.broker("broker-1"),
        keys.BUNDLE_OWNERS: keys.bundle_owner("t/ns", "0x00000000_0x40000000"),
        keys.BUNDLE_ASSIGNMENTS: keys.bundle_assignment("t/ns", "0x00000000_0x40000000"),
        keys.BUNDLE_TRANSFERS: keys.bundle_transfer("t/ns", "0x00000000_0x40000000"),
    }
    for prefix, key in samples.items():
        assert [p for p in TOP_LEVEL if key.startswith(p)] == [prefix], key
    assert keys.namespace_bundles("t", "ns").startswith(keys.NAMESPACES)


def test_ledger_keys_sort_numerically_and_parse_back():
    """Zero-padded ids: key order is numeric order, and the id parses back."""
    ledger_ids = [0, 1, 9, 10, 99, 100, 12345, 2**32, 2**63 - 1]
    ledger_keys = [keys.ledger(i) for i in ledger_ids]
    assert sorted(ledger_keys) == ledger_keys
    assert [keys.ledger_id_from_key(k) for k in ledger_keys] == ledger_ids
    assert keys.ledger(7) == "/ledgers/00000000000000000007"


def test_negative_ledger_ids_are_a_programming_error():
    """A negative ledger id trips the assertion instead of making a key."""
    with pytest.raises(AssertionError):
        keys.ledger(-1)


# Look-alike local names: prefixes of each other, '%' that looks like an encoding,
# characters that mean something in URLs and key paths.
LOOK_ALIKE_TOPICS = ["a", "a-b", "ab", "a+b", "a%2Fb", "a%252Fb", "a.b", "a:b", "a?b", "a#b", "é", "a-partition-1"]
LOOK_ALIKE_SUBSCRIPTIONS = ["s", "s-2", "s/x", "s%2Fx", "s x", "", "/", "é", "..", "s/"]


def _topic(local_name: str, namespace: str = "ns") -> TopicName:
    return TopicName.from_parts("t", namespace, local_name)


def test_cursor_keys_of_one_topic_never_match_another_topics_prefix():
    """cursors_of_topic(a) lists exactly a's cursors: not those of "a-b", "ab" or any
    look-alike, whatever the subscription names hold."""
    for owner, other in itertools.product(LOOK_ALIKE_TOPICS, repeat=2):
        prefix = keys.cursors_of_topic(_topic(owner).key_path)
        for subscription in LOOK_ALIKE_SUBSCRIPTIONS:
            key = keys.cursor(_topic(other).key_path, subscription)
            assert key.startswith(prefix) == (owner == other), (owner, other, subscription)


def test_cursor_keys_are_one_segment_per_subscription_and_injective():
    """The subscription is percent-encoded after the topic's prefix: one segment that
    decodes back to the name, and no two (topic, subscription) pairs share a key."""
    seen = {}
    for local_name, subscription in itertools.product(LOOK_ALIKE_TOPICS, LOOK_ALIKE_SUBSCRIPTIONS):
        topic = _topic(local_name)
        key = keys.cursor(topic.key_path, subscription)
        rest = key[len(keys.cursors_of_topic(topic.key_path)):]
        assert "/" not in rest
        assert unquote(rest) == subscription
        assert key not in seen, (key, seen.get(key), (local_name, subscription))
        seen[key] = (local_name, subscription)


def test_managed_ledger_keys_list_by_namespace_and_decode_to_the_topic():
    """A namespace's managed-ledger prefix holds its own topics only (not those of
    "ns-2" or "n"), and the rest of each key decodes to the local name."""
    namespaces = ["ns", "ns-2", "n", "ns.2"]
    for owner, other in itertools.product(namespaces, repeat=2):
        prefix = keys.managed_ledgers_of_namespace("t", owner)
        for local_name in LOOK_ALIKE_TOPICS:
            key = keys.managed_ledger(_topic(local_name, other).key_path)
            assert key.startswith(prefix) == (owner == other), (owner, other, local_name)
            if owner == other:
                assert "/" not in key[len(prefix):]
                assert unquote(key[len(prefix):]) == local_name
    managed = {keys.managed_ledger(_topic(n).key_path) for n in LOOK_ALIKE_TOPICS}
    assert len(managed) == len(LOOK_ALIKE_TOPICS)


def test_partitioned_topic_keys_list_by_namespace():
    """The listing prefix is the key with an empty name: it ends with '/', so it
    matches the namespace's own partitioned topics only."""
    prefix = keys.partitioned_topic("t", "ns", "")
    assert prefix.endswith("/")
    assert keys.partitioned_topic("t", "ns", "orders").startswith(prefix)
    assert not keys.partitioned_topic("t", "ns-2", "orders").startswith(prefix)
    assert not keys.partitioned_topic("t-2", "ns", "orders").startswith(prefix)


def test_namespace_keys_of_look_alike_tenants_and_namespaces_stay_apart():
    """A tenant's namespaces are listed under "/namespaces/<tenant>/": tenant "a" never
    sees the namespaces of tenant "a-b", and a namespace's policies and bundles keys are
    distinct leaves under its own prefix."""
    tenant_prefix = f"{keys.NAMESPACES}a/"
    assert keys.namespace_policies("a", "ns").startswith(tenant_prefix)
    assert not keys.namespace_policies("a-b", "ns").startswith(tenant_prefix)
    namespace_prefix = f"{keys.NAMESPACES}a/ns/"
    leaves = {keys.namespace_policies("a", "ns"), keys.namespace_bundles("a", "ns")}
    assert len(leaves) == 2 and all(k.startswith(namespace_prefix) for k in leaves)
    assert not keys.namespace_policies("a", "ns-2").startswith(namespace_prefix)
    assert keys.tenant("a") != keys.tenant("a-b") and not keys.tenant("a-b").startswith(keys.tenant("a") + "/")


@pytest.mark.parametrize("make, prefix", [
    (keys.bundle_owner, keys.BUNDLE_OWNERS),
    (keys.bundle_assignment, keys.BUNDLE_ASSIGNMENTS),
    (keys.bundle_transfer, keys.BUNDLE_TRANSFERS),
])
def test_bundle_keys_split_back_into_namespace_and_bundle(make, prefix: str):
    """split_bundle_key inverts each bundle key maker for every default range."""
    for namespace in ("public/default", "t/ns-2", "a-b/c.d"):
        for bundle in Bundles(tuple(default_boundaries(4))).ranges:
            key = make(namespace, bundle.name)
            assert key.startswith(prefix)
            assert keys.split_bundle_key(key, prefix) == (namespace, bundle.name)
