"""``magnetar produce``: send messages to a topic with the official Pulsar client and
print, per message, one JSON line with its index and message id (or, with ``--quiet``,
one summary line at the end).

    magnetar produce --service-url pulsar://127.0.0.1:6650 my-topic -m hello -m world \\
        --key k1 --property origin=cli -n 3

Each ``-m`` message and each ``--file`` (its whole content is one message; ``-`` is
stdin) is sent ``-n`` times, in order. Sends are asynchronous with at most
``--max-pending`` unacknowledged at once (fewer for big messages, so that at most 32 MiB
is pending); the client completes one producer's sends in order, so the lines come out
in send order. A message counts as sent only when the broker acknowledged it (for
Magnetar: stored on Qa bookies). Exit code 0 when every message was acknowledged, 1
otherwise (the first error is printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import pulsar

from magnetar.tools.client import (
    PENDING_BYTES_MAX,
    add_service_url_argument,
    message_id_json,
    open_client,
    report_client_failure,
)
from magnetar.tools.diagnosis import result_class
from magnetar.tools.failure import print_failure, usage_failure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_url_argument(parser)
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("-m", "--message", action="append", default=[], dest="messages",
                        help="a message (UTF-8 text); repeat for several")
    parser.add_argument("--file", action="append", default=[], dest="files",
                        help="a file whose whole content is one message ('-': stdin); repeat for several")
    parser.add_argument("-n", "--count", type=int, default=1, help="times each message is sent (default 1)")
    parser.add_argument("--key", default=None, help="the messages' key (partition key)")
    parser.add_argument("-p", "--property", action="append", default=[], dest="properties", metavar="K=V",
                        help="a message property; repeat for several")
    parser.add_argument("--event-time-ms", type=int, default=None,
                        help="event time to set on every message (default: none)")
    parser.add_argument("--batching", action="store_true", help="let the client batch messages (off by default)")
    parser.add_argument("--max-pending", type=int, default=1000, help="messages sent and not yet acknowledged, at most")
    parser.add_argument("--send-timeout-s", type=int, default=30)
    parser.add_argument("--quiet", action="store_true", help="print one summary line instead of one line per message")


def _parse_properties(items: list[str]) -> dict[str, str]:
    properties = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"--property wants K=V, got {item!r}")
        properties[key] = value
    return properties


def _payloads(args: argparse.Namespace) -> list[bytes]:
    payloads = [message.encode("utf-8") for message in args.messages]
    for path in args.files:
        if path == "-":
            payloads.append(sys.stdin.buffer.read())
        else:
            with open(path, "rb") as handle:
                payloads.append(handle.read())
    return payloads


class _Outcome:
    """What the send callbacks report, shared with the main thread under a lock."""

    def __init__(self, quiet: bool) -> None:
        self.lock = threading.Lock()
        self.quiet = quiet
        self.acknowledged = 0
        self.failed = 0
        self.first_error: str | None = None
        self.first_result: str | None = None
        self.first_message_id: dict | None = None
        self.last_message_id: dict | None = None
        self.completed = threading.Condition(self.lock)
        self.outstanding = 0

    def on_sent(self, index: int, window: threading.BoundedSemaphore, result, message_id) -> None:
        # Runs on a client IO thread: it must never raise (see client.py).
        try:
            with self.lock:
                if result == pulsar.Result.Ok:
                    self.acknowledged += 1
                    document = message_id_json(message_id)
                    self.first_message_id = self.first_message_id or document
                    self.last_message_id = document
                    if not self.quiet:
                        print(json.dumps({"index": index, "message_id": document}), flush=True)
                else:
                    self.failed += 1
                    self.first_error = self.first_error or f"message {index}: {result}"
                    self.first_result = self.first_result or str(result).rsplit(".", 1)[-1]
                self.outstanding -= 1
                self.completed.notify_all()
        except BaseException as error:  # noqa: BLE001 - an escaping exception kills the process
            self.first_error = self.first_error or f"callback failed: {error!r}"
        finally:
            window.release()


def main(args: argparse.Namespace) -> int:
    try:
        properties = _parse_properties(args.properties)
        payloads = _payloads(args)
    except (ValueError, OSError) as error:
        usage_failure("produce", str(error))
        return 2
    if not payloads:
        usage_failure("produce", "nothing to send (give -m MESSAGE or --file F)")
        return 2
    if args.count < 1 or args.max_pending < 1:
        usage_failure("produce", "--count and --max-pending must be at least 1")
        return 2
    outcome = _Outcome(args.quiet)
    # The window bounds bytes as well as messages (client.py): big files go fewer at a time.
    window_size = max(1, min(args.max_pending, PENDING_BYTES_MAX // max(1, max(map(len, payloads)))))
    window = threading.BoundedSemaphore(window_size)
    started = time.monotonic()
    client = open_client(args)
    created = False
    try:
        producer = client.create_producer(
            args.topic, batching_enabled=args.batching, send_timeout_millis=args.send_timeout_s * 1000,
            # Our window bounds what is pending; the client's queue, twice as large, only
            # has to hold it (whatever order it frees a slot and calls back in).
            max_pending_messages=2 * window_size, block_if_queue_full=False)
        created = True
        send_options = {"properties": properties}
        if args.key is not None:
            send_options["partition_key"] = args.key
        if args.event_time_ms is not None:
            send_options["event_timestamp"] = args.event_time_ms
        index = 0
        for payload in payloads:
            for _ in range(args.count):
                window.acquire()
                with outcome.lock:
                    outcome.outstanding += 1
                producer.send_async(payload, lambda result, message_id, index=index:
                                    outcome.on_sent(index, window, result, message_id), **send_options)
                index += 1
        producer.flush()
        with outcome.lock:
            # Bounded: every pending send completes or fails within the send timeout.
            outcome.completed.wait_for(lambda: outcome.outstanding == 0, timeout=args.send_timeout_s + 10)
        producer.close()
    except pulsar.PulsarException as error:
        report_client_failure("produce", args, error, created=created)
        return 1
    finally:
        client.close()
    elapsed_s = time.monotonic() - started
    if args.quiet:
        print(json.dumps({"topic": args.topic, "sent": outcome.acknowledged, "failed": outcome.failed,
                          "seconds": round(elapsed_s, 3), "first_message_id": outcome.first_message_id,
                          "last_message_id": outcome.last_message_id}), flush=True)
    if outcome.failed or outcome.acknowledged != len(payloads) * args.count:
        # A send's refusal reaches the client as its result only (SEND_ERROR's text is
        # not passed on): the result names the catalogue class.
        cls = result_class(outcome.first_result or "Timeout")
        print_failure("produce", f"{outcome.failed} of {len(payloads) * args.count} messages failed",
                      f"first error: {outcome.first_error}", cls.__name__, cls.code)
        return 1
    return 0
