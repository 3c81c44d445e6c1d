"""Pulsar's HTTP lookup, used by clients given an ``http://`` service URL:

    GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}[?listenerName=NAME]
        {"brokerUrl", "brokerUrlTls", "httpUrl", "httpUrlTls", "nativeUrl"} of the owner;
        with a listener name (the query parameter, or the X-Pulsar-ListenerName header
        as Pulsar takes it) brokerUrl is the owner's advertised listener of that name,
        and a name the owner does not advertise is refused

(Clients ask ``GET /admin/v2/persistent/.../{topic}/partitions`` first; topics.py
answers that.)
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.common import topic_of
from broker.admin.keys import SERVICE

LISTENER_NAME_HEADER = "X-Pulsar-ListenerName"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}")
async def lookup(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    listener_name = request.query.get("listenerName") or request.headers.get(LISTENER_NAME_HEADER, "")
    owner = await service.lookup(topic_of(request), listener_name)
    return web.json_response({"brokerUrl": owner.service_url, "httpUrl": owner.web_service_url,
                              "nativeUrl": owner.service_url, "brokerUrlTls": owner.service_url_tls,
                              "httpUrlTls": owner.web_service_url_tls})
