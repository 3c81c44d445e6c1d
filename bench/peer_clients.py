"""The client process of bench/peers.py: one Python asyncio process driving one peer
(Redis, NATS JetStream or RabbitMQ) with its usual client through the workloads of
bench/latency_client.py, in the same order, and printing one JSON line per workload
(the last line is the summary of them all, in the shape bench/latency.py reads).

Same message (1 KiB, due time in the first 8 bytes), same in-flight bound (1,000
awaiting their acknowledgement), same fixed-rate schedule (bench/load_shapes.py) as the
Magnetar client. Per system, what each workload is:

| | Redis (Streams, AOF ``appendfsync always``) | NATS JetStream (file storage) | RabbitMQ (quorum queues) |
|---|---|---|---|
| durable ack | the XADD reply: with ``appendfsync always`` Redis writes and fsyncs the AOF before it sends the replies of an event-loop round | the PubAck of ``js.publish`` (stored; fsynced only with ``sync_interval: always``) | the publisher confirm (a quorum queue confirms once a majority of its members fsynced the entry: one member here) |
| publish | XADD in pipelines of ``PUBLISH_BATCH`` on a bounded pool of connections | ``js.publish_async``, PubAcks awaited (one connection) | ``publish`` with confirms concurrently, batches spread over 8 channels of one connection |
| drain | XREAD from the start, ``count`` 1,000 (no acknowledgement exists for a plain reader: its position is its state) | a durable push consumer from the stream's start, a callback, ``ack`` per message | a consumer, prefetch 1,000, ``ack`` per message |
| work queue | one consumer group, 4 consumers, XREADGROUP ``count`` 1,000, one XACK per message (pipelined per read) | 4 queue subscriptions of one durable push consumer | 4 consumers on one queue, prefetch 1,000 each |
| fan-out | 4 XREAD readers from the start | 4 durable push consumers | a fanout exchange to 4 quorum queues, a consumer each |
| e2e | XADD pipelined as messages come (one pipeline in flight), XREAD BLOCK on the stream's tail | ``js.publish`` per message, a push consumer, ``ack`` per message | ``publish`` per message, a consumer, ``ack`` per message |

In Redis and NATS one stream of the backlog is written by ``publish`` and read by
drain, work queue and fan-out (the Redis consumer group exists before the publish, as
Magnetar's subscriptions do; NATS consumers are created when they read, from the
stream's first message, which reads the same backlog; nats-py's pull ``fetch`` hands
messages over one await at a time and was 3-5x slower than push callbacks here). RabbitMQ's queues are the subscriptions
themselves: ``publish`` writes the drain queue, and before the work queue and the
fan-out the same number of messages is written again (unmeasured: ``refill_s``) into
the work queue and through the fanout exchange into its 4 queues.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import json
import os
import sys
import time
import uuid

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

from load_shapes import (FANOUT_SUBSCRIPTIONS, MAX_PENDING, PUBLISH_BATCH, RECEIVE_IDLE_S,  # noqa: E402
                         WARMUP_MESSAGES, WORK_QUEUE_CONSUMERS, FixedRate, due_of, filler_bytes, payload)
from magnetar.tools.latency_histogram import LatencyHistogram  # noqa: E402

CONNECT_TIMEOUT_S = 60.0
PUBLISH_TIMEOUT_S = 30.0
# A consumer workload never runs longer than this.
CONSUME_LIMIT_S = 120.0
# Reading loops wait at most this long for data before they look whether to stop (the
# runner's idle rule, RECEIVE_IDLE_S without progress, decides when a backlog is read).
POLL_MS = 250
# Reading tasks get this long to return once told to stop, then are cancelled.
STOP_GRACE_S = 5.0


class Progress:
    """What consumers of one workload received, for the runner's stop rule."""

    def __init__(self, consumers: int) -> None:
        self.received = 0
        self.per_consumer = [0] * consumers
        self.first: float | None = None
        self.last: float | None = None
        self.last_progress = time.monotonic()
        self.errors: list[str] = []

    def record(self, consumer: int, count: int = 1) -> None:
        now = time.time()
        self.received += count
        self.per_consumer[consumer] += count
        if self.first is None:
            self.first = now
        self.last = now
        self.last_progress = time.monotonic()

    def failed(self, error: BaseException) -> None:
        self.errors.append(f"{type(error).__name__}: {error}"[:300])


def _task_failed(progress: Progress):
    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            progress.failed(task.exception())
    return done


# --- the peers ---------------------------------------------------------------------------------

class Peer(abc.ABC):
    """One system. ``publish`` returns once the message is acknowledged durably (in the
    system's own sense, see the module's table); consumers call ``progress.record``."""

    name = "peer"

    def __init__(self, port: int, prefix: str) -> None:
        self.port = port
        self.prefix = prefix
        # Set by the runner when a workload is over: reading loops return at their next
        # turn (cancelling a redis-py read in flight proved to hang).
        self.stopping = False

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def prepare(self) -> None:
        """Streams / queues / consumers, before anything is published."""

    @abc.abstractmethod
    async def publish(self, kind: str, data: bytes) -> None:
        """Publishes one message of ``kind`` and waits for the system's acknowledgement."""

    async def publish_many(self, kind: str, datas: list[bytes]) -> list[int]:
        """Publishes ``datas``; the ``perf_counter_ns`` each was acknowledged at."""
        async def one(data: bytes) -> int:
            await self.publish(kind, data)
            return time.perf_counter_ns()
        return list(await asyncio.gather(*(one(data) for data in datas)))

    def e2e_send(self, data: bytes) -> asyncio.Future:
        """Sends one message of the fixed-rate case without waiting: its ack's future."""
        return asyncio.ensure_future(self.publish("e2e", data))

    @abc.abstractmethod
    async def start_e2e(self, on_data) -> list[asyncio.Task]:
        """Starts the fixed-rate case's readers, calling ``on_data(bytes)`` per message."""

    async def refill(self, mode: str, count: int, filler: bytes) -> None:
        """Before ``mode``, a backlog of ``count`` where ``publish`` did not write it."""

    @abc.abstractmethod
    async def consume(self, mode: str, progress: Progress) -> list[asyncio.Task]:
        """Starts the readers of ``mode`` (drain, work queue, fan-out) recording into ``progress``."""

    async def stop_consumers(self) -> None:
        """Ends the consumers ``consume`` started without tasks (callbacks)."""


class RedisPeer(Peer):
    name = "redis"

    async def connect(self) -> None:
        import redis.asyncio as aioredis
        self.aioredis = aioredis
        # A bounded pool: one connection per pipeline in flight (MAX_PENDING / PUBLISH_BATCH).
        self.pool = aioredis.BlockingConnectionPool(host="127.0.0.1", port=self.port,
                                                    max_connections=MAX_PENDING // PUBLISH_BATCH + 4,
                                                    timeout=PUBLISH_TIMEOUT_S)
        self.client = aioredis.Redis(connection_pool=self.pool)
        await self.client.ping()
        self.readers: list = []
        self._e2e_queue: list[tuple[bytes, asyncio.Future]] = []   # bounded: the runner's window
        self._e2e_flusher: asyncio.Future | None = None

    def e2e_send(self, data: bytes) -> asyncio.Future:
        """Pipelined as the messages come: one pipeline in flight, and what arrives
        meanwhile goes in the next one (redis-py does not pipeline on its own; one XADD
        per task over the pool fell behind 1,000 msgs/s here, acks 30-50 ms late at
        p50, on the client's CPU). No timer: a message alone leaves at once."""
        future = asyncio.get_running_loop().create_future()
        self._e2e_queue.append((data, future))
        if self._e2e_flusher is None or self._e2e_flusher.done():
            self._e2e_flusher = asyncio.ensure_future(self._flush_e2e())
        return future

    async def _flush_e2e(self) -> None:
        while self._e2e_queue:
            batch, self._e2e_queue = self._e2e_queue, []
            try:
                await self.publish_many("e2e", [data for data, _ in batch])
            except Exception as error:   # noqa: BLE001 - handed to each message's future
                for _, future in batch:
                    future.set_exception(error)
            else:
                for _, future in batch:
                    future.set_result(None)

    def _reader(self):
        reader = self.aioredis.Redis(host="127.0.0.1", port=self.port)
        self.readers.append(reader)
        return reader

    async def close(self) -> None:
        for reader in self.readers:
            await reader.aclose()
        await self.client.aclose()
        await self.pool.disconnect()

    def key(self, kind: str) -> str:
        return f"{self.prefix}-{kind}"

    async def prepare(self) -> None:
        await self.client.xgroup_create(self.key("backlog"), "work", id="0", mkstream=True)

    async def publish(self, kind: str, data: bytes) -> None:
        await self.client.xadd(self.key(kind), {"d": data})

    async def publish_many(self, kind: str, datas: list[bytes]) -> list[int]:
        async with self.client.pipeline(transaction=False) as pipe:
            for data in datas:
                pipe.xadd(self.key(kind), {"d": data})
            await pipe.execute()
        return [time.perf_counter_ns()] * len(datas)

    async def start_e2e(self, on_data) -> list[asyncio.Task]:
        reader = self._reader()
        key = self.key("e2e")
        # The stream exists and is read from this entry on, whenever the reader's first
        # XREAD goes out.
        start_id = await self.client.xadd(key, {"d": b"start"})

        async def run() -> None:
            last = start_id
            while not self.stopping:
                answer = await reader.xread({key: last}, count=1000, block=POLL_MS)
                for _stream, entries in answer or []:
                    for entry_id, fields in entries:
                        last = entry_id
                        on_data(fields[b"d"])
        return [asyncio.create_task(run())]

    async def consume(self, mode: str, progress: Progress) -> list[asyncio.Task]:
        key = self.key("backlog")

        async def read_all(index: int) -> None:
            reader = self._reader()
            last = "0-0"
            while not self.stopping:
                answer = await reader.xread({key: last}, count=1000, block=POLL_MS)
                if not answer:
                    continue
                for _stream, entries in answer:
                    last = entries[-1][0]
                    progress.record(index, len(entries))

        async def work(index: int) -> None:
            reader = self._reader()
            while not self.stopping:
                answer = await reader.xreadgroup("work", f"c{index}", {key: ">"}, count=1000, block=POLL_MS)
                if not answer:
                    continue
                for _stream, entries in answer:
                    async with reader.pipeline(transaction=False) as pipe:
                        for entry_id, _fields in entries:
                            pipe.xack(key, "work", entry_id)
                        await pipe.execute()
                    progress.record(index, len(entries))

        if mode == "drain":
            return [asyncio.create_task(read_all(0))]
        if mode == "work_queue":
            return [asyncio.create_task(work(n)) for n in range(WORK_QUEUE_CONSUMERS)]
        return [asyncio.create_task(read_all(n)) for n in range(FANOUT_SUBSCRIPTIONS)]


class NatsPeer(Peer):
    name = "nats"
    STREAMS = ("ack", "e2e", "backlog")

    async def connect(self) -> None:
        import nats
        from nats.js import api
        self.api = api
        self.nc = await nats.connect(f"nats://127.0.0.1:{self.port}", connect_timeout=10,
                                     max_reconnect_attempts=0)
        self.js = self.nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        self.subscriptions: list = []

    async def close(self) -> None:
        await self.nc.close()

    def subject(self, kind: str) -> str:
        return f"{self.prefix}.{kind}"

    async def prepare(self) -> None:
        api = self.api
        for kind in self.STREAMS:
            await self.js.add_stream(name=f"{self.prefix}-{kind}".upper(), subjects=[self.subject(kind)],
                                     storage=api.StorageType.FILE)

    async def publish(self, kind: str, data: bytes) -> None:
        await self.js.publish(self.subject(kind), data)

    async def publish_many(self, kind: str, datas: list[bytes]) -> list[int]:
        """``publish_async``: the PubAcks come back on one shared reply subscription
        (nats-py's way to keep many publishes in flight, as the Go client's)."""
        acked: list[int] = []

        def done(_future) -> None:
            acked.append(time.perf_counter_ns())
        futures = []
        for data in datas:
            future = await self.js.publish_async(self.subject(kind), data)
            future.add_done_callback(done)
            futures.append(future)
        for future in futures:
            await future      # raises a refused or failed publish
        return acked

    async def start_e2e(self, on_data) -> list[asyncio.Task]:
        async def handler(message) -> None:
            on_data(message.data)
            await message.ack()
        subscription = await self.js.subscribe(self.subject("e2e"), cb=handler, manual_ack=True,
                                               deliver_policy=self.api.DeliverPolicy.NEW)
        self.subscriptions.append(subscription)
        return []

    async def consume(self, mode: str, progress: Progress) -> list[asyncio.Task]:
        """Push consumers created now, delivering the stream from its first message (the
        stream keeps every message: limits retention), with a callback each."""
        def handler_for(index: int):
            async def handler(message) -> None:
                await message.ack()
                progress.record(index)
            return handler

        policy = self.api.DeliverPolicy.ALL
        if mode == "drain":
            specs = [(0, "drain", None)]
        elif mode == "work_queue":
            specs = [(n, "work", "work") for n in range(WORK_QUEUE_CONSUMERS)]
        else:
            specs = [(n, f"fanout{n}", None) for n in range(FANOUT_SUBSCRIPTIONS)]
        for index, durable, queue in specs:
            self.subscriptions.append(await self.js.subscribe(
                self.subject("backlog"), queue=queue, durable=durable, cb=handler_for(index), manual_ack=True,
                deliver_policy=policy))
        return []

    async def stop_consumers(self) -> None:
        for subscription in self.subscriptions:
            await subscription.unsubscribe()
        self.subscriptions = []


class RabbitPeer(Peer):
    name = "rabbitmq"
    PREFETCH = 1000
    PUBLISH_CHANNELS = 8

    async def connect(self) -> None:
        import aio_pika
        self.aio_pika = aio_pika
        url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                self.connection = await aio_pika.connect(url, timeout=10)
                break
            except Exception:   # the broker may still be booting: retry until the deadline
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        # aiormq sends a channel's frames one publish at a time behind a lock, waiting for
        # each write: publishes in flight are spread over several channels (a batch each).
        self.channels = [await self.connection.channel(publisher_confirms=True)
                         for _ in range(self.PUBLISH_CHANNELS)]
        self.channel = self.channels[0]
        self.next_channel = 0

    async def close(self) -> None:
        await self.connection.close()

    def queue_name(self, kind: str) -> str:
        return f"{self.prefix}-{kind}"

    QUEUES = ["ack", "e2e", "drain", "work"] + [f"fanout{n}" for n in range(FANOUT_SUBSCRIPTIONS)]

    async def prepare(self) -> None:
        quorum = {"x-queue-type": "quorum"}
        self.queues = {}
        for kind in self.QUEUES:
            self.queues[kind] = await self.channel.declare_queue(self.queue_name(kind), durable=True,
                                                                 arguments=quorum)
        self.fanout = await self.channel.declare_exchange(self.queue_name("fanout"),
                                                          self.aio_pika.ExchangeType.FANOUT, durable=True)
        for n in range(FANOUT_SUBSCRIPTIONS):
            await self.queues[f"fanout{n}"].bind(self.fanout)

    async def publish(self, kind: str, data: bytes, channel=None) -> None:
        message = self.aio_pika.Message(data, delivery_mode=self.aio_pika.DeliveryMode.PERSISTENT)
        channel = channel or self.channel
        if kind == "fanout":
            exchange = await channel.get_exchange(self.queue_name("fanout"), ensure=False)
            await exchange.publish(message, routing_key="")
        else:
            queue = "drain" if kind == "backlog" else kind
            await channel.default_exchange.publish(message, routing_key=self.queue_name(queue))

    async def publish_many(self, kind: str, datas: list[bytes]) -> list[int]:
        channel = self.channels[self.next_channel]
        self.next_channel = (self.next_channel + 1) % len(self.channels)

        async def one(data: bytes) -> int:
            await self.publish(kind, data, channel)
            return time.perf_counter_ns()
        return list(await asyncio.gather(*(one(data) for data in datas)))

    async def refill(self, mode: str, count: int, filler: bytes) -> None:
        kind = {"work_queue": "work", "fanout": "fanout"}.get(mode)
        if kind is None:
            return
        sent = 0
        while sent < count:
            batch = min(MAX_PENDING, count - sent)
            await self.publish_many(kind, [payload(0, filler)] * batch)
            sent += batch

    async def _consumer(self, queue_kind: str, index: int, progress: Progress, on_data=None):
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=self.PREFETCH)
        queue = await channel.get_queue(self.queue_name(queue_kind), ensure=False)

        async def handler(message) -> None:
            if on_data is not None:
                on_data(message.body)
            # basic.ack is one-way: sent without waiting for the socket write to drain.
            await message.channel.basic_ack(delivery_tag=message.delivery_tag, wait=False)
            if progress is not None:
                progress.record(index)
        await queue.consume(handler, no_ack=False)
        return channel

    async def start_e2e(self, on_data) -> list[asyncio.Task]:
        self.e2e_channel = await self._consumer("e2e", 0, None, on_data)
        return []

    async def consume(self, mode: str, progress: Progress) -> list[asyncio.Task]:
        if mode == "drain":
            specs = [("drain", 0)]
        elif mode == "work_queue":
            specs = [("work", n) for n in range(WORK_QUEUE_CONSUMERS)]
        else:
            specs = [(f"fanout{n}", n) for n in range(FANOUT_SUBSCRIPTIONS)]
        self.consumer_channels = [await self._consumer(kind, index, progress) for kind, index in specs]
        return []

    async def stop_consumers(self) -> None:
        for channel in getattr(self, "consumer_channels", []):
            await channel.close()
        self.consumer_channels = []


PEERS = {"redis": RedisPeer, "nats": NatsPeer, "rabbitmq": RabbitPeer}


# --- the workloads -------------------------------------------------------------------------------

class Runner:
    def __init__(self, peer: Peer, args: argparse.Namespace) -> None:
        self.peer = peer
        self.args = args
        self.filler = filler_bytes(os.urandom)

    async def stop_tasks(self, tasks: list[asyncio.Task]) -> None:
        self.peer.stopping = True
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
            for task in pending:
                task.cancel()
        self.peer.stopping = False

    def emit(self, name: str, result: dict) -> dict:
        result["workload"] = name
        print(json.dumps(result), flush=True)
        return result

    async def durable_ack(self) -> dict:
        histogram = LatencyHistogram()
        started_unix = None
        for index in range(WARMUP_MESSAGES + self.args.ack_messages):
            if index == WARMUP_MESSAGES:
                started_unix = time.time()
            started = time.perf_counter_ns()
            await asyncio.wait_for(self.peer.publish("ack", payload(started, self.filler)), PUBLISH_TIMEOUT_S)
            if index >= WARMUP_MESSAGES:
                histogram.record((time.perf_counter_ns() - started) // 1000)
        return {"messages": histogram.count, "errors": 0, "latency_ms": histogram.summary_ms(),
                "started_unix_s": started_unix, "ended_unix_s": time.time()}

    async def e2e(self) -> dict:
        args = self.args
        total = WARMUP_MESSAGES + int(args.rate * args.e2e_seconds)
        schedule = FixedRate(args.rate, total, WARMUP_MESSAGES)
        histogram = LatencyHistogram()
        state = {"received": 0, "errors": 0, "over_window": 0}
        all_in = asyncio.Event()

        def on_data(data: bytes) -> None:
            now = time.perf_counter_ns()
            due = due_of(data) if len(data) >= 8 else 0
            if due == 0:
                return   # not ours (Redis' stream-creating entry)
            state["received"] += 1
            if schedule.counted(due):
                histogram.record((now - due) // 1000)
            if state["received"] >= total:
                all_in.set()

        tasks = await self.peer.start_e2e(on_data)
        in_flight: set[asyncio.Task] = set()

        def sent(task: asyncio.Task) -> None:
            in_flight.discard(task)
            if task.cancelled() or task.exception() is not None:
                state["errors"] += 1

        def send(_index: int, due: int) -> None:
            if len(in_flight) >= MAX_PENDING:   # never waits: the schedule must not slip
                state["over_window"] += 1
                return
            task = self.peer.e2e_send(payload(due, self.filler))
            in_flight.add(task)
            task.add_done_callback(sent)

        await schedule.run_async(send)
        try:
            await asyncio.wait_for(all_in.wait(), 30)
        except TimeoutError:
            pass
        ended_unix = time.time()
        await self.stop_tasks(tasks)
        return {"rate_target": args.rate, "messages": histogram.count,
                "errors": state["errors"] + state["over_window"],
                "received": state["received"] - WARMUP_MESSAGES, "complete": state["received"] >= total,
                "sender_late_max_ms": schedule.late_max_ms(), "latency_ms": histogram.summary_ms(),
                "started_unix_s": schedule.started_unix_s, "ended_unix_s": ended_unix}

    async def publish(self) -> dict:
        args = self.args
        window = asyncio.Semaphore(MAX_PENDING)
        histogram = LatencyHistogram()
        counts = {"acked": 0, "errors": 0, "sent": 0}
        last_ack = [0.0]
        tasks: set[asyncio.Task] = set()

        async def batch(started_ns: int, datas: list[bytes]) -> None:
            try:
                acked = await asyncio.wait_for(self.peer.publish_many("backlog", datas), PUBLISH_TIMEOUT_S)
                for at in acked:
                    histogram.record((at - started_ns) // 1000)
                counts["acked"] += len(datas)
                last_ack[0] = time.time()
            except Exception:
                counts["errors"] += len(datas)
            finally:
                for _ in datas:
                    window.release()

        started_unix = time.time()
        deadline = time.monotonic() + args.publish_seconds
        while time.monotonic() < deadline:
            for _ in range(PUBLISH_BATCH):
                await window.acquire()
            now = time.perf_counter_ns()
            task = asyncio.create_task(batch(now, [payload(now, self.filler)] * PUBLISH_BATCH))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            counts["sent"] += PUBLISH_BATCH
        await asyncio.gather(*list(tasks))
        ended_unix = last_ack[0] or time.time()
        seconds = ended_unix - started_unix
        return {"messages": counts["acked"], "sent": counts["sent"], "errors": counts["errors"],
                "msgs_per_s": round(counts["acked"] / seconds, 1), "max_pending": MAX_PENDING,
                "publish_batch": PUBLISH_BATCH, "publish_latency_ms": histogram.summary_ms(),
                "started_unix_s": started_unix, "ended_unix_s": ended_unix}

    async def consume(self, mode: str, backlog: int) -> dict:
        refill_started = time.monotonic()
        await self.peer.refill(mode, backlog, self.filler)
        refill_s = round(time.monotonic() - refill_started, 3)
        consumers = {"drain": 1, "work_queue": WORK_QUEUE_CONSUMERS}.get(mode, FANOUT_SUBSCRIPTIONS)
        expected = backlog * (FANOUT_SUBSCRIPTIONS if mode == "fanout" else 1)
        progress = Progress(consumers)
        tasks = await self.peer.consume(mode, progress)
        for task in tasks:
            task.add_done_callback(_task_failed(progress))
        limit = time.monotonic() + CONSUME_LIMIT_S
        while (progress.received < expected and not progress.errors and time.monotonic() < limit
               and time.monotonic() - progress.last_progress < RECEIVE_IDLE_S + 1
               and (not tasks or not all(task.done() for task in tasks))):
            await asyncio.sleep(0.02)
        await self.stop_tasks(tasks)
        await self.peer.stop_consumers()
        first, last = progress.first, progress.last
        seconds = (last - first) if first and last and last > first else None
        return {"messages": progress.received, "expected": expected, "complete": progress.received >= expected,
                "per_consumer": progress.per_consumer, "errors": len(progress.errors),
                "error_texts": progress.errors[:3], "refill_s": refill_s,
                "msgs_per_s": round(progress.received / seconds, 1) if seconds else None,
                "started_unix_s": first, "ended_unix_s": last}

    async def run(self) -> dict:
        peer = self.peer
        await asyncio.wait_for(peer.connect(), CONNECT_TIMEOUT_S)
        results = {}
        try:
            await peer.prepare()
            results["durable_ack"] = self.emit("durable_ack", await self.durable_ack())
            results["e2e"] = self.emit("e2e", await self.e2e())
            results["publish"] = self.emit("publish", await self.publish())
            backlog = results["publish"]["messages"]
            for mode in ("drain", "work_queue", "fanout"):
                results[mode] = self.emit(mode, await self.consume(mode, backlog))
        finally:
            await peer.close()
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", required=True, choices=sorted(PEERS))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ack-messages", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--publish-seconds", type=float, default=4.0)
    args = parser.parse_args()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    peer = PEERS[args.system](args.port, prefix)
    results = asyncio.run(Runner(peer, args).run())
    print(json.dumps({"summary": True, **results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
