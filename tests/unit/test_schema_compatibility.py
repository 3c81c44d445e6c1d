"""Schema compatibility (broker/schema_compatibility.py): Avro resolution (by the avro
library) for AVRO and JSON schemas under each strategy — fields and defaults, enum
symbols, fixed sizes, named types, unions, arrays and maps — transitive forms against
every version, KEY_VALUE checked key and value each, unparsable definitions matching only
themselves, and same-type-only rules for the other schema types."""

from __future__ import annotations

import json

import pytest

from broker.schema_compatibility import can_read, compatible


def _record(*fields) -> bytes:
    return json.dumps({"type": "record", "name": "R", "fields": [dict(f) for f in fields]}).encode()


NAME = {"name": "name", "type": "string"}
QTY = {"name": "qty", "type": "int"}
QTY_LONG = {"name": "qty", "type": "long"}
QTY_TEXT = {"name": "qty", "type": "string"}
NOTE_DEFAULT = {"name": "note", "type": ["null", "string"], "default": None}
NOTE = {"name": "note", "type": ["null", "string"]}

V1 = ("JSON", _record(NAME, QTY))


@pytest.mark.parametrize("strategy, new, expected", [
    ("BACKWARD", ("JSON", _record(NAME, QTY, NOTE_DEFAULT)), True),   # added with a default
    ("BACKWARD", ("JSON", _record(NAME, QTY, NOTE)), False),          # added without one
    ("BACKWARD", ("JSON", _record(NAME)), True),                      # dropped
    ("FORWARD", ("JSON", _record(NAME)), False),                      # old readers need qty
    ("FORWARD", ("JSON", _record(NAME, QTY, NOTE)), True),
    ("FULL", ("JSON", _record(NAME, QTY, NOTE_DEFAULT)), True),
    ("FULL", ("JSON", _record(NAME)), False),
    ("BACKWARD", ("JSON", _record(NAME, QTY_LONG)), True),            # int promotes to long
    ("FORWARD", ("JSON", _record(NAME, QTY_LONG)), False),
    ("FULL", ("JSON", _record(NAME, QTY_TEXT)), False),
    ("ALWAYS_COMPATIBLE", ("JSON", _record(NAME, QTY_TEXT)), True),
    ("ALWAYS_INCOMPATIBLE", ("JSON", _record(NAME, QTY, NOTE_DEFAULT)), False),
    ("FULL", ("AVRO", _record(NAME, QTY)), False),                    # another type
])
def test_strategies_against_the_last_version(strategy, new, expected):
    assert compatible(strategy, new, [V1]) is expected


def test_transitive_checks_every_version():
    v2 = ("JSON", _record(NAME, QTY, NOTE_DEFAULT))
    v3 = ("JSON", _record(NAME, NOTE_DEFAULT))        # drops qty: v2 readers still fine backward
    assert compatible("FORWARD", v3, [V1, v2]) is False
    assert compatible("BACKWARD", v3, [V1, v2]) is True
    only_note = ("JSON", _record({"name": "name", "type": "string", "default": ""}, NOTE))
    assert compatible("BACKWARD", only_note, [v2]) is True
    assert compatible("BACKWARD_TRANSITIVE", only_note, [V1, v2]) is False   # V1 data lacks note


def test_other_types_need_the_same_type():
    assert can_read("STRING", b"", "STRING", b"")
    assert not can_read("STRING", b"", "INT32", b"")
    assert compatible("FULL", ("PROTOBUF", b"x"), [("PROTOBUF", b"y")])
    assert not compatible("FULL", ("JSON", b"not json"), [("JSON", b"other")])


# --- The rules Avro's resolution has and hand-written rules missed (checked by the
# avro library). Each row: (reader, writer, readable); schemas as Python objects.

def _avro(node: object) -> bytes:
    return json.dumps(node).encode()


def _in_record(field_type: object, **extra) -> dict:
    return {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type, **extra}]}


COLOR_AB = {"type": "enum", "name": "Color", "symbols": ["A", "B"]}
COLOR_ABC = {"type": "enum", "name": "Color", "symbols": ["A", "B", "C"]}
COLOR_AB_DEFAULT = {"type": "enum", "name": "Color", "symbols": ["A", "B"], "default": "A"}
SHADE_AB = {"type": "enum", "name": "Shade", "symbols": ["A", "B"]}
MD5 = {"type": "fixed", "name": "Digest", "size": 16}
SHA1 = {"type": "fixed", "name": "Digest", "size": 20}
OTHER_MD5 = {"type": "fixed", "name": "Hash", "size": 16}
POINT = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "int"}]}
SPOT = {"type": "record", "name": "Spot", "fields": [{"name": "x", "type": "int"}]}
SPOT_ALIASED = {"type": "record", "name": "Spot", "aliases": ["Point"], "fields": [{"name": "x", "type": "int"}]}


@pytest.mark.parametrize("rule, reader, writer, readable", [
    # enum symbols: every symbol the writer may write must be known to the reader…
    ("enum: reader knows more symbols", COLOR_ABC, COLOR_AB, True),
    ("enum: writer has a symbol the reader lacks", COLOR_AB, COLOR_ABC, False),
    # …unless the reader has a default symbol to read unknown ones as.
    ("enum: reader's default covers a new symbol", COLOR_AB_DEFAULT, COLOR_ABC, True),
    ("enum: another name", SHADE_AB, COLOR_AB, False),
    # fixed: same size and name.
    ("fixed: same size", MD5, dict(MD5), True),
    ("fixed: another size", SHA1, MD5, False),
    ("fixed: another name", OTHER_MD5, MD5, False),
    # named types are matched by full name (or the reader's aliases).
    ("record: another name", SPOT, POINT, False),
    ("record: the reader's alias names the writer", SPOT_ALIASED, POINT, True),
    # Names compare unqualified (as Avro's Java SchemaCompatibility, which Pulsar uses).
    ("record: same name, another namespace", dict(POINT, namespace="a.b"), dict(POINT, namespace="c.d"), True),
    # unions: each writer branch readable by some reader branch.
    ("union: reader adds a branch", ["null", "string", "int"], ["null", "string"], True),
    ("union: writer has a branch the reader lacks", ["null", "string"], ["null", "string", "int"], False),
    ("union: plain writer into a reader's union", ["null", "long"], "int", True),
    ("union: writer's union into a plain reader", "string", ["null", "string"], False),
    # arrays and maps by their items and values, with promotions.
    ("array: items promote", {"type": "array", "items": "double"}, {"type": "array", "items": "float"}, True),
    ("array: items narrow", {"type": "array", "items": "int"}, {"type": "array", "items": "long"}, False),
    ("map: values of another type", {"type": "map", "values": "int"}, {"type": "map", "values": "string"}, False),
])
def test_avro_resolution_rules(rule, reader, writer, readable):
    """Each of Avro's resolution rules, inside a record field as Pulsar's schemas are
    records: whether data written with ``writer`` reads as ``reader``."""
    assert can_read("AVRO", _avro(_in_record(reader)), "AVRO", _avro(_in_record(writer))) is readable, rule
    # JSON schemas are Avro definitions too: the same answer.
    assert can_read("JSON", _avro(_in_record(reader)), "JSON", _avro(_in_record(writer))) is readable, rule


def test_defaults_decide_added_and_removed_fields():
    """A reader field missing in the writer needs a default (of the field's type); a
    writer field the reader does not have is skipped."""
    base = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    added_with_default = {"type": "record", "name": "R",
                          "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": "x"}]}
    added_without = {"type": "record", "name": "R",
                     "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "string"}]}
    for strategy, new, expected in (("BACKWARD", added_with_default, True), ("BACKWARD", added_without, False),
                                    ("FORWARD", added_without, True), ("FULL", added_with_default, True),
                                    ("FULL", added_without, False)):
        assert compatible(strategy, ("AVRO", _avro(new)), [("AVRO", _avro(base))]) is expected, (strategy, new)
    # A nested record's new field is held to the same rule.
    outer = lambda inner: {"type": "record", "name": "Outer", "fields": [{"name": "in", "type": inner}]}  # noqa: E731
    assert compatible("BACKWARD", ("AVRO", _avro(outer(added_with_default))), [("AVRO", _avro(outer(base)))])
    assert not compatible("BACKWARD", ("AVRO", _avro(outer(added_without))), [("AVRO", _avro(outer(base)))])


def test_unparsable_definitions_are_compatible_only_with_themselves():
    """A definition the avro library refuses (bad JSON, an unknown type name, an enum
    with a duplicate symbol) matches only the same bytes, under any checking strategy."""
    for bad in (b"not json", _avro(_in_record("no-such-type")),
                _avro(_in_record({"type": "enum", "name": "E", "symbols": ["A", "A"]}))):
        assert compatible("FULL", ("AVRO", bad), [("AVRO", bad)])
        assert not compatible("BACKWARD", ("AVRO", bad), [("AVRO", _avro(_in_record("int")))])
        assert not compatible("FORWARD", ("AVRO", _avro(_in_record("int"))), [("AVRO", bad)])


def _key_value(key_type: str, key: bytes, value_type: str, value: bytes) -> tuple[str, bytes, dict]:
    from broker.schema_compatibility import join_key_value

    return ("KEY_VALUE", join_key_value(key, value),
            {"key.schema.type": key_type, "value.schema.type": value_type, "kv.encoding.type": "INLINE"})


def test_key_value_checks_the_key_and_the_value_each():
    """KEY_VALUE is compatible when its key schema and its value schema each are, by
    their own type's rules; a change of either part's type is not; a malformed
    encoding matches only itself."""
    value_v1 = _avro(_in_record("int"))
    value_long = _avro(_in_record("long"))
    value_text = _avro(_in_record("string"))
    v1 = _key_value("STRING", b"", "AVRO", value_v1)
    assert compatible("BACKWARD", _key_value("STRING", b"", "AVRO", value_long), [v1])       # int -> long
    assert not compatible("FORWARD", _key_value("STRING", b"", "AVRO", value_long), [v1])
    assert not compatible("BACKWARD", _key_value("STRING", b"", "AVRO", value_text), [v1])   # value breaks
    assert not compatible("FULL", _key_value("INT64", b"", "AVRO", value_v1), [v1])          # key type changed
    assert not compatible("FULL", _key_value("STRING", b"", "JSON", value_v1), [v1])         # value type changed
    # Avro keys are checked as Avro too.
    key_enum = _key_value("AVRO", _avro(COLOR_AB), "AVRO", value_v1)
    assert compatible("BACKWARD", _key_value("AVRO", _avro(COLOR_ABC), "AVRO", value_v1), [key_enum])
    assert not compatible("FORWARD", _key_value("AVRO", _avro(COLOR_ABC), "AVRO", value_v1), [key_enum])
    # Transitive: against every version.
    v2 = _key_value("STRING", b"", "AVRO", _avro({"type": "record", "name": "R", "fields": [
        {"name": "f", "type": "int"}, {"name": "g", "type": "int", "default": 0}]}))
    v3 = _key_value("STRING", b"", "AVRO", _avro({"type": "record", "name": "R", "fields": [
        {"name": "f", "type": "int"}, {"name": "g", "type": "int"}]}))
    assert compatible("BACKWARD", v3, [v1, v2]) and not compatible("BACKWARD_TRANSITIVE", v3, [v1, v2])
    malformed = ("KEY_VALUE", b"\x00\x00\x00\x09abc", {})
    assert compatible("FULL", malformed, [malformed]) and not compatible("FULL", malformed, [v1])
    # Without the type properties both parts are BYTES (Pulsar's default): any bytes pass.
    assert compatible("FULL", ("KEY_VALUE", v3[1], {}), [("KEY_VALUE", v1[1], {})])
