"""``magnetar consume``: subscribe to a topic with the official Pulsar client, then
receive, acknowledge and print one JSON line per message, until ``-n`` messages came or
``--timeout-s`` passed.

    magnetar consume --service-url pulsar://127.0.0.1:6650 my-topic -s my-sub \\
        -t shared -n 10 --initial-position earliest --timeout-s 10

A line holds the message id, topic, key, properties, event and publish times (ms since
the epoch), redelivery count and the payload: UTF-8 text when it decodes as such, else
base64 (``encoding`` says which). A message is printed before it is acknowledged, so a
crash in between redelivers it rather than losing it. Acknowledgements are grouped by
the client and flushed when the consumer closes, which this tool always does before it
exits. ``-n 0`` means "until the timeout". Exit code 0 when ``-n`` messages came (or
``-n 0``), 3 when the timeout came first, 1 on a client error.
"""

from __future__ import annotations

import argparse
import json
import time

import pulsar

from magnetar.tools.client import (
    INITIAL_POSITIONS,
    SUBSCRIPTION_TYPES,
    add_service_url_argument,
    message_json,
    open_client,
    report_client_failure,
)
from magnetar.tools.failure import print_failure, usage_failure
from common.errors import OperationTimeout

# receive() wakes at least this often to check the deadline.
_RECEIVE_SLICE_MS = 200
EXIT_TIMED_OUT = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_url_argument(parser)
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("-s", "--subscription", required=True)
    parser.add_argument("-t", "--subscription-type", default="exclusive", choices=sorted(SUBSCRIPTION_TYPES))
    parser.add_argument("-n", "--count", type=int, default=1, help="messages to receive (0: until the timeout)")
    parser.add_argument("--initial-position", default="latest", choices=sorted(INITIAL_POSITIONS),
                        help="where a new subscription starts (default latest, as in Pulsar)")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="stop after this long in any case")
    parser.add_argument("--receiver-queue-size", type=int, default=1000)
    parser.add_argument("--no-ack", action="store_true", help="receive without acknowledging")
    parser.add_argument("--quiet", action="store_true", help="print one summary line instead of the messages")


def main(args: argparse.Namespace) -> int:
    if args.count < 0 or args.timeout_s <= 0:
        usage_failure("consume", "--count must be >= 0 and --timeout-s > 0")
        return 2
    received = 0
    started = time.monotonic()
    deadline = started + args.timeout_s
    client = open_client(args)
    created = False
    try:
        consumer = client.subscribe(
            args.topic, args.subscription, consumer_type=SUBSCRIPTION_TYPES[args.subscription_type],
            initial_position=INITIAL_POSITIONS[args.initial_position],
            receiver_queue_size=args.receiver_queue_size)
        created = True
        try:
            while args.count == 0 or received < args.count:
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0:
                    break
                try:
                    message = consumer.receive(timeout_millis=min(remaining_ms, _RECEIVE_SLICE_MS))
                except pulsar.Timeout:
                    continue
                if not args.quiet:
                    print(json.dumps(message_json(message)), flush=True)
                if not args.no_ack:
                    consumer.acknowledge(message)
                received += 1
        except KeyboardInterrupt:
            pass  # Ctrl-C ends a tail (-n 0) cleanly: what was printed is acknowledged below
        consumer.close()  # flushes the grouped acknowledgements
    except pulsar.PulsarException as error:
        report_client_failure("consume", args, error, created=created, subscribe={
            "subscription": args.subscription, "sub_type": args.subscription_type,
            "initial_position": args.initial_position})
        return 1
    finally:
        client.close()
    if args.quiet:
        print(json.dumps({"topic": args.topic, "subscription": args.subscription, "received": received,
                          "seconds": round(time.monotonic() - started, 3)}), flush=True)
    if args.count and received < args.count:
        print_failure("consume", f"timed out after {args.timeout_s:g} s", f"{received} of {args.count} messages "
                      "came", OperationTimeout.__name__, OperationTimeout.code)
        return EXIT_TIMED_OUT
    return 0
