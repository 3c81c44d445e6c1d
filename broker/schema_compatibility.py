"""Schema compatibility checks, as Pulsar's strategies define them. Pure.

Strategies: ALWAYS_COMPATIBLE, ALWAYS_INCOMPATIBLE, BACKWARD (a consumer of the new
schema reads data written with the last one), FORWARD (a consumer of the last schema
reads data written with the new one), FULL (both), and the ``*_TRANSITIVE`` forms,
which check against every earlier version instead of the last only.

"Reads" is Avro's schema resolution for AVRO and JSON schemas (JSON schemas are Avro
definitions in Pulsar), decided by Apache's ``avro`` library
(``avro.compatibility.ReaderWriterCompatibilityChecker``, the port of the Java
``SchemaCompatibility`` that Pulsar's checks use): record fields matched by name (or
alias), a reader field missing in the writer needs a default; type promotions (int to
long, float, double; long to float, double; float to double; string and bytes both
ways); unions (each writer branch must be readable by some reader branch); enums (every
writer symbol known to the reader, unless the reader has a default symbol); fixed
(same size and name); named types (records, enums, fixed) matched by name, unqualified as
Java's SchemaCompatibility does, or by the reader's aliases; arrays
and maps by their items and values. A definition that the library cannot parse is
compatible only with the very same bytes.

KEY_VALUE schemas hold two schemas (Pulsar's encoding: ``i32 key length, key bytes,
i32 value length, value bytes``, big-endian, -1 for none; their types in the
``key.schema.type`` and ``value.schema.type`` properties, BYTES when absent): the key
and the value are each checked by the rules of their own type, and both must pass.

PROTOBUF_NATIVE schemas follow protobuf's own rules for updating a message type
(schema_protobuf_native.py). Any other type (primitive schemas, PROTOBUF) is compatible
with any definition of the same type: their data carry no field layout to check.
Different types are never compatible.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass, field

import avro.compatibility
import avro.errors
import avro.schema

from broker import schema_protobuf_native

STRATEGIES = ("ALWAYS_COMPATIBLE", "ALWAYS_INCOMPATIBLE", "BACKWARD", "FORWARD", "FULL",
              "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
DEFAULT_STRATEGY = "FULL"          # Pulsar's broker default
RECORD_TYPES = ("AVRO", "JSON")
KEY_VALUE = "KEY_VALUE"
# Parsed definitions kept (a check parses each side once; a topic's versions recur).
# Bounded: schemas are at most broker/schemas.py's SCHEMA_BYTES_MAX each.
PARSED_SCHEMAS_MAX = 256


@dataclass(frozen=True)
class SchemaDefinition:
    """One schema version as the check sees it."""
    type: str
    data: bytes
    properties: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


@functools.lru_cache(maxsize=PARSED_SCHEMAS_MAX)
def _parse_avro(data: bytes) -> avro.schema.Schema | None:
    try:
        return avro.schema.parse(data.decode())
    except (avro.errors.AvroException, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        # SchemaParseException is an AvroException; ValueError covers bad JSON and
        # bad UTF-8; the others come from malformed nodes the parser did not expect.
        return None


def _avro_reads(reader_data: bytes, writer_data: bytes) -> bool:
    reader, writer = _parse_avro(reader_data), _parse_avro(writer_data)
    if reader is None or writer is None:
        return reader_data == writer_data
    result = avro.compatibility.ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
    return result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible


def split_key_value(data: bytes) -> tuple[bytes, bytes] | None:
    """The key's and the value's definitions of a KEY_VALUE schema (None: malformed)."""
    parts = []
    offset = 0
    for _ in range(2):
        if len(data) < offset + 4:
            return None
        (length,) = struct.unpack_from(">i", data, offset)
        offset += 4
        if length < 0:
            parts.append(b"")
            continue
        if len(data) < offset + length:
            return None
        parts.append(data[offset:offset + length])
        offset += length
    if offset != len(data):
        return None
    return parts[0], parts[1]


def join_key_value(key: bytes, value: bytes) -> bytes:
    """The inverse of split_key_value (for tests and tools)."""
    return struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value


def _key_value_parts(schema: SchemaDefinition) -> tuple[SchemaDefinition, SchemaDefinition] | None:
    parts = split_key_value(schema.data)
    if parts is None:
        return None
    key_type = schema.properties.get("key.schema.type", "BYTES").upper()
    value_type = schema.properties.get("value.schema.type", "BYTES").upper()
    return (SchemaDefinition(key_type, parts[0], _nested_properties(schema.properties, "key")),
            SchemaDefinition(value_type, parts[1], _nested_properties(schema.properties, "value")))


def _nested_properties(properties: dict[str, str], side: str) -> dict[str, str]:
    text = properties.get(f"{side}.schema.properties", "")
    try:
        nested = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in nested.items()} if isinstance(nested, dict) else {}


def reads(reader: SchemaDefinition, writer: SchemaDefinition, *, depth: int = 0) -> bool:
    """Whether data written with ``writer`` can be read with ``reader``."""
    if reader.type != writer.type:
        return False
    if reader.type in RECORD_TYPES:
        return _avro_reads(reader.data, writer.data)
    if reader.type == KEY_VALUE:
        if depth > 0:
            return False   # a KEY_VALUE inside a KEY_VALUE is not a schema Pulsar makes
        reader_parts, writer_parts = _key_value_parts(reader), _key_value_parts(writer)
        if reader_parts is None or writer_parts is None:
            return reader.data == writer.data
        return all(reads(r, w, depth=depth + 1) for r, w in zip(reader_parts, writer_parts))
    if reader.type == "PROTOBUF_NATIVE":
        return schema_protobuf_native.can_read(reader.data, writer.data)
    return True


def can_read(reader_type: str, reader_data: bytes, writer_type: str, writer_data: bytes) -> bool:
    """``reads`` for two definitions without properties."""
    return reads(SchemaDefinition(reader_type, reader_data), SchemaDefinition(writer_type, writer_data))


def _definition(schema: SchemaDefinition | tuple) -> SchemaDefinition:
    return schema if isinstance(schema, SchemaDefinition) else SchemaDefinition(*schema)


def compatible(strategy: str, new: SchemaDefinition | tuple, existing: list) -> bool:
    """Whether ``new`` may follow ``existing`` (oldest first); each a SchemaDefinition or
    a (type, data[, properties]) tuple."""
    assert strategy in STRATEGIES, strategy
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return True
    if strategy == "ALWAYS_INCOMPATIBLE":
        return False
    candidate = _definition(new)
    against = [_definition(old) for old in (existing if strategy.endswith("_TRANSITIVE") else existing[-1:])]
    base = strategy.removesuffix("_TRANSITIVE")
    for old in against:
        if base in ("BACKWARD", "FULL") and not reads(candidate, old):
            return False
        if base in ("FORWARD", "FULL") and not reads(old, candidate):
            return False
    return True
