"""The console's history of a topic (broker/stats_history.py), from the broker serving it:

    GET /admin/v2/persistent/{tenant}/{ns}/{topic}/statsHistory[?samples=false]

Answers the topic's samples (``timestamps`` in ms since the epoch, ``msgRateIn``,
``msgRateOut``, ``msgBacklog``, ``storageSize``) and each tracked subscription's
(``msgBacklog``, ``msgRateOut``, ``unackedMessages``, aligned with the last of the
topic's timestamps from ``firstSampleIndex`` on), with ``behindSince`` per subscription
and for the topic (its subscription behind the longest, ``behindSubscription``).
``samples=false`` leaves the series out (the console's topic list asks that).

Like the other topic paths: authorized as a tenant admin of the topic's tenant
(broker/admin/permissions.py), redirected (307) to the broker serving the topic, 404
for a topic that does not exist. A partition has a history of its own; a partitioned
topic's name is refused (ask a partition), as for ``lastMessageId``. The topic is not
loaded for this: one that exists but is not loaded here has no history
(``tracked: false``).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin import topic_access
from broker.admin.common import flag, topic_of
from broker.admin.keys import SERVICE
from common.errors import NotAllowed, TopicNotFound

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/statsHistory")
async def stats_history(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name) > 0:
        raise NotAllowed(f"{name} is a partitioned topic: ask one of its partitions for its history")
    await topic_access.redirect_unless_owner(service, name, request)
    if service.loaded_topic(name) is None and not await topic_access.exists(service, name):
        raise TopicNotFound(f"topic {name} does not exist")
    return web.json_response(service.stats_history.topic_history(str(name),
                                                                 samples=flag(request, "samples", default=True)))
