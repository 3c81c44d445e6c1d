"""What every admin handler needs to read a request and write an answer: names from the
path, flags from the query string, JSON bodies, message ids, and the empty 204 that
Pulsar's admin API answers to a successful change.

Bad input raises InvalidArgument (400) here, so handlers only see valid values.
Request bodies are bounded by ``BrokerConfig.http_body_bytes_max`` (1 MiB by default; 413 past it).
"""

from __future__ import annotations

import json

from aiohttp import web

from common.position import Position
from common.topic_name import NamespaceName, TopicName
from common.errors import InvalidArgument

# The clients' MessageId.earliest is (-1, -1) and MessageId.latest (INT64_MAX, INT64_MAX).
EARLIEST_LEDGER_ID = -1
LATEST_LEDGER_ID = 2**63 - 1


def no_content() -> web.Response:
    return web.Response(status=204)


def redirect_base(request: web.Request, web_service_url: str, web_service_url_tls: str) -> str:
    """Where a redirect to another broker points: its HTTPS URL for a request that came
    over HTTPS (the caller follows with its credentials, which must not go on in the
    clear), else the URL it advertises."""
    return web_service_url_tls if request.secure and web_service_url_tls else web_service_url


def namespace_of(request: web.Request) -> NamespaceName:
    return NamespaceName.parse(f"{request.match_info['tenant']}/{request.match_info['namespace']}")


def topic_of(request: web.Request) -> TopicName:
    """The topic named by the path (aiohttp has already percent-decoded the parts)."""
    return TopicName.from_parts(request.match_info["tenant"], request.match_info["namespace"],
                                request.match_info["topic"])


def flag(request: web.Request, name: str, *, default: bool = False) -> bool:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise InvalidArgument(f"query parameter {name} must be true or false, not {value!r}")
    return lowered == "true"


async def json_body(request: web.Request, *, required: bool) -> object:
    """The request body decoded as JSON; None when it is empty and not required."""
    text = await request.text()
    if not text.strip():
        if required:
            raise InvalidArgument("a JSON request body is required")
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument(f"request body is not JSON: {error}") from None


def integer(value: object, what: str, *, minimum: int, maximum: int) -> int:
    # bool is an int in Python; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer, not {json.dumps(value)}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be in [{minimum}, {maximum}], not {value}")
    return value


def path_integer(request: web.Request, name: str, *, minimum: int, maximum: int) -> int:
    text = request.match_info[name]
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, not {text!r}") from None
    return integer(value, name, minimum=minimum, maximum=maximum)


def query_integer(request: web.Request, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """An integer query parameter (``default`` when absent)."""
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, not {text!r}") from None
    return integer(value, name, minimum=minimum, maximum=maximum)


def message_id_of(doc: object) -> tuple[str, Position | None]:
    """A message id body ``{"ledgerId": L, "entryId": E, ...}`` as ("earliest", None),
    ("latest", None) or ("position", Position)."""
    if not isinstance(doc, dict):
        raise InvalidArgument("a message id must be a JSON object with ledgerId and entryId")
    ledger_id = integer(doc.get("ledgerId"), "ledgerId", minimum=-1, maximum=LATEST_LEDGER_ID)
    entry_id = integer(doc.get("entryId"), "entryId", minimum=-1, maximum=LATEST_LEDGER_ID)
    if ledger_id == EARLIEST_LEDGER_ID:
        return "earliest", None
    if ledger_id == LATEST_LEDGER_ID:
        return "latest", None
    if entry_id < 0:
        raise InvalidArgument("entryId must not be negative")
    return "position", Position(ledger_id, entry_id)
