"""Receives and acknowledges over Pulsar's binary protocol with the broker's own codec
(bench/rawclient.py): SUBSCRIBE, FLOW permits, count every MESSAGE (one entry, and the
messages its metadata says it holds), ACK each entry. Measures what the broker serves
without the official client's per-message overhead. One JSON summary line on stdout;
exit 1 on any error, 3 when ``--messages`` was not reached in time.

    python bench/raw_consumer.py --service-url pulsar://127.0.0.1:6650 TOPIC -s sub \\
        -t shared --messages 1000000 --permits 10000 --ack-group-entries 1

Throughput is over the span from the first message to the last, so neither the wait
for the first one nor an idle tail dilutes it. ``--positions-out`` writes the entries
received (16 bytes each) so a runner can check that the consumers of a shared
subscription together got every entry exactly once.
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
from magnetar.tools.perf_stats import announce_ready  # noqa: E402

EXIT_TIMED_OUT = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--service-url", default="pulsar://127.0.0.1:6650")
    parser.add_argument("-s", "--subscription", default="raw")
    parser.add_argument("-t", "--subscription-type", default="exclusive", choices=sorted(rawclient.SUB_TYPES))
    parser.add_argument("--initial-position", default="earliest", choices=sorted(rawclient.INITIAL_POSITIONS))
    parser.add_argument("--messages", type=int, default=None, help="stop after this many messages")
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this long in any case")
    parser.add_argument("--idle-timeout-s", type=float, default=None, help="stop once nothing came for this long")
    parser.add_argument("--permits", type=int, default=10_000, help="receiver queue, in messages")
    parser.add_argument("--ack", choices=("individual", "cumulative"), default="individual")
    parser.add_argument("--ack-group-entries", type=int, default=1,
                        help="message ids per ACK command at most (individual), entries per ACK (cumulative)")
    parser.add_argument("--consumer-name", default="")
    parser.add_argument("--positions-out", default=None, help="write the positions received to this file")
    parser.add_argument("--wait-for-start", action="store_true",
                        help="after subscribing, say so on stderr and grant no permits until a line (or EOF) "
                             "arrives on stdin")
    return parser.parse_args(argv)


async def wait_for_start_line() -> None:
    # The line a runner waits for on stderr before starting the consumers (as perf consume).
    announce_ready()
    await asyncio.to_thread(sys.stdin.readline)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = rawclient.ConsumeSettings(
        service_url=args.service_url, topic=args.topic, subscription=args.subscription,
        sub_type=args.subscription_type, initial_position=args.initial_position, messages=args.messages,
        seconds=args.seconds, idle_timeout_s=args.idle_timeout_s, permits=args.permits,
        cumulative=args.ack == "cumulative", ack_group_entries=args.ack_group_entries,
        consumer_name=args.consumer_name)
    problem = settings.problem()
    if problem is not None:
        print(f"raw_consumer: {problem}", file=sys.stderr)
        return 2
    start_gate = wait_for_start_line if args.wait_for_start else None
    try:
        summary, positions = asyncio.run(rawclient.consume(settings, start_gate))
    except (rawclient.ProtocolViolation, rawclient.RequestFailed, ConnectionError, TimeoutError, OSError) as error:
        print(f"raw_consumer: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if args.positions_out:
        with open(args.positions_out, "wb") as handle:
            handle.write(rawclient.encode_positions(positions))
    print(json.dumps(summary), flush=True)
    if args.messages is not None and summary["messages"] < args.messages:
        print(f"raw_consumer: {summary['messages']} of {args.messages} messages in {args.seconds:g} s",
              file=sys.stderr)
        return EXIT_TIMED_OUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
