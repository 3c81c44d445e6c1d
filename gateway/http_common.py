"""What every handler does the same way: read the JSON body (bounded by the app's
``client_max_size``), name the topic and subscription from the path, and answer JSON."""

from __future__ import annotations

import re
from typing import Any

import orjson
from aiohttp import web

from common.errors import InvalidArgument
from common.topic_name import TopicName

# A subscription name is one path segment: no '/', no control characters, and not the
# broadcast member separator '::' (the broker names member cursors with it).
_SUBSCRIPTION_BAD = re.compile(r"[\x00-\x1f\x7f/]|::")
SUBSCRIPTION_CHARS_MAX = 256
# The document's bounds on a topic path (gateway/openapi.py): ASCII tenant and namespace
# names of at most 128 characters and a local name of at most 188, so that the whole
# name is always within common/topic_name.py's 1,024 bytes.
_TENANT = re.compile(r"[-=:.A-Za-z0-9_]{1,128}")
TOPIC_CHARS_MAX = 188
_DOT_SEGMENTS = (".", "..")
# A local name ending as a partition's does: the gateway serves topics, not partitions,
# whatever comes before the suffix (the document's "not" on the topic; TopicName does
# not call "-partition-0", with nothing before it, a partition).
PARTITION_SUFFIX = re.compile(r"-partition-(0|[1-9][0-9]*)$")


async def json_body(request: web.Request, *, required: bool = True) -> Any:
    """The request body parsed as JSON; InvalidArgument if it is not JSON. An empty body
    is None when not ``required``."""
    data = await request.read()
    # isspace, not strip: strip copies the whole body (140 KB for a batch of 100).
    if not data or data.isspace():
        if required:
            raise InvalidArgument("the request needs a JSON body")
        return None
    try:
        return loads(data)
    except (ValueError, RecursionError):
        raise InvalidArgument("the request body is not valid JSON") from None


# The gateway's JSON path: orjson, several times faster than the standard library's json
# both ways (docs/gateway.md, Speed). It is strict where json is lenient (NaN, integers
# beyond 64 bits, lone surrogates, nesting past 1,024): such a body is not valid JSON.
loads = orjson.loads


def dumps(document: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return orjson.dumps(document)


def topic_of(request: web.Request) -> str:
    info = request.match_info
    for part in ("tenant", "namespace"):
        if not _TENANT.fullmatch(info[part]) or info[part] in _DOT_SEGMENTS:
            raise InvalidArgument(f"bad {part} name {info[part][:64]!r}: 1-128 of the characters A-Z a-z 0-9 "
                                  "- = : . _ (not '.' or '..')")
    if len(info["topic"]) > TOPIC_CHARS_MAX or info["topic"] in _DOT_SEGMENTS:
        raise InvalidArgument(f"topic: a topic's local name is 1-{TOPIC_CHARS_MAX} characters, not '.' or '..'")
    try:
        name = TopicName.from_parts(info["tenant"], info["namespace"], info["topic"])
    except InvalidArgument as error:
        raise InvalidArgument(f"topic: {error.message}") from None
    if name.is_partition or PARTITION_SUFFIX.search(info["topic"]):
        raise InvalidArgument("name the topic, not one of its partitions (the gateway spreads over them)")
    return str(name)


def subscription_of(request: web.Request) -> str:
    name = request.match_info["subscription"]
    if (not name or len(name) > SUBSCRIPTION_CHARS_MAX or _SUBSCRIPTION_BAD.search(name)
            or name in _DOT_SEGMENTS):
        raise InvalidArgument(f"bad subscription name {name[:64]!r}: 1-{SUBSCRIPTION_CHARS_MAX} characters, "
                              "no '/', '::' or control characters")
    return name


def ok(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(document), status=status, content_type="application/json")
