"""Bundle ownership across two brokers' managers on one store (the in-memory store
keeps etcd's transactions, leases and watches): a split made by the owner must not
leave another broker answering lookups from its cached, pre-split boundaries.

What it proves: broker A, which looked the namespace up before B split the bundle,
answers a lookup for a topic in either half with B at once (the old bundle has no owner
record any more, so A re-reads the boundaries) rather than waiting for an owner of a
bundle that no longer exists and failing with "no owner yet".
"""

from __future__ import annotations

import asyncio

from common.topic_name import NamespaceName, TopicName
from bundles.config import BundlesConfig
from bundles.hashing import BundleRange, default_boundaries, topic_hash
from bundles.ownership import BrokerIdentity, OwnershipManager
from bundles.records import AssignmentRecord, BundlesRecord
from metadata import keys
from metadata.memory_store import MemoryStore

NAMESPACE = NamespaceName("public", "default")
YIELDS_MAX = 500


async def _until(condition) -> None:
    for _ in range(YIELDS_MAX):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met")


def _manager(store: MemoryStore, name: str) -> OwnershipManager:
    identity = BrokerIdentity(name, f"pulsar://{name}:6650", f"http://{name}:8080")

    async def close_topics(_topics, _reason, _destination=None) -> None:
        return None

    return OwnershipManager(store, BundlesConfig(ownership_wait_s=0.5), identity,
                            loaded_topics=list, close_topics=close_topics)


def _urls(broker_id: str):
    return f"pulsar://{broker_id}:6650", f"http://{broker_id}:8080"


async def test_lookup_after_a_split_elsewhere_finds_the_owner_of_the_half():
    store = MemoryStore()
    await store.put(keys.namespace_policies("public", "default"), b"{}")
    await store.put(keys.namespace_bundles("public", "default"), BundlesRecord(default_boundaries(1)).encode())
    a, b = _manager(store, "a"), _manager(store, "b")
    await a.start()
    await b.start()
    try:
        whole = BundleRange.parse("0x00000000_0xffffffff")
        await store.put(keys.bundle_assignment(str(NAMESPACE), whole.name), AssignmentRecord("b").encode())
        topic = TopicName.parse("persistent://public/default/orders")
        await _until(lambda: f"{NAMESPACE}/{whole.name}" in b.serving())
        assert (await a.owner_of(topic, _urls)).broker_id == "b"      # A caches one bundle

        low, high = await b.split(NAMESPACE, whole.name)
        half = low if BundleRange.parse(low).contains(topic_hash(str(topic))) else high
        await _until(lambda: f"{NAMESPACE}/{half}" in b.serving())
        owner = await asyncio.wait_for(a.owner_of(topic, _urls), 0.4)   # well inside the 0.5 s wait
        assert owner.broker_id == "b"
        assert (await a.bundle_of(topic))[1].name == half
    finally:
        await a.close()
        await b.close()
