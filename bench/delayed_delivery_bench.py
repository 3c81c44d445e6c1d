"""Memory of the delayed-delivery tracker (subscriptions/delayed_delivery.py) holding
1,000,000 delayed entries, due at random times over the next 24 hours, measured with
tracemalloc (every allocation the tracker made), and the time to release them all.

    .venv/bin/python bench/delayed_delivery_bench.py --out bench/results/delayed_delivery.json

The stated bound is 32 MiB for 1,000,000 entries; the run fails if it is passed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from subscriptions.delayed_delivery import DelayedDeliveryTracker  # noqa: E402

ENTRIES = 1_000_000
BOUND_BYTES = 32 * 1024 * 1024
NOW = 1_800_000_000_000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rng = random.Random(1)
    due = [NOW + rng.randrange(86_400_000) for _ in range(ENTRIES)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracker = DelayedDeliveryTracker(entries_max=ENTRIES)
    for entry_id, deliver_at in enumerate(due):
        tracker.add(deliver_at, entry_id // 50_000, entry_id % 50_000, NOW)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    started = time.perf_counter()
    released = 0
    now = NOW
    while len(tracker):
        now = max(now + 1000, tracker.next_due_ms() or now)
        released += len(tracker.pop_due(now, 100_000))
    release_s = time.perf_counter() - started
    result = {"entries": ENTRIES, "traced_bytes": used, "bytes_per_entry": round(used / ENTRIES, 2),
              "bound_bytes": BOUND_BYTES, "released": released, "release_all_s": round(release_s, 2)}
    print(json.dumps(result))
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    assert released == ENTRIES
    assert used < BOUND_BYTES, used


if __name__ == "__main__":
    main()
