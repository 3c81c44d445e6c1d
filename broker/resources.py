"""Tenants, namespaces, clusters and partitioned-topic metadata in etcd: the records
the admin API manages and the broker consults (Pulsar calls these "resources").

Reads of namespace policies are cached for ``cache_ttl_s`` (they are read on every
topic load); writes go straight to etcd and drop the cached copy.
"""

from __future__ import annotations

import json
import time

from common.topic_name import NamespaceName, TopicName, validate_name_part
from common.errors import (
    AlreadyExists,
    MetadataKeyExists,
    NamespaceNotFound,
    NotFound,
    PreconditionFailed,
    TenantNotFound,
)
from broker.topic_policies import PolicyResolver, TopicPolicyStore
from metadata import keys
from metadata.policies import NamespacePolicies, TenantInfo
from metadata.store import MetadataStore


class Resources:
    def __init__(self, store: MetadataStore, *, cache_ttl_s: float = 5.0, default_bundles: int = 4) -> None:
        self.store = store
        self.default_bundles = default_bundles
        self._cache_ttl_s = cache_ttl_s
        self._policies: dict[str, tuple[float, NamespacePolicies | None]] = {}
        # Topics' own policies and the one resolver of a topic's effective policies
        # (broker/topic_policies.py): what every enforcement reads.
        self.topic_policies = TopicPolicyStore(store, cache_ttl_s=cache_ttl_s)
        self._resolver = PolicyResolver(self.policies, self.topic_policies)

    async def effective_policies(self, topic: TopicName, *, fresh: bool = False) -> NamespacePolicies:
        """The policies ``topic`` is served under: topic over namespace (broker defaults
        are applied where each is enforced). ServiceNotReady if the topic's own policies
        cannot be read; NamespaceNotFound as ``policies``. ``fresh``: the topic's own
        record read from etcd, not the cache."""
        return await self._resolver.effective(topic, fresh=fresh)

    # --- clusters ---------------------------------------------------------------------------

    async def ensure_cluster(self, name: str, service_url: str, web_service_url: str) -> None:
        data = json.dumps({"serviceUrl": web_service_url, "brokerServiceUrl": service_url}).encode()
        try:
            await self.store.create(keys.cluster(name), data)
        except MetadataKeyExists:
            pass

    async def clusters(self) -> list[str]:
        return [r.key[len(keys.CLUSTERS):] for r in await self.store.get_prefix(keys.CLUSTERS, keys_only=True)]

    async def cluster(self, name: str) -> dict:
        record = await self.store.get(keys.cluster(name))
        if record is None:
            raise NotFound(f"cluster {name} does not exist")
        return json.loads(record.value)

    async def put_cluster(self, name: str, data: dict) -> None:
        validate_name_part(name, "cluster")
        await self.store.put(keys.cluster(name), json.dumps(data).encode())

    async def delete_cluster(self, name: str) -> None:
        if not await self.store.delete(keys.cluster(name)):
            raise NotFound(f"cluster {name} does not exist")

    # --- tenants ------------------------------------------------------------------------------

    async def tenants(self) -> list[str]:
        return [r.key[len(keys.TENANTS):] for r in await self.store.get_prefix(keys.TENANTS, keys_only=True)]

    async def tenant(self, name: str) -> TenantInfo:
        record = await self.store.get(keys.tenant(name))
        if record is None:
            raise TenantNotFound(f"tenant {name} does not exist")
        return TenantInfo.decode(record.value)

    async def create_tenant(self, name: str, info: TenantInfo) -> None:
        validate_name_part(name, "tenant")
        try:
            await self.store.create(keys.tenant(name), info.encode())
        except MetadataKeyExists:
            raise AlreadyExists(f"tenant {name} already exists") from None

    async def update_tenant(self, name: str, info: TenantInfo) -> None:
        await self.tenant(name)
        await self.store.put(keys.tenant(name), info.encode())

    async def delete_tenant(self, name: str) -> None:
        await self.tenant(name)
        if await self.namespaces(name):
            raise PreconditionFailed(f"tenant {name} still has namespaces")
        await self.store.delete(keys.tenant(name))

    # --- namespaces ----------------------------------------------------------------------------

    async def namespaces(self, tenant: str) -> list[str]:
        prefix = f"{keys.NAMESPACES}{tenant}/"
        names = []
        for record in await self.store.get_prefix(prefix, keys_only=True):
            rest = record.key[len(prefix):]
            namespace, _, leaf = rest.partition("/")
            if leaf == "policies":
                names.append(f"{tenant}/{namespace}")
        return names

    async def policies(self, namespace: NamespaceName, *, fresh: bool = False) -> NamespacePolicies:
        key = str(namespace)
        cached = self._policies.get(key)
        now = time.monotonic()
        if cached is not None and not fresh and now - cached[0] < self._cache_ttl_s and cached[1] is not None:
            return cached[1]
        record = await self.store.get(keys.namespace_policies(namespace.tenant, namespace.namespace))
        if record is None:
            self._policies.pop(key, None)
            raise NamespaceNotFound(f"namespace {namespace} does not exist")
        policies = NamespacePolicies.decode(record.value)
        self._policies[key] = (now, policies)
        return policies

    def forget_policies(self, namespace: NamespaceName | None = None) -> None:
        """Drops the cached policies of ``namespace`` (of every namespace when None): they
        changed in etcd (broker/policy_watch.py), the next read is fresh."""
        if namespace is None:
            self._policies.clear()
        else:
            self._policies.pop(str(namespace), None)

    async def create_namespace(self, namespace: NamespaceName, policies: NamespacePolicies | None = None,
                               default_bundles: int | None = None) -> None:
        """Creates the namespace with its bundles (``policies.bundles.numBundles`` or
        ``default_bundles`` equal ranges), in one transaction."""
        from bundles.hashing import default_boundaries
        from bundles.records import BundlesRecord
        from metadata.store import Compare, Put

        await self.tenant(namespace.tenant)
        policies = policies or NamespacePolicies()
        count = default_bundles or self.default_bundles
        if isinstance(policies.bundles, dict) and policies.bundles.get("numBundles"):
            count = int(policies.bundles["numBundles"])
        boundaries = BundlesRecord(default_boundaries(count)).encode()
        policies_key = keys.namespace_policies(namespace.tenant, namespace.namespace)
        bundles_key = keys.namespace_bundles(namespace.tenant, namespace.namespace)
        created = await self.store.transaction([Compare(policies_key, 0)],
                                               [Put(policies_key, policies.encode()), Put(bundles_key, boundaries)])
        if created is None:
            raise AlreadyExists(f"namespace {namespace} already exists")

    async def update_policies(self, namespace: NamespaceName, change) -> NamespacePolicies:
        """Read-modify-write of a namespace's policies with compare-and-swap."""
        key = keys.namespace_policies(namespace.tenant, namespace.namespace)
        for _ in range(16):
            record = await self.store.get(key)
            if record is None:
                raise NamespaceNotFound(f"namespace {namespace} does not exist")
            policies = NamespacePolicies.decode(record.value)
            change(policies)
            from common.errors import MetadataVersionConflict

            try:
                await self.store.compare_and_set(key, policies.encode(), expected_version=record.version)
            except MetadataVersionConflict:
                continue
            self._policies.pop(str(namespace), None)
            return policies
        raise PreconditionFailed(f"namespace {namespace} policies changed concurrently too often")

    async def delete_namespace(self, namespace: NamespaceName) -> None:
        await self.policies(namespace, fresh=True)
        await self.store.delete_prefix(f"{keys.NAMESPACES}{namespace.tenant}/{namespace.namespace}/")
        await self.store.delete_prefix(keys.topic_policies(f"persistent/{namespace.tenant}/{namespace.namespace}/"))
        self._policies.pop(str(namespace), None)

    # --- partitioned topics -------------------------------------------------------------------

    def _partitioned_key(self, topic: TopicName) -> str:
        parent = topic.partitioned_parent
        return keys.partitioned_topic(parent.tenant, parent.namespace, parent.key_path.rsplit("/", 1)[1])

    async def partitions(self, topic: TopicName) -> int:
        """Partition count of a partitioned topic; 0 if the topic is not partitioned."""
        if topic.is_partition:
            return 0
        record = await self.store.get(self._partitioned_key(topic))
        return int(json.loads(record.value)["partitions"]) if record is not None else 0

    async def create_partitioned(self, topic: TopicName, partitions: int) -> None:
        if partitions < 1:
            raise PreconditionFailed("a partitioned topic needs at least one partition")
        try:
            await self.store.create(self._partitioned_key(topic), json.dumps({"partitions": partitions}).encode())
        except MetadataKeyExists:
            raise AlreadyExists(f"partitioned topic {topic} already exists") from None

    async def update_partitions(self, topic: TopicName, partitions: int) -> None:
        current = await self.partitions(topic)
        if current == 0:
            raise NotFound(f"partitioned topic {topic} does not exist")
        if partitions <= current:
            raise PreconditionFailed(f"partitions can only grow: {current} -> {partitions}")
        await self.store.put(self._partitioned_key(topic), json.dumps({"partitions": partitions}).encode())

    async def delete_partitioned(self, topic: TopicName) -> None:
        if not await self.store.delete(self._partitioned_key(topic)):
            raise NotFound(f"partitioned topic {topic} does not exist")
        await self.topic_policies.delete(topic)

    async def partitioned_topics(self, namespace: NamespaceName) -> list[str]:
        from urllib.parse import unquote

        prefix = keys.partitioned_topic(namespace.tenant, namespace.namespace, "")
        return [f"persistent://{namespace}/{unquote(r.key[len(prefix):])}"
                for r in await self.store.get_prefix(prefix, keys_only=True)]

    async def topics(self, namespace: NamespaceName) -> list[str]:
        """Non-partitioned topics and partitions that have a managed ledger."""
        from urllib.parse import unquote

        prefix = keys.managed_ledgers_of_namespace(namespace.tenant, namespace.namespace)
        return [f"persistent://{namespace}/{unquote(r.key[len(prefix):])}"
                for r in await self.store.get_prefix(prefix, keys_only=True)]
