"""PROTOBUF_NATIVE schema compatibility (broker/schema_protobuf_native.py and the
strategies of broker/schema_compatibility.py): definitions built as Pulsar's clients
send them (a base64 FileDescriptorSet, the root message's name). Adding or removing an
optional field keeps both directions readable; changing a field number's type across
wire types, repeated-ness, adding a required field, or renaming the root message does
not; interchangeable integer types and string/bytes stay compatible; nested messages
are checked recursively (a recursive message terminates); unparsable definitions are
compatible only with the same bytes."""

from __future__ import annotations

import base64
import json

import pytest

from broker.schema_compatibility import compatible
from broker.schema_protobuf_native import can_read
from google.protobuf import descriptor_pb2

F = descriptor_pb2.FieldDescriptorProto


def _definition(fields: list[tuple[str, int, int, int]], *, root: str = "Order",
                inner: list[tuple[str, int, int, int]] | None = None) -> bytes:
    """(name, number, type, label) fields of message demo.<root>; an ``inner`` message
    demo.<root>.Line when given (a TYPE_MESSAGE field refers to it)."""
    file = descriptor_pb2.FileDescriptorProto(name="demo.proto", package="demo", syntax="proto2")
    message = file.message_type.add(name=root)
    for name, number, field_type, label in fields:
        field = message.field.add(name=name, number=number, type=field_type, label=label)
        if field_type == F.TYPE_MESSAGE:
            field.type_name = f".demo.{root}.Line"
    if inner is not None:
        line = message.nested_type.add(name="Line")
        for name, number, field_type, label in inner:
            field = line.field.add(name=name, number=number, type=field_type, label=label)
            if field_type == F.TYPE_MESSAGE:
                field.type_name = f".demo.{root}.Line"
    files = descriptor_pb2.FileDescriptorSet(file=[file])
    return json.dumps({"fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode(),
                       "rootMessageTypeName": f"demo.{root}", "rootFileDescriptorName": "demo.proto"}).encode()


OPT, REQ, REP = F.LABEL_OPTIONAL, F.LABEL_REQUIRED, F.LABEL_REPEATED
BASE = [("id", 1, F.TYPE_INT64, REQ), ("note", 2, F.TYPE_STRING, OPT)]


@pytest.mark.parametrize("changed, backward, forward", [
    (BASE + [("qty", 3, F.TYPE_INT32, OPT)], True, True),                  # optional field added
    (BASE[:1], True, True),                                                  # optional field removed
    ([("id", 1, F.TYPE_UINT64, REQ), BASE[1]], True, True),                  # int64 -> uint64: same wire type
    ([BASE[0], ("note", 2, F.TYPE_BYTES, OPT)], True, True),                 # string <-> bytes
    ([("renamed", 1, F.TYPE_INT64, REQ), BASE[1]], True, True),              # names do not travel
    ([BASE[0], ("note", 2, F.TYPE_DOUBLE, OPT)], False, False),              # another wire type
    ([BASE[0], ("note", 2, F.TYPE_STRING, REP)], False, False),              # becomes repeated
    (BASE + [("must", 3, F.TYPE_INT32, REQ)], False, True),                  # required added: old data lacks it
    ([("id", 1, F.TYPE_INT64, OPT), BASE[1]], True, False),                  # required -> optional: new data may lack it
])
def test_field_changes(changed, backward, forward):
    old, new = _definition(BASE), _definition(changed)
    assert can_read(new, old) is backward       # a consumer of the new schema reads old data
    assert can_read(old, new) is forward        # a consumer of the old schema reads new data
    assert compatible("BACKWARD", ("PROTOBUF_NATIVE", new), [("PROTOBUF_NATIVE", old)]) is backward
    assert compatible("FULL", ("PROTOBUF_NATIVE", new), [("PROTOBUF_NATIVE", old)]) is (backward and forward)


def test_root_rename_and_nested_messages():
    base = _definition(BASE)
    assert not can_read(_definition(BASE, root="Invoice"), base)
    nested = [("line", 3, F.TYPE_MESSAGE, OPT)]
    line_v1 = [("sku", 1, F.TYPE_STRING, OPT), ("next", 2, F.TYPE_MESSAGE, OPT)]   # recursive
    line_v2 = [("sku", 1, F.TYPE_FLOAT, OPT), ("next", 2, F.TYPE_MESSAGE, OPT)]
    old = _definition(BASE + nested, inner=line_v1)
    assert can_read(_definition(BASE + nested, inner=line_v1 + [("qty", 3, F.TYPE_INT32, OPT)]), old)
    assert not can_read(_definition(BASE + nested, inner=line_v2), old)


def test_unparsable_definitions_match_only_themselves():
    good = _definition(BASE)
    assert can_read(b"not json", b"not json")
    assert not can_read(b"not json", good)
    assert not can_read(good, b'{"fileDescriptorSet": "!!", "rootMessageTypeName": "demo.Order"}')
    assert not can_read(good, json.dumps({"fileDescriptorSet": json.loads(good)["fileDescriptorSet"],
                                          "rootMessageTypeName": "demo.Missing"}).encode())
