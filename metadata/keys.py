"""Where each piece of metadata lives in the store (keys relative to the cluster root).

One function per kind of key, so the layout is written down once. Ledger ids are
zero-padded to 20 digits so that key order is numeric order.
"""

from __future__ import annotations

BOOKIES = "/bookies/"
LEDGERS = "/ledgers/"
LEDGER_ID_COUNTER = "/counters/ledger-id"


def bookie(bookie_id: str) -> str:
    return f"{BOOKIES}{bookie_id}"


def ledger(ledger_id: int) -> str:
    assert ledger_id >= 0, ledger_id
    return f"{LEDGERS}{ledger_id:020d}"


def ledger_id_from_key(key: str) -> int:
    assert key.startswith(LEDGERS), key
    return int(key[len(LEDGERS):])


COOKIES = "/cookies/"


def cookie(bookie_id: str) -> str:
    return f"{COOKIES}{bookie_id}"
