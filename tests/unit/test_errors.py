"""The error catalogue (ledger/errors.py).

What it proves: every error class has its own code; the code ranges, retriable flags
and HTTP statuses follow the catalogue's documented rules; error_for_code rebuilds
every class with its message (and keeps its family, so callers can still catch
LedgerError or MetadataError); an unknown code becomes UnknownError carrying the
message; register() adds classes from other modules and refuses a code clash.

How: walks every subclass of MagnetarError, so a class added later is covered too.
"""

from __future__ import annotations

import pytest

from common import errors
from common.errors import (
    DigestMismatch,
    EntryTooLarge,
    LedgerError,
    LedgerFenced,
    MagnetarError,
    MetadataError,
    NoSuchEntry,
    NotEnoughBookies,
    UnknownError,
    error_class_for_code,
    error_for_code,
)


def _all_classes() -> list[type[MagnetarError]]:
    found, pending = [], [MagnetarError]
    while pending:
        cls = pending.pop()
        if cls.__module__ == errors.__name__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


ALL_CLASSES = _all_classes()


def test_catalogue_is_not_empty():
    """The walk finds the whole catalogue (sanity for the tests below)."""
    names = {cls.__name__ for cls in ALL_CLASSES}
    assert {"ConfigError", "MalformedFrame", "LedgerFenced", "DigestMismatch", "Overloaded",
            "MetadataVersionConflict", "UnknownError"} <= names


def test_every_class_has_a_unique_code():
    """No two classes share a code (error_for_code would be ambiguous)."""
    by_code: dict[int, list[str]] = {}
    for cls in ALL_CLASSES:
        by_code.setdefault(cls.code, []).append(cls.__name__)
    assert {code: names for code, names in by_code.items() if len(names) > 1} == {}


def test_every_subclass_sets_its_own_code():
    """A subclass that forgot to set ``code`` would inherit its parent's."""
    for cls in ALL_CLASSES:
        if cls is not MagnetarError:
            assert "code" in vars(cls), cls.__name__


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_code_lookup_finds_the_class(cls):
    """error_class_for_code maps each code back to exactly its class."""
    assert error_class_for_code(cls.code) is cls


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_error_for_code_round_trips_class_and_message(cls):
    """The receiving side rebuilds the exact class, message, flags and status."""
    message = f"something about {cls.__name__}: ledger_id=7"
    rebuilt = error_for_code(cls.code, message)
    assert type(rebuilt) is cls
    assert str(rebuilt) == message
    assert rebuilt.message == message
    assert rebuilt.code == cls.code
    assert rebuilt.retriable == cls.retriable
    assert rebuilt.http_status == cls.http_status
    assert rebuilt.to_dict() == {"code": cls.code, "error": cls.__name__, "message": message}
    with pytest.raises(cls):
        raise rebuilt


def test_round_trip_of_a_raised_error_keeps_its_family():
    """An error raised on a bookie, sent as (code, message), is caught by family."""
    original = LedgerFenced(42)
    rebuilt = error_for_code(original.code, original.message)
    assert isinstance(rebuilt, LedgerError)
    assert str(rebuilt) == str(original) == "ledger 42 is fenced"
    with pytest.raises(LedgerError):
        raise rebuilt


@pytest.mark.parametrize("code", [0, -1, 999, 1005, 2999, 4999, 9999, 10**9])
def test_unknown_code_becomes_unknown_error_with_the_message(code):
    """A code this side does not know (a newer peer) becomes UnknownError."""
    rebuilt = error_for_code(code, "from the future")
    assert type(rebuilt) is UnknownError
    assert str(rebuilt) == "from the future"


def test_empty_message_falls_back_to_the_class_name():
    """An empty message still gives a readable error."""
    assert str(error_for_code(LedgerFenced.code, "")) == "LedgerFenced"
    assert str(MagnetarError()) == "MagnetarError"


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_codes_sit_in_their_documented_range(cls):
    """1000-1999 input/config, 2000-2999 ledgers, 3000-3999 metadata, 5000-5999
    capacity, 6000-6999 the archive, 7000-7999 security; ledger, metadata and archive families stay in
    their ranges."""
    assert 1000 <= cls.code <= 7999
    if issubclass(cls, errors.SecurityError):
        assert 7000 <= cls.code <= 7999, cls.__name__
    if issubclass(cls, errors.ArchiveError):
        assert 6000 <= cls.code <= 6999, cls.__name__
    if issubclass(cls, LedgerError):
        assert 2000 <= cls.code <= 2999, cls.__name__
    if issubclass(cls, MetadataError):
        assert 3000 <= cls.code <= 3999, cls.__name__
    if 1000 <= cls.code <= 1999:
        assert not cls.retriable, f"{cls.__name__}: bad input is never retriable"


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_http_status_is_an_error_status(cls):
    """Every class answers REST callers with a 4xx or 5xx status."""
    assert 400 <= cls.http_status <= 599


def test_capacity_errors_are_retriable_with_503_or_504():
    """Overloaded and friends tell the caller to come back later."""
    for name in ("Overloaded", "OperationTimeout", "ServiceNotReady", "ShuttingDown"):
        cls = getattr(errors, name)
        assert cls.retriable
        assert cls.http_status in (503, 504)


def test_errors_carry_their_fields_and_build_their_message():
    """Typed errors keep their fields and name them in the message."""
    error = NoSuchEntry(3, 9)
    assert (error.ledger_id, error.entry_id) == (3, 9)
    assert "ledger_id=3" in str(error) and "entry_id=9" in str(error)
    error = DigestMismatch(1, 2, "stored 0x1 computed 0x2")
    assert str(error).endswith(": stored 0x1 computed 0x2")
    error = EntryTooLarge(10, 5)
    assert (error.size_bytes, error.size_bytes_max) == (10, 5)
    error = NotEnoughBookies(3, 1)
    assert "needed=3" in str(error) and "available=1" in str(error)


def test_register_adds_a_class_and_refuses_a_clash(monkeypatch):
    """Another module's error joins the table; re-registering is harmless; a second
    class on a taken code is a programmer error."""
    monkeypatch.setattr(errors, "_BY_CODE", dict(errors._BY_CODE))

    class TopicTerminated(MagnetarError):
        code, http_status = 4321, 409

    assert errors.register(TopicTerminated) is TopicTerminated
    assert errors.register(TopicTerminated) is TopicTerminated
    assert type(error_for_code(4321, "t")) is TopicTerminated

    class Clash(MagnetarError):
        code = LedgerFenced.code

    with pytest.raises(AssertionError):
        errors.register(Clash)
    assert error_class_for_code(LedgerFenced.code) is LedgerFenced
