"""Where each piece of metadata lives in the store (keys relative to the cluster root).

One function per kind of key, so the layout is written down once. Ledger ids are
zero-padded to 20 digits so that key order is numeric order.
"""

from __future__ import annotations

BOOKIES = "/bookies/"
LEDGERS = "/ledgers/"
LEDGER_ID_COUNTER = "/counters/ledger-id"


def bookie(bookie_id: str) -> str:
    return f"{BOOKIES}{bookie_id}"


def ledger(ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{LEDGERS}{ledger_id:020d}"


def ledger_id_from_key(key: str) -> int:
    assert key.startswith(LEDGERS), key
    return int(key[len(LEDGERS):])


COOKIES = "/cookies/"


def cookie(bookie_id: str) -> str:
    return f"{COOKIES}{bookie_id}"


TENANTS = "/tenants/"
NAMESPACES = "/namespaces/"
PARTITIONED_TOPICS = "/partitioned-topics/"
MANAGED_LEDGERS = "/managed-ledgers/"
CURSORS = "/cursors/"
CLUSTERS = "/clusters/"
BROKERS = "/brokers/"


def tenant(name: str) -> str:
    return f"{TENANTS}{name}"


def namespace_policies(tenant_name: str, namespace: str) -> str:
    return f"{NAMESPACES}{tenant_name}/{namespace}/policies"


def partitioned_topic(tenant_name: str, namespace: str, encoded_local_name: str) -> str:
    return f"{PARTITIONED_TOPICS}{tenant_name}/{namespace}/{encoded_local_name}"


def managed_ledger(topic_key_path: str) -> str:
    """``topic_key_path`` is TopicName.key_path (persistent/tenant/ns/encoded-name)."""
    return f"{MANAGED_LEDGERS}{topic_key_path}"


def managed_ledgers_of_namespace(tenant_name: str, namespace: str) -> str:
    return f"{MANAGED_LEDGERS}persistent/{tenant_name}/{namespace}/"


def cursor(topic_key_path: str, subscription: str) -> str:
    from urllib.parse import quote

    return f"{CURSORS}{topic_key_path}/{quote(subscription, safe='')}"


def cursors_of_topic(topic_key_path: str) -> str:
    return f"{CURSORS}{topic_key_path}/"


# When a topic, and each of its subscriptions, last became inactive (broker/inactivity.py):
# a JSON record per topic, written only when something turns inactive or active again.
TOPIC_ACTIVITY = "/topic-activity/"


def topic_activity(topic_key_path: str) -> str:
    return f"{TOPIC_ACTIVITY}{topic_key_path}"


def topic_activity_of_namespace(tenant_name: str, namespace: str) -> str:
    return f"{TOPIC_ACTIVITY}persistent/{tenant_name}/{namespace}/"


def cluster(name: str) -> str:
    return f"{CLUSTERS}{name}"


def broker(broker_id: str) -> str:
    return f"{BROKERS}{broker_id}"


BUNDLE_OWNERS = "/bundle-owners/"
BUNDLE_ASSIGNMENTS = "/bundle-assignments/"
BUNDLE_TRANSFERS = "/bundle-transfers/"
LEADER = "/leader"


def namespace_bundles(tenant_name: str, namespace: str) -> str:
    return f"{NAMESPACES}{tenant_name}/{namespace}/bundles"


def bundle_owner(namespace: str, bundle_name: str) -> str:
    """``namespace`` is "tenant/ns"."""
    return f"{BUNDLE_OWNERS}{namespace}/{bundle_name}"


def bundle_assignment(namespace: str, bundle_name: str) -> str:
    return f"{BUNDLE_ASSIGNMENTS}{namespace}/{bundle_name}"


def bundle_transfer(namespace: str, bundle_name: str) -> str:
    return f"{BUNDLE_TRANSFERS}{namespace}/{bundle_name}"


def split_bundle_key(key: str, prefix: str) -> tuple[str, str]:
    """(namespace "t/ns", bundle name) of a key under one of the bundle prefixes."""
    rest = key[len(prefix):]
    namespace, _, bundle = rest.rpartition("/")
    return namespace, bundle


SCHEMAS = "/schemas/"


def schema(topic_key_path: str) -> str:
    """A topic's schema versions (broker/schemas.py); a partition uses its parent's."""
    return f"{SCHEMAS}{topic_key_path}"


TOPIC_POLICIES = "/topic-policies/"


def topic_policies(topic_key_path: str) -> str:
    """A topic's own policies (broker/topic_policies.py); a partition uses its parent's."""
    return f"{TOPIC_POLICIES}{topic_key_path}"


ARCHIVE = "/archive/"


def archive_of_topic(topic_key_path: str) -> str:
    """The prefix of a topic's archive manifest: one record per archived ledger."""
    return f"{ARCHIVE}{topic_key_path}/"


def archive_ledger(topic_key_path: str, ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{ARCHIVE}{topic_key_path}/{ledger_id:020d}"


# Archives of deleted topics waiting for collection (broker/archiver.py): one record per
# deleted topic that had archived ledgers, until its archive retention has passed.
ARCHIVE_DELETED = "/archive-deleted/"


def archive_deleted_topic(topic_key_path: str) -> str:
    return f"{ARCHIVE_DELETED}{topic_key_path}"


# Auto-recovery (ledger/auditor.py, ledger/replication.py): the elected auditor's leased
# key, one record per under-replicated ledger, a leased lock per ledger being
# re-replicated, and the bookies an operator marked for decommissioning.
AUDITOR = "/autorecovery/auditor"
UNDER_REPLICATED = "/autorecovery/under-replicated/"
REPLICATION_LOCKS = "/autorecovery/locks/"
DECOMMISSIONED = "/autorecovery/decommissioned/"


def under_replicated(ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{UNDER_REPLICATED}{ledger_id:020d}"


def under_replicated_ledger_id(key: str) -> int:
    assert key.startswith(UNDER_REPLICATED), key
    return int(key[len(UNDER_REPLICATED):])


def replication_lock(ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{REPLICATION_LOCKS}{ledger_id:020d}"


def decommissioned(bookie_id: str) -> str:
    return f"{DECOMMISSIONED}{bookie_id}"


# Transactions (transactions/): each coordinator's id counter and one record per open
# or ending transaction; each subscription's acknowledgements pending in a transaction.
TRANSACTION_COORDINATORS = "/transactions/coordinators/"
TRANSACTION_PENDING_ACKS = "/transactions/pending-acks/"


def transaction_id_counter(coordinator_id: int) -> str:
    return f"{TRANSACTION_COORDINATORS}{coordinator_id}/next-id"


def transactions_of_coordinator(coordinator_id: int) -> str:
    return f"{TRANSACTION_COORDINATORS}{coordinator_id}/txns/"


def transaction(coordinator_id: int, sequence: int) -> str:
    assert sequence >= 0, sequence
    return f"{transactions_of_coordinator(coordinator_id)}{sequence:020d}"


def pending_acks_of_topic(topic_key_path: str) -> str:
    return f"{TRANSACTION_PENDING_ACKS}{topic_key_path}/"


def pending_acks(topic_key_path: str, subscription: str, txn_text: str) -> str:
    return f"{pending_acks_of_subscription(topic_key_path, subscription)}{txn_text}"


def pending_acks_of_subscription(topic_key_path: str, subscription: str) -> str:
    """Every pending-ack record of one subscription (the name quoted: no other
    subscription's prefix)."""
    from urllib.parse import quote

    return f"{pending_acks_of_topic(topic_key_path)}{quote(subscription, safe='')}/"


def transactional_topic(topic_key_path: str) -> str:
    """Present once a transaction named the topic (ADD_PARTITION_TO_TXN): its owner
    then rebuilds the topic's transaction buffer when it loads it."""
    return f"/transactions/topics/{topic_key_path}"
