"""What every handler does the same way: read the JSON body (bounded by the app's
``client_max_size``), name the topic and subscription from the path, and answer JSON."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from common.errors import InvalidArgument
from common.topic_name import TopicName

# A subscription name is one path segment: no '/', no control characters, and not the
# broadcast member separator '::' (the broker names member cursors with it).
_SUBSCRIPTION_BAD = re.compile(r"[\x00-\x1f\x7f/]|::")
SUBSCRIPTION_CHARS_MAX = 256


async def json_body(request: web.Request, *, required: bool = True) -> Any:
    """The request body parsed as JSON; InvalidArgument if it is not JSON. An empty body
    is None when not ``required``."""
    data = await request.read()
    if not data.strip():
        if required:
            raise InvalidArgument("the request needs a JSON body")
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise InvalidArgument("the request body is not valid JSON") from None


def topic_of(request: web.Request) -> str:
    info = request.match_info
    try:
        name = TopicName.from_parts(info["tenant"], info["namespace"], info["topic"])
    except InvalidArgument as error:
        raise InvalidArgument(f"topic: {error.message}") from None
    if name.is_partition:
        raise InvalidArgument("name the topic, not one of its partitions (the gateway spreads over them)")
    return str(name)


def subscription_of(request: web.Request) -> str:
    name = request.match_info["subscription"]
    if not name or len(name) > SUBSCRIPTION_CHARS_MAX or _SUBSCRIPTION_BAD.search(name):
        raise InvalidArgument(f"bad subscription name {name[:64]!r}: 1-{SUBSCRIPTION_CHARS_MAX} characters, "
                              "no '/', '::' or control characters")
    return name


def ok(document: Any, status: int = 200) -> web.Response:
    return web.json_response(document, status=status, dumps=_dumps)


def _dumps(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)
