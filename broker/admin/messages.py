"""Admin REST for looking at stored messages without consuming them, as Pulsar's paths
(``{topic}`` is ``/admin/v2/persistent/{tenant}/{namespace}/{topic}``, a topic or one
partition; a partitioned topic's name is refused: ask a partition):

    GET {topic}/subscription/{sub}/position/{n}      the n-th (from 1) unacknowledged entry
                                                     of the subscription ("peek"; the cursor
                                                     does not move)
    GET {topic}/ledger/{ledgerId}/entry/{entryId}    the entry at that position
    GET {topic}/examinemessage?initialPosition=earliest|latest&messagePosition=n
                                                     the n-th entry from the oldest stored
                                                     one, or back from the newest (default)

The answer is the entry's payload, uncompressed, as ``application/octet-stream``, with
its metadata in Pulsar's ``X-Pulsar-*`` headers (protocol/admin_entry.py has the
format; ``magnetar admin topics peek-messages`` and the gateway's peek read it back).
No such entry: 404.
"""

from __future__ import annotations

import logging

from aiohttp import web

from broker.admin import topic_access
from broker.admin.common import path_integer, query_integer, topic_of
from broker.admin.subscriptions import nth_unacknowledged
from broker.admin.policy_codec import subscription_name_of
from broker.admin.keys import SERVICE
from broker.topic import PersistentTopic
from client.compression import CODECS, decompress
from common.errors import BrokerError, InvalidArgument, MalformedFrame, NotAllowed, NotFound
from common.position import Position
from protocol.admin_entry import entry_headers
from protocol.codec import decode_stored

log = logging.getLogger(__name__)

# The furthest a peek looks into a backlog (a walk of entries, subscriptions.nth_unacknowledged).
PEEK_POSITION_MAX = 1_000_000
# One entry is read, at most this large.
_ENTRY_BYTES_MAX = 64 * 1024 * 1024
_ID_MAX = 2**63 - 1


def entry_response(position: Position, stored: bytes | memoryview) -> web.Response:
    """The HTTP answer for one stored entry: its payload uncompressed, its metadata in
    Pulsar's headers."""
    try:
        section = decode_stored(stored)
        metadata = section.metadata
        payload = bytes(section.payload)
        if metadata.compression:
            if metadata.compression not in CODECS:
                raise MalformedFrame(f"unknown compression {metadata.compression}")
            payload = decompress(metadata.compression, payload, metadata.uncompressed_size)
    except MalformedFrame as error:
        # A stored entry that does not parse (or whose checksum does not match) is the
        # store's problem, not the caller's: a broker error that names it.
        raise BrokerError(f"entry {position} does not decode: {error.message}") from None
    headers = entry_headers(position.ledger_id, position.entry_id, metadata, len(payload))
    return web.Response(body=payload, headers=headers, content_type="application/octet-stream")


async def _entry(topic: PersistentTopic, position: Position) -> web.Response:
    entries = await topic.ledger.read(position, 1, _ENTRY_BYTES_MAX)
    if not entries or entries[0].position != position:
        raise NotFound(f"no entry at {position} of {topic.full_name}")
    return entry_response(position, entries[0].data)

TOPIC_PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


async def loaded(request: web.Request) -> PersistentTopic:
    service = request.app[SERVICE]
    name = topic_of(request)
    if await topic_access.partition_count(service, name) > 0:
        raise NotAllowed(f"{name} is a partitioned topic: look at the messages of one of its partitions")
    return await topic_access.load(service, name, request)


@routes.get(f"{TOPIC_PATH}/examinemessage")
async def examine(request: web.Request) -> web.Response:
    """The n-th message from the topic's oldest stored entry (``initialPosition=
    earliest``) or back from its newest (``latest``, the default; 1 is the last)."""
    initial = request.query.get("initialPosition", "latest")
    if initial not in ("earliest", "latest"):
        raise InvalidArgument(f"initialPosition must be earliest or latest, not {initial!r}")
    n = query_integer(request, "messagePosition", default=1, minimum=1, maximum=PEEK_POSITION_MAX)
    topic = await loaded(request)
    ledger = topic.ledger
    first = ledger.first_position
    before_first = Position(first.ledger_id, first.entry_id - 1)
    stored = topic.entries_between(before_first, ledger.last_confirmed) if ledger.last_confirmed >= first else 0
    if n > stored:
        raise NotFound(f"{topic.full_name} holds {stored} entries, fewer than {n}")
    position = topic.position_after(before_first, n if initial == "earliest" else stored - n + 1)
    return await _entry(topic, position)


@routes.get(f"{TOPIC_PATH}/subscription/{{subscription}}/position/{{position}}")
async def peek(request: web.Request) -> web.Response:
    n = path_integer(request, "position", minimum=1, maximum=PEEK_POSITION_MAX)
    subscription_name = subscription_name_of(request.match_info["subscription"])
    topic = await loaded(request)
    subscription = topic_access.subscription_of(topic, subscription_name)
    position = await nth_unacknowledged(topic, subscription, n)
    if position is None:
        raise NotFound(f"subscription {subscription_name} of {topic.full_name} has fewer than {n} "
                       "unacknowledged entries")
    return await _entry(topic, position)


@routes.get(f"{TOPIC_PATH}/ledger/{{ledger}}/entry/{{entry}}")
async def by_id(request: web.Request) -> web.Response:
    ledger_id = path_integer(request, "ledger", minimum=0, maximum=_ID_MAX)
    entry_id = path_integer(request, "entry", minimum=0, maximum=_ID_MAX)
    topic = await loaded(request)
    position = Position(ledger_id, entry_id)
    if position > topic.ledger.last_confirmed or position < topic.ledger.first_position:
        raise NotFound(f"no entry at {position} of {topic.full_name}")
    return await _entry(topic, position)
