"""Admin REST for the namespaces' rate limits, as Pulsar's paths and bodies
(broker/rate_limits.py applies them to each topic of the namespace):

    GET/POST/DELETE /admin/v2/namespaces/{tenant}/{namespace}/publishRate
        PublishRate {"publishThrottlingRateInMsg": n, "publishThrottlingRateInByte": bytes}
        (-1 or 0: no limit); each topic of the namespace publishes at most that
    GET/POST/DELETE /admin/v2/namespaces/{tenant}/{namespace}/dispatchRate
        DispatchRate {"dispatchThrottlingRateInMsg", "dispatchThrottlingRateInByte",
        "ratePeriodInSecond", "relativeToPublishRate"}; each topic dispatches at most that
        over all its subscriptions (relativeToPublishRate true is refused)

The namespace's policies keep them per cluster, as Pulsar's do (``publishMaxMessageRate``
and ``topicDispatchRate``: {cluster: rate}); these paths read and write this broker's
cluster's entry. A GET answers null when none is set. Brokers apply a change at their
next policy check (``policy_check_interval_s``) or when the topic loads.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from aiohttp import web

from broker.admin.common import integer, json_body, namespace_of, no_content
from broker.service import BrokerService
from common.errors import InvalidArgument

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
    if relative:
        raise InvalidArgument("relativeToPublishRate is not supported: give absolute rates")
    return {"dispatchThrottlingRateInMsg": integer(doc.get("dispatchThrottlingRateInMsg", -1),
                                                   "dispatchThrottlingRateInMsg", minimum=-1, maximum=2**31 - 1),
            "dispatchThrottlingRateInByte": integer(doc.get("dispatchThrottlingRateInByte", -1),
                                                    "dispatchThrottlingRateInByte", minimum=-1, maximum=INT64_MAX),
            "ratePeriodInSecond": integer(doc.get("ratePeriodInSecond", 1), "ratePeriodInSecond",
                                          minimum=1, maximum=86_400),
            "relativeToPublishRate": False}



# path -> (NamespacePolicies attribute, decoder of the POST body)
_RATES: dict[str, tuple[str, Callable[[object], dict]]] = {
    "publishRate": ("publishMaxMessageRate", publish_rate_of),
    "dispatchRate": ("topicDispatchRate", dispatch_rate_of),
}


def add_routes(app: web.Application, service: BrokerService) -> None:
    resources = service.resources
    cluster = service.config.cluster

    def handlers(path: str, attribute: str, decode: Callable[[object], dict]) -> None:
        async def get_rate(request: web.Request) -> web.Response:
            policies = await resources.policies(namespace_of(request), fresh=True)
            return web.json_response((getattr(policies, attribute) or {}).get(cluster))

        async def set_rate(request: web.Request) -> web.Response:
            namespace = namespace_of(request)
            rate = decode(await json_body(request, required=True))
            await resources.update_policies(
                namespace, lambda p: setattr(p, attribute, {**(getattr(p, attribute) or {}), cluster: rate}))
            log.info("namespace rate set: namespace=%s policy=%s value=%s", namespace, path, json.dumps(rate))
            service.apply_rate_limits_soon()
            return no_content()

        async def remove_rate(request: web.Request) -> web.Response:
            namespace = namespace_of(request)

            def remove(policies) -> None:
                rates = dict(getattr(policies, attribute) or {})
                rates.pop(cluster, None)
                setattr(policies, attribute, rates or None)

            await resources.update_policies(namespace, remove)
            log.info("namespace rate removed: namespace=%s policy=%s", namespace, path)
            service.apply_rate_limits_soon()
            return no_content()

        route = f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{path}"
        app.router.add_get(route, get_rate)
        app.router.add_post(route, set_rate)
        app.router.add_delete(route, remove_rate)

    for path, (attribute, decode) in _RATES.items():
        handlers(path, attribute, decode)
