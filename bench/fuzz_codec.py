"""The long fuzz of the wire codecs (``make fuzz``): at least a million inputs through
the Pulsar frame decoder and the bookie's entry check, each allowed to raise only our
own error type (MalformedFrame for frames; MalformedFrame or DigestMismatch for
entries). Any other exception stops the run and is reported with the seed and input
that replay it.

Inputs (seeded, so a run replays): 70% streams of one to three seed frames (see
tests/fuzz_inputs.py), most of them mutated, fed in random splits; 20% random bytes;
10% mutated or random bookie entries. A mutation-based fuzzer rather than a
coverage-guided one: atheris is not among this project's dependencies; the mutations
aim at the bytes that steer decoding (length fields, magic, protobuf tags).

    python bench/fuzz_codec.py --inputs 1000000 --out bench/results/fuzz_codec.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.errors import DigestMismatch, MalformedFrame  # noqa: E402
from tests.fuzz_inputs import check_entry, decode_all, mutate, seed_entries, seed_frames  # noqa: E402


def run(inputs: int, seed: int) -> dict:
    rng = random.Random(seed)
    frames_corpus = seed_frames()
    entries = seed_entries()
    counts = {"frame_streams": 0, "random_bytes": 0, "entries": 0, "frames_decoded": 0, "refused": 0}
    started = time.perf_counter()
    for index in range(inputs):
        kind = rng.random()
        if kind < 0.7:
            parts = [rng.choice(frames_corpus) for _ in range(rng.randint(1, 3))]
            data = b"".join(mutate(rng, p, frames_corpus) if rng.random() < 0.85 else p for p in parts)
            counts["frame_streams"] += 1
        elif kind < 0.9:
            data = rng.randbytes(rng.randint(0, 512))
            counts["random_bytes"] += 1
        else:
            data = mutate(rng, rng.choice(entries)) if rng.random() < 0.8 else rng.randbytes(rng.randint(0, 128))
            counts["entries"] += 1
            try:
                check_entry(data)
            except (MalformedFrame, DigestMismatch):
                counts["refused"] += 1
            except Exception:
                return _failure(counts, index, seed, data, "entry", started)
            continue
        cuts = [rng.randint(0, len(data)) for _ in range(rng.randint(0, 4))]
        try:
            counts["frames_decoded"] += decode_all(data, cuts)
        except MalformedFrame:
            counts["refused"] += 1
        except Exception:
            return _failure(counts, index, seed, data, "frame", started)
    elapsed = time.perf_counter() - started
    return {"ok": True, "inputs": inputs, "seed": seed, **counts, "elapsed_s": round(elapsed, 1),
            "inputs_per_s": round(inputs / elapsed)}


def _failure(counts: dict, index: int, seed: int, data: bytes, kind: str, started: float) -> dict:
    return {"ok": False, "failed_at_input": index, "seed": seed, "kind": kind, "input_hex": data.hex(),
            "traceback": traceback.format_exc(), **counts, "elapsed_s": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = run(args.inputs, args.seed)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
