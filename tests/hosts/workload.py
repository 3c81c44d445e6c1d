"""The traffic: official ``pulsar-client`` producers and consumers run on a client host
(``python -m tests.hosts.workload produce|consume …`` inside its namespace), each
recording only what the client told it, one JSON line per event, in a history file
that the checker reads afterwards (never the servers' word).

History events (Jepsen's shape: an operation is invoked, then ok or fail):
- ``{"type": "invoke", "f": "send", "producer", "key", "seq", "t"}``
- ``{"type": "ok", "f": "send", "producer", "key", "seq", "ledger", "entry", "t"}`` —
  the send receipt; the message must be consumed by every subscription
- ``{"type": "fail", "f": "send", … "error"}`` — indeterminate: may or may not be stored
- ``{"type": "receive", "subscription", "mode", "consumer", "producer", "key", "seq",
  "ledger", "entry", "redelivery", "t"}``
- ``{"type": "ready", "subscriptions": {name: mode}, "t"}`` once every consumer is
  subscribed (the producers' has no subscriptions); ``{"type": "done"}``.

A payload is ``producer|key|seq`` (plus padding), so a received message names the send
it came from. Producers send at a fixed rate (``--rate`` per producer, at most
``--in-flight`` unanswered) for ``--duration-s``, then wait for their receipts
(bounded by the send timeout). Consumers run until ``--expect-file`` appears and every
payload it lists has reached every subscription, or until ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

PAYLOAD_PAD = b"." * 64
SEND_TIMEOUT_MS = 30_000          # the official client's default
IN_FLIGHT_MAX = 200


class History:
    """Appends events (thread-safe; the client's callbacks run on its own threads)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, **event) -> None:
        event.setdefault("t", time.time())
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


def client(service_url: str):
    import pulsar

    return pulsar.Client(service_url, operation_timeout_seconds=30, connection_timeout_ms=5_000,
                         logger=_quiet_logger())


def _quiet_logger():
    import logging

    logger = logging.getLogger("pulsar-client")
    # INFO shows the client's connections opening and closing (tests/hosts/owner_isolation.py).
    logger.setLevel(os.environ.get("HOSTS_CLIENT_LOG_LEVEL", "WARNING"))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
    logger.addHandler(handler)
    return logger


def created(create, deadline: float):
    """``create()`` tried again until ``deadline``: a lookup may land on a broker that
    is being cut off, or a bundle may be moving (tests/cluster.py created_retrying)."""
    import pulsar

    while True:
        try:
            return create()
        except (pulsar.Timeout, pulsar.ConnectError, pulsar.ServiceUnitNotReady, pulsar.LookupError) as error:
            if time.monotonic() > deadline:
                raise
            print(f"creating failed ({type(error).__name__}), trying again", file=sys.stderr, flush=True)
            time.sleep(0.5)


def produce(args: argparse.Namespace) -> int:
    history = History(args.history)
    pulsar_client = client(args.service_url)
    setup_deadline = time.monotonic() + 60
    producers = []
    for index, topic in enumerate(args.topics):
        name = f"p{index}"
        producer = created(lambda: pulsar_client.create_producer(
            topic, producer_name=f"{name}-{os.getpid()}", send_timeout_millis=SEND_TIMEOUT_MS,
            block_if_queue_full=True, max_pending_messages=IN_FLIGHT_MAX, batching_enabled=False), setup_deadline)
        producers.append((name, producer))
    slots = threading.BoundedSemaphore(IN_FLIGHT_MAX * len(producers))
    history.write(type="ready")

    import pulsar

    def on_sent(name: str, key: str, seq: int):
        def callback(result, message_id) -> None:
            slots.release()
            if result == pulsar.Result.Ok:
                history.write(type="ok", f="send", producer=name, key=key, seq=seq,
                              ledger=message_id.ledger_id(), entry=message_id.entry_id())
            else:
                history.write(type="fail", f="send", producer=name, key=key, seq=seq, error=str(result))
        return callback

    interval_s = 1.0 / args.rate
    start = time.monotonic()
    seq = 0
    while time.monotonic() - start < args.duration_s:
        for name, producer in producers:
            key = f"k{seq % args.keys}"
            payload = f"{name}|{key}|{seq}|".encode() + PAYLOAD_PAD
            if not slots.acquire(timeout=SEND_TIMEOUT_MS / 1000 + 5):
                history.write(type="info", f="send", producer=name, note="no slot: receipts overdue")
                continue
            history.write(type="invoke", f="send", producer=name, key=key, seq=seq)
            producer.send_async(payload, on_sent(name, key, seq), partition_key=key)
        seq += 1
        next_at = start + seq * interval_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    for _name, producer in producers:
        try:
            producer.flush()
        except Exception as error:        # the receipts say what happened to each send
            print(f"flush: {error}", file=sys.stderr, flush=True)
    # Every receipt (or failure) in: all slots back, bounded by the send timeout.
    for _ in range(IN_FLIGHT_MAX * len(producers)):
        slots.acquire(timeout=SEND_TIMEOUT_MS / 1000 + 5)
    history.write(type="done")
    history.close()
    pulsar_client.close()
    return 0


MODES = ("shared", "failover", "key_shared")


def consume(args: argparse.Namespace) -> int:
    import pulsar

    types = {"shared": pulsar.ConsumerType.Shared, "failover": pulsar.ConsumerType.Failover,
             "key_shared": pulsar.ConsumerType.KeyShared}
    history = History(args.history)
    pulsar_client = client(args.service_url)
    received: dict[str, set[str]] = {}
    lock = threading.Lock()
    consumers = []
    modes: dict[str, str] = {}
    setup_deadline = time.monotonic() + 60

    def listener(subscription: str, mode: str, consumer_name: str):
        def on_message(consumer, message) -> None:
            text = message.data().decode(errors="replace")
            producer, key, seq, _pad = text.split("|", 3)
            message_id = message.message_id()
            history.write(type="receive", subscription=subscription, mode=mode, consumer=consumer_name,
                          producer=producer, key=key, seq=int(seq), ledger=message_id.ledger_id(),
                          entry=message_id.entry_id(), redelivery=message.redelivery_count())
            with lock:
                received.setdefault(subscription, set()).add(f"{producer}|{seq}")
            consumer.acknowledge(message)
        return on_message

    for topic_index, topic in enumerate(args.topics):
        for mode in MODES:
            subscription = f"{mode}-t{topic_index}"
            received[subscription] = set()
            modes[subscription] = mode
            for copy in range(args.consumers_per_subscription):
                consumer_name = f"{subscription}-c{copy}"
                consumers.append(created(lambda: pulsar_client.subscribe(
                    topic, subscription, consumer_type=types[mode], consumer_name=consumer_name,
                    receiver_queue_size=100, initial_position=pulsar.InitialPosition.Earliest,
                    message_listener=listener(subscription, mode, consumer_name)), setup_deadline))
    history.write(type="ready", subscriptions={sub: mode for sub, mode in modes.items()})
    deadline = time.monotonic() + args.deadline_s
    expected_by_topic: dict[int, set[str]] | None = None
    while time.monotonic() < deadline:
        time.sleep(0.25)
        if expected_by_topic is None:
            if not os.path.exists(args.expect_file):
                continue
            with open(args.expect_file) as handle:
                expected = json.load(handle)
            expected_by_topic = {int(index): set(items) for index, items in expected.items()}
        with lock:
            complete = all(expected_by_topic.get(int(sub.rsplit("-t", 1)[1]), set()) <= seen
                           for sub, seen in received.items())
        if complete:
            time.sleep(args.linger_s)     # duplicates still in flight are counted too
            break
    history.write(type="done", complete=expected_by_topic is not None and time.monotonic() < deadline)
    history.close()
    for consumer in consumers:
        try:
            consumer.close()
        except Exception:
            pass
    pulsar_client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--service-url", required=True)
    parser.add_argument("--topic", dest="topics", action="append", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--rate", type=float, default=50.0, help="messages per second per producer")
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--consumers-per-subscription", type=int, default=2)
    parser.add_argument("--expect-file", default="")
    parser.add_argument("--deadline-s", type=float, default=600.0)
    parser.add_argument("--linger-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    return produce(args) if args.role == "produce" else consume(args)


if __name__ == "__main__":
    sys.exit(main())
