"""What a role may do: Pulsar's authorization model, off unless configured.

- A **superuser** (``superuser_roles``) may do everything.
- A **tenant admin** (the tenant's ``adminRoles``) may administer the tenant's
  namespaces and topics, and produce and consume on them.
- Any other role may produce or consume on a topic only with that permission granted
  on the topic's namespace (``/admin/v2/namespaces/{tenant}/{ns}/permissions/{role}``)
  or on the topic itself; a lookup needs either.
- Clusters, brokers, bookies, and creating, changing or deleting tenants are for
  superusers.

Decisions read the namespace policies and tenant records through ``Resources``, whose
cached copies live ``cache_ttl_s`` (a grant or revoke made through this broker drops
the cached copy, so it acts at once here and within that time on other brokers).
With authorization off every check passes.
"""

from __future__ import annotations

from broker.authentication import AuthConfig
from broker.resources import Resources
from common.errors import AuthorizationDenied, NamespaceNotFound, TenantNotFound
from common.topic_name import NamespaceName, TopicName

PRODUCE = "produce"
CONSUME = "consume"
# Pulsar's AuthAction values a grant may name (functions, packages, sinks and sources
# are accepted and kept, and mean nothing here).
ACTIONS = frozenset({PRODUCE, CONSUME, "functions", "packages", "sinks", "sources"})


class Authorizer:
    def __init__(self, config: AuthConfig, resources: Resources) -> None:
        self.config = config
        self.enabled = config.authorization_enabled
        self.resources = resources
        self.superusers = config.superusers

    def is_superuser(self, role: str | None) -> bool:
        return not self.enabled or (role is not None and role in self.superusers)

    async def is_tenant_admin(self, role: str | None, tenant: str) -> bool:
        if self.is_superuser(role):
            return True
        if role is None:
            return False
        try:
            info = await self.resources.tenant(tenant)
        except TenantNotFound:
            return False
        return role in info.adminRoles

    async def allowed(self, role: str | None, topic: TopicName, action: str) -> bool:
        """May ``role`` do ``action`` (PRODUCE or CONSUME) on ``topic``?"""
        assert action in (PRODUCE, CONSUME), action
        if self.is_superuser(role):
            return True
        if role is None:
            return False
        if await self.is_tenant_admin(role, topic.tenant):
            return True
        try:
            policies = await self.resources.policies(topic.namespace_name)
        except NamespaceNotFound:
            return False
        topic_key = str(topic.partitioned_parent) if topic.is_partition else str(topic)
        return action in policies.granted_actions(role, topic_key)

    async def check(self, role: str | None, topic: TopicName, action: str) -> None:
        if not await self.allowed(role, topic, action):
            raise AuthorizationDenied(f"role {role!r} may not {action} on {topic}")

    async def check_lookup(self, role: str | None, topic: TopicName) -> None:
        """A lookup (or partition metadata) needs produce or consume."""
        if not (await self.allowed(role, topic, PRODUCE) or await self.allowed(role, topic, CONSUME)):
            raise AuthorizationDenied(f"role {role!r} may neither produce nor consume on {topic}")

    async def check_namespace_access(self, role: str | None, namespace: NamespaceName) -> None:
        """Listing a namespace's topics: a tenant admin, or a role with any grant there."""
        if await self.is_tenant_admin(role, namespace.tenant):
            return
        try:
            policies = await self.resources.policies(namespace)
        except NamespaceNotFound:
            policies = None
        if role is None or policies is None or not policies.granted_actions(role):
            raise AuthorizationDenied(f"role {role!r} has no permission on namespace {namespace}")

    async def check_tenant_admin(self, role: str | None, tenant: str) -> None:
        if not await self.is_tenant_admin(role, tenant):
            raise AuthorizationDenied(f"role {role!r} is not an admin of tenant {tenant}")

    def check_superuser(self, role: str | None) -> None:
        if not self.is_superuser(role):
            raise AuthorizationDenied(f"role {role!r} is not a superuser")
