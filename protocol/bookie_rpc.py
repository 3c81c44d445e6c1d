"""Conventions of the bookie's gRPC API beyond the messages in ``proto/bookie.proto``,
shared by the bookie (which sends them) and the ledger client (which reads them).

A failed call carries the Magnetar error code of its cause (``common/errors.py``) in
its trailing metadata, so the client rebuilds the typed error with
``error_for_code``; the gRPC status alone is too coarse (a fenced ledger and a full
disk would both be FAILED_PRECONDITION)."""

from __future__ import annotations

from typing import Iterable

ERROR_CODE_METADATA_KEY = "magnetar-error-code"


def error_code_metadata(code: int) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``code``."""
    return ((ERROR_CODE_METADATA_KEY, str(code)),)


def error_code_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The error code carried in trailing metadata; None when absent or not a number."""
    for key, value in metadata or ():
        if key == ERROR_CODE_METADATA_KEY:
            try:
                return int(value)
            except ValueError:
                return None
    return None
