"""The retention rule (managed_ledger/retention.py): which consumed ledgers go, by table."""

from __future__ import annotations

import pytest

from managed_ledger.retention import LedgerSpan, ledgers_to_delete

MIB = 1024 * 1024
NOW = 10_000_000_000
SPANS = [LedgerSpan(1, 9, 10 * MIB, NOW - 3_600_000), LedgerSpan(2, 9, 10 * MIB, NOW - 1_800_000),
         LedgerSpan(3, 9, 10 * MIB, NOW - 60_000), LedgerSpan(4, 9, 10 * MIB, NOW)]


@pytest.mark.parametrize("consumed, minutes, mb, expected", [
    ((4, 9), 0, 0, [1, 2, 3]),        # default: every consumed ledger but the current one
    ((2, 9), 0, 0, [1, 2]),           # only what every cursor passed
    ((2, 8), 0, 0, [1]),              # a ledger partly consumed stays
    ((0, 0), 0, 0, []),               # nothing consumed
    ((4, 9), -1, -1, []),             # keep forever
    ((4, 9), 45, -1, [1]),            # time: only ledgers older than 45 minutes
    ((4, 9), -1, 25, [1, 2]),         # size: keep at most 25 MiB (40 stored -> drop two)
    ((4, 9), 10, 100, [1, 2]),        # whichever limit comes first: two are past 10 minutes
    ((4, 9), 90, 100, []),            # both protect: nothing expired, under the size
    ((4, 9), 10, 15, [1, 2, 3]),      # size pressure deletes even young consumed ledgers
])
def test_ledgers_to_delete(consumed, minutes, mb, expected):
    """Consumed ledgers go oldest first, unless retention time or size protects them;
    the current ledger (4) never goes."""
    assert ledgers_to_delete(SPANS, 4, consumed, minutes, mb, NOW) == expected
