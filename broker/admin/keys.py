"""The typed keys of the broker's admin aiohttp application: what the module-level
handlers of a route table (``web.RouteTableDef``) find in ``request.app``."""

from __future__ import annotations

from aiohttp import web

from broker import stats
from broker.service import BrokerService

SERVICE = web.AppKey("service", BrokerService)
# The topic stats' rate meter (rates between two reads of a topic's stats).
TOPIC_RATES = web.AppKey("topic_rates", stats.RateMeter)


def set_up(app: web.Application, service: BrokerService) -> None:
    app[SERVICE] = service
    app[TOPIC_RATES] = stats.RateMeter()
