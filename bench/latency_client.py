"""The client process of bench/latency.py: one Python process with the official
``pulsar-client`` driving one standalone through the issue-16 workloads, in order, and
printing one JSON line per workload (the last line is the summary of them all).

Workloads (1 KiB messages, batching on with a 1 ms publish delay unless said):
- ``durable_ack``: one message at a time: ``send_async`` then ``flush`` (the batch of
  one leaves at once instead of waiting for the batch timer), timed from just before
  the send to the send's callback, i.e. to the broker's receipt, which Magnetar sends
  only once the ack quorum's journals fdatasynced the entry. The next message goes
  only after that: nothing else is in flight.
- ``e2e`` (and ``e2e_unbatched``, the producer's batching off; only with ``--only``):
  end-to-end latency at a fixed rate. Message i is due at t0 + i / rate; the
  sender sleeps until then (or sends at once when late) and puts the due time in the
  payload. The consumer (same process, same clock: ``perf_counter_ns``) takes receive
  time minus due time, so a stall of the sender, the client or the servers counts
  against every message it delayed (no coordinated omission).
- ``publish``: as fast as receipts come back with at most ``--max-pending`` messages
  awaiting theirs: the producer's own bound (``max_pending_messages`` with
  ``block_if_queue_full``), so ``send_async`` blocks while it is full. It sends in
  bursts of 50 with one payload each and asks for a receipt callback on each burst's
  last message only (the producer completes sends in order), as the Redis driver gets
  one reply per pipeline of 50. It writes the backlog the next three drain: their
  subscriptions exist before it.
- ``drain``: one exclusive consumer reads the whole backlog. With ``--consume batch``
  (the default) it takes what has arrived with ``batch_receive`` (up to 1,000 messages
  a call) and acknowledges each batch with one cumulative acknowledgement of its last
  message, the client's own bulk API, as the Redis peer reads with XREAD COUNT; with
  ``--consume per-message`` it receives and acknowledges one message at a time.
- ``work_queue``: 4 consumers on one shared subscription, per-message acknowledgement
  (a shared subscription has no cumulative acknowledgement), one thread each, until the
  backlog is consumed between them.
- ``fanout``: 4 subscriptions, one consumer each (one thread each), consumed as drain
  is; counted is every message delivered to any of them.
- ``raw_e2e``, ``raw_publish``, ``raw_drain``, ``raw_work_queue``, ``raw_fanout``: the same
  through the project's raw protocol client, on topics of their own (bench/latency_raw.py):
  the servers' capacity when the client is not the limit.
- ``publish_each``: ``publish`` with a receipt callback on every message (to a topic
  of its own, last): the official client's per-message callback, which takes the GIL
  from the client's IO thread each time, is then the limit (docs/performance.md step 14).

Around each workload the servers' /metrics are scraped, and the difference of their
stage histograms over the workload is reported (bench/stage_breakdown.py).

Each result carries its wall-clock window (``started_unix_s`` / ``ended_unix_s``), which
the runner uses to account the CPU of every process over exactly that window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import pulsar  # noqa: E402

import latency_raw  # noqa: E402
import rawclient  # noqa: E402
from load_shapes import (FANOUT_SUBSCRIPTIONS, MESSAGE_BYTES, PUBLISH_BATCH, RECEIVE_IDLE_S,  # noqa: E402
                         WARMUP_MESSAGES, WORK_QUEUE_CONSUMERS, FixedRate, due_of, filler_bytes, payload)
from magnetar.tools.latency_histogram import LatencyHistogram  # noqa: E402
from stage_breakdown import breakdown, scrape_all  # noqa: E402

# drain and fan-out with --consume batch: at most this many messages (or bytes) a
# batch_receive, which returns what has arrived after waiting at most this long.
BATCH_RECEIVE_MAX = 1000
BATCH_RECEIVE_BYTES_MAX = 16 * 1024 * 1024
BATCH_RECEIVE_WAIT_MS = 10

RECEIVE_IDLE_MS = int(RECEIVE_IDLE_S * 1000)


def summary_ms(histogram: LatencyHistogram) -> dict:
    return histogram.summary_ms()


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client = pulsar.Client(args.service_url, operation_timeout_seconds=30, io_threads=1,
                                    message_listener_threads=FANOUT_SUBSCRIPTIONS)
        self.filler = filler_bytes(os.urandom)
        run_id = uuid.uuid4().hex[:8]
        self.topic_prefix = f"persistent://public/default/latency-{run_id}"
        self.raw_backlog = 0     # messages raw_publish wrote, for the raw consumers

    def producer(self, topic: str, *, queue_limit: int = 2000, batching: bool = True):
        return self.client.create_producer(
            topic, batching_enabled=batching, batching_max_publish_delay_ms=self.args.batch_delay_ms,
            batching_max_messages=1000, batching_max_allowed_size_in_bytes=128 * 1024,
            max_pending_messages=queue_limit, block_if_queue_full=True,
            send_timeout_millis=30_000)

    def scrape(self) -> dict:
        return scrape_all(self.args.metrics_url)

    def measured(self, name: str, function) -> dict:
        before = self.scrape()
        started = time.time()
        result = function()
        ended = time.time()
        result.setdefault("started_unix_s", started)
        result.setdefault("ended_unix_s", ended)
        result["stages"] = breakdown(before, self.scrape())
        result["workload"] = name
        print(json.dumps(result), flush=True)
        return result

    # --- latency ------------------------------------------------------------------------

    def raw_durable_ack(self) -> dict:
        """``durable_ack`` through the project's raw protocol client (bench/rawclient.py,
        asyncio, no client threads): one SEND of a one-message batch at a time, timed
        from its write to its SEND_RECEIPT. Against ``durable_ack`` it tells the official
        client's share of a durable ack from the servers'."""
        return asyncio.run(self._raw_durable_ack())

    async def _raw_durable_ack(self) -> dict:
        connection = await rawclient.RawConnection.open(self.args.service_url)
        histogram = LatencyHistogram()
        try:
            producer_id = 1
            request_id = connection.request_id()
            answer = await connection.request(
                rawclient.producer_command(f"{self.topic_prefix}-raw-ack", producer_id, request_id),
                request_id, "PRODUCER")
            producer_name = answer.command.producer_success.producer_name
            batch = rawclient.build_batch(1, MESSAGE_BYTES)
            receipt = asyncio.Event()
            connection.on_receipt = lambda _receipt: receipt.set()
            for sequence_id in range(WARMUP_MESSAGES + self.args.ack_messages):
                receipt.clear()
                started = time.perf_counter_ns()
                connection.write(rawclient.send_frame(producer_id, producer_name, sequence_id, batch,
                                                      int(time.time() * 1000)))
                await rawclient._wait_event(receipt, connection, timeout_s=30)
                if sequence_id >= WARMUP_MESSAGES:
                    histogram.record((time.perf_counter_ns() - started) // 1000)
        finally:
            connection.close()
        return {"messages": histogram.count, "errors": 0, "latency_ms": summary_ms(histogram)}

    def durable_ack(self) -> dict:
        producer = self.producer(f"{self.topic_prefix}-ack")
        done = threading.Event()
        acked_ns = [0]
        results = []

        def callback(result, _message_id) -> None:
            acked_ns[0] = time.perf_counter_ns()
            results.append(result)
            done.set()

        histogram = LatencyHistogram()
        errors = 0
        for index in range(WARMUP_MESSAGES + self.args.ack_messages):
            done.clear()
            started = time.perf_counter_ns()
            producer.send_async(payload(started, self.filler), callback)
            producer.flush()
            if not done.wait(30):
                errors += 1
                continue
            if results[-1] != pulsar.Result.Ok:
                errors += 1
            elif index >= WARMUP_MESSAGES:
                histogram.record((acked_ns[0] - started) // 1000)
        producer.close()
        return {"messages": histogram.count, "errors": errors, "latency_ms": summary_ms(histogram)}

    def e2e_unbatched(self) -> dict:
        """``e2e`` with the producer's batching off (one entry per message, no batch
        timer): what a latency-sensitive user runs (bench/floor.py)."""
        return self.e2e(batching=False)

    def e2e(self, batching: bool = True) -> dict:
        args = self.args
        topic = f"{self.topic_prefix}-e2e{'' if batching else '-unbatched'}"
        messages = int(args.rate * args.e2e_seconds)
        histogram = LatencyHistogram()
        received = [0]
        all_in = threading.Event()
        lock = threading.Lock()
        total = WARMUP_MESSAGES + messages
        schedule = FixedRate(args.rate, total, WARMUP_MESSAGES)

        def listener(consumer, message) -> None:
            now = time.perf_counter_ns()
            due = due_of(message.data())
            consumer.acknowledge(message)
            with lock:
                received[0] += 1
                if schedule.counted(due):
                    histogram.record((now - due) // 1000)
                if received[0] >= total:
                    all_in.set()

        consumer = self.client.subscribe(topic, "e2e", message_listener=listener, receiver_queue_size=1000)
        producer = self.producer(topic, batching=batching)
        errors = [0]

        def on_sent(result, _message_id) -> None:
            if result != pulsar.Result.Ok:
                errors[0] += 1

        schedule.run_sync(lambda _index, due: producer.send_async(payload(due, self.filler), on_sent))
        producer.flush()
        all_in.wait(30)
        ended_unix = time.time()
        producer.close()
        consumer.close()
        return {"rate_target": args.rate, "messages": histogram.count, "errors": errors[0],
                "received": received[0] - WARMUP_MESSAGES, "complete": received[0] >= total,
                "sender_late_max_ms": schedule.late_max_ms(),
                "latency_ms": summary_ms(histogram), "started_unix_s": schedule.started_unix_s,
                "ended_unix_s": ended_unix}

    # --- through the raw protocol client (bench/latency_raw.py) --------------------------

    def raw_e2e(self) -> dict:
        args = self.args
        return asyncio.run(latency_raw.raw_e2e(args.service_url, self.topic_prefix, args.rate, args.e2e_seconds,
                                               self.filler))

    def raw_publish(self) -> dict:
        result = asyncio.run(latency_raw.raw_publish(self.args.service_url, self.topic_prefix,
                                                     self.args.publish_seconds))
        self.raw_backlog = result["messages"]
        return result

    def raw_drain(self) -> dict:
        return asyncio.run(latency_raw.raw_drain(self.args.service_url, self.topic_prefix, self.raw_backlog))

    def raw_work_queue(self) -> dict:
        return asyncio.run(latency_raw.raw_work_queue(self.args.service_url, self.topic_prefix, self.raw_backlog))

    def raw_fanout(self) -> dict:
        return asyncio.run(latency_raw.raw_fanout(self.args.service_url, self.topic_prefix, self.raw_backlog))

    # --- throughput ---------------------------------------------------------------------

    def backlog_topic(self) -> str:
        return f"{self.topic_prefix}-backlog"

    def create_subscriptions(self) -> None:
        topic = self.backlog_topic()
        specs = [("drain", pulsar.ConsumerType.Exclusive), ("work-queue", pulsar.ConsumerType.Shared)]
        specs += [(f"fanout-{n}", pulsar.ConsumerType.Exclusive) for n in range(FANOUT_SUBSCRIPTIONS)]
        for name, kind in specs:
            self.client.subscribe(topic, name, consumer_type=kind,
                                  initial_position=pulsar.InitialPosition.Earliest).close()

    def publish(self) -> dict:
        """As fast as receipts come back, in bursts of PUBLISH_BATCH (one payload and one
        start time each), a receipt callback on each burst's last message only: the
        producer completes its sends in order (a receipt out of order makes it reconnect
        and resend), so that receipt means the whole burst is stored, as a Redis
        pipeline's one reply does for the Redis driver (bench/peer_clients.py). Writes the
        backlog the next three drain."""
        return self._publish(self.backlog_topic(), callback_each=False)

    def publish_each(self) -> dict:
        """``publish`` with a receipt callback on every message, to a topic of its own:
        what the official client's per-message callback costs (each one takes the GIL
        from its IO thread; docs/performance.md step 14). Not compared with the peers."""
        return self._publish(f"{self.topic_prefix}-publish-each", callback_each=True)

    def _publish(self, topic: str, *, callback_each: bool) -> dict:
        args = self.args
        # The window is the client's own: at most max_pending messages pending in the
        # producer (queued or awaiting their receipt), send_async blocking while it is
        # full, as a user of the official client bounds what is in flight. (It was a
        # Python semaphore taken before each send and released by each callback: two
        # more Python lock operations per message across the client's threads, measured
        # 0.8-0.9x the rate of this, docs/performance.md step 11.) The callbacks all run
        # on the client's one IO thread, so what they count needs no lock.
        producer = self.producer(topic, queue_limit=args.max_pending)
        histogram = LatencyHistogram()
        counts = {"acked": 0, "errors": 0}
        last_ack = [0.0]
        ok = pulsar.Result.Ok
        clock = time.perf_counter_ns

        def completed(result, started_ns: int, messages: int) -> None:
            if result == ok:
                counts["acked"] += messages
                histogram.record((clock() - started_ns) // 1000, messages)
            else:
                counts["errors"] += messages
            last_ack[0] = time.time()

        send = producer.send_async
        started_unix = time.time()
        deadline = time.monotonic() + args.publish_seconds
        sent = 0
        while time.monotonic() < deadline:
            now = clock()
            data = payload(now, self.filler)
            if callback_each:
                for _ in range(PUBLISH_BATCH):
                    send(data, lambda result, _message_id, started_ns=now: completed(result, started_ns, 1))
            else:
                for _ in range(PUBLISH_BATCH - 1):
                    send(data, None)
                send(data, lambda result, _message_id, started_ns=now: completed(result, started_ns,
                                                                                   PUBLISH_BATCH))
            sent += PUBLISH_BATCH
        producer.flush()          # returns once every message sent has its receipt
        producer.close()
        ended_unix = last_ack[0] or time.time()
        seconds = ended_unix - started_unix
        return {"messages": counts["acked"], "sent": sent, "errors": counts["errors"],
                "msgs_per_s": round(counts["acked"] / seconds, 1), "max_pending": args.max_pending,
                "publish_batch": PUBLISH_BATCH, "callback_each": callback_each,
                "publish_latency_ms": summary_ms(histogram),
                "started_unix_s": started_unix, "ended_unix_s": ended_unix}

    def _consume(self, subscriptions: list[str], kind, expected_each: int | None, expected_total: int) -> dict:
        """A consumer per entry of ``subscriptions`` (a name may repeat: shared), each in
        its own thread, acknowledging every message. Each stops at ``expected_each``
        (when given), once ``expected_total`` arrived in all, or once it idles."""
        topic = self.backlog_topic()
        consumers_count = len(subscriptions)
        # Bulk consumption where the subscription allows a cumulative acknowledgement.
        batched = self.args.consume == "batch" and kind != pulsar.ConsumerType.Shared
        policy = pulsar.ConsumerBatchReceivePolicy(BATCH_RECEIVE_MAX, BATCH_RECEIVE_BYTES_MAX,
                                                   BATCH_RECEIVE_WAIT_MS) if batched else None
        consumers = [self.client.subscribe(topic, name, consumer_type=kind, receiver_queue_size=1000,
                                           initial_position=pulsar.InitialPosition.Earliest,
                                           batch_receive_policy=policy)
                     for name in subscriptions]
        lock = threading.Lock()
        state = {"received": 0, "first": None, "last": None}
        per_consumer = [0] * consumers_count
        go = threading.Event()

        def count(index: int, messages: int) -> None:
            now = time.time()
            per_consumer[index] += messages
            with lock:
                state["received"] += messages
                if state["first"] is None:
                    state["first"] = now
                state["last"] = now

        def run_batched(index: int, consumer) -> None:
            go.wait()
            idle_since = time.monotonic()
            while expected_each is None or per_consumer[index] < expected_each:
                messages = consumer.batch_receive()
                if len(messages) == 0:
                    if time.monotonic() - idle_since >= RECEIVE_IDLE_MS / 1000:
                        return
                    continue
                idle_since = time.monotonic()
                consumer.acknowledge_cumulative(messages[len(messages) - 1])
                count(index, len(messages))

        def run(index: int, consumer) -> None:
            go.wait()
            limit = expected_each
            while limit is None or per_consumer[index] < limit:
                with lock:
                    if expected_each is None and state["received"] >= expected_total:
                        return
                try:
                    message = consumer.receive(timeout_millis=RECEIVE_IDLE_MS)
                except pulsar.Timeout:
                    return
                consumer.acknowledge(message)
                count(index, 1)

        threads = [threading.Thread(target=run_batched if batched else run, args=(n, c), daemon=True)
                   for n, c in enumerate(consumers)]
        for thread in threads:
            thread.start()
        go.set()
        for thread in threads:
            thread.join(120)
        for consumer in consumers:
            consumer.close()
        first, last = state["first"], state["last"]
        seconds = (last - first) if first and last and last > first else None
        return {"messages": state["received"], "expected": expected_total,
                "complete": state["received"] >= expected_total, "per_consumer": per_consumer,
                "msgs_per_s": round(state["received"] / seconds, 1) if seconds else None,
                "started_unix_s": first, "ended_unix_s": last}

    def run(self) -> dict:
        args = self.args
        results = {}
        if args.only:
            for name in args.only.split(","):
                results[name] = self.measured(name, getattr(self, name))
            self.client.close()
            return results
        results["durable_ack"] = self.measured("durable_ack", self.durable_ack)
        results["raw_durable_ack"] = self.measured("raw_durable_ack", self.raw_durable_ack)
        results["e2e"] = self.measured("e2e", self.e2e)
        results["raw_e2e"] = self.measured("raw_e2e", self.raw_e2e)
        self.create_subscriptions()
        results["publish"] = self.measured("publish", self.publish)
        backlog = results["publish"]["messages"]
        results["drain"] = self.measured(
            "drain", lambda: self._consume(["drain"], pulsar.ConsumerType.Exclusive, backlog, backlog))
        results["work_queue"] = self.measured(
            "work_queue", lambda: self._consume(["work-queue"] * WORK_QUEUE_CONSUMERS, pulsar.ConsumerType.Shared,
                                                None, backlog))
        fanout = [f"fanout-{n}" for n in range(FANOUT_SUBSCRIPTIONS)]
        results["fanout"] = self.measured(
            "fanout", lambda: self._consume(fanout, pulsar.ConsumerType.Exclusive, backlog,
                                            backlog * FANOUT_SUBSCRIPTIONS))
        for name in ("raw_publish", "raw_drain", "raw_work_queue", "raw_fanout"):
            results[name] = self.measured(name, getattr(self, name))
        results["publish_each"] = self.measured("publish_each", self.publish_each)
        self.client.close()
        del args
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service-url", required=True)
    parser.add_argument("--metrics-url", action="append", default=[],
                        help="a server's /metrics (repeat): broker and bookies")
    parser.add_argument("--ack-messages", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--publish-seconds", type=float, default=4.0)
    parser.add_argument("--max-pending", type=int, default=1000)
    parser.add_argument("--batch-delay-ms", type=int, default=1)
    parser.add_argument("--consume", choices=["batch", "per-message"], default="batch",
                        help="drain and fan-out: batch_receive + one cumulative ack per batch, or one at a time")
    parser.add_argument("--only", default="", help="only these latency workloads (durable_ack,e2e), for profiling")
    args = parser.parse_args()
    results = Client(args).run()
    print(json.dumps({"summary": True, **{k: v for k, v in results.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
