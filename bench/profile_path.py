"""Profiles of the publish path (issue 16): a ``magnetar standalone`` (1 bookie, 1 copy
by default), the latency client running one workload (``durable_ack``: one message at a
time; ``e2e``: 1,000 msgs/s), and py-spy sampling the broker and the bookie (all
threads, idle time included with ``--idle``) for the length of it. Writes one
speedscope / flamegraph file per process to ``--out-dir`` and prints py-spy's top
functions of each, so the report can say where the time goes.

    python bench/profile_path.py --workload durable_ack --out-dir bench/results/profiles
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

from latency import REPO_DIR, Standalone, children_of  # noqa: E402

PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="durable_ack", choices=["durable_ack", "e2e"])
    parser.add_argument("--bookies", type=int, default=1)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--seconds", type=int, default=10, help="how long py-spy samples")
    parser.add_argument("--format", default="flamegraph", choices=["flamegraph", "speedscope", "raw"])
    parser.add_argument("--idle", action="store_true", help="count idle (waiting) stacks too")
    parser.add_argument("--out-dir", default="bench/results/profiles")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    base_dir = tempfile.mkdtemp(prefix="magnetar-profile-")
    standalone = Standalone(REPO_DIR, base_dir, args.bookies, args.copies)
    standalone.start()
    try:
        children = children_of(standalone.process.pid)
        client = subprocess.Popen(
            [sys.executable, os.path.join(BENCH_DIR, "latency_client.py"), "--service-url",
             standalone.ready["service_url"], "--only", args.workload, "--ack-messages", "100000",
             "--e2e-seconds", str(args.seconds + 10)] + sum((["--metrics-url", u] for u in standalone.metrics_urls), []),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        time.sleep(3)   # past the client's start-up and warm-up
        extension = {"flamegraph": "svg", "speedscope": "json", "raw": "txt"}[args.format]
        spies = []
        for name in ("broker", "bookie-0"):
            out = os.path.join(args.out_dir, f"{args.workload}-{name}.{extension}")
            argv = [PY_SPY, "record", "--pid", str(children[name]), "--duration", str(args.seconds), "--rate", "500",
                    "--format", args.format, "--output", out, "--threads", "--nonblocking"]
            if args.idle:
                argv.append("--idle")
            spies.append((name, out, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        for name, out, spy in spies:
            _, stderr = spy.communicate(timeout=args.seconds + 60)
            print(f"{name}: {out} (py-spy exit {spy.returncode}) {stderr.decode()[-300:]}")
        client.kill()
        client.wait()
    finally:
        standalone.stop()
        shutil.rmtree(base_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
