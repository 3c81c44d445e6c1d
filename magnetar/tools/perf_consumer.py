"""``magnetar perf consume``: receive and acknowledge as fast as the cluster delivers,
and measure throughput and end-to-end latency.

End-to-end latency is receive time minus send time, both read from the wall clock of
this machine (producer and consumer must share a clock to mean anything):
- the send time in ns from the perf header (perf_payload.py) when the payload has one;
- else the message's event time (ms), set by the producer;
- else the publish time (ms), set by the producer's client when it sent the message.
The receive time is taken right after ``receive()`` returns, so the latency includes the
time a message waited in the consumer's receiver queue behind others: what an
application sees. Every message is acknowledged (individually; the client groups acks on
the wire), so the subscription's backlog drains as it would for a real consumer.

Perf headers also give a sequence number per producer: a number not above the last one
seen from that producer is a duplicate (or a redelivery); a jump is a gap. Exclusive and
failover subscriptions deliver one producer's messages in order, so for them both must be
zero unless something was lost or delivered twice.

With ``--wait-for-start`` the consumer subscribes, says so on stderr, and receives
nothing until a line (or EOF) arrives on stdin: how a runner starts several consumer
processes at one moment.

A run ends after ``--messages``, after ``--seconds``, or (with ``--idle-timeout-s``) once
no message came for that long (since the subscription was ready, then since the last
message): how several consumers of one shared subscription, none knowing its share, stop
after draining a backlog together.

Throughput is over the time from the first message received to the last, so neither the
wait for a producer to start (or for a broker to load the topic) nor the idle tail of a
run that ends by timeout dilutes it; ``first_message_after_s`` tells the wait apart.
"""

from __future__ import annotations

import argparse
import sys
import time

import pulsar

from magnetar.tools import perf_payload
from magnetar.tools.client import INITIAL_POSITIONS, SUBSCRIPTION_TYPES
from magnetar.tools.perf_stats import MB, PerfStats, ProgressReporter, announce_ready

# receive() wakes at least this often to check the deadline.
RECEIVE_SLICE_MS = 100


class PerfConsumer:
    def __init__(self, client: pulsar.Client, args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        self.stats = PerfStats()
        self.latency_sources = {"payload_header": 0, "event_time": 0, "publish_time": 0}
        self._last_sequence: dict[int, int] = {}
        self.duplicates = 0
        self.gaps = 0

    @staticmethod
    def check_arguments(args: argparse.Namespace) -> str | None:
        if args.messages is not None and args.messages < 1:
            return "--messages must be >= 1"
        if args.seconds <= 0:
            return "--seconds must be > 0"
        if args.idle_timeout_s is not None and args.idle_timeout_s <= 0:
            return "--idle-timeout-s must be > 0"
        return None

    def _latency_us(self, message: pulsar.Message, payload: bytes, received_ns: int) -> int:
        header = perf_payload.decode(payload)
        if header is not None:
            self.latency_sources["payload_header"] += 1
            self._check_sequence(header)
            return (received_ns - header.send_time_ns) // 1000
        event_time_ms = message.event_timestamp()
        if event_time_ms:
            self.latency_sources["event_time"] += 1
            return received_ns // 1000 - event_time_ms * 1000
        self.latency_sources["publish_time"] += 1
        return received_ns // 1000 - message.publish_timestamp() * 1000

    def _check_sequence(self, header: perf_payload.PerfHeader) -> None:
        last = self._last_sequence.get(header.producer_id)
        if last is not None and header.sequence <= last:
            self.duplicates += 1
            return
        if last is not None and header.sequence > last + 1:
            self.gaps += header.sequence - last - 1
        self._last_sequence[header.producer_id] = header.sequence

    def run(self) -> dict:
        args = self.args
        consumer = self.client.subscribe(
            args.topic, args.subscription, consumer_type=SUBSCRIPTION_TYPES[args.subscription_type],
            initial_position=INITIAL_POSITIONS[args.initial_position],
            receiver_queue_size=args.receiver_queue_size)
        # Runners wait for this line before producing (perf_stats.READY_EVENT).
        announce_ready(topic=args.topic, subscription=args.subscription)
        if getattr(args, "wait_for_start", False):
            # A runner starting several consumers lets them all subscribe first, then
            # starts them at once (a line or EOF on stdin), so none drains a backlog
            # alone while the others are still importing the client. What the client
            # prefetched meanwhile (up to its receiver queue) is counted from here on.
            sys.stdin.readline()
        reporter = ProgressReporter(args.progress_interval_s, self.stats.take_interval)
        started_s = time.monotonic()
        deadline_s = started_s + args.seconds
        first_message_s = last_message_s = None
        first_message_unix_s = last_message_unix_s = None
        self.stats.take_interval()
        reporter.start()
        interrupted = False
        try:
            while args.messages is None or self.stats.messages < args.messages:
                now_s = time.monotonic()
                remaining_ms = int((deadline_s - now_s) * 1000)
                if remaining_ms <= 0:
                    break
                if args.idle_timeout_s is not None and now_s - (last_message_s or started_s) >= args.idle_timeout_s:
                    break
                try:
                    message = consumer.receive(timeout_millis=min(remaining_ms, RECEIVE_SLICE_MS))
                except pulsar.Timeout:
                    continue
                received_ns = time.time_ns()
                last_message_s = time.monotonic()
                first_message_s = first_message_s or last_message_s
                last_message_unix_s = received_ns / 1e9
                first_message_unix_s = first_message_unix_s or last_message_unix_s
                payload = message.data()
                self.stats.record(len(payload), self._latency_us(message, payload, received_ns))
                consumer.acknowledge(message)
        except KeyboardInterrupt:
            interrupted = True
        ended_s = time.monotonic()
        reporter.stop()
        consumer.close()  # flushes the grouped acknowledgements
        summary = self._summary(started_s, first_message_s, last_message_s, ended_s, interrupted=interrupted)
        # Wall-clock bounds, so that a runner can add up several consumer processes exactly.
        summary["first_message_unix_s"] = round(first_message_unix_s, 6) if first_message_unix_s else None
        summary["last_message_unix_s"] = round(last_message_unix_s, 6) if last_message_unix_s else None
        return summary

    def _summary(self, started_s, first_message_s, last_message_s, ended_s, *, interrupted: bool) -> dict:
        args = self.args
        stats = self.stats
        if first_message_s is not None and last_message_s > first_message_s:
            elapsed_s = last_message_s - first_message_s
        else:
            elapsed_s = ended_s - started_s
        return {
            "mode": "consume", "topic": args.topic, "subscription": args.subscription,
            "subscription_type": args.subscription_type, "messages_target": args.messages,
            "seconds": round(elapsed_s, 3), "run_seconds": round(ended_s - started_s, 3),
            "first_message_after_s": round(first_message_s - started_s, 3) if first_message_s else None,
            "messages": stats.messages, "msgs_per_s": round(stats.messages / elapsed_s, 1),
            "MB_per_s": round(stats.bytes / elapsed_s / MB, 3),
            "end_to_end_latency_ms": stats.latency.summary_ms(), "latency_sources": self.latency_sources,
            "duplicates": self.duplicates, "sequence_gaps": self.gaps,
            "errors": stats.errors, "first_error": stats.first_error, "interrupted": interrupted,
        }
