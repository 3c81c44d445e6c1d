"""Schemas: how a producer turns values into payload bytes and a consumer turns them
back, and the ``Schema`` a producer registers (PRODUCER) and a consumer declares
(SUBSCRIBE). The wire forms are those of the official client's ``pulsar.schema``, so
either client reads what the other wrote:

- ``BytesSchema``: payloads as they are; no schema registered (type None).
- ``StringSchema``: UTF-8 text; type String, empty definition.
- ``JsonSchema(definition)``: a JSON document per message; type Json, the definition is
  an Avro record schema in JSON (what ``pulsar.schema.Record.schema()`` returns).
- ``AvroSchema(definition)``: Avro binary encoding of one datum, no container header
  (fastavro's schemaless form, which the official client writes); type Avro.

``definition`` is an Avro record schema as a dict, or a class with a ``schema()``
classmethod returning one (a ``pulsar.schema.Record`` subclass works as it is). Values
are dicts, dataclass instances or objects whose ``__dict__`` holds the fields; with
``record_type`` given, decode returns ``record_type(**fields)`` instead of a dict.
Pure: bytes and protobufs in and out.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Callable, Mapping

from common.errors import InvalidArgument
from protocol.proto import pulsar_api_pb2 as pb


class Schema:
    """Bytes as they are (the official client's BytesSchema)."""

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"{type(self).__name__} sends bytes, not {type(value).__name__}")
        return bytes(value)

    def decode(self, data: bytes) -> Any:
        return data

    def schema_info(self) -> pb.Schema | None:
        """What PRODUCER and SUBSCRIBE carry; None: nothing (raw bytes)."""
        return None


BytesSchema = Schema


class StringSchema(Schema):
    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise InvalidArgument(f"StringSchema sends str, not {type(value).__name__}")
        return value.encode()

    def decode(self, data: bytes) -> str:
        return data.decode()

    def schema_info(self) -> pb.Schema:
        return pb.Schema(name="String", type=pb.Schema.String, schema_data=b"")


def _definition(definition: Mapping[str, Any] | type) -> dict:
    if isinstance(definition, Mapping):
        result = dict(definition)
    elif callable(getattr(definition, "schema", None)):
        result = dict(definition.schema())
    else:
        raise InvalidArgument("a schema definition is an Avro record schema (a dict) or a class with schema()")
    if result.get("type") != "record" or not isinstance(result.get("fields"), list):
        raise InvalidArgument("a schema definition is an Avro record schema: type 'record' with fields")
    return result


def _fields(value: Any) -> dict:
    if isinstance(value, Mapping):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "__dict__"):
        return {name: field for name, field in vars(value).items() if not name.startswith("_")}
    raise InvalidArgument(f"cannot take fields from a {type(value).__name__}")


class _RecordSchema(Schema):
    type_name = ""
    type_code = 0

    def __init__(self, definition: Mapping[str, Any] | type,
                 record_type: Callable[..., Any] | None = None) -> None:
        self.definition = _definition(definition)
        self.field_names = [field["name"] for field in self.definition["fields"]]
        self.record_type = record_type
        self._schema_data = json.dumps(self.definition).encode()

    def schema_info(self) -> pb.Schema:
        return pb.Schema(name=self.definition.get("name", ""), type=self.type_code, schema_data=self._schema_data)

    def _record(self, fields: dict) -> Any:
        return fields if self.record_type is None else self.record_type(**fields)


class JsonSchema(_RecordSchema):
    type_code = pb.Schema.Json

    def encode(self, value: Any) -> bytes:
        fields = _fields(value)
        return json.dumps({name: fields.get(name) for name in self.field_names}).encode()

    def decode(self, data: bytes) -> Any:
        fields = json.loads(data)
        if not isinstance(fields, dict):
            raise InvalidArgument("a JSON schema's message is a JSON object")
        return self._record(fields)


class AvroSchema(_RecordSchema):
    type_code = pb.Schema.Avro

    def __init__(self, definition: Mapping[str, Any] | type,
                 record_type: Callable[..., Any] | None = None) -> None:
        super().__init__(definition, record_type)
        import avro.io
        import avro.schema

        self._avro_io = avro.io
        self._parsed = avro.schema.parse(self._schema_data.decode())
        self._writer = avro.io.DatumWriter(self._parsed)
        self._reader = avro.io.DatumReader(self._parsed, self._parsed)

    def encode(self, value: Any) -> bytes:
        fields = _fields(value)
        buffer = io.BytesIO()
        try:
            self._writer.write({name: fields.get(name) for name in self.field_names},
                               self._avro_io.BinaryEncoder(buffer))
        except self._avro_io.AvroTypeException as error:
            raise InvalidArgument(f"value does not match the Avro schema: {error}") from None
        return buffer.getvalue()

    def decode(self, data: bytes) -> Any:
        return self._record(self._reader.read(self._avro_io.BinaryDecoder(io.BytesIO(data))))
