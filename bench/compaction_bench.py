"""Memory of one compaction (managed_ledger/compaction.py) as the number of keys grows: an
in-memory topic of batches (100 messages each, every key written twice, one key in 20
then deleted by a tombstone) is compacted into an in-memory side ledger, and the peak
of the Python allocations made during the run (tracemalloc) is compared across key
counts. The latest-key table lives in SQLite (its page cache, 8 MiB at most, is outside
tracemalloc's view and bounded by managed_ledger/compaction_keys.py), so the traced peak must
not grow with the keys: the run fails if, from the middle key count to the largest
(three times as many), the peak grows by more than half, or if any peak passes 16 MiB. The compacted output itself (the survivors' copies) is not
counted: it is the result, held by the fake ledger. Each size is also compacted once
without tracing, for its speed.

    .venv/bin/python bench/compaction_bench.py --out bench/results/compaction.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from managed_ledger.compaction import compact  # noqa: E402
from common.position import ManagedEntry, Position  # noqa: E402
from protocol.batch import encode_batch  # noqa: E402
from protocol.codec import encode_stored  # noqa: E402
from protocol.proto.pulsar_api_pb2 import MessageMetadata, SingleMessageMetadata  # noqa: E402

KEY_COUNTS = (10_000, 50_000, 150_000)
BATCH = 100
# The peak grows while the input chunks are not yet full (small topics), then stays flat:
# between the two largest sizes (keys x3) it may grow by half at most, and never pass
# PEAK_BOUND_BYTES.
GROWTH_MAX = 1.5
PEAK_BOUND_BYTES = 16 * 1024 * 1024


class _Side:
    def __init__(self) -> None:
        self.ledger_id = 1
        self.entries = 0

    def submit_nowait(self, payload: bytes) -> asyncio.Future[int]:
        self.entries += 1                      # counted, not kept: the output is not measured
        future = asyncio.get_running_loop().create_future()
        future.set_result(self.entries - 1)
        return future

    async def close(self) -> None:
        pass


class _Topic:
    name = "persistent://bench/ns/compacted"

    def __init__(self, entries: list[bytes]) -> None:
        self.entries = entries

    @property
    def last_confirmed(self) -> Position:
        return Position(7, len(self.entries) - 1)

    @property
    def first_position(self) -> Position:
        return Position(7, 0)

    def next_position(self, position: Position) -> Position:
        return Position(7, position.entry_id + 1)

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        return [ManagedEntry(Position(7, i), self.entries[i])
                for i in range(start.entry_id, min(len(self.entries), start.entry_id + count_max))]

    async def create_side_ledger(self, purpose: str) -> _Side:
        return _Side()

    async def delete_side_ledger(self, ledger_id: int) -> None:
        pass


def _topic(keys: int) -> list[bytes]:
    messages = [(f"k{i}", f"old-{i}".encode()) for i in range(keys)]
    messages += [(f"k{i}", f"new-{i}".encode()) for i in range(keys)]
    messages += [(f"k{i}", b"") for i in range(0, keys, 20)]
    entries = []
    for start in range(0, len(messages), BATCH):
        chunk = messages[start:start + BATCH]
        singles = []
        for key, payload in chunk:
            single = SingleMessageMetadata(payload_size=len(payload), partition_key=key)
            if not payload:
                single.null_value = True
            singles.append((single, payload))
        metadata = MessageMetadata(producer_name="bench", sequence_id=start, publish_time=1,
                                   num_messages_in_batch=len(chunk))
        entries.append(encode_stored(metadata, encode_batch(singles)))
    return entries


async def _measure(keys: int) -> dict:
    topic = _Topic(_topic(keys))
    started = time.perf_counter()
    await compact(topic, None)                 # untraced: the speed (tracing slows it several times)
    untraced_s = time.perf_counter() - started
    tracemalloc.start()
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    record = await compact(topic, None)
    peak = tracemalloc.get_traced_memory()[1] - baseline
    tracemalloc.stop()
    return {"keys": keys, "messages": 2 * keys + keys // 20, "entries_in": len(topic.entries),
            "entries_out": record.entries, "traced_peak_bytes": peak, "untraced_seconds": round(untraced_s, 2),
            "messages_per_s": int((2 * keys + keys // 20) / untraced_s)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    runs = [asyncio.run(_measure(keys)) for keys in KEY_COUNTS]
    growth = runs[-1]["traced_peak_bytes"] / max(1, runs[-2]["traced_peak_bytes"])
    result = {"runs": runs, "peak_growth_last_two": round(growth, 2), "growth_max": GROWTH_MAX,
              "peak_bound_bytes": PEAK_BOUND_BYTES}
    print(json.dumps(result, indent=2))
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
    assert growth <= GROWTH_MAX, growth
    assert all(run["traced_peak_bytes"] <= PEAK_BOUND_BYTES for run in runs), runs


if __name__ == "__main__":
    main()
