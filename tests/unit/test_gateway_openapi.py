"""The gateway's OpenAPI document (gateway/openapi.py, gateway/openapi.json).

What it proves: the document built from the app's routes documents every route and
nothing else; the checked-in gateway/openapi.json is exactly that document (regenerate
with ``magnetar gateway --print-openapi``); the app serves it at /v1/openapi.json; it is
OpenAPI 3.1 with every $ref resolving; a route without an operation fails the build.
How: the real app factory, served by aiohttp's test server (no broker is needed to
serve the document).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway import openapi
from gateway.app import default_config, init_app

CHECKED_IN = Path(__file__).resolve().parents[2] / "gateway" / "openapi.json"


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    return {(route.method, route.resource.canonical) for route in app.router.routes()
            if route.method not in ("HEAD", "OPTIONS")}


def test_document_covers_exactly_the_routes():
    config = default_config()
    app = init_app(config)
    document = openapi.build(app, config)
    documented = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert documented == routes_of(app)


def test_checked_in_document_is_the_built_one():
    config = default_config()
    assert json.loads(CHECKED_IN.read_text()) == openapi.build(init_app(config), config), \
        "gateway/openapi.json is stale: magnetar gateway --print-openapi > gateway/openapi.json"


async def test_served_document_is_the_checked_in_one():
    async with TestClient(TestServer(init_app(default_config()))) as client:
        response = await client.get("/v1/openapi.json")
        assert response.status == 200
        assert await response.json() == json.loads(CHECKED_IN.read_text())
        missing = await client.get("/v1/nothing-here")
        assert missing.status == 404
        assert set(await missing.json()) == {"code", "error", "message", "retriable"}


def test_document_is_openapi_31_and_every_ref_resolves():
    document = json.loads(CHECKED_IN.read_text())
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]

    def refs(node):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    for ref in refs(document):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status in ("400", "413", "429", "default"):
                assert status in operation["responses"], (method, path, status)
            parameters = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
            assert parameters == set(__import__("re").findall(r"{(\w+)}", path)), (method, path)


def test_a_route_without_an_operation_fails_the_build():
    config = default_config()
    app = init_app(config)

    async def undocumented(_request):
        return web.Response()

    app.router.add_get("/v1/secret", undocumented)
    with pytest.raises(AssertionError, match="has no OpenAPI operation"):
        openapi.build(app, config)


def test_the_documents_whitespace_is_pythons():
    """The document spells whitespace out (ECMAScript's \\s and Python's differ); it must
    be exactly what common/topic_name.py refuses."""
    import re

    from gateway.json_codec import WHITESPACE_CLASS
    spelled = re.compile(f"[{WHITESPACE_CLASS}]")
    python = re.compile(r"\s")
    assert all(bool(spelled.match(chr(c))) == bool(python.match(chr(c))) for c in range(0x110000))


def test_every_subscription_name_the_document_allows_has_a_dead_letter_topic():
    """Pulsar's default {topic}-{subscription}-DLQ when it is a topic name; otherwise
    (whitespace in the subscription name, or past 1,024 bytes) a digest of the
    subscription name in its place, still a valid topic name (schemathesis found it)."""
    from common.topic_name import NAME_BYTES_MAX, TopicName
    from gateway.service import dead_letter_topic

    assert dead_letter_topic("persistent://public/default/t", "s", None) == "persistent://public/default/t-s-DLQ"
    for topic, subscription in [("persistent://public/default/t", "a\x85b"),
                                ("persistent://" + "t" * 128 + "/" + "n" * 128 + "/" + "\U00046b57" * 188,
                                 "\u00e9" * 256)]:
        name = dead_letter_topic(topic, subscription, None)
        assert TopicName.parse(name) and len(name.encode()) <= NAME_BYTES_MAX and name.endswith("-DLQ"), name
        assert dead_letter_topic(topic, subscription, None) == name   # the same every time
