"""Admin REST for a topic's archive (docs/archive.md). ``{topic}`` is
``{tenant}/{namespace}/{local name}``:

    PUT  /admin/v2/persistent/{topic}/offload   archive every closed ledger up to a message
                                                id (body: {"ledgerId", "entryId"}; empty
                                                body: the last message); 204, the work runs
                                                in the background (Pulsar's triggerOffload)
    GET  /admin/v2/persistent/{topic}/offload   OffloadProcessStatus: {"status": NOT_RUN |
                                                RUNNING | SUCCESS | ERROR, "lastError",
                                                "firstUnoffloadedMessage", "ledgersArchived"}
    GET  /admin/v2/persistent/{topic}/archive   the archive manifest, for Spark and tools:
                                                {"topic", "partitions", "ledgers": [LedgerRecord
                                                JSON, with its files' URLs, entry ranges, row
                                                counts, sizes, CRC32C and publish time ranges]}

The first two go to the topic's owner (307 elsewhere). The manifest is read from the
metadata store, so any broker answers it; for a partitioned topic it lists every
partition's archived ledgers (``partitions`` is the partition count, 0 when not
partitioned).
"""

from __future__ import annotations

import logging

from aiohttp import web

from broker.admin import topic_access
from broker.admin.common import json_body, message_id_of, no_content, topic_of
from broker.admin.keys import SERVICE
from common.errors import TopicNotFound

log = logging.getLogger(__name__)

TOPIC_PATH = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"

# Module-level handlers, registered in this order; each finds the broker in
# ``request.app[SERVICE]``.
routes = web.RouteTableDef()


@routes.put(f"{TOPIC_PATH}/offload")
async def trigger(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    archiver = service.archiver
    name = topic_of(request)
    topic = await topic_access.load(service, name, request)
    body = await json_body(request, required=False)
    upto = topic.ledger.last_confirmed
    if body is not None:
        kind, position = message_id_of(body)
        if kind == "position":
            assert position is not None
            upto = position
        elif kind == "earliest":
            return no_content()
    archiver.request(name, upto)
    log.info("archive requested by admin: topic=%s upto=%s", name, upto)
    return no_content()


@routes.get(f"{TOPIC_PATH}/offload")
async def status(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    archiver = service.archiver
    name = topic_of(request)
    await topic_access.load(service, name, request)
    archive = archiver.topic_archive(name)
    if archive is None:
        raise TopicNotFound(f"topic {name} is not loaded here")
    return web.json_response(archive.status.to_json(name.partition_index))


@routes.get(f"{TOPIC_PATH}/archive")
async def manifest(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    archiver = service.archiver
    name = topic_of(request)
    count = await topic_access.partition_count(service, name)
    names = [name.partition(i) for i in range(count)] if count > 0 else [name]
    if count == 0 and not await topic_access.exists(service, name):
        raise TopicNotFound(f"topic {name} does not exist")
    ledgers = []
    for topic in names:
        records = await archiver.manifest.ledgers(topic.key_path)
        ledgers.extend(record.to_json() for record in records.values())
    return web.json_response({"topic": str(name), "partitions": count, "ledgers": ledgers})
