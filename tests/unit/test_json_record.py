"""The one JSON <-> dataclass codec for records kept in etcd (metadata/json_record.py)
and the records that use it: bundle records, tenant and namespace policies, bookie
records and cookies.

What it proves: for every record class, a record survives encode/decode and encodes
with sorted keys (equal records are equal bytes); unknown fields are dropped; a missing
required field, a non-object, bad JSON or bad UTF-8 raise MalformedFrame naming the
record and nothing else; from_doc (parsed REST bodies) raises InvalidArgument instead.

How: one table of (class, a valid record, its name in errors), each run through the
same checks.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from bundles.records import AssignmentRecord, BundlesRecord, LeaderRecord, LoadReport, OwnerRecord, TransferRecord
from common.errors import InvalidArgument, MalformedFrame
from metadata import json_record
from metadata.bookie_record import BookieRecord, Cookie
from metadata.policies import NamespacePolicies, TenantInfo

RECORDS = [
    (BundlesRecord([0, 2**31, 2**32]), "bundles record"),
    (OwnerRecord("b1", "pulsar://b1:6650", "http://b1:8080", "releasing", "b2", 17), "bundle owner record"),
    (AssignmentRecord("b1", "unowned", "b0", 5), "bundle assignment"),
    (TransferRecord("b2", "load", 9), "bundle transfer"),
    (LoadReport("b1", "pulsar://b1", "http://b1", 0.5, 1.0, 2.0, 3, 4, ["t/ns/0x0_0x1"], {"t/ns/0x0_0x1": 1.5}, 6, 7),
     "load report"),
    (LeaderRecord("b1", "http://b1", "pulsar://b1", 8), "leader record"),
    (TenantInfo(["admin"], ["c1"]), "tenant record"),
    (NamespacePolicies(message_ttl_in_seconds=5, broadcast_subscriptions=["s"]), "namespace policies"),
    (BookieRecord("bk1", "h:1", "h:2", False, 10, 20, 0.5, "1.0", 99), "bookie record"),
    (Cookie("bk1", "instance", "/j", ["/l1", "/l2"]), "cookie"),
]
IDS = [type(record).__name__ for record, _ in RECORDS]


def required_fields(record) -> list[str]:
    return [f.name for f in dataclasses.fields(record)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


# Classes whose every field has a default (a record of {} is valid) have nothing to
# miss; the missing-field check runs over the others.
WITH_REQUIRED = [(record, what) for record, what in RECORDS if required_fields(record)]


@pytest.mark.parametrize("record, what", RECORDS, ids=IDS)
def test_round_trip_with_sorted_keys(record, what: str):
    data = record.encode()
    assert type(record).decode(data) == record
    assert list(json.loads(data)) == sorted(json.loads(data))
    assert data == json_record.encode(record)


@pytest.mark.parametrize("record, what", RECORDS, ids=IDS)
def test_unknown_fields_are_dropped(record, what: str):
    doc = json.loads(record.encode())
    doc["from_a_newer_version"] = {"x": 1}
    decoded = type(record).decode(json.dumps(doc).encode())
    assert decoded == record
    assert "from_a_newer_version" not in json.loads(decoded.encode())


@pytest.mark.parametrize("record, what", RECORDS, ids=IDS)
@pytest.mark.parametrize("data", [b"", b"{", b"not json", b"[]", b"null", b"42", b'"x"', b"\xff\xfe", b'{"a": }'])
def test_garbage_raises_malformed_frame_naming_the_record(record, what: str, data: bytes):
    with pytest.raises(MalformedFrame, match=what):
        type(record).decode(data)


@pytest.mark.parametrize("record, what", WITH_REQUIRED, ids=[type(r).__name__ for r, _ in WITH_REQUIRED])
def test_a_missing_required_field_is_malformed(record, what: str):
    """Each class with a required field refuses a record without it."""
    doc = json.loads(record.encode())
    del doc[required_fields(record)[0]]
    with pytest.raises(MalformedFrame, match=what):
        type(record).decode(json.dumps(doc).encode())


def test_records_without_required_fields_decode_an_empty_object():
    """The classes left out above: every field has a default, so {} is their default record."""
    defaulted = [record for record, _ in RECORDS if not required_fields(record)]
    assert defaulted, "the table has no such class: the split above is pointless"
    for record in defaulted:
        assert type(record).decode(b"{}") == type(record)()


def test_from_doc_raises_invalid_argument_for_request_bodies():
    """Parsed bodies are the sender's fault: InvalidArgument, never MalformedFrame."""
    assert json_record.from_doc(TransferRecord, {"to": "b", "extra": 1}, "transfer") == TransferRecord("b")
    for doc in ([], "x", None, 5):
        with pytest.raises(InvalidArgument, match="must be a JSON object"):
            json_record.from_doc(TransferRecord, doc, "transfer")
    with pytest.raises(InvalidArgument, match="bad transfer"):
        json_record.from_doc(TransferRecord, {"reason": "no destination"}, "transfer")
    with pytest.raises(InvalidArgument):
        TenantInfo.from_json({"adminRoles": "not a list"})
