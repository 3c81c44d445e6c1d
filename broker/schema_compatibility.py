"""Schema compatibility checks, as Pulsar's strategies define them. Pure.

Strategies: ALWAYS_COMPATIBLE, ALWAYS_INCOMPATIBLE, BACKWARD (a consumer of the new
schema reads data written with the last one), FORWARD (a consumer of the last schema
reads data written with the new one), FULL (both), and the ``*_TRANSITIVE`` forms,
which check against every earlier version instead of the last only.

"Reads" follows Avro's schema resolution for records (AVRO and JSON schemas are Avro
record definitions in Pulsar): every field of the reader must either exist in the
writer with a type the reader accepts (the same type, or a union of the reader that
holds each branch of the writer's), or have a default; writer fields unknown to the
reader are skipped. Nested records are checked the same way. PROTOBUF_NATIVE schemas
follow protobuf's own rules for updating a message type (schema_protobuf_native.py).
Anything else (primitive schemas, PROTOBUF, unparsable text) is compatible only with a
schema of the same type and the same definition — or any definition of the same type
for primitive and PROTOBUF schemas, whose data carry no field layout we check.
"""

from __future__ import annotations

import json

from broker import schema_protobuf_native

STRATEGIES = ("ALWAYS_COMPATIBLE", "ALWAYS_INCOMPATIBLE", "BACKWARD", "FORWARD", "FULL",
              "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
DEFAULT_STRATEGY = "FULL"          # Pulsar's broker default
RECORD_TYPES = ("AVRO", "JSON")


def _parse(data: bytes) -> object | None:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _type_name(node: object) -> object:
    """A comparable form of an Avro type (records by name and fields)."""
    if isinstance(node, dict):
        if node.get("type") == "record":
            return ("record", node.get("name"), tuple((f.get("name"), _type_name(f.get("type")))
                                                        for f in node.get("fields", []) if isinstance(f, dict)))
        if node.get("type") in ("array", "map"):
            return (node["type"], _type_name(node.get("items", node.get("values"))))
        if "logicalType" in node:
            return (node.get("type"), node.get("logicalType"))
        return _type_name(node.get("type"))
    if isinstance(node, list):
        return ("union", tuple(_type_name(branch) for branch in node))
    return node


def _accepts(reader: object, writer: object) -> bool:
    """Can data written as ``writer`` be read as ``reader``?"""
    if isinstance(reader, dict) and reader.get("type") == "record" and \
            isinstance(writer, dict) and writer.get("type") == "record":
        return _record_reads(reader, writer)
    if isinstance(reader, list):
        writer_branches = writer if isinstance(writer, list) else [writer]
        return all(any(_accepts(branch, w) for branch in reader) for w in writer_branches)
    if isinstance(writer, list):
        return all(_accepts(reader, w) for w in writer)
    if _type_name(reader) == _type_name(writer):
        return True
    # Avro's promotions.
    promotions = {("long", "int"), ("float", "int"), ("float", "long"), ("double", "int"), ("double", "long"),
                  ("double", "float"), ("string", "bytes"), ("bytes", "string")}
    return (_type_name(reader), _type_name(writer)) in promotions


def _record_reads(reader: dict, writer: dict) -> bool:
    writer_fields = {f.get("name"): f for f in writer.get("fields", []) if isinstance(f, dict)}
    for field in reader.get("fields", []):
        if not isinstance(field, dict):
            return False
        source = writer_fields.get(field.get("name"))
        if source is None:
            if "default" not in field:
                return False
            continue
        if not _accepts(field.get("type"), source.get("type")):
            return False
    return True


def can_read(reader_type: str, reader_data: bytes, writer_type: str, writer_data: bytes) -> bool:
    if reader_type != writer_type:
        return False
    if reader_type in RECORD_TYPES:
        reader, writer = _parse(reader_data), _parse(writer_data)
        if isinstance(reader, dict) and isinstance(writer, dict):
            return _accepts(reader, writer)
        return reader_data == writer_data
    if reader_type == "PROTOBUF_NATIVE":
        return schema_protobuf_native.can_read(reader_data, writer_data)
    return True


def compatible(strategy: str, new: tuple[str, bytes], existing: list[tuple[str, bytes]]) -> bool:
    """Whether ``new`` (type, definition) may follow ``existing`` (oldest first)."""
    assert strategy in STRATEGIES, strategy
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return True
    if strategy == "ALWAYS_INCOMPATIBLE":
        return False
    against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    base = strategy.removesuffix("_TRANSITIVE")
    for old in against:
        if base in ("BACKWARD", "FULL") and not can_read(new[0], new[1], old[0], old[1]):
            return False
        if base in ("FORWARD", "FULL") and not can_read(old[0], old[1], new[0], new[1]):
            return False
    return True
