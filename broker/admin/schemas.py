"""Admin REST for schemas, as Pulsar's ``/admin/v2/schemas`` paths (``{topic}`` below is
``{tenant}/{namespace}/{topic}``; a partitioned topic's partitions share its schema):

    GET    /admin/v2/schemas/{topic}/schema              the latest version (404: none)
    GET    /admin/v2/schemas/{topic}/schema/{version}    one version
    GET    /admin/v2/schemas/{topic}/schemas             {"getSchemaResponses": [every version]}
    POST   /admin/v2/schemas/{topic}/schema              register {"type", "schema", "properties"};
                                                         answers {"version": n}; 409 if incompatible
    POST   /admin/v2/schemas/{topic}/compatibility       {"isCompatible", "schemaCompatibilityStrategy"}
    DELETE /admin/v2/schemas/{topic}/schema              every version

A version is answered as {"version", "type", "timestamp", "data", "properties"}.
"""

from __future__ import annotations

import logging

from aiohttp import web

from broker import schema_compatibility
from broker.admin.common import json_body, no_content, topic_of
from broker.schemas import TYPE_CODES
from broker.admin.keys import SERVICE
from common.errors import InvalidArgument, NotFound

log = logging.getLogger(__name__)


def _schema_body(doc: object) -> tuple[str, bytes, dict[str, str]]:
    if not isinstance(doc, dict):
        raise InvalidArgument("the body must be an object: {type, schema, properties}")
    schema_type = doc.get("type")
    if not isinstance(schema_type, str) or schema_type.upper() not in TYPE_CODES:
        raise InvalidArgument(f"type must be one of {', '.join(sorted(TYPE_CODES))}")
    data = doc.get("schema", "")
    if not isinstance(data, str):
        raise InvalidArgument("schema must be a string")
    properties = doc.get("properties") or {}
    if not isinstance(properties, dict):
        raise InvalidArgument("properties must be an object")
    return schema_type.upper(), data.encode(), {str(k): str(v) for k, v in properties.items()}

BASE = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.get(f"{BASE}/schema")
async def get_latest(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    registry = service.schemas
    name = topic_of(request)
    found = await registry.get(name)
    if found is None:
        raise NotFound(f"no schema for {name}")
    return web.json_response(found.admin_json())


@routes.get(f"{BASE}/schema/{{version}}")
async def get_version(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    registry = service.schemas
    name = topic_of(request)
    text = request.match_info["version"]
    if not text.isdigit():
        raise InvalidArgument(f"version must be a number, not {text!r}")
    version = int(text)
    found = await registry.get(name, version)
    if found is None:
        raise NotFound(f"no schema version {version} for {name}")
    return web.json_response(found.admin_json())


@routes.get(f"{BASE}/schemas")
async def get_all(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    registry = service.schemas
    versions = await registry.versions(topic_of(request))
    return web.json_response({"getSchemaResponses": [v.admin_json() for v in versions]})


@routes.post(f"{BASE}/schema")
async def post_schema(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    registry = service.schemas
    name = topic_of(request)
    schema_type, data, properties = _schema_body(await json_body(request, required=True))
    strategy = await service.schema_strategy(name)
    version = await registry.put(name, schema_type, data, properties, strategy)
    log.info("schema registered by admin: topic=%s version=%d type=%s", name, version, schema_type)
    return web.json_response({"version": version})


@routes.post(f"{BASE}/compatibility")
async def check_compatibility(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    registry = service.schemas
    name = topic_of(request)
    schema_type, data, _ = _schema_body(await json_body(request, required=True))
    strategy = await service.schema_strategy(name)
    versions = await registry.versions(name)
    ok = any(v.type == schema_type and v.data == data for v in versions) or schema_compatibility.compatible(
        strategy, (schema_type, data), [(v.type, v.data) for v in versions])
    return web.json_response({"isCompatible": ok, "schemaCompatibilityStrategy": strategy})


@routes.delete(f"{BASE}/schema")
async def delete_schema(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    registry = service.schemas
    name = topic_of(request)
    if not await registry.delete(name):
        raise NotFound(f"no schema for {name}")
    log.info("schema deleted by admin: topic=%s", name)
    return no_content()
