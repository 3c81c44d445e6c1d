"""Route table of the broker's HTTP API."""

from __future__ import annotations

from aiohttp import web

from broker.service import BrokerService
from broker.topic_name import TopicName


def add_routes(app: web.Application, service: BrokerService) -> None:
    async def lookup(request: web.Request) -> web.Response:
        name = TopicName.from_parts(request.match_info["tenant"], request.match_info["namespace"],
                                    request.match_info["topic"])
        owner = await service.lookup(name)
        return web.json_response({"brokerUrl": owner.service_url, "httpUrl": owner.web_service_url,
                                  "nativeUrl": owner.service_url, "brokerUrlTls": "", "httpUrlTls": ""})

    async def brokers_health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}", lookup)
    app.router.add_get("/admin/v2/brokers/health", brokers_health)
