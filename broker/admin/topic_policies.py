"""Admin REST for topic-level policies, on Pulsar's paths
(``/admin/v2/persistent/{tenant}/{namespace}/{topic}/<policy>``; broker/topic_policies.py
says how they are stored and resolved):

    GET    .../{topic}/retention[?applied=true]          RetentionPolicies (topic-level; applied: effective)
    POST   .../{topic}/retention                         body RetentionPolicies
    DELETE .../{topic}/retention
    GET    .../{topic}/messageTTL[?applied=true]         seconds
    POST   .../{topic}/messageTTL?messageTTL=N           (Pulsar's query parameter; a JSON body works too)
    DELETE .../{topic}/messageTTL
    GET    .../{topic}/backlogQuotaMap[?applied=true]    {type: BacklogQuota}
    POST   .../{topic}/backlogQuota[?backlogQuotaType=T] body BacklogQuota
    DELETE .../{topic}/backlogQuota[?backlogQuotaType=T]
    GET/POST/DELETE .../{topic}/maxProducers             body N (0: the namespace's or broker's)
    GET/POST/DELETE .../{topic}/maxConsumers             body N
    GET/POST/DELETE .../{topic}/deduplicationEnabled     body true|false
    GET/POST/DELETE .../{topic}/compactionThreshold      body bytes
    GET/POST|PUT/DELETE .../{topic}/schemaCompatibilityStrategy  body "BACKWARD", ...
    GET/POST/DELETE .../{topic}/persistence              body PersistencePolicies (the
                                                         topic's ledgers from its next load)

A GET answers the topic's own value (``null`` when it has none); with
``?applied=true`` the value in force: the topic's, else the namespace's, else the
broker's default. A partition's policies are its partitioned topic's. The topic must
exist (404 otherwise, as Pulsar). Any broker answers (the record is in etcd); the one
serving the topic applies a change at once when the change went through it, and as
soon as its topic policy watch sees it otherwise (broker/policy_watch.py; within its
policy cache time if the watch is down). Authorized like the topic's other admin paths (its
tenant's admins, superusers).
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from aiohttp import web

from broker.admin import policy_codec, topic_access
from broker.admin.common import flag, json_body, no_content, topic_of
from broker.schema_compatibility import DEFAULT_STRATEGY
from broker.admin.keys import SERVICE
from broker.service import BrokerService
from broker.topic_policies import limit
from common.errors import InvalidArgument, TopicNotFound
from common.topic_name import TopicName
from metadata.policies import NamespacePolicies, TopicPolicies

log = logging.getLogger(__name__)

# path -> (the TopicPolicies / NamespacePolicies field, the body's decoder)
_SIMPLE: dict[str, tuple[str, Callable[[object], object]]] = {
    "retention": ("retention_policies", policy_codec.retention_of),
    "messageTTL": ("message_ttl_in_seconds", policy_codec.message_ttl_of),
    "maxProducers": ("max_producers_per_topic", policy_codec.clients_per_topic_of),
    "maxConsumers": ("max_consumers_per_topic", policy_codec.clients_per_topic_of),
    "deduplicationEnabled": ("deduplicationEnabled", policy_codec.deduplication_of),
    "compactionThreshold": ("compaction_threshold", policy_codec.compaction_threshold_of),
    "schemaCompatibilityStrategy": ("schema_compatibility_strategy", policy_codec.schema_compatibility_strategy_of),
    "persistence": ("persistence", policy_codec.persistence_of),
}


def _applied(service: BrokerService, attribute: str, effective: NamespacePolicies) -> object:
    """The value in force: the effective policies' (topic over namespace), else the
    broker's default."""
    value = getattr(effective, attribute)
    config = service.config
    if attribute == "max_producers_per_topic":
        return limit(value, config.producers_per_topic_max)
    if attribute == "max_consumers_per_topic":
        return limit(value, config.consumers_per_topic_max)
    if value is not None:
        return value
    base = config.managed_ledger
    defaults = {"retention_policies": {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
                "message_ttl_in_seconds": 0, "deduplicationEnabled": False, "compaction_threshold": 0,
                "schema_compatibility_strategy": DEFAULT_STRATEGY,
                "persistence": {"bookkeeperEnsemble": base.ensemble_size, "bookkeeperWriteQuorum":
                                base.write_quorum_size, "bookkeeperAckQuorum": base.ack_quorum_size,
                                "managedLedgerMaxMarkDeleteRate": 0.0}}
    return defaults.get(attribute)

TOPIC_PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


async def existing_topic(request: web.Request) -> TopicName:
    service = request.app[SERVICE]
    name = topic_of(request)
    owner = name.partitioned_parent
    if await topic_access.partition_count(service, owner) > 0 or await topic_access.exists(service, name):
        return name
    raise TopicNotFound(f"topic {name} does not exist")


def simple(path: str, attribute: str, decode: Callable[[object], object]) -> None:
    async def get_policy(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        store = resources.topic_policies
        name = await existing_topic(request)
        if flag(request, "applied"):
            return web.json_response(_applied(service, attribute,
                                              await resources.effective_policies(name, fresh=True)))
        own = await store.get(name, fresh=True)
        return web.json_response(getattr(own, attribute) if own is not None else None)

    async def set_policy(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        store = resources.topic_policies
        name = await existing_topic(request)
        if path == "messageTTL" and "messageTTL" in request.query:
            try:
                body: object = int(request.query["messageTTL"])
            except ValueError:
                raise InvalidArgument("messageTTL must be an integer number of seconds") from None
        else:
            body = await json_body(request, required=True)
        value = decode(body)
        await store.update(name, lambda p: setattr(p, attribute, value))
        log.info("topic policy set: topic=%s policy=%s value=%s", name.partitioned_parent, path,
                 json.dumps(value))
        return no_content()

    async def remove_policy(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        store = resources.topic_policies
        name = await existing_topic(request)
        await store.update(name, lambda p: setattr(p, attribute, None))
        log.info("topic policy removed: topic=%s policy=%s", name.partitioned_parent, path)
        return no_content()

    route = f"/admin/v2/persistent/{{tenant}}/{{namespace}}/{{topic}}/{path}"
    routes.get(route)(get_policy)
    routes.post(route)(set_policy)
    if path == "schemaCompatibilityStrategy":
        routes.put(route)(set_policy)      # Pulsar's verb for this one
    routes.delete(route)(remove_policy)


for _path, (_attribute, _decode) in _SIMPLE.items():
    simple(_path, _attribute, _decode)


@routes.get(f"{TOPIC_PATH}/backlogQuotaMap")
async def get_backlog_quotas(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    store = resources.topic_policies
    name = await existing_topic(request)
    if flag(request, "applied"):
        return web.json_response((await resources.effective_policies(name, fresh=True)).backlog_quota_map)
    own = await store.get(name, fresh=True)
    return web.json_response(own.backlog_quota_map if own is not None else {})


@routes.post(f"{TOPIC_PATH}/backlogQuota")
async def set_backlog_quota(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    store = resources.topic_policies
    name = await existing_topic(request)
    quota_type = policy_codec.backlog_quota_type_of(request.query.get("backlogQuotaType"))
    quota = policy_codec.backlog_quota_of(await json_body(request, required=True))

    def change(policies: TopicPolicies) -> None:
        policies.backlog_quota_map = {**policies.backlog_quota_map, quota_type: quota}

    await store.update(name, change)
    log.info("topic backlog quota set: topic=%s type=%s quota=%s", name.partitioned_parent, quota_type,
             json.dumps(quota))
    return no_content()


@routes.delete(f"{TOPIC_PATH}/backlogQuota")
async def remove_backlog_quota(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    resources = service.resources
    store = resources.topic_policies
    name = await existing_topic(request)
    quota_type = policy_codec.backlog_quota_type_of(request.query.get("backlogQuotaType"))

    def change(policies: TopicPolicies) -> None:
        policies.backlog_quota_map = {k: v for k, v in policies.backlog_quota_map.items() if k != quota_type}

    await store.update(name, change)
    log.info("topic backlog quota removed: topic=%s type=%s", name.partitioned_parent, quota_type)
    return no_content()
