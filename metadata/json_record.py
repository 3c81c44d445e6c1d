"""JSON <-> dataclass for the records kept in etcd (bundle records, namespace
policies, tenants, bookie records and cookies). Pure.

The one rule every such record follows: the JSON object's keys are the dataclass's
field names; keys the class does not know are dropped (a record written by a newer
version still reads, and the unknown keys do not survive a read-modify-write); fields
the object lacks take their defaults, and a missing field without a default is an
error. Encoding sorts the keys, so equal records are equal bytes.

Errors: ``from_doc`` (an already-parsed document, e.g. a REST body) raises
``InvalidArgument``: whoever sent it is to blame. ``decode`` (bytes read back from
etcd) raises ``MalformedFrame`` and nothing else, whatever is wrong with the bytes:
not UTF-8, not JSON, not an object, a required field missing, or a value the class's
own checks (``__post_init__``) refuse.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any, TypeVar

from common.errors import InvalidArgument, MalformedFrame

T = TypeVar("T")


def encode(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True).encode()


def _known(cls: type, doc: dict) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {name: value for name, value in doc.items() if name in names}


def from_doc(cls: type[T], doc: object, what: str) -> T:
    """``cls`` from a parsed JSON object; InvalidArgument if it does not fit."""
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    try:
        return cls(**_known(cls, doc))
    except TypeError as error:   # a required field is missing
        raise InvalidArgument(f"bad {what}: {error}") from None


def decode(cls: type[T], data: bytes, what: str) -> T:
    """``cls`` from the bytes of a stored record; MalformedFrame on anything bad."""
    try:
        doc = json.loads(data)   # ValueError: not JSON, or not UTF-8
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return cls(**_known(cls, doc))
    except (ValueError, TypeError, InvalidArgument) as error:
        raise MalformedFrame(f"bad {what}: {error}") from None
