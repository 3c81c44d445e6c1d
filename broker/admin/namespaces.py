"""Admin REST for namespaces and their policies, as Pulsar's ``/admin/v2/namespaces``
paths (``{ns}`` below is ``{tenant}/{namespace}``):

    GET    /admin/v2/namespaces/{tenant}        the tenant's namespaces ("tenant/ns")
    PUT    /admin/v2/namespaces/{ns}            create; optional body: Policies (409 if it exists)
    GET    /admin/v2/namespaces/{ns}            Policies
    DELETE /admin/v2/namespaces/{ns}[?force=true]
                                                delete; refused (412) while it has topics,
                                                unless force, which deletes them first
    GET    /admin/v2/namespaces/{ns}/topics     its topics (non-partitioned and partitions)

Policies, each GET / POST (set; body the value) / DELETE (back to the broker default).
A GET answers the namespace's own setting, ``null`` when it has none:

    /admin/v2/namespaces/{ns}/retention           {"retentionTimeInMinutes", "retentionSizeInMB"}
    /admin/v2/namespaces/{ns}/deduplication       true | false
    /admin/v2/namespaces/{ns}/messageTTL          seconds
    /admin/v2/namespaces/{ns}/compactionThreshold bytes written since the last compaction that start one (0: off)
    /admin/v2/namespaces/{ns}/persistence         {"bookkeeperEnsemble", "bookkeeperWriteQuorum",
                                                   "bookkeeperAckQuorum", "managedLedgerMaxMarkDeleteRate"}
    /admin/v2/namespaces/{ns}/autoTopicCreation   {"allowAutoTopicCreation", "topicType"}
    /admin/v2/namespaces/{ns}/schemaCompatibilityStrategy  "FULL" | "BACKWARD" | ... (PUT too)
    /admin/v2/namespaces/{ns}/offloadPolicies     OffloadPolicies: when closed ledgers are archived
                                                  as Arrow files (docs/archive.md)
    /admin/v2/namespaces/{ns}/subscriptionExpirationTime   minutes without a consumer after which
                                                  a subscription is deleted (0: the broker's default)
    /admin/v2/namespaces/{ns}/inactiveTopicPolicies {"inactiveTopicDeleteMode", "maxInactiveDurationSeconds",
                                                  "deleteWhileInactive"} (broker/inactivity.py)
    GET    /admin/v2/namespaces/{ns}/backlogQuotaMap               {type: BacklogQuota}
    POST   /admin/v2/namespaces/{ns}/backlogQuota[?backlogQuotaType=destination_storage|message_age]
    DELETE /admin/v2/namespaces/{ns}/backlogQuota[?backlogQuotaType=...]

Magnetar extension, the namespace's broadcast subscriptions (every consumer of such a
subscription gets every message; field ``broadcast_subscriptions`` of the policies):

    GET    /admin/v2/namespaces/{ns}/broadcastSubscriptions                 list of names
    POST   /admin/v2/namespaces/{ns}/broadcastSubscriptions                 body: a JSON string,
                                                                            the name (409 if listed)
    DELETE /admin/v2/namespaces/{ns}/broadcastSubscriptions/{subscription}  (404 if not listed)

Every change is a compare-and-swap of the namespace's policies record, so concurrent
changes of different policies do not overwrite each other.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from aiohttp import web

from broker import inactivity
from broker.admin import policy_codec, topic_access
from broker.admin.common import flag, json_body, namespace_of, no_content
from broker.admin.keys import SERVICE
from common.topic_name import TopicName
from common.errors import AlreadyExists, NotFound, PreconditionFailed, TopicNotFound
from metadata.policies import NamespacePolicies

log = logging.getLogger(__name__)

# path -> (NamespacePolicies attribute, decoder of the POST body)
_SIMPLE_POLICIES: dict[str, tuple[str, Callable[[object], object]]] = {
    "retention": ("retention_policies", policy_codec.retention_of),
    "deduplication": ("deduplicationEnabled", policy_codec.deduplication_of),
    "messageTTL": ("message_ttl_in_seconds", policy_codec.message_ttl_of),
    "compactionThreshold": ("compaction_threshold", policy_codec.compaction_threshold_of),
    "persistence": ("persistence", policy_codec.persistence_of),
    "autoTopicCreation": ("autoTopicCreationOverride", policy_codec.auto_topic_creation_of),
    "offloadPolicies": ("offload_policies", policy_codec.offload_policies_of),
    "schemaCompatibilityStrategy": ("schema_compatibility_strategy", policy_codec.schema_compatibility_strategy_of),
    # Overridden per topic by .../{topic}/maxProducers and maxConsumers (broker/admin/topic_policies.py).
    "maxProducersPerTopic": ("max_producers_per_topic", policy_codec.clients_per_topic_of),
    "maxConsumersPerTopic": ("max_consumers_per_topic", policy_codec.clients_per_topic_of),
    "encryptionRequired": ("encryption_required", policy_codec.encryption_required_of),
    # broker/inactivity.py
    "subscriptionExpirationTime": ("subscription_expiration_time_minutes", inactivity.subscription_expiration_of),
    "inactiveTopicPolicies": ("inactive_topic_policies", inactivity.inactive_topic_policy_of),
}

NAMESPACE_PATH = "/admin/v2/namespaces/{tenant}/{namespace}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


def simple_policy_handlers(path: str, attribute: str, decode: Callable[[object], object]) -> None:
    async def get_policy(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        policies = await resources.policies(namespace_of(request), fresh=True)
        return web.json_response(getattr(policies, attribute))

    async def set_policy(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        namespace = namespace_of(request)
        value = decode(await json_body(request, required=True))
        await resources.update_policies(namespace, lambda p: setattr(p, attribute, value))
        log.info("namespace policy set: namespace=%s policy=%s value=%s", namespace, path, json.dumps(value))
        return no_content()

    async def remove_policy(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        namespace = namespace_of(request)
        await resources.update_policies(namespace, lambda p: setattr(p, attribute, None))
        log.info("namespace policy removed: namespace=%s policy=%s", namespace, path)
        return no_content()

    route = f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{path}"
    routes.get(route)(get_policy)
    routes.post(route)(set_policy)
    if path == "schemaCompatibilityStrategy":
        routes.put(route)(set_policy)      # Pulsar's verb for this one
    routes.delete(route)(remove_policy)


@routes.get("/admin/v2/namespaces/{tenant}")
async def list_namespaces(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    tenant = request.match_info["tenant"]
    await resources.tenant(tenant)
    return web.json_response(sorted(await resources.namespaces(tenant)))


@routes.put(NAMESPACE_PATH)
async def create_namespace(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    policies = policy_codec.namespace_policies_of(await json_body(request, required=False))
    await resources.create_namespace(namespace, policies)
    log.info("namespace created: namespace=%s", namespace)
    return no_content()


@routes.get(NAMESPACE_PATH)
async def get_namespace(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    policies = await resources.policies(namespace_of(request), fresh=True)
    return web.json_response(json.loads(policies.encode()))


@routes.delete(NAMESPACE_PATH)
async def delete_namespace(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    force = flag(request, "force")
    await resources.policies(namespace, fresh=True)
    topics = await service.topics_of_namespace(namespace)
    partitioned = await resources.partitioned_topics(namespace)
    if (topics or partitioned) and not force:
        raise PreconditionFailed(f"namespace {namespace} still has {len(topics)} topics and "
                                 f"{len(partitioned)} partitioned topics")
    for parent in partitioned:
        await topic_access.delete_partitioned(service, TopicName.parse(parent), request, force=True)
    await topic_access.delete_topics(service,
                                     [TopicName.parse(t) for t in await service.topics_of_namespace(namespace)],
                                     request, what=f"deleting the topics of {namespace}")
    await resources.delete_namespace(namespace)
    log.info("namespace deleted: namespace=%s force=%s topics=%d partitioned=%d", namespace, force,
             len(topics), len(partitioned))
    return no_content()


@routes.get(f"{NAMESPACE_PATH}/topics")
async def namespace_topics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(await topic_access.namespace_topics(service, namespace_of(request)))


for _path, (_attribute, _decode) in _SIMPLE_POLICIES.items():
    simple_policy_handlers(_path, _attribute, _decode)


@routes.get(f"{NAMESPACE_PATH}/backlogQuotaMap")
async def get_backlog_quotas(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    policies = await resources.policies(namespace_of(request), fresh=True)
    return web.json_response(policies.backlog_quota_map)


@routes.post(f"{NAMESPACE_PATH}/backlogQuota")
async def set_backlog_quota(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    quota_type = policy_codec.backlog_quota_type_of(request.query.get("backlogQuotaType"))
    quota = policy_codec.backlog_quota_of(await json_body(request, required=True))
    await resources.update_policies(namespace, lambda p: p.backlog_quota_map.__setitem__(quota_type, quota))
    log.info("backlog quota set: namespace=%s type=%s quota=%s", namespace, quota_type, json.dumps(quota))
    return no_content()


@routes.delete(f"{NAMESPACE_PATH}/backlogQuota")
async def remove_backlog_quota(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    quota_type = policy_codec.backlog_quota_type_of(request.query.get("backlogQuotaType"))
    await resources.update_policies(namespace, lambda p: p.backlog_quota_map.pop(quota_type, None))
    log.info("backlog quota removed: namespace=%s type=%s", namespace, quota_type)
    return no_content()


@routes.get(f"{NAMESPACE_PATH}/broadcastSubscriptions")
async def list_broadcast(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    policies = await resources.policies(namespace_of(request), fresh=True)
    return web.json_response(sorted(policies.broadcast_subscriptions))


@routes.post(f"{NAMESPACE_PATH}/broadcastSubscriptions")
async def add_broadcast(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    name = policy_codec.subscription_name_of(await json_body(request, required=True))

    def add(policies: NamespacePolicies) -> None:
        if name in policies.broadcast_subscriptions:
            raise AlreadyExists(f"{name} is already a broadcast subscription of {namespace}")
        if len(policies.broadcast_subscriptions) >= policy_codec.BROADCAST_SUBSCRIPTIONS_MAX:
            raise PreconditionFailed(f"namespace {namespace} has the most broadcast subscriptions allowed "
                                     f"({policy_codec.BROADCAST_SUBSCRIPTIONS_MAX})")
        policies.broadcast_subscriptions = sorted([*policies.broadcast_subscriptions, name])

    await resources.update_policies(namespace, add)
    log.info("broadcast subscription added: namespace=%s subscription=%s", namespace, name)
    return no_content()


@routes.delete(f"{NAMESPACE_PATH}/broadcastSubscriptions/{{subscription}}")
async def remove_broadcast(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    namespace = namespace_of(request)
    name = request.match_info["subscription"]

    def remove(policies: NamespacePolicies) -> None:
        if name not in policies.broadcast_subscriptions:
            raise NotFound(f"{name} is not a broadcast subscription of {namespace}")
        policies.broadcast_subscriptions = [s for s in policies.broadcast_subscriptions if s != name]

    await resources.update_policies(namespace, remove)
    log.info("broadcast subscription removed: namespace=%s subscription=%s", namespace, name)
    return no_content()
