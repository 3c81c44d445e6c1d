"""Schema compatibility (broker/schema_compatibility.py): Avro record resolution for
AVRO and JSON schemas under each strategy, transitive forms against every version, and
same-type-only rules for the other schema types."""

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
