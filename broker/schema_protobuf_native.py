"""Whether data written with one PROTOBUF_NATIVE schema can be read with another. Pure.

A PROTOBUF_NATIVE schema definition is JSON (what Pulsar's clients send):
``{"fileDescriptorSet": base64 FileDescriptorSet, "rootMessageTypeName": "pkg.Msg",
"rootFileDescriptorName": "file.proto"}``. Protobuf data is read field by field
number, so the check follows the protobuf language guide's rules for updating a
message type, applied to the root message and, recursively, to the messages its fields
hold:

- The root message keeps its full name (Pulsar's own rule for this schema type).
- A field of the reader that the writer lacks is fine (it reads as its default)
  unless it is ``required`` (proto2); fields only the writer has are skipped.
- A field number both have must keep a wire-compatible type: int32, uint32, int64,
  uint64, bool and enums are interchangeable; sint32/sint64; string/bytes;
  fixed32/sfixed32; fixed64/sfixed64; float and double only themselves; message
  fields must hold messages that are readable in turn. It must keep being repeated or
  not, and a ``required`` reader field must be required in the writer too.

A definition that cannot be parsed is compatible only with the very same bytes.
"""

from __future__ import annotations

import base64
import binascii
import json

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

F = descriptor_pb2.FieldDescriptorProto
_WIRE_GROUPS = (
    frozenset((F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_BOOL, F.TYPE_ENUM)),
    frozenset((F.TYPE_SINT32, F.TYPE_SINT64)),
    frozenset((F.TYPE_STRING, F.TYPE_BYTES)),
    frozenset((F.TYPE_FIXED32, F.TYPE_SFIXED32)),
    frozenset((F.TYPE_FIXED64, F.TYPE_SFIXED64)),
)
# Definitions bigger than this are compared as bytes (bounds the work of one check).
DEFINITION_BYTES_MAX = 4 * 1024 * 1024

Messages = dict[str, descriptor_pb2.DescriptorProto]


def _parse(data: bytes) -> tuple[Messages, str] | None:
    """Every message type of the definition by full name ('.pkg.Outer.Inner'), and the
    root's full name; None if it is not a definition we can read."""
    if len(data) > DEFINITION_BYTES_MAX:
        return None
    try:
        doc = json.loads(data)
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(doc["fileDescriptorSet"]))
        root = "." + str(doc["rootMessageTypeName"]).lstrip(".")
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, binascii.Error, DecodeError):
        return None
    messages: Messages = {}

    def add(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{message.name}"
        messages[name] = message
        for nested in message.nested_type:
            add(name, nested)

    for file in descriptors.file:
        for message in file.message_type:
            add(f".{file.package}" if file.package else "", message)
    return (messages, root) if root in messages else None


def _same_wire_type(reader: descriptor_pb2.FieldDescriptorProto, writer: descriptor_pb2.FieldDescriptorProto) -> bool:
    if reader.type == writer.type:
        return True
    return any(reader.type in group and writer.type in group for group in _WIRE_GROUPS)


def _reads(reader: Messages, reader_name: str, writer: Messages, writer_name: str,
           checked: set[tuple[str, str]]) -> bool:
    if (reader_name, writer_name) in checked:
        return True          # already being checked higher up (a recursive message)
    checked.add((reader_name, writer_name))
    reader_message, writer_message = reader.get(reader_name), writer.get(writer_name)
    if reader_message is None or writer_message is None:
        return False
    writer_fields = {field.number: field for field in writer_message.field}
    for field in reader_message.field:
        source = writer_fields.get(field.number)
        if source is None:
            if field.label == F.LABEL_REQUIRED:
                return False
            continue
        if (field.label == F.LABEL_REPEATED) != (source.label == F.LABEL_REPEATED):
            return False
        if field.label == F.LABEL_REQUIRED and source.label != F.LABEL_REQUIRED:
            return False
        if not _same_wire_type(field, source):
            return False
        if field.type == F.TYPE_MESSAGE and not _reads(reader, field.type_name, writer, source.type_name, checked):
            return False
    return True


def can_read(reader_data: bytes, writer_data: bytes) -> bool:
    """Can data written with the ``writer_data`` schema be read with ``reader_data``?"""
    reader, writer = _parse(reader_data), _parse(writer_data)
    if reader is None or writer is None:
        return reader_data == writer_data
    (reader_messages, reader_root), (writer_messages, writer_root) = reader, writer
    if reader_root != writer_root:
        return False
    return _reads(reader_messages, reader_root, writer_messages, writer_root, set())
