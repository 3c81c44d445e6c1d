"""The schema registry: each topic's schema versions, as Pulsar keeps them, in etcd
under ``/schemas/<topic>`` (a partition's schema is its partitioned topic's).

- A producer (or GET_OR_CREATE_SCHEMA, or the admin POST) that brings a schema gets the
  version of an identical one already registered; otherwise the new schema must be
  compatible with the existing versions under the namespace's strategy
  (``schema_compatibility_strategy``, default FULL; broker/schema_compatibility.py)
  and becomes the next version, else IncompatibleSchema. A consumer that brings a
  schema registers it when the topic has none, and must be compatible otherwise.
- Versions are numbered from 0 and travel as 8-byte big-endian integers (what the
  clients put in each message's metadata). At most ``VERSIONS_MAX`` are kept per topic.
- The record is JSON with the definition base64-encoded; it changes by compare-and-set
  (a racing registration retries, a bounded number of times).
"""

from __future__ import annotations

import base64
import json
import struct
import time
from dataclasses import dataclass, field

from broker import schema_compatibility
from common.errors import (
    IncompatibleSchema,
    MalformedFrame,
    MetadataKeyExists,
    MetadataVersionConflict,
    PreconditionFailed,
)
from common.topic_name import TopicName
from metadata import keys
from metadata.store import MetadataStore
from protocol.proto import pulsar_api_pb2 as pb

VERSIONS_MAX = 100
_CAS_ATTEMPTS_MAX = 5
# Schema definitions larger than this are refused (Pulsar's default max is 10 MiB; a
# record in etcd must stay well under its 1.5 MiB value limit).
SCHEMA_BYTES_MAX = 256 * 1024

# Wire type <-> the names the admin API uses.
TYPE_NAMES = {pb.Schema.String: "STRING", pb.Schema.Json: "JSON", pb.Schema.Protobuf: "PROTOBUF",
              pb.Schema.Avro: "AVRO", pb.Schema.Bool: "BOOLEAN", pb.Schema.Int8: "INT8", pb.Schema.Int16: "INT16",
              pb.Schema.Int32: "INT32", pb.Schema.Int64: "INT64", pb.Schema.Float: "FLOAT",
              pb.Schema.Double: "DOUBLE", pb.Schema.Date: "DATE", pb.Schema.Time: "TIME",
              pb.Schema.Timestamp: "TIMESTAMP", pb.Schema.KeyValue: "KEY_VALUE", pb.Schema.Instant: "INSTANT",
              pb.Schema.LocalDate: "LOCAL_DATE", pb.Schema.LocalTime: "LOCAL_TIME",
              pb.Schema.LocalDateTime: "LOCAL_DATE_TIME", pb.Schema.ProtobufNative: "PROTOBUF_NATIVE",
              0: "BYTES"}   # Schema.Type "None" (a Python keyword): raw bytes
TYPE_CODES = {name: code for code, name in TYPE_NAMES.items()}


def encode_version(version: int) -> bytes:
    return struct.pack(">q", version)


def decode_version(data: bytes) -> int:
    if len(data) != 8:
        raise MalformedFrame(f"a schema version is 8 bytes, not {len(data)}")
    return struct.unpack(">q", data)[0]


@dataclass(frozen=True)
class SchemaVersion:
    version: int
    type: str                      # admin name: "JSON", "AVRO", "STRING"...
    data: bytes
    properties: dict[str, str] = field(default_factory=dict)
    timestamp_ms: int = 0

    def admin_json(self) -> dict:
        return {"version": self.version, "type": self.type, "timestamp": self.timestamp_ms,
                "data": self.data.decode(errors="replace"), "properties": self.properties}

    def to_wire(self, name: str) -> pb.Schema:
        return pb.Schema(name=name, schema_data=self.data, type=TYPE_CODES.get(self.type, 0),
                         properties=[pb.KeyValue(key=k, value=v) for k, v in self.properties.items()])


def _decode_record(value: bytes) -> list[SchemaVersion]:
    try:
        doc = json.loads(value)
        return [SchemaVersion(int(v["version"]), str(v["type"]), base64.b64decode(v["data"]),
                              {str(k): str(x) for k, x in v.get("properties", {}).items()},
                              int(v.get("timestamp", 0))) for v in doc["versions"]]
    except (ValueError, KeyError, TypeError) as error:
        raise MalformedFrame(f"bad schema record: {error}") from None


def _encode_record(versions: list[SchemaVersion]) -> bytes:
    return json.dumps({"format_version": 1, "versions": [
        {"version": v.version, "type": v.type, "data": base64.b64encode(v.data).decode(),
         "properties": v.properties, "timestamp": v.timestamp_ms} for v in versions]}).encode()


def schema_key(topic: TopicName) -> str:
    base = topic.partitioned_parent if topic.is_partition else topic
    return keys.schema(base.key_path)


class SchemaRegistry:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def _load(self, topic: TopicName) -> tuple[list[SchemaVersion], int | None]:
        record = await self._store.get(schema_key(topic))
        if record is None:
            return [], None
        return _decode_record(record.value), record.version

    async def versions(self, topic: TopicName) -> list[SchemaVersion]:
        return (await self._load(topic))[0]

    async def get(self, topic: TopicName, version: int | None = None) -> SchemaVersion | None:
        versions = await self.versions(topic)
        if not versions:
            return None
        if version is None:
            return versions[-1]
        return next((v for v in versions if v.version == version), None)

    async def put(self, topic: TopicName, schema_type: str, data: bytes, properties: dict[str, str],
                  strategy: str, *, only_if_empty_or_compatible: bool = False) -> int:
        """Registers (or finds) a schema; returns its version. IncompatibleSchema when
        the strategy refuses it."""
        if len(data) > SCHEMA_BYTES_MAX:
            raise PreconditionFailed(f"schema definition of {len(data)} bytes is over {SCHEMA_BYTES_MAX}")
        for _attempt in range(_CAS_ATTEMPTS_MAX):
            versions, record_version = await self._load(topic)
            for existing in versions:
                if existing.type == schema_type and existing.data == data:
                    return existing.version
            if not schema_compatibility.compatible(strategy, (schema_type, data, properties),
                                                   [(v.type, v.data, v.properties) for v in versions]):
                raise IncompatibleSchema(f"schema of type {schema_type} is not compatible with the schema of "
                                         f"{topic} under strategy {strategy}")
            if only_if_empty_or_compatible and versions:
                return versions[-1].version   # a consumer: compatible, nothing to register
            if len(versions) >= VERSIONS_MAX:
                raise PreconditionFailed(f"{topic} has {VERSIONS_MAX} schema versions already")
            version = versions[-1].version + 1 if versions else 0
            updated = versions + [SchemaVersion(version, schema_type, data, properties, int(time.time() * 1000))]
            try:
                if record_version is None:
                    await self._store.create(schema_key(topic), _encode_record(updated))
                else:
                    await self._store.compare_and_set(schema_key(topic), _encode_record(updated),
                                                      expected_version=record_version)
            except (MetadataVersionConflict, MetadataKeyExists):
                continue
            return version
        raise PreconditionFailed(f"schema of {topic} kept changing while registering; retry")

    async def delete(self, topic: TopicName) -> bool:
        record = await self._store.get(schema_key(topic))
        if record is None:
            return False
        await self._store.delete(schema_key(topic))
        return True
