"""Ledger metadata (ledger/metadata.py): the JSON kept in etcd for each ledger.

What it proves: encode/decode round-trips every field and state; fragment lookups
(fragment_index_for, ensemble_for, fragment_last_entry_id) pick the right fragment at
and around every boundary; with_ensemble_from appends a fragment, or replaces the last
one when it starts at the same entry (nothing was confirmed in it); closed() sets the
final fields and keeps the rest; invalid quorums raise ConfigError; and any bad bytes
read back from etcd raise MalformedFrame - never AttributeError, AssertionError or
another error type, because the metadata store is a peer whose bytes are input.

How: tables of fragments and entry ids, and a table of (bad bytes, reason).
"""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from common.errors import ConfigError, MalformedFrame
from ledger.metadata import (
    METADATA_FORMAT_VERSION,
    Fragment,
    LedgerMetadata,
    LedgerState,
    validate_quorums,
)


def _metadata(*fragments: tuple[int, tuple[str, ...]], state: LedgerState = LedgerState.OPEN,
              shape: tuple[int, int, int] = (3, 2, 2), **extra) -> LedgerMetadata:
    ensemble_size, write_quorum_size, ack_quorum_size = shape
    return LedgerMetadata(
        ledger_id=extra.pop("ledger_id", 17), ensemble_size=ensemble_size, write_quorum_size=write_quorum_size,
        ack_quorum_size=ack_quorum_size, state=state,
        fragments=tuple(Fragment(first, bookies) for first, bookies in fragments), **extra)


THREE_FRAGMENTS = _metadata((0, ("a", "b", "c")), (10, ("a", "d", "c")), (25, ("e", "d", "c")))


# --- round trip -----------------------------------------------------------------------------

@pytest.mark.parametrize("metadata", [
    _metadata((0, ("a", "b", "c"))),
    _metadata((0, ("a", "b", "c")), state=LedgerState.IN_RECOVERY, created_ms=1_700_000_000_123),
    THREE_FRAGMENTS.closed(last_entry_id=40, length_bytes=123_456),
    _metadata((0, ("x",)), shape=(1, 1, 1), custom={"topic": "persistent://t/n/x", "empty": ""}),
    _metadata((0, ("a", "b", "c", "d", "e")), shape=(5, 3, 2), ledger_id=2**63 - 1),
])
def test_json_round_trip(metadata):
    """decode(encode(m)) == m for every state, with fragments and custom fields."""
    decoded = LedgerMetadata.decode(metadata.encode())
    assert decoded == metadata
    assert decoded.encode() == metadata.encode()


def test_encoding_is_readable_json_with_a_format_version():
    """Operators read these: plain JSON, sorted keys, the documented field names."""
    doc = json.loads(THREE_FRAGMENTS.encode())
    assert doc["format_version"] == METADATA_FORMAT_VERSION
    assert doc["state"] == "OPEN"
    assert doc["fragments"] == [
        {"first_entry_id": 0, "bookies": ["a", "b", "c"]},
        {"first_entry_id": 10, "bookies": ["a", "d", "c"]},
        {"first_entry_id": 25, "bookies": ["e", "d", "c"]},
    ]
    assert list(doc) == sorted(doc)


def test_decode_accepts_older_documents_without_optional_fields():
    """created_ms, custom and format_version may be absent (older writers)."""
    doc = json.loads(THREE_FRAGMENTS.encode())
    for name in ("created_ms", "custom", "format_version"):
        del doc[name]
    decoded = LedgerMetadata.decode(json.dumps(doc).encode())
    assert decoded.created_ms == 0
    assert decoded.custom == {}
    assert decoded.fragments == THREE_FRAGMENTS.fragments


def test_metadata_is_immutable():
    """Changes go through replace-style methods, never in place."""
    with pytest.raises(FrozenInstanceError):
        THREE_FRAGMENTS.state = LedgerState.CLOSED  # type: ignore[misc]


# --- fragments ------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry_id, index", [
    (0, 0), (1, 0), (9, 0), (10, 1), (11, 1), (24, 1), (25, 2), (26, 2), (10**9, 2),
])
def test_fragment_index_and_ensemble_for(entry_id, index):
    """An entry belongs to the last fragment starting at or before it."""
    assert THREE_FRAGMENTS.fragment_index_for(entry_id) == index
    assert THREE_FRAGMENTS.ensemble_for(entry_id) == THREE_FRAGMENTS.fragments[index].bookies


@pytest.mark.parametrize("index, last_entry_id, expected", [
    (0, 40, 9), (1, 40, 24), (2, 40, 40), (2, 24, 24), (0, -1, 9),
])
def test_fragment_last_entry_id(index, last_entry_id, expected):
    """A fragment ends where the next begins; the last one ends at the ledger's end."""
    assert THREE_FRAGMENTS.fragment_last_entry_id(index, last_entry_id) == expected


def test_single_fragment_lookups():
    """With one fragment every entry maps to it and it ends at the ledger's end."""
    metadata = _metadata((0, ("a", "b", "c")))
    assert metadata.fragment_index_for(0) == 0
    assert metadata.fragment_index_for(12345) == 0
    assert metadata.fragment_last_entry_id(0, 7) == 7
    assert metadata.current_ensemble == ("a", "b", "c")


def test_all_bookies_and_current_ensemble():
    """all_bookies is the union over fragments; current_ensemble is the last one."""
    assert THREE_FRAGMENTS.all_bookies() == {"a", "b", "c", "d", "e"}
    assert THREE_FRAGMENTS.current_ensemble == ("e", "d", "c")


def test_with_ensemble_from_appends_a_fragment():
    """A change from a later entry adds a fragment and leaves the original unchanged."""
    changed = THREE_FRAGMENTS.with_ensemble_from(31, ("e", "f", "c"))
    assert [f.first_entry_id for f in changed.fragments] == [0, 10, 25, 31]
    assert changed.ensemble_for(30) == ("e", "d", "c")
    assert changed.ensemble_for(31) == ("e", "f", "c")
    assert len(THREE_FRAGMENTS.fragments) == 3
    assert changed.ledger_id == THREE_FRAGMENTS.ledger_id
    assert changed.state == THREE_FRAGMENTS.state


def test_with_ensemble_from_replaces_an_empty_last_fragment():
    """A second change at the same first entry (no entry confirmed in between) replaces
    the last fragment instead of adding an empty one."""
    once = THREE_FRAGMENTS.with_ensemble_from(31, ("e", "f", "c"))
    twice = once.with_ensemble_from(31, ("e", "g", "c"))
    assert [f.first_entry_id for f in twice.fragments] == [0, 10, 25, 31]
    assert twice.current_ensemble == ("e", "g", "c")
    assert twice.fragments[:3] == THREE_FRAGMENTS.fragments


def test_with_ensemble_from_entry_zero_replaces_the_first_fragment():
    """Before any entry was confirmed, the only fragment is replaced in place."""
    metadata = _metadata((0, ("a", "b", "c")))
    changed = metadata.with_ensemble_from(0, ["a", "x", "c"])  # type: ignore[arg-type]
    assert changed.fragments == (Fragment(0, ("a", "x", "c")),)
    assert isinstance(changed.fragments[0].bookies, tuple)


def test_with_ensemble_from_an_earlier_entry_is_a_programmer_error():
    """Ensemble changes only move forward."""
    with pytest.raises(AssertionError):
        THREE_FRAGMENTS.with_ensemble_from(24, ("a", "b", "c"))


def test_closed_sets_state_last_entry_and_length():
    """closed() makes a CLOSED copy with the final last_entry_id and length_bytes."""
    closed = THREE_FRAGMENTS.closed(last_entry_id=30, length_bytes=999)
    assert closed.is_closed
    assert closed.state is LedgerState.CLOSED
    assert (closed.last_entry_id, closed.length_bytes) == (30, 999)
    assert closed.fragments == THREE_FRAGMENTS.fragments
    assert not THREE_FRAGMENTS.is_closed
    empty = _metadata((0, ("a", "b", "c"))).closed(last_entry_id=-1, length_bytes=0)
    assert empty.is_closed and empty.last_entry_id == -1


@pytest.mark.parametrize("fragments, shape", [
    ((), (3, 2, 2)),                                            # no fragment
    (((1, ("a", "b", "c")),), (3, 2, 2)),                       # first fragment not at 0
    (((0, ("a", "b", "c")), (5, ("a", "b", "d")), (5, ("a", "b", "e"))), (3, 2, 2)),  # not increasing
    (((0, ("a", "b")),), (3, 2, 2)),                            # ensemble of the wrong size
])
def test_inconsistent_fragments_are_programmer_errors_in_the_constructor(fragments, shape):
    """Building inconsistent metadata in code is a bug and asserts."""
    with pytest.raises(AssertionError):
        _metadata(*fragments, shape=shape)


# --- quorum validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 2, 2), (3, 3, 2), (5, 3, 1), (10, 10, 10)])
def test_valid_quorums(shape):
    """E >= Qw >= Qa >= 1 is accepted."""
    validate_quorums(*shape)


@pytest.mark.parametrize("shape", [(0, 0, 0), (1, 1, 0), (2, 3, 2), (3, 2, 3), (3, 3, 4), (-1, -1, -1), (2, 0, 0)])
def test_invalid_quorums_raise_config_error(shape):
    """Anything else raises ConfigError showing the three values, from validate_quorums
    and from the LedgerMetadata constructor alike."""
    with pytest.raises(ConfigError) as caught:
        validate_quorums(*shape)
    assert f"E={shape[0]} Qw={shape[1]} Qa={shape[2]}" in str(caught.value)
    with pytest.raises(ConfigError):
        LedgerMetadata(ledger_id=1, ensemble_size=shape[0], write_quorum_size=shape[1],
                       ack_quorum_size=shape[2], state=LedgerState.OPEN,
                       fragments=(Fragment(0, ("a",) * max(shape[0], 0)),))


# --- bad input -----------------------------------------------------------------------------------

def _doc(**changes) -> bytes:
    doc = json.loads(THREE_FRAGMENTS.encode())
    for name, value in changes.items():
        if value is ...:
            del doc[name]
        else:
            doc[name] = value
    return json.dumps(doc).encode()


BAD_METADATA = [
    (b"", "empty"),
    (b"{", "truncated JSON"),
    (THREE_FRAGMENTS.encode()[:-1], "truncated document"),
    (b"\xff\xfe", "not UTF-8"),
    (_doc(ledger_id=...), "missing ledger_id"),
    (_doc(fragments=...), "missing fragments"),
    (_doc(state="BOGUS"), "unknown state"),
    (_doc(ledger_id="abc"), "non-numeric ledger_id"),
    (_doc(format_version=METADATA_FORMAT_VERSION + 1), "newer format"),
    (_doc(format_version="x"), "format_version of the wrong type"),
    (_doc(fragments=[{"first_entry_id": 0}]), "fragment without bookies"),
    (_doc(fragments=[{"first_entry_id": "zero", "bookies": ["a", "b", "c"]}]), "bad first_entry_id"),
    (b"[]", "a JSON array"),
    (b"null", "JSON null"),
    (b"5", "a JSON number"),
    (b'"OPEN"', "a JSON string"),
    (_doc(custom=[]), "custom of the wrong type"),
    (_doc(fragments=[]), "no fragment"),
    (_doc(fragments=[{"first_entry_id": 3, "bookies": ["a", "b", "c"]}]), "first fragment not at 0"),
    (_doc(fragments=[{"first_entry_id": 0, "bookies": ["a", "b"]}]), "ensemble of the wrong size"),
    (_doc(fragments=[{"first_entry_id": 0, "bookies": ["a", "b", "c"]},
                     {"first_entry_id": 0, "bookies": ["d", "b", "c"]}]), "fragments not increasing"),
    (_doc(write_quorum_size=4), "Qw > E"),
    (_doc(ack_quorum_size=0), "Qa = 0"),
]


@pytest.mark.parametrize("data, reason", BAD_METADATA, ids=[reason for _, reason in BAD_METADATA])
def test_bad_metadata_bytes_raise_malformed_frame(data, reason):
    """Whatever is wrong with the bytes read from the store, decode raises
    MalformedFrame: a caller catches one error type for bad metadata."""
    with pytest.raises(MalformedFrame):
        LedgerMetadata.decode(data)
