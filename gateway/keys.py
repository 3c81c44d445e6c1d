"""The typed keys of the gateway's aiohttp application (what handlers find in
``request.app``)."""

from __future__ import annotations

from aiohttp import web

from gateway.service import GatewayService

SERVICE = web.AppKey("service", GatewayService)
OPENAPI = web.AppKey("openapi", dict)
