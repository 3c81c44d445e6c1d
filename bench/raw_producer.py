"""Publishes pre-built batches over Pulsar's binary protocol with the broker's own codec
(bench/rawclient.py), to measure what the broker and bookies take without the official
client's per-message overhead. One JSON summary line on stdout; exit 1 on any error
(SEND_ERROR, a receipt out of order, a lost connection).

    python bench/raw_producer.py --service-url pulsar://127.0.0.1:6650 TOPIC \\
        --messages 1000000 --batch-messages 100 --message-bytes 1024 --window-entries 64

``--messages`` is rounded up to whole batches; ``--seconds`` publishes for a fixed time
instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import rawclient  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--service-url", default="pulsar://127.0.0.1:6650")
    stop = parser.add_mutually_exclusive_group(required=True)
    stop.add_argument("--messages", type=int, help="messages to publish (rounded up to whole batches)")
    stop.add_argument("--seconds", type=float, help="publish for this long")
    parser.add_argument("--batch-messages", type=int, default=100, help="messages per batch entry")
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--window-entries", type=int, default=64, help="SENDs outstanding at most")
    args = parser.parse_args(argv)
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be >= 1")
    if args.seconds is not None and args.seconds <= 0:
        parser.error("--seconds must be > 0")
    if args.batch_messages < 1 or args.message_bytes < 4 or args.window_entries < 1:
        parser.error("--batch-messages and --window-entries must be >= 1, --message-bytes >= 4")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = rawclient.ProduceSettings(
        service_url=args.service_url, topic=args.topic, messages=args.messages, seconds=args.seconds,
        batch_messages=args.batch_messages, message_bytes=args.message_bytes, window_entries=args.window_entries)
    try:
        summary = asyncio.run(rawclient.produce(settings))
    except (rawclient.ProtocolViolation, rawclient.RequestFailed, ConnectionError, TimeoutError, OSError) as error:
        print(f"raw_producer: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
