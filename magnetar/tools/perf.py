"""``magnetar perf produce|consume``: throughput and latency runs with the official Pulsar
client, in the manner of ``pulsar-perf``.

    magnetar perf produce --service-url pulsar://127.0.0.1:6650 perf-topic \\
        --rate 10000 --size 1024 --seconds 30 --batching --max-pending 1000 --producers 1
    magnetar perf consume --service-url pulsar://127.0.0.1:6650 perf-topic \\
        --subscription perf --seconds 30 --out consume.json

Progress goes to stderr as one JSON line per ``--progress-interval-s`` (rates and latency
of that interval); the final summary is one JSON line on stdout (msgs/s, MB/s, latency
percentiles in ms, errors), also written to ``--out`` when given. ``perf consume``
prints ``{"event": "subscribed"}`` on stderr once its subscription exists, so a runner
can start producers after it. How each side measures is told in perf_producer.py and
perf_consumer.py.

Exit code 0 when the run had no errors; 1 on errors, a client failure, or (produce)
sends still unresolved when the run gave up waiting for them (``"drained": false``:
nobody knows whether they were stored); 3 when ``perf consume --messages N`` timed out
short of N.
"""

from __future__ import annotations

import argparse
import json
import os

import pulsar

from magnetar.tools.client import (
    INITIAL_POSITIONS,
    SUBSCRIPTION_TYPES,
    add_service_url_argument,
    open_client,
    report_client_failure,
)
from magnetar.tools.diagnosis import result_class
from magnetar.tools.failure import print_failure, usage_failure
from common.errors import OperationTimeout
from magnetar.tools.perf_consumer import PerfConsumer
from magnetar.tools.perf_producer import PerfProducer

EXIT_TIMED_OUT = 3


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_service_url_argument(parser)
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--messages", type=int, default=None, help="stop after this many messages")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="stop after this long (produce: unless --messages is given; consume: in any case)")
    parser.add_argument("--progress-interval-s", type=float, default=5.0, help="0: no progress lines")
    parser.add_argument("--out", default=None, help="also write the summary JSON to this file")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="perf_mode", required=True)

    produce = modes.add_parser("produce", help="publish and measure throughput and publish latency")
    _add_common(produce)
    produce.add_argument("--rate", type=float, default=0.0, help="messages/s over all producers (0: as fast as "
                                                                 "acknowledgements allow)")
    produce.add_argument("--size", type=int, default=1024, help="payload bytes per message")
    produce.add_argument("--batching", action=argparse.BooleanOptionalAction, default=True,
                         help="client-side batching (default on, as pulsar-perf)")
    produce.add_argument("--batch-max-delay-ms", type=int, default=1, help="pulsar-perf's default: 1 ms")
    produce.add_argument("--batch-max-messages", type=int, default=1000)
    produce.add_argument("--batch-max-bytes", type=int, default=128 * 1024)
    produce.add_argument("--max-pending", type=int, default=1000, help="unacknowledged messages per producer")
    produce.add_argument("--producers", type=int, default=1)
    produce.add_argument("--send-timeout-s", type=int, default=30)
    produce.set_defaults(perf_runner=PerfProducer)

    consume = modes.add_parser("consume", help="receive, acknowledge, measure throughput and end-to-end latency")
    _add_common(consume)
    consume.add_argument("-s", "--subscription", default="perf")
    consume.add_argument("-t", "--subscription-type", default="exclusive", choices=sorted(SUBSCRIPTION_TYPES))
    consume.add_argument("--initial-position", default="latest", choices=sorted(INITIAL_POSITIONS))
    consume.add_argument("--receiver-queue-size", type=int, default=1000)
    consume.add_argument("--idle-timeout-s", type=float, default=None,
                         help="stop once no message came for this long (default: never)")
    consume.add_argument("--wait-for-start", action="store_true",
                         help="after subscribing, receive nothing until a line (or EOF) arrives on stdin")
    consume.set_defaults(perf_runner=PerfConsumer)


def main(args: argparse.Namespace) -> int:
    runner_class = args.perf_runner
    problem = runner_class.check_arguments(args)
    if problem is not None:
        usage_failure(f"perf {args.perf_mode}", problem)
        return 2
    client = open_client(args)
    try:
        summary = runner_class(client, args).run()
    except pulsar.PulsarException as error:
        subscribe = None
        if args.perf_mode == "consume":
            subscribe = {"subscription": args.subscription, "sub_type": args.subscription_type,
                         "initial_position": args.initial_position}
        report_client_failure(f"perf {args.perf_mode}", args, error, subscribe=subscribe)
        return 1
    finally:
        client.close()
    print(json.dumps(summary), flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=2)
    if summary["errors"]:
        cls = result_class(str(summary["first_error"]).rsplit(".", 1)[-1])
        print_failure(f"perf {args.perf_mode}", f"{summary['errors']} errors", f"first: {summary['first_error']}",
                      cls.__name__, cls.code)
        return 1
    if args.perf_mode == "produce" and not summary["drained"]:
        unresolved = summary["sent"] - summary["messages"] - summary["errors"]
        print_failure("perf produce", f"{unresolved} sends neither acknowledged nor failed",
                      "the run gave up waiting for them", OperationTimeout.__name__, OperationTimeout.code)
        return 1
    if args.perf_mode == "consume" and args.messages is not None and summary["messages"] < args.messages:
        print_failure("perf consume", f"timed out after {args.seconds:g} s",
                      f"{summary['messages']} of {args.messages} messages came", OperationTimeout.__name__,
                      OperationTimeout.code)
        return EXIT_TIMED_OUT
    return 0
