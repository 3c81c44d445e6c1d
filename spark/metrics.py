"""The reader's own counters: each planning and each read task writes one small JSON
file to ``metricsDir`` when the option is set, so a test or a benchmark can see what
was planned, pruned, opened and read (Spark's Python data sources have no
accumulators). Nothing is written without the option. Each record also names the
process and its working directory: on a Spark cluster an executor runs in its own
work directory on its worker, so a test sees which executor ran a task."""

from __future__ import annotations

import glob
import json
import os
import uuid


def record(metrics_dir: str | None, kind: str, **counters: object) -> None:
    if metrics_dir is None:
        return
    os.makedirs(metrics_dir, exist_ok=True)
    path = os.path.join(metrics_dir, f"{kind}-{uuid.uuid4().hex}.json")
    temp = f"{path}.tmp"
    with open(temp, "w") as handle:
        json.dump({"kind": kind, "pid": os.getpid(), "cwd": os.getcwd(), **counters}, handle)
    os.rename(temp, path)        # a reader never sees half a file


def collect(metrics_dir: str, kind: str) -> list[dict]:
    found = []
    for path in sorted(glob.glob(os.path.join(metrics_dir, f"{kind}-*.json"))):
        with open(path) as handle:
            found.append(json.load(handle))
    return found
