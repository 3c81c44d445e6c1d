"""The client process of bench/peers_calls.py: the same workloads through one way of
calling a Pulsar client, against one broker (Magnetar or pulsar-lite), printing one JSON
line per workload (the last line is the summary of them all).

Ways of calling (``--style``), as a Python user writes them:
- ``sync``: the official ``pulsar-client``, blocking API: ``send_async`` with a callback
  per message (``block_if_queue_full``, at most 1,000 pending), ``receive`` one message
  at a time; one thread per consumer.
- ``sync_batch``: the same, consumers with ``batch_receive`` (up to 1,000 a call).
- ``asyncio``: the official client's ``pulsar.asyncio`` API: ``await producer.send`` per
  message (at most 1,000 awaiting), ``await consumer.receive`` per message; one task per
  consumer, all in one event loop.
- ``listener``: the official client's ``message_listener`` callbacks (4 listener threads);
  publishing as ``sync``.
- ``magnetar``: the project's own asyncio client (``client/``): ``producer.send`` per
  message (one entry each: it has no batch timer), consumers with explicit flow (1,000
  permits, granted again as they are used) and ``await consumer.ack``.

Workloads, 1 KiB messages, in order on topics of their own:
- ``publish``: ``--messages`` as fast as receipts come back, at most 1,000 awaiting, the
  producer's batching on (1 ms delay); its backlog is what the consuming workloads read
  (their subscriptions exist before it).
- ``publish_unbatched``: the same with the producer's batching off (one entry per
  message), on a topic of its own with no subscription.
- ``drain``: one exclusive consumer reads the backlog; a cumulative ack per 1,000.
- ``drain_ack_each``: the same on a subscription of its own, an ack per message.
- ``work_queue``: 4 consumers on one shared subscription, one ack per message.
- ``fanout``: 4 subscriptions, one consumer each; counted: every delivery.
- ``e2e``: ``--rate`` messages a second for ``--e2e-seconds``, the producer's batching
  off (a latency-sensitive user turns it off); message i is due at t0 + i/rate and
  carries its due time, the consumer (same process, same clock) records receive - due.

The official producer batches with a 1 ms delay for publish (the issue's harness). Each
workload stops by itself: a consumer that gets nothing for ``RECEIVE_IDLE_S`` is done,
and its result says whether it read everything (``complete``).
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

from load_shapes import (FANOUT_SUBSCRIPTIONS, MAX_PENDING, RECEIVE_IDLE_S, WARMUP_MESSAGES,  # noqa: E402
                         WORK_QUEUE_CONSUMERS, FixedRate, due_of, filler_bytes, payload)
from magnetar.tools.latency_histogram import LatencyHistogram  # noqa: E402

STYLES = ("sync", "sync_batch", "asyncio", "listener", "magnetar")
WORKLOADS = ("publish", "publish_unbatched", "drain", "drain_ack_each", "work_queue", "fanout", "e2e")
CUMULATIVE_EVERY = 1000
BATCH_DELAY_MS = 1
RECEIVE_TIMEOUT_MS = int(RECEIVE_IDLE_S * 1000)
# Permits the own client's consumers keep granted (the official receiver_queue_size).
PERMITS = 1000


def quiet_logger():
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)


def emit(name: str, result: dict) -> dict:
    result["workload"] = name
    print(json.dumps(result), flush=True)
    return result


def failed(error: BaseException) -> dict:
    return {"error": f"{type(error).__name__}: {error}"[:400], "complete": False}


def guarded(name: str, run) -> dict:
    """A workload's result, or what failed it (the next workloads still run)."""
    try:
        return emit(name, run())
    except Exception as error:    # noqa: BLE001 - reported in the results, loudly
        return emit(name, failed(error))


async def guarded_async(name: str, run) -> dict:
    try:
        return emit(name, await run)
    except Exception as error:    # noqa: BLE001 - reported in the results, loudly
        return emit(name, failed(error))


def consumed(name: str, started: float, last: float | None, received: int, expected: int) -> dict:
    """A consuming workload's result: the rate is over first-call .. last message."""
    ended = last or time.time()
    seconds = max(ended - started, 1e-9)
    return {"messages": received, "expected": expected, "complete": received >= expected,
            "msgs_per_s": round(received / seconds, 1), "started_unix_s": started, "ended_unix_s": ended}


class Counter:
    """Messages received across consumer threads, and the time of the last one."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.last: float | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def add(self, count: int) -> None:
        with self.lock:
            self.count += count
            self.last = time.time()
            if self.count >= self.expected:
                self.done.set()


# --- the official client, blocking API and listeners ---------------------------------------

class OfficialSync:
    def __init__(self, args: argparse.Namespace, prefix: str, filler: bytes) -> None:
        self.args = args
        self.prefix = prefix
        self.filler = filler
        self.client = pulsar.Client(args.service_url, operation_timeout_seconds=30, logger=quiet_logger(),
                                    message_listener_threads=FANOUT_SUBSCRIPTIONS)

    def subscribe(self, topic: str, name: str, kind, *, listener=None, batched: bool = False):
        policy = pulsar.ConsumerBatchReceivePolicy(1000, 16 * 1024 * 1024, 10) if batched else None
        return self.client.subscribe(topic, name, consumer_type=kind, receiver_queue_size=1000,
                                     initial_position=pulsar.InitialPosition.Earliest,
                                     batch_receive_policy=policy, message_listener=listener)

    def publish(self, topic: str, batching: bool = True) -> dict:
        subscriptions = self.backlog_subscriptions(topic) if batching else []
        producer = self.client.create_producer(
            topic, batching_enabled=batching, batching_max_publish_delay_ms=BATCH_DELAY_MS,
            max_pending_messages=MAX_PENDING, block_if_queue_full=True, send_timeout_millis=30_000)
        total = self.args.messages
        counter, errors = Counter(total), [0]

        def on_sent(result, _message_id) -> None:
            if result != pulsar.Result.Ok:
                errors[0] += 1
            counter.add(1)

        data = payload(0, self.filler)
        started = time.time()
        for _ in range(total):
            producer.send_async(data, on_sent)
        producer.flush()
        counter.done.wait(60)
        result = consumed("publish", started, counter.last, counter.count, total)
        result["errors"] = errors[0]
        producer.close()
        for consumer in subscriptions:
            consumer.close()
        return result

    def backlog_subscriptions(self, topic: str) -> list:
        return ([self.subscribe(topic, name, pulsar.ConsumerType.Exclusive) for name in ("drain", "drain-each")]
                + [self.subscribe(topic, "work", pulsar.ConsumerType.Shared)]
                + [self.subscribe(topic, f"fan-{index}", pulsar.ConsumerType.Exclusive)
                   for index in range(FANOUT_SUBSCRIPTIONS)])

    def consume(self, topic: str, subscriptions: list[str], kind, expected: int, per_message_ack: bool) -> dict:
        counter = Counter(expected)
        started = time.time()
        if self.args.style == "listener":
            consumers = self._consume_listeners(topic, subscriptions, kind, counter, per_message_ack)
        else:
            consumers = self._consume_threads(topic, subscriptions, kind, counter, per_message_ack)
        result = consumed("", started, counter.last, counter.count, expected)
        for consumer in consumers:
            consumer.close()
        return result

    def _consume_threads(self, topic, subscriptions, kind, counter: Counter, per_message_ack: bool) -> list:
        batched = self.args.style == "sync_batch"
        consumers = [self.subscribe(topic, name, kind, batched=batched) for name in subscriptions]

        subscribed = time.time()

        def run(consumer) -> None:
            since_ack = 0
            while not counter.done.is_set():
                try:
                    if batched:
                        messages = consumer.batch_receive()
                        if not messages:
                            if time.time() - (counter.last or subscribed) > RECEIVE_IDLE_S:
                                return
                            continue
                    else:
                        messages = [consumer.receive(RECEIVE_TIMEOUT_MS)]
                except pulsar.Timeout:
                    return
                if per_message_ack:
                    for message in messages:
                        consumer.acknowledge(message)
                else:
                    since_ack += len(messages)
                    if batched or since_ack >= CUMULATIVE_EVERY:
                        consumer.acknowledge_cumulative(messages[-1])
                        since_ack = 0
                counter.add(len(messages))

        threads = [threading.Thread(target=run, args=(consumer,), daemon=True) for consumer in consumers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        return consumers

    def _consume_listeners(self, topic, subscriptions, kind, counter: Counter, per_message_ack: bool) -> list:
        since_ack: dict[str, int] = {}

        def on_message(consumer, message) -> None:
            if per_message_ack:
                consumer.acknowledge(message)
            else:
                name = consumer.subscription_name()
                since_ack[name] = since_ack.get(name, 0) + 1
                if since_ack[name] >= CUMULATIVE_EVERY:
                    consumer.acknowledge_cumulative(message)
                    since_ack[name] = 0
            counter.add(1)

        subscribed = time.time()
        consumers = [self.subscribe(topic, name, kind, listener=on_message) for name in subscriptions]
        while not counter.done.wait(0.2):
            if time.time() - (counter.last or subscribed) > RECEIVE_IDLE_S:
                break
        return consumers

    def e2e(self, topic: str) -> dict:
        args = self.args
        total = WARMUP_MESSAGES + int(args.rate * args.e2e_seconds)
        schedule = FixedRate(args.rate, total, WARMUP_MESSAGES)
        recorder = E2eRecorder(schedule, total)
        counter = recorder.counter

        def record(message) -> None:
            recorder.record(message.data(), time.perf_counter_ns())

        if args.style == "listener":
            consumer = self.subscribe(topic, "e2e", pulsar.ConsumerType.Exclusive,
                                      listener=lambda c, m: (record(m), c.acknowledge(m)))
            reader = None
        else:
            consumer = self.subscribe(topic, "e2e", pulsar.ConsumerType.Exclusive)

            def read() -> None:
                while not counter.done.is_set():
                    try:
                        message = consumer.receive(RECEIVE_TIMEOUT_MS)
                    except pulsar.Timeout:
                        return
                    record(message)
                    consumer.acknowledge(message)
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
        producer = self.client.create_producer(topic, batching_enabled=False, max_pending_messages=MAX_PENDING,
                                               block_if_queue_full=True, send_timeout_millis=30_000)
        schedule.run_sync(lambda _index, due: producer.send_async(payload(due, self.filler), None))
        producer.flush()
        counter.done.wait(30)
        if reader is not None:
            reader.join(RECEIVE_IDLE_S + 1)
        producer.close()
        consumer.close()
        return recorder.result()

    def close(self) -> None:
        self.client.close()


class E2eRecorder:
    """receive - due per distinct message (a message delivered again counts once, as a
    duplicate); done when every message sent, warm-up included, arrived."""

    def __init__(self, schedule: FixedRate, total: int) -> None:
        self.schedule = schedule
        self.total = total
        self.histogram = LatencyHistogram()
        self.counter = Counter(total)
        self.seen: set[int] = set()
        self.duplicates = 0
        self.lock = threading.Lock()

    def record(self, data: bytes, now_ns: int) -> None:
        due = due_of(data)
        with self.lock:
            if due in self.seen:
                self.duplicates += 1
                return
            self.seen.add(due)
            if self.schedule.counted(due):
                self.histogram.record((now_ns - due) // 1000)
        self.counter.add(1)

    def result(self) -> dict:
        measured = self.total - WARMUP_MESSAGES
        return {"rate_target": self.schedule.rate, "messages": self.histogram.count, "expected": measured,
                "complete": self.histogram.count >= measured, "duplicates": self.duplicates,
                "sender_late_max_ms": self.schedule.late_max_ms(), "latency_ms": self.histogram.summary_ms(),
                "started_unix_s": self.schedule.started_unix_s, "ended_unix_s": self.counter.last or time.time()}


def run_official_sync(args: argparse.Namespace, prefix: str, filler: bytes) -> dict:
    runner = OfficialSync(args, prefix, filler)
    out = {}
    try:
        backlog = f"{prefix}-backlog"
        out["publish"] = guarded("publish", lambda: runner.publish(backlog))
        total = out["publish"].get("messages", 0)
        exclusive, shared = pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Shared
        out["publish_unbatched"] = guarded("publish_unbatched", lambda: runner.publish(f"{prefix}-unbatched", False))
        out["drain"] = guarded("drain", lambda: runner.consume(backlog, ["drain"], exclusive, total, False))
        out["drain_ack_each"] = guarded("drain_ack_each", lambda: runner.consume(
            backlog, ["drain-each"], exclusive, total, True))
        out["work_queue"] = guarded("work_queue", lambda: runner.consume(
            backlog, ["work"] * WORK_QUEUE_CONSUMERS, shared, total, True))
        out["fanout"] = guarded("fanout", lambda: runner.consume(
            backlog, [f"fan-{i}" for i in range(FANOUT_SUBSCRIPTIONS)], exclusive, total * FANOUT_SUBSCRIPTIONS,
            False))
        out["e2e"] = guarded("e2e", lambda: runner.e2e(f"{prefix}-e2e"))
    finally:
        runner.close()
    return out


# --- asyncio: the official pulsar.asyncio and the project's own client ---------------------

class AsyncAdapter:
    """What the asyncio workloads need from a client; one subclass per client."""

    async def producer(self, topic: str, batching: bool): ...
    def send(self, producer, data: bytes) -> asyncio.Future: ...
    async def subscribe(self, topic: str, name: str, kind: str): ...
    async def receive(self, consumer, timeout_s: float) -> list: ...     # the messages of one call
    def data(self, message) -> bytes: ...
    async def ack(self, consumer, messages: list, cumulative: bool) -> None: ...
    async def close_consumer(self, consumer) -> None: ...
    async def close_producer(self, producer) -> None: ...
    async def close(self) -> None: ...


class OfficialAsyncio(AsyncAdapter):
    def __init__(self, service_url: str) -> None:
        import pulsar.asyncio as pulsar_asyncio
        self.client = pulsar_asyncio.Client(service_url, operation_timeout_seconds=30, logger=quiet_logger())

    async def producer(self, topic: str, batching: bool):
        return await self.client.create_producer(topic, batching_enabled=batching,
                                                 batching_max_publish_delay_ms=BATCH_DELAY_MS,
                                                 max_pending_messages=MAX_PENDING, block_if_queue_full=True)

    def send(self, producer, data: bytes) -> asyncio.Future:
        return asyncio.ensure_future(producer.send(data))

    async def subscribe(self, topic: str, name: str, kind: str):
        kinds = {"exclusive": pulsar.ConsumerType.Exclusive, "shared": pulsar.ConsumerType.Shared}
        return await self.client.subscribe(topic, name, consumer_type=kinds[kind], receiver_queue_size=1000,
                                           initial_position=pulsar.InitialPosition.Earliest)

    async def receive(self, consumer, timeout_s: float) -> list:
        return [await asyncio.wait_for(consumer.receive(), timeout_s)]

    def data(self, message) -> bytes:
        return message.data()

    async def ack(self, consumer, messages: list, cumulative: bool) -> None:
        if cumulative:
            await consumer.acknowledge_cumulative(messages[-1])
        else:
            for message in messages:
                await consumer.acknowledge(message)

    async def close_consumer(self, consumer) -> None:
        await consumer.close()

    async def close_producer(self, producer) -> None:
        await producer.close()

    async def close(self) -> None:
        await self.client.close()


class OwnClient(AsyncAdapter):
    """The project's own client (client/), through its current internal API."""

    class _Feed:
        """A consumer's listener: entries into a queue, permits granted again as used."""

        def __init__(self) -> None:
            self.queue: asyncio.Queue = asyncio.Queue()
            self.consumer = None
            self.used = 0

        def on_entry(self, entry) -> None:
            self.queue.put_nowait(entry)

        def on_disconnected(self) -> None:
            pass

        def on_reconnected(self) -> None:
            self.consumer.flow(PERMITS)

        def on_failed(self, error) -> None:
            self.queue.put_nowait(error)

    def __init__(self, service_url: str) -> None:
        from client.client import PulsarClient
        from client.messages import OutgoingMessage
        self.client = PulsarClient(service_url)
        self.message = OutgoingMessage

    async def producer(self, topic: str, batching: bool):
        return await self.client.create_producer(topic)

    def send(self, producer, data: bytes) -> asyncio.Future:
        return producer.send(self.message(data))

    async def subscribe(self, topic: str, name: str, kind: str):
        feed = self._Feed()
        consumer = await self.client.subscribe(topic, name, sub_type=kind, initial_position="earliest", listener=feed)
        feed.consumer = consumer
        consumer.flow(PERMITS)
        return feed

    async def receive(self, feed, timeout_s: float) -> list:
        entry = await asyncio.wait_for(feed.queue.get(), timeout_s)
        if isinstance(entry, Exception):
            raise entry
        feed.used += len(entry.messages)
        if feed.used >= PERMITS // 2:
            feed.consumer.flow(feed.used)
            feed.used = 0
        return list(entry.messages)

    def data(self, message) -> bytes:
        return message.payload

    async def ack(self, feed, messages: list, cumulative: bool) -> None:
        if cumulative:
            await feed.consumer.ack([messages[-1].message_id], cumulative=True)
        else:
            await feed.consumer.ack([message.message_id for message in messages])

    async def close_consumer(self, feed) -> None:
        await feed.consumer.close()

    async def close_producer(self, producer) -> None:
        await producer.close()

    async def close(self) -> None:
        await self.client.close()


async def async_publish(client: AsyncAdapter, topic: str, total: int, filler: bytes, batching: bool = True) -> dict:
    """With ``batching`` the backlog's subscriptions are made first; without, the topic has none."""
    subscriptions = [await client.subscribe(topic, name, kind) for name, kind in
                     [("drain", "exclusive"), ("drain-each", "exclusive"), ("work", "shared")]
                     + [(f"fan-{index}", "exclusive") for index in range(FANOUT_SUBSCRIPTIONS)]] if batching else []
    producer = await client.producer(topic, batching=batching)
    data = payload(0, filler)
    pending: set = set()
    errors = done = 0
    last = None
    started = time.time()
    for _ in range(total):
        if len(pending) >= MAX_PENDING:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in finished:
                errors += future.exception() is not None
            done += len(finished)
            last = time.time()
        pending.add(client.send(producer, data))
    if pending:
        finished, _ = await asyncio.wait(pending, timeout=60)
        errors += sum(future.exception() is not None for future in finished)
        done += len(finished)
        last = time.time()
    result = consumed("publish", started, last, done, total)
    result["errors"] = errors
    await client.close_producer(producer)
    for consumer in subscriptions:
        await client.close_consumer(consumer)
    return result


async def async_consume(client: AsyncAdapter, topic: str, subscriptions: list[str], kind: str, expected: int,
                        per_message_ack: bool) -> dict:
    consumers = [await client.subscribe(topic, name, kind) for name in subscriptions]
    counter = Counter(expected)
    started = time.time()

    async def run(consumer) -> None:
        since_ack = 0
        while not counter.done.is_set():
            try:
                messages = await client.receive(consumer, RECEIVE_IDLE_S)
            except TimeoutError:
                return
            if per_message_ack:
                await client.ack(consumer, messages, False)
            else:
                since_ack += len(messages)
                if since_ack >= CUMULATIVE_EVERY:
                    await client.ack(consumer, messages, True)
                    since_ack = 0
            counter.add(len(messages))

    await asyncio.gather(*(run(consumer) for consumer in consumers))
    for consumer in consumers:
        await client.close_consumer(consumer)
    return consumed("", started, counter.last, counter.count, expected)


async def async_e2e(client: AsyncAdapter, topic: str, rate: int, seconds: float, filler: bytes) -> dict:
    total = WARMUP_MESSAGES + int(rate * seconds)
    schedule = FixedRate(rate, total, WARMUP_MESSAGES)
    recorder = E2eRecorder(schedule, total)
    counter = recorder.counter
    consumer = await client.subscribe(topic, "e2e", "exclusive")
    producer = await client.producer(topic, batching=False)
    sends: set = set()
    acks: set = set()

    async def read() -> None:
        while not counter.done.is_set():
            try:
                messages = await client.receive(consumer, RECEIVE_IDLE_S)
            except TimeoutError:
                return
            now = time.perf_counter_ns()
            for message in messages:
                recorder.record(client.data(message), now)
            # Not awaited: a latency-sensitive reader does not wait for the broker's
            # answer to one ack before taking the next message.
            ack = asyncio.ensure_future(client.ack(consumer, messages, False))
            acks.add(ack)
            ack.add_done_callback(acks.discard)

    def send(_index: int, due: int) -> None:
        future = client.send(producer, payload(due, filler))
        sends.add(future)
        future.add_done_callback(sends.discard)

    reader = asyncio.ensure_future(read())
    await schedule.run_async(send)
    if sends:
        await asyncio.wait(set(sends), timeout=30)
    try:
        await asyncio.wait_for(reader, 30)
    except TimeoutError:
        pass
    if acks:
        await asyncio.wait(set(acks), timeout=10)
    await client.close_producer(producer)
    await client.close_consumer(consumer)
    return recorder.result()


async def run_async_style(args: argparse.Namespace, prefix: str, filler: bytes) -> dict:
    client: AsyncAdapter = OfficialAsyncio(args.service_url) if args.style == "asyncio" else OwnClient(args.service_url)
    out = {}
    try:
        backlog = f"{prefix}-backlog"
        out["publish"] = await guarded_async("publish", async_publish(client, backlog, args.messages, filler))
        total = out["publish"].get("messages", 0)
        out["publish_unbatched"] = await guarded_async("publish_unbatched", async_publish(
            client, f"{prefix}-unbatched", args.messages, filler, batching=False))
        out["drain"] = await guarded_async("drain", async_consume(client, backlog, ["drain"], "exclusive", total,
                                                                  False))
        out["drain_ack_each"] = await guarded_async("drain_ack_each", async_consume(
            client, backlog, ["drain-each"], "exclusive", total, True))
        out["work_queue"] = await guarded_async("work_queue", async_consume(
            client, backlog, ["work"] * WORK_QUEUE_CONSUMERS, "shared", total, True))
        out["fanout"] = await guarded_async("fanout", async_consume(
            client, backlog, [f"fan-{i}" for i in range(FANOUT_SUBSCRIPTIONS)], "exclusive",
            total * FANOUT_SUBSCRIPTIONS, False))
        out["e2e"] = await guarded_async("e2e", async_e2e(client, f"{prefix}-e2e", args.rate, args.e2e_seconds,
                                                          filler))
    finally:
        await client.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service-url", required=True)
    parser.add_argument("--style", choices=STYLES, required=True)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    args = parser.parse_args()
    filler = filler_bytes(os.urandom)
    prefix = f"persistent://public/default/calls-{args.style.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    if args.style in ("asyncio", "magnetar"):
        out = asyncio.run(run_async_style(args, prefix, filler))
    else:
        out = run_official_sync(args, prefix, filler)
    print(json.dumps({"summary": True, "style": args.style, **out}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
