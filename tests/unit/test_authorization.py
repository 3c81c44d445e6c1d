"""Authorization decisions (broker/authorization.py) on an in-memory store, and the
gateway's permission cache and action table (gateway/auth.py).

Proves: with authorization off everything passes (role or not); superusers may do
everything; a tenant's admins may administer it and produce and consume in it, not in
other tenants; other roles need the action granted on the namespace or on the topic
(a partition inherits its partitioned topic's grant); lookups need either action;
listing a namespace needs some grant there; unknown roles and no role are refused with
AuthorizationDenied. The gateway cache keeps answers for their time and no more
entries than its bound.
"""

from __future__ import annotations

import pytest

from broker.authentication import AuthConfig
from broker.authorization import CONSUME, PRODUCE, Authorizer
from broker.resources import Resources
from common.errors import AuthorizationDenied
from common.topic_name import NamespaceName, TopicName
from gateway.auth import PermissionCache
from metadata.memory_store import MemoryStore
from metadata.policies import TenantInfo

ON = AuthConfig(authentication_enabled=True, authorization_enabled=True, superuser_roles="root",
                token_secret_key="data:;base64,AAAA")


async def _setup(config: AuthConfig = ON) -> Authorizer:
    resources = Resources(MemoryStore())
    await resources.ensure_cluster("standalone", "pulsar://x:6650", "http://x:8080")
    await resources.create_tenant("t", TenantInfo(adminRoles=["owner"], allowedClusters=["standalone"]))
    await resources.create_tenant("u", TenantInfo(adminRoles=[], allowedClusters=["standalone"]))
    for name in ("t/ns", "u/ns"):
        await resources.create_namespace(NamespaceName.parse(name))

    def grant(policies):
        policies.auth_policies["namespace_auth"]["writer"] = [PRODUCE]
        policies.auth_policies["destination_auth"]["persistent://t/ns/only"] = {"reader": [CONSUME]}

    await resources.update_policies(NamespaceName.parse("t/ns"), grant)
    return Authorizer(config, resources)


TOPIC = TopicName.parse("persistent://t/ns/x")
ONLY = TopicName.parse("persistent://t/ns/only")


async def test_off_allows_everything():
    authorizer = await _setup(AuthConfig())
    assert await authorizer.allowed(None, TOPIC, PRODUCE)
    authorizer.check_superuser(None)
    await authorizer.check_tenant_admin("anyone", "t")


async def test_superuser_and_tenant_admin():
    authorizer = await _setup()
    assert await authorizer.allowed("root", TopicName.parse("persistent://u/ns/y"), CONSUME)
    authorizer.check_superuser("root")
    with pytest.raises(AuthorizationDenied):
        authorizer.check_superuser("owner")
    await authorizer.check_tenant_admin("owner", "t")
    with pytest.raises(AuthorizationDenied):
        await authorizer.check_tenant_admin("owner", "u")
    assert await authorizer.allowed("owner", TOPIC, CONSUME)
    assert not await authorizer.allowed("owner", TopicName.parse("persistent://u/ns/y"), PRODUCE)


async def test_namespace_and_topic_grants():
    authorizer = await _setup()
    assert await authorizer.allowed("writer", TOPIC, PRODUCE)
    assert not await authorizer.allowed("writer", TOPIC, CONSUME)
    await authorizer.check_lookup("writer", TOPIC)
    await authorizer.check_namespace_access("writer", NamespaceName.parse("t/ns"))
    assert await authorizer.allowed("reader", ONLY, CONSUME)
    assert await authorizer.allowed("reader", TopicName.parse("persistent://t/ns/only-partition-3"), CONSUME)
    assert not await authorizer.allowed("reader", TOPIC, CONSUME)
    with pytest.raises(AuthorizationDenied):
        await authorizer.check_namespace_access("reader", NamespaceName.parse("t/ns"))
    for role in (None, "stranger"):
        with pytest.raises(AuthorizationDenied):
            await authorizer.check(role, TOPIC, PRODUCE)
        with pytest.raises(AuthorizationDenied):
            await authorizer.check_lookup(role, TOPIC)
    assert not await authorizer.allowed("writer", TopicName.parse("persistent://t/missing/x"), PRODUCE)


def test_gateway_permission_cache_expires_and_stays_bounded():
    cache = PermissionCache(ttl_ms=1000, entries_max=3)
    denied = AuthorizationDenied("no")
    cache.put((b"a", "t", "produce"), None, now=0.0)
    cache.put((b"b", "t", "produce"), denied, now=0.0)
    assert cache.get((b"a", "t", "produce"), now=0.5) == (True, None)
    assert cache.get((b"b", "t", "produce"), now=0.5) == (True, denied)
    assert cache.get((b"a", "t", "produce"), now=1.5) == (False, None)
    for index in range(10):
        cache.put((bytes([index]), "t", "consume"), None, now=2.0)
    assert len(cache._entries) == 3
    assert cache.get((bytes([9]), "t", "consume"), now=2.1) == (True, None)
    assert cache.get((bytes([0]), "t", "consume"), now=2.1) == (False, None)
