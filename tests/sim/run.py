"""``make sim SEEDS=N`` (or ``python -m tests.sim.run --seeds N``): runs seeds 0..N-1
(or ``--first``..), prints each failing seed with its violations and the command that
replays it, and a summary line (JSON) at the end. ``--seed S`` replays one seed,
printing its trace digest and events summary. Exit status 1 if any seed failed."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tests.sim.scenario import replay_command, run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.sim.run")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="replay this one seed")
    parser.add_argument("--bug", default=None, help="inject a deliberate bug (recovery-skips-last, ack-one-short)")
    args = parser.parse_args(argv)
    if args.seed is not None:
        result = run_seed(args.seed, args.bug)
        print(json.dumps({"seed": result.seed, "ok": result.ok, "trace": result.trace, "acked": result.acked,
                          "last_entry_id": result.last_entry_id, "crashes": result.crashes,
                          "faults": result.faults, "violations": result.violations}))
        return 0 if result.ok else 1
    started = time.monotonic()
    failed: list[int] = []
    crashes = faults = acked = 0
    for seed in range(args.first, args.first + args.seeds):
        result = run_seed(seed, args.bug)
        crashes += result.crashes
        faults += result.faults
        acked += result.acked
        if not result.ok:
            failed.append(seed)
            print(f"seed {seed} FAILED: {result.violations[:3]}\n  replay: {replay_command(seed, args.bug)}",
                  flush=True)
    seconds = time.monotonic() - started
    print(json.dumps({"seeds": args.seeds, "first": args.first, "failed": len(failed), "failed_seeds": failed[:50],
                      "seconds": round(seconds, 1), "bookie_crashes": crashes, "faults_planned": faults,
                      "entries_acked": acked, "bug": args.bug}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
