"""Acknowledgement state at scale: a cursor acknowledging every other entry of a ledger
(100,000 holes), then filling the holes, so the mark-delete position walks to the end.

The unit tests prove what the state holds; this measures how fast it gets there, as a
ratio to a baseline of the same run (inserting the same ids into a plain Python set and
draining it in order), so a quadratic slip shows as a ratio that grows with the size
while noise on a shared machine moves both sides. Two sizes are run: a ratio that holds
from the small to the large one means linear cost.

    .venv/bin/python bench/ack_state_bench.py --out bench/results/ack_state.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.position import Position  # noqa: E402
from subscriptions.cursor import CursorState, ManagedCursor  # noqa: E402
from tests.unit.fake_managed_ledger import FakeManagedLedger  # noqa: E402

EARLIEST = Position(-1, -1)
SIZES = (50_000, 200_000)
REPEATS = 3


def cursor_case(entries: int) -> float:
    ledger = FakeManagedLedger(first_ledger_id=10)
    ledger.append_many(entries)
    cursor = ManagedCursor("bench", ledger, CursorState(EARLIEST), None)
    started = time.perf_counter()
    for entry_id in range(1, entries, 2):
        cursor.ack(Position(10, entry_id))
    for entry_id in range(0, entries, 2):
        cursor.ack(Position(10, entry_id))
    elapsed = time.perf_counter() - started
    assert cursor.mark_delete_position == Position(10, entries - 1), cursor.mark_delete_position
    return elapsed


def baseline_case(entries: int) -> float:
    started = time.perf_counter()
    acked: set[int] = set()
    for entry_id in range(1, entries, 2):
        acked.add(entry_id)
    mark = -1
    for entry_id in range(0, entries, 2):
        acked.add(entry_id)
        while mark + 1 in acked:
            acked.discard(mark + 1)
            mark += 1
    elapsed = time.perf_counter() - started
    assert mark == entries - 1 and not acked
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/ack_state.json")
    args = parser.parse_args()
    results = []
    for entries in SIZES:
        cursor_s = min(cursor_case(entries) for _ in range(REPEATS))
        baseline_s = min(baseline_case(entries) for _ in range(REPEATS))
        results.append({"entries": entries, "holes": entries // 2, "cursor_s": round(cursor_s, 4),
                         "baseline_set_s": round(baseline_s, 4), "ratio_to_baseline": round(cursor_s / baseline_s, 2),
                         "acks_per_s": round(entries / cursor_s)})
    growth = results[-1]["ratio_to_baseline"] / results[0]["ratio_to_baseline"]
    report = {"cases": results, "ratio_growth_small_to_large": round(growth, 2),
              "linear": growth < 2.0, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
