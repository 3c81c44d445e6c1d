"""The admin API's answer for one stored entry (Pulsar's peek, get-message-by-id and
examine-message paths): the entry's payload, uncompressed, as the body — a batch
entry's whole batch payload, each message with its own metadata — and the entry's
metadata in ``X-Pulsar-*`` headers, as Pulsar's brokers write them.

Pure: ``entry_headers`` writes the headers (the broker), ``entry_messages`` reads an
answer back into its messages (the gateway's peek, ``magnetar admin``). Times are
ISO 8601 in UTC with milliseconds; text that is not printable ASCII (producer name,
partition key) is percent-encoded; the properties travel as one JSON object
(``X-Pulsar-PROPERTY``: a header per property cannot carry every key).
"""

from __future__ import annotations

import base64
import datetime
import json
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import quote, unquote

from protocol.batch import parse_batch
from protocol.proto.pulsar_api_pb2 import MessageMetadata

# Printable ASCII kept as is in a header value; anything else is percent-encoded.
_HEADER_SAFE = " !#$&'()*+,/:;=?@[]~-._"


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """One message of an entry the admin API answered with."""

    ledger_id: int
    entry_id: int
    payload: bytes
    batch_index: int = -1          # -1: stored alone
    batch_size: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    publish_time_ms: int | None = None
    event_time_ms: int | None = None
    producer: str = ""
    sequence_id: int = 0


def time_text(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}+0000"


def time_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z")
    except ValueError:
        return None
    # Whole seconds and milliseconds apart: a float of milliseconds can round down by one.
    return int(moment.replace(microsecond=0).timestamp()) * 1000 + moment.microsecond // 1000


def entry_headers(ledger_id: int, entry_id: int, metadata: MessageMetadata, payload_size: int) -> dict[str, str]:
    """The headers of the answer for the entry at (ledger_id, entry_id), whose
    uncompressed payload is ``payload_size`` bytes."""
    headers = {"X-Pulsar-Message-ID": f"{ledger_id}:{entry_id}",
               "X-Pulsar-batch-size": str(payload_size),
               "X-Pulsar-PROPERTY": json.dumps({kv.key: kv.value for kv in metadata.properties}),
               "X-Pulsar-producer-name": quote(metadata.producer_name, safe=_HEADER_SAFE),
               "X-Pulsar-sequence-id": str(metadata.sequence_id)}
    if metadata.publish_time:
        headers["X-Pulsar-publish-time"] = time_text(metadata.publish_time)
    if metadata.event_time:
        headers["X-Pulsar-event-time"] = time_text(metadata.event_time)
    if metadata.HasField("num_messages_in_batch"):
        headers["X-Pulsar-num-batch-message"] = str(metadata.num_messages_in_batch)
    if metadata.HasField("deliver_at_time"):
        headers["X-Pulsar-deliver-at-time"] = time_text(metadata.deliver_at_time)
    if metadata.HasField("partition_key"):
        headers["X-Pulsar-partition-key"] = quote(metadata.partition_key, safe=_HEADER_SAFE)
        if metadata.partition_key_b64_encoded:
            headers["X-Pulsar-partition-key-b64-encoded"] = "true"
    if metadata.HasField("ordering_key"):
        headers["X-Pulsar-Base64-ordering-key"] = base64.b64encode(metadata.ordering_key).decode("ascii")
    return headers


def entry_messages(headers: Mapping[str, str], body: bytes) -> list[PeekedMessage]:
    """The messages of one answer (a batch entry split into its messages). Raises
    MalformedFrame for a batch payload that does not parse, ValueError for headers
    that do not."""
    lower = {name.lower(): value for name, value in headers.items()}
    ledger_id, entry_id = (int(part) for part in lower["x-pulsar-message-id"].split(":")[:2])
    common = {"publish_time_ms": time_ms(lower.get("x-pulsar-publish-time")),
              "producer": unquote(lower.get("x-pulsar-producer-name", "")),
              "sequence_id": int(lower.get("x-pulsar-sequence-id", "0"))}
    event_time_ms = time_ms(lower.get("x-pulsar-event-time"))
    if "x-pulsar-num-batch-message" not in lower:
        key = lower.get("x-pulsar-partition-key")
        return [PeekedMessage(ledger_id, entry_id, body, properties=json.loads(lower.get("x-pulsar-property") or "{}"),
                              key=unquote(key) if key is not None else None, event_time_ms=event_time_ms,
                              **common)]
    count = int(lower["x-pulsar-num-batch-message"])
    metadata = MessageMetadata(producer_name="", sequence_id=0, publish_time=0, num_messages_in_batch=count)
    return [PeekedMessage(ledger_id, entry_id, bytes(single.payload), single.batch_index, count,
                          properties={kv.key: kv.value for kv in single.metadata.properties},
                          key=single.metadata.partition_key if single.metadata.HasField("partition_key") else None,
                          event_time_ms=single.metadata.event_time or event_time_ms, **common)
            for single in parse_batch(metadata, body)]
