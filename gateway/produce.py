"""Producing over HTTP: one message, a batch, or a stream of NDJSON lines.

Every answer comes after the broker's receipt, that is once the entry is durable on the
bookies (DESIGN.md: "A publish is acknowledged only when Qa bookies have it fsynced").
A batch request is stored as one batch entry per partition it touches, so its messages
share an entry and their ids differ by batch index; its answer lists a result per
message, in request order. A stream stores what has arrived so far as one entry at a
time (up to ``batch_messages_max`` lines) and writes one result line per message, in
order, as soon as its entry is stored; a bad line gets an error line and the stream goes
on. At-least-once: a produce that times out (504) or whose connection broke may have
been stored; sending it again may store it twice — unless it names a producer and
numbers its messages (``producer``, ``sequence_id``: gateway/idempotent.py), which makes
sending it again safe: what was stored is answered ``duplicate``, not stored again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from aiohttp import web

from client.messages import MessageId, OutgoingMessage
from common.errors import LimitExceeded, MagnetarError, OperationTimeout
from gateway import json_codec
from gateway.errors import error_document
from gateway.http_common import dumps, json_body, loads, ok, topic_of
from gateway.idempotent import DUPLICATE, Duplicate
from gateway.keys import SERVICE
from gateway.producers import SentEntry
from gateway.service import GatewayService, now_unix_ms

log = logging.getLogger(__name__)


async def _stored(service: GatewayService, entries: Sequence[SentEntry], count: int
                  ) -> list[MessageId | MagnetarError]:
    """Waits for the entries' receipts (at most ``produce_timeout_ms``): per message of
    the request, its id or an error."""
    futures = [entry.future for entry in entries]
    try:
        async with asyncio.timeout(service.config.produce_timeout_ms / 1000):
            await asyncio.wait(futures)
    except TimeoutError:
        pass
    results: list[MessageId | MagnetarError | None] = [None] * count
    for entry in entries:
        future = entry.future
        outcome: MessageId | list[MessageId] | MagnetarError
        if not future.done():
            outcome = OperationTimeout(f"no receipt from the broker within {service.config.produce_timeout_ms} ms; "
                                       "the message may or may not be stored")
        elif future.exception() is not None:
            error = future.exception()
            outcome = error if isinstance(error, MagnetarError) else OperationTimeout(str(error))
        else:
            outcome = future.result()
        for position, index in enumerate(entry.indexes):
            results[index] = outcome[position] if isinstance(outcome, list) else outcome
    assert all(result is not None for result in results)
    return results  # type: ignore[return-value]


def _result(outcome: MessageId | Duplicate | MagnetarError) -> dict:
    if type(outcome) is MessageId:
        return {"status": "stored", "message_id": f"{outcome[0]}:{outcome[1]}:{outcome[2]}:{outcome[3]}"}
    if isinstance(outcome, MagnetarError):
        return {"status": "error", "error": error_document(outcome)}
    if isinstance(outcome, Duplicate):
        return {"status": "duplicate"}
    return {"status": "stored", "message_id": str(outcome)}


async def produce_one(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    config = service.config
    topic = topic_of(request)
    message, sequenced = json_codec.parse_one(await json_body(request), bytes_max=config.message_bytes_max,
                                              now_unix_ms=now_unix_ms())
    if sequenced is not None:
        (outcome,) = await service.idempotent.send(topic, [message], sequenced)
        if isinstance(outcome, MagnetarError):
            raise outcome
        if outcome is DUPLICATE:
            return ok({"message_id": None, "duplicate": True})
        service.messages_produced += 1
        return ok({"message_id": str(outcome), "duplicate": False})
    entries = await service.producers.send(topic, [message], batch=False)
    (outcome,) = await _stored(service, entries, 1)
    if isinstance(outcome, MagnetarError):
        raise outcome
    service.messages_produced += 1
    return ok({"message_id": str(outcome)})


async def produce_batch(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    config = service.config
    topic = topic_of(request)
    messages, sequenced = json_codec.parse_batch(await json_body(request), messages_max=config.batch_messages_max,
                                                 bytes_max=config.message_bytes_max, now_unix_ms=now_unix_ms())
    _check_batch_bytes(messages, config.message_bytes_max)
    outcomes: Sequence[MessageId | Duplicate | MagnetarError]
    if sequenced is not None and sequenced.refused:
        kept = [index for index in range(len(messages)) if index not in sequenced.refused]
        sent = await service.idempotent.send(topic, [messages[index] for index in kept], json_codec.Sequenced(
            sequenced.producer, [sequenced.sequence_ids[index] for index in kept])) if kept else []
        sent_by_index = dict(zip(kept, sent))
        outcomes = [sequenced.refused.get(index) or sent_by_index[index] for index in range(len(messages))]
    elif sequenced is not None:
        outcomes = await service.idempotent.send(topic, messages, sequenced)
    else:
        entries = await service.producers.send(topic, messages, batch=True)
        outcomes = await _stored(service, entries, len(messages))
    stored = sum(1 for outcome in outcomes if not isinstance(outcome, (MagnetarError, Duplicate)))
    service.messages_produced += stored
    errors = [outcome for outcome in outcomes if isinstance(outcome, MagnetarError)]
    if len(errors) == len(outcomes):
        raise errors[0]
    return ok({"results": [_result(outcome) for outcome in outcomes]})


def _check_batch_bytes(messages: Sequence[OutgoingMessage], bytes_max: int) -> None:
    """A batch is one entry, so it is bounded like one message."""
    total = sum(message.size_bytes + 16 for message in messages)
    if total > bytes_max:
        raise LimitExceeded("batch bytes", total, bytes_max)


async def produce_stream(request: web.Request) -> web.StreamResponse:
    """NDJSON in, NDJSON out: each input line is a message object; each output line is
    ``{"line": n, "status": "stored", "message_id": ...}`` or ``{"line": n, "status":
    "error", "error": {...}}``, in input order."""
    service = request.app[SERVICE]
    config = service.config
    topic = topic_of(request)
    # ?producer=NAME: the idempotent form; every line then carries a sequence_id, and
    # they increase through the stream (gateway/idempotent.py).
    producer = json_codec.parse_producer_name(request.query.get("producer"))
    if producer is not None:
        await service.idempotent.check_policy(topic)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    reader = request.content
    line_number = 0
    last_sequence_id = -1
    pending: list[tuple[int, OutgoingMessage]] = []
    sequence_ids: list[int] = []
    pending_bytes = 0
    errors: list[dict] = []

    async def flush() -> None:
        nonlocal pending, pending_bytes, sequence_ids
        if pending:
            batch, pending, pending_bytes = pending, [], 0
            ids, sequence_ids = sequence_ids, []
            outcomes: Sequence[MessageId | Duplicate | MagnetarError]
            try:
                if producer is not None:
                    outcomes = await service.idempotent.send(topic, [message for _, message in batch],
                                                             json_codec.Sequenced(producer, ids))
                else:
                    entries = await service.producers.send(topic, [message for _, message in batch], batch=True)
                    outcomes = await _stored(service, entries, len(batch))
            except MagnetarError as error:
                outcomes = [error] * len(batch)
            lines = []
            for (number, _), outcome in zip(batch, outcomes):
                if not isinstance(outcome, (MagnetarError, Duplicate)):
                    service.messages_produced += 1
                lines.append({"line": number, **_result(outcome)})
            await _write_lines(response, sorted(errors + lines, key=lambda line: line["line"]))
            errors.clear()
        elif errors:
            await _write_lines(response, errors)
            errors.clear()

    def take_line(line: bytes) -> None:
        nonlocal line_number, pending_bytes, last_sequence_id
        line_number += 1
        text = line.strip()
        if not text:
            return
        try:
            try:
                document = loads(text)
            except (ValueError, RecursionError):
                raise json_codec.InvalidArgument("line is not valid JSON") from None
            path = f"line {line_number}"
            if producer is None:
                message = json_codec.parse_message(document, path, bytes_max=config.message_bytes_max,
                                                   now_unix_ms=now_unix_ms())
            else:
                message, sequence_id = json_codec.parse_sequenced_line(
                    document, path, bytes_max=config.message_bytes_max, now_unix_ms=now_unix_ms())
                if sequence_id <= last_sequence_id:
                    raise json_codec.InvalidArgument(f"{path}.sequence_id {sequence_id} is not above the one "
                                                     f"before it ({last_sequence_id}): a producer's sequence ids "
                                                     "increase")
                last_sequence_id = sequence_id
                sequence_ids.append(sequence_id)
        except MagnetarError as error:
            errors.append({"line": line_number, "status": "error", "error": error_document(error)})
            return
        pending.append((line_number, message))
        pending_bytes += message.size_bytes + 16

    def too_long() -> None:
        nonlocal line_number
        line_number += 1
        errors.append({"line": line_number, "status": "error", "error": error_document(
            LimitExceeded("line bytes", config.stream_line_bytes_max + 1, config.stream_line_bytes_max))})

    # Lines are split here, not by the reader (whose own limit is far below a message):
    # at most one line is buffered, and a line past the limit is skipped to its end.
    buffer = bytearray()
    skipping = False
    async for chunk in reader.iter_any():
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if not skipping:
                buffer += chunk[start:end]
                if len(buffer) > config.stream_line_bytes_max:
                    buffer.clear()
                    skipping = True
            if newline < 0:
                break
            start = newline + 1
            if skipping:
                too_long()
                skipping = False
            else:
                take_line(bytes(buffer))
                buffer.clear()
            if len(pending) >= config.batch_messages_max or pending_bytes >= config.message_bytes_max // 2:
                await flush()
        # What has arrived so far is stored as one entry: a client writing one line at
        # a time gets one result at a time, one writing fast gets big batches.
        await flush()
    if skipping:
        too_long()
    elif buffer.strip():
        take_line(bytes(buffer))
    await flush()
    await response.write_eof()
    return response


async def _write_lines(response: web.StreamResponse, lines: list[dict]) -> None:
    if lines:
        await response.write(b"".join(dumps(line) + b"\n" for line in lines))
