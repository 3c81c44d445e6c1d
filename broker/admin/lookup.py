"""Pulsar's HTTP lookup, used by clients given an ``http://`` service URL:

    GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}
        {"brokerUrl", "brokerUrlTls", "httpUrl", "httpUrlTls", "nativeUrl"} of the owner

(Clients ask ``GET /admin/v2/persistent/.../{topic}/partitions`` first; topics.py
answers that.)
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.common import topic_of
from broker.service import BrokerService


def add_routes(app: web.Application, service: BrokerService) -> None:
    async def lookup(request: web.Request) -> web.Response:
        owner = await service.lookup(topic_of(request))
        return web.json_response({"brokerUrl": owner.service_url, "httpUrl": owner.web_service_url,
                                  "nativeUrl": owner.service_url, "brokerUrlTls": owner.service_url_tls,
                                  "httpUrlTls": owner.web_service_url_tls})

    app.router.add_get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}", lookup)
