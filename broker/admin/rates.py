"""Admin REST for rate limits, namespace- and topic-level, as Pulsar's paths and bodies
(broker/rate_limits.py applies them to each topic):

    GET/POST/DELETE /admin/v2/namespaces/{tenant}/{namespace}/publishRate
    GET/POST/DELETE /admin/v2/persistent/{tenant}/{namespace}/{topic}/publishRate[?applied=true]
        PublishRate {"publishThrottlingRateInMsg": n, "publishThrottlingRateInByte": bytes}
        (-1 or 0: no limit); each topic publishes at most that
    GET/POST/DELETE .../dispatchRate (namespace and topic paths as above)
        DispatchRate {"dispatchThrottlingRateInMsg", "dispatchThrottlingRateInByte",
        "ratePeriodInSecond", "relativeToPublishRate"}; each topic dispatches at most that
        over all its subscriptions (with relativeToPublishRate: that plus what the topic
        was published at over the last second, as Pulsar's)
    GET/POST/DELETE .../subscriptionDispatchRate (namespace and topic paths as above)
        DispatchRate; each subscription of a topic dispatches at most that on its own
        (and all of them together still at most the topic's dispatchRate)

A topic's rate overrides its namespace's; removing it lets the namespace's apply again
(broker/topic_policies.py lays the topic's over the namespace's). Both keep rates per
cluster, as Pulsar's namespace policies do (``publishMaxMessageRate``,
``topicDispatchRate``, ``subscriptionDispatchRate``: {cluster: rate}); these paths read
and write this broker's cluster's entry. A GET answers null when none is set; a topic
GET with ``?applied=true`` answers the rate in force (the topic's, else the
namespace's). A topic path answers 404 for a missing topic; a partitioned topic's rate
holds for each partition. The broker that took the change applies it at once (its
policy pass is woken); so do the others when their policy watches see it in etcd
(broker/policy_watch.py wakes their passes); were a watch down, at the next policy
check (``policy_check_interval_s``) after the cached copy expired (``cache_ttl_s``).
A topic applies the current rates when it loads too.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from aiohttp import web

from broker.admin import topic_access
from broker.admin.common import flag, integer, json_body, namespace_of, no_content, topic_of
from broker.admin.keys import SERVICE
from common.errors import InvalidArgument, TopicNotFound
from common.topic_name import TopicName

log = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1


def publish_rate_of(doc: object) -> dict:
    """Pulsar's PublishRate body, checked: {"publishThrottlingRateInMsg": n,
    "publishThrottlingRateInByte": bytes} (-1 or 0: no limit)."""
    if not isinstance(doc, dict):
        raise InvalidArgument("publish rate must be a JSON object")
    return {"publishThrottlingRateInMsg": integer(doc.get("publishThrottlingRateInMsg", -1),
                                                  "publishThrottlingRateInMsg", minimum=-1, maximum=2**31 - 1),
            "publishThrottlingRateInByte": integer(doc.get("publishThrottlingRateInByte", -1),
                                                   "publishThrottlingRateInByte", minimum=-1, maximum=INT64_MAX)}


def dispatch_rate_of(doc: object) -> dict:
    """Pulsar's DispatchRate body, checked: {"dispatchThrottlingRateInMsg",
    "dispatchThrottlingRateInByte", "ratePeriodInSecond", "relativeToPublishRate"}."""
    if not isinstance(doc, dict):
        raise InvalidArgument("dispatch rate must be a JSON object")
    relative = doc.get("relativeToPublishRate", False)
    if not isinstance(relative, bool):
        raise InvalidArgument("relativeToPublishRate must be true or false")
    return {"dispatchThrottlingRateInMsg": integer(doc.get("dispatchThrottlingRateInMsg", -1),
                                                   "dispatchThrottlingRateInMsg", minimum=-1, maximum=2**31 - 1),
            "dispatchThrottlingRateInByte": integer(doc.get("dispatchThrottlingRateInByte", -1),
                                                    "dispatchThrottlingRateInByte", minimum=-1, maximum=INT64_MAX),
            "ratePeriodInSecond": integer(doc.get("ratePeriodInSecond", 1), "ratePeriodInSecond",
                                          minimum=1, maximum=86_400),
            "relativeToPublishRate": relative}



# path -> (NamespacePolicies / TopicPolicies attribute, decoder of the POST body)
_RATES: dict[str, tuple[str, Callable[[object], dict]]] = {
    "publishRate": ("publishMaxMessageRate", publish_rate_of),
    "dispatchRate": ("topicDispatchRate", dispatch_rate_of),
    "subscriptionDispatchRate": ("subscriptionDispatchRate", dispatch_rate_of),
}


def _with_rate(rates: dict | None, cluster: str, rate: dict | None) -> dict | None:
    """``rates`` (by cluster) with this cluster's entry set (None: removed); None when
    no cluster is left."""
    changed = {k: v for k, v in (rates or {}).items() if k != cluster}
    if rate is not None:
        changed[cluster] = rate
    return changed or None

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


async def existing_topic(request: web.Request) -> TopicName:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name.partitioned_parent) > 0 \
            or await topic_access.exists(service, name):
        return name
    raise TopicNotFound(f"topic {name} does not exist")


def namespace_handlers(path: str, attribute: str, decode: Callable[[object], dict]) -> None:
    async def get_rate(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        cluster = service.config.cluster
        policies = await resources.policies(namespace_of(request), fresh=True)
        return web.json_response((getattr(policies, attribute) or {}).get(cluster))

    async def set_rate(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        cluster = service.config.cluster
        namespace = namespace_of(request)
        rate = decode(await json_body(request, required=True))
        await resources.update_policies(
            namespace, lambda p: setattr(p, attribute, _with_rate(getattr(p, attribute), cluster, rate)))
        log.info("namespace rate set: namespace=%s policy=%s value=%s", namespace, path, json.dumps(rate))
        service.apply_rate_limits_soon()
        return no_content()

    async def remove_rate(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        cluster = service.config.cluster
        namespace = namespace_of(request)
        await resources.update_policies(
            namespace, lambda p: setattr(p, attribute, _with_rate(getattr(p, attribute), cluster, None)))
        log.info("namespace rate removed: namespace=%s policy=%s", namespace, path)
        service.apply_rate_limits_soon()
        return no_content()

    route = f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{path}"
    routes.get(route)(get_rate)
    routes.post(route)(set_rate)
    routes.delete(route)(remove_rate)


def topic_handlers(path: str, attribute: str, decode: Callable[[object], dict]) -> None:
    async def get_rate(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        topic_store = resources.topic_policies
        cluster = service.config.cluster
        name = await existing_topic(request)
        if flag(request, "applied"):
            policies = await resources.effective_policies(name, fresh=True)
        else:
            policies = await topic_store.get(name, fresh=True)
        return web.json_response((getattr(policies, attribute) or {}).get(cluster) if policies else None)

    async def set_rate(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        topic_store = resources.topic_policies
        cluster = service.config.cluster
        name = await existing_topic(request)
        rate = decode(await json_body(request, required=True))
        await topic_store.update(
            name, lambda p: setattr(p, attribute, _with_rate(getattr(p, attribute), cluster, rate)))
        log.info("topic rate set: topic=%s policy=%s value=%s", name.partitioned_parent, path, json.dumps(rate))
        service.apply_rate_limits_soon()
        return no_content()

    async def remove_rate(request: web.Request) -> web.Response:
        service = request.app[SERVICE]
        resources = service.resources
        topic_store = resources.topic_policies
        cluster = service.config.cluster
        name = await existing_topic(request)
        await topic_store.update(
            name, lambda p: setattr(p, attribute, _with_rate(getattr(p, attribute), cluster, None)))
        log.info("topic rate removed: topic=%s policy=%s", name.partitioned_parent, path)
        service.apply_rate_limits_soon()
        return no_content()

    route = f"/admin/v2/persistent/{{tenant}}/{{namespace}}/{{topic}}/{path}"
    routes.get(route)(get_rate)
    routes.post(route)(set_rate)
    routes.delete(route)(remove_rate)


for _path, (_attribute, _decode) in _RATES.items():
    namespace_handlers(_path, _attribute, _decode)
    topic_handlers(_path, _attribute, _decode)
