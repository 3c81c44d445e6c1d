"""The public asyncio client (magnetar.client) against the official client's asyncio
API (``pulsar.asyncio``, pulsar-client) and against Redis through redis-py's asyncio API
(``redis.asyncio``, Streams) in one run, against two Pulsar-protocol brokers: Magnetar
(etcd, one bookie, one broker, one copy) and pulsar-lite (a Pulsar-protocol broker
compiled from Rust). ``make bench-client`` writes bench/results/client_bench.json.

Workloads, each in a client process of its own (the client is what is measured: one
process, one event loop, as an asyncio service would run it):

- produce: MESSAGES messages of MESSAGE_BYTES to a fresh topic, WINDOW sends in flight
  (``await producer.send`` gathered in windows: the only send the official asyncio API
  has; ours the same, so the call pattern is equal), batching on with each client's
  defaults; the rate counts until the last receipt.
- produce_nowait (ours and Redis only: the official asyncio API has no such call): the
  same, but ``send_nowait`` per message (a future, no coroutine) and one await per window
  (``flush``, then the window's last receipt), as a Redis user sends a pipeline.
- drain: a backlog of MESSAGES messages (written beforehand, batched) read from the
  earliest position by one exclusive consumer, ``await receive()`` then
  ``await acknowledge(message)`` per message; the rate counts from subscribing to the
  last message.
- fanout: the same backlog read by FANOUT_SUBSCRIPTIONS subscriptions of the topic
  (exclusive, from the earliest position), a consumer each, all in the one process and
  reading at once through one client (against pulsar-lite a client each:
  FANOUT_CLIENT_PER_SUBSCRIPTION), ``receive`` + ``acknowledge`` per message; the rate counts every
  delivery (MESSAGES x FANOUT_SUBSCRIPTIONS) from subscribing to the last one. A backlog,
  not live traffic: live, the rate would be the producer's, and the client's delivery
  capacity (what the issue's aim is about) would not show; a service catching up after a
  deploy or an outage reads exactly this.
- work_queue: the same backlog read by WORK_QUEUE_CONSUMERS consumers of one Shared
  subscription in one process, ``receive`` + ``acknowledge`` per message; the rate counts
  messages until MESSAGES deliveries have been received.

Redis, driven as a Redis user would (a stream per case; redis-server started by the
bench on a free loopback port with the AOF fsynced before replies, ``appendfsync always``,
as Magnetar's bookie fsyncs before its receipt; one ``redis.asyncio.Redis`` per process,
its connection pool giving each concurrent reader a connection; hiredis parses replies):

- produce and produce_nowait: XADD in a pipeline per WINDOW messages, the pipeline's reply awaited (the
  usual way to publish fast with redis-py, which does not pipeline concurrent calls on
  its own); the rate counts until the last reply.
- drain: a consumer group created at id 0 (as a subscription from the earliest
  position), one consumer reading XREADGROUP COUNT RECEIVE_BATCH (our consumers
  prefetch a receiver queue of the same size), and an XACK *per message*, the XACKs of
  one read sent as one pipeline (one round trip per read, as our client sends the
  individual acks of a 100 ms window in one ACK command).
- fanout: FANOUT_SUBSCRIPTIONS consumer groups on the one stream, a reader each as in
  drain, at once; every delivery counted.
- work_queue: one consumer group, WORK_QUEUE_CONSUMERS consumers as in drain.

Reported per broker and workload: each client's msgs/s and the client process's CPU
seconds per 100,000 messages (deliveries for fanout), and ours / official and ours / Redis
as ratios of rates and of CPU per message, with the issue's aims (drain and fanout >= 5x
the official client, produce and work_queue >= 2x; >= Redis everywhere) checked. A client
process that crashes or hangs before its timed section ends, or a consuming case in
which nothing arrives for STALL_S, is recorded as a failed run (with its stderr's end),
not fatal. The three clients run the same case back to back, ours in the middle (adjacent to
both others), the order reversed on every other repeat, and the ratios are of the
medians. Redis is measured again in each broker's section, beside that section's runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MESSAGES = 50_000
MESSAGE_BYTES = 256
WINDOW = 1_000
FANOUT_SUBSCRIPTIONS = 4
WORK_QUEUE_CONSUMERS = 4
# Entries per XREADGROUP: the size of our consumers' (and the official client's) default
# receiver queue, which they ask the broker to fill ahead of receive().
RECEIVE_BATCH = 1_000
# A Redis read waits this long for entries before it looks whether to stop (never
# cancelled mid-read: redis-py connections are not safe to cancel in a read).
REDIS_BLOCK_MS = 100
CASE_TIMEOUT_S = 150
# A consuming case in which nothing arrives for this long ends as a failed run (pulsar-lite
# 0.2.0 sometimes stops dispatching to one of several subscriptions: docs/client.md "Speed").
STALL_S = 20.0
# Fan-out through one client (one connection) per process, except against pulsar-lite
# 0.2.0: with several subscriptions of one topic on one connection it dispatches far more
# than the consumers' permits (a consumer of a 50,000-message backlog held 399,640 in its
# queue) and then stops dispatching to one of them, to our client and to the official one
# alike (docs/client.md "Speed"); with a connection per subscription it does not.
FANOUT_CLIENT_PER_SUBSCRIPTION = {"magnetar": False, "pulsar-lite": True}
CLIENTS = ("ours", "official", "redis")
WORKLOADS = ("produce", "produce_nowait", "drain", "fanout", "work_queue")
# The official asyncio API has no send without a coroutine per message: produce_nowait is
# ours against Redis only.
ONLY_OURS_AND_REDIS = ("produce_nowait",)
# ours / official at least this (the aims); ours / Redis at least 1 everywhere.
AIMS_VS_OFFICIAL = {"produce": 2.0, "drain": 5.0, "fanout": 5.0, "work_queue": 2.0}
AIM_VS_REDIS = 1.0


def deliveries(workload: str, messages: int) -> int:
    """What a case's rate counts: every delivery (fan-out reads the backlog once per
    subscription)."""
    return messages * FANOUT_SUBSCRIPTIONS if workload == "fanout" else messages


def _timed(elapsed: float, cpu_s: float) -> tuple[float, float]:
    """Prints a case's result as soon as its timed section ends: a client that crashes
    while closing or exiting (the official client has, twice: SIGABRT, "terminate called
    without an active exception") still has its measurement, recorded with the crash."""
    print(json.dumps({"elapsed_s": elapsed, "cpu_s": cpu_s}), flush=True)
    return elapsed, cpu_s


# --- the client processes: Pulsar's protocol (ours and the official asyncio API) ------------------

@contextlib.asynccontextmanager
async def _pulsar_client(kind: str, url: str):
    """(client, ConsumerType, InitialPosition) of either client: the calls the cases make
    are then the same text for both."""
    if kind == "ours":
        from magnetar.client import Client, ConsumerType, InitialPosition

        async with Client(url) as client:
            yield client, ConsumerType, InitialPosition
    else:
        import pulsar
        import pulsar.asyncio

        client = pulsar.asyncio.Client(url)
        try:
            yield client, pulsar.ConsumerType, pulsar.InitialPosition
        finally:
            await client.close()


async def _produce_pulsar(kind: str, url: str, topic: str, count: int, size: int, window: int,
                          nowait: bool = False) -> tuple[float, float]:
    """``await send()`` gathered per window; or (``nowait``, ours only) ``send_nowait`` per
    message and one await per window, as a Redis pipeline is: ``flush`` sends the batch
    being gathered and the window's last receipt (receipts come in order) ends it, every
    future of the window then checked."""
    payload = b"x" * size
    async with _pulsar_client(kind, url) as (client, _types, _positions):
        producer = await client.create_producer(topic, max_pending_messages=max(window, 1_000))
        start, cpu_start = time.perf_counter(), time.process_time()
        for base in range(0, count, window):
            if nowait:
                futures = [producer.send_nowait(payload) for _ in range(min(window, count - base))]
                await producer.flush()
                await futures[-1]
                failed = [future for future in futures if not future.done() or future.exception()]
                if failed:
                    raise RuntimeError(f"{len(failed)} sends of a window not stored: {failed[0]}")
                continue
            await asyncio.gather(*(producer.send(payload) for _ in range(min(window, count - base))))
        elapsed, cpu_s = _timed(time.perf_counter() - start, time.process_time() - cpu_start)
        await producer.close()
    return elapsed, cpu_s


async def _until_done(tasks: list[asyncio.Task], received: list[int], done: asyncio.Event,
                      cancel: bool = True) -> tuple[float, float]:
    """Waits for ``done``; a case in which no consumer received anything for STALL_S ends
    with an error naming each consumer's count (recorded as a failed run), not at the
    runner's CASE_TIMEOUT_S. The tasks are cancelled either way (a work-queue consumer
    waits in receive() for nothing more once the backlog is read); with ``cancel`` False
    (redis-py readers, not safe to cancel mid-read) they are awaited instead, unless the
    case failed. Returns ``perf_counter()`` and ``process_time()`` at the moment ``done``
    was seen: the end of the timed section (not the tasks' winding down)."""
    try:
        seen, since = -1, time.monotonic()
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1.0)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception():
                    raise task.exception()
            if sum(received) != seen:
                seen, since = sum(received), time.monotonic()
            elif time.monotonic() - since > STALL_S:
                raise RuntimeError(f"stalled: nothing received for {STALL_S:.0f} s; received per consumer: "
                                   f"{received}")
        return time.perf_counter(), time.process_time()
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    finally:
        if cancel:
            for task in tasks:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _consume_pulsar(kind: str, url: str, topic: str, count: int, workload: str,
                          client_per_subscription: bool = False) -> tuple[float, float]:
    async with contextlib.AsyncExitStack() as stack:
        client, types, positions = await stack.enter_async_context(_pulsar_client(kind, url))
        # One client (one connection to the broker) for every subscription, as a service
        # would have; or, where the broker needs it (pulsar-lite: FANOUT_CLIENT_PER_
        # SUBSCRIPTION), a client each, made before the timed section like the one.
        fanout_clients = [client]
        if workload == "fanout" and client_per_subscription:
            fanout_clients = [client] + [(await stack.enter_async_context(_pulsar_client(kind, url)))[0]
                                         for _ in range(FANOUT_SUBSCRIPTIONS - 1)]
        earliest = positions.Earliest
        start, cpu_start = time.perf_counter(), time.process_time()
        if workload == "drain":
            consumers = [await client.subscribe(topic, "drain", initial_position=earliest)]
        elif workload == "fanout":
            consumers = await asyncio.gather(*(
                fanout_clients[n % len(fanout_clients)].subscribe(topic, f"fanout-{n}", initial_position=earliest)
                for n in range(FANOUT_SUBSCRIPTIONS)))
        else:
            consumers = await asyncio.gather(*(
                client.subscribe(topic, "work", consumer_type=types.Shared, initial_position=earliest,
                                 consumer_name=f"worker-{n}")
                for n in range(WORK_QUEUE_CONSUMERS)))
        # Each consumer counts what it received; the case is done when each of them has
        # read the backlog (drain, fanout: every subscription gets every message) or when
        # they have together (work_queue: one subscription shares it out).
        received = [0] * len(consumers)
        done = asyncio.Event()
        shared = workload == "work_queue"
        finished, total = [0], [0]

        async def receive_each(index: int, consumer) -> None:
            while True:
                message = await consumer.receive()
                await consumer.acknowledge(message)
                received[index] += 1
                if shared:
                    total[0] += 1
                    if total[0] >= count:
                        done.set()
                elif received[index] >= count:
                    finished[0] += 1
                    if finished[0] == len(consumers):
                        done.set()
                    return

        end, cpu_end = await _until_done(
            [asyncio.create_task(receive_each(n, consumer)) for n, consumer in enumerate(consumers)], received, done)
        elapsed, cpu_s = _timed(end - start, cpu_end - cpu_start)
        for consumer in consumers:
            await consumer.close()
    return elapsed, cpu_s


async def _fill_pulsar(url: str, topic: str, count: int, size: int) -> None:
    """A backlog for a consuming case, written by our client (batched, fast)."""
    from magnetar.client import Client

    payload = b"y" * size
    async with Client(url) as client:
        producer = await client.create_producer(topic, max_pending_messages=10_000, batching_max_messages=1_000)
        for base in range(0, count, 5_000):
            await asyncio.gather(*(producer.send(payload) for _ in range(min(5_000, count - base))))
        await producer.close()


# --- the client processes: Redis (redis-py asyncio, Streams) ----------------------------------------

def _redis(url: str):
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(url)


async def _produce_redis(url: str, key: str, count: int, size: int, window: int) -> tuple[float, float]:
    payload = b"x" * size
    client = _redis(url)
    try:
        await client.ping()
        start, cpu_start = time.perf_counter(), time.process_time()
        for base in range(0, count, window):
            async with client.pipeline(transaction=False) as pipe:
                for _ in range(min(window, count - base)):
                    pipe.xadd(key, {"d": payload})
                await pipe.execute()
        return _timed(time.perf_counter() - start, time.process_time() - cpu_start)
    finally:
        await client.aclose()


async def _redis_group_reader(client, key: str, group: str, consumer: str, index: int, received: list[int],
                              count: int, total: list[int], done: asyncio.Event) -> None:
    """XREADGROUP a batch, handle each entry and queue an XACK for it, send the batch's
    XACKs in one pipeline; until ``count`` entries are read by this reader (its own
    group: drain, fanout) or by all the readers sharing ``total`` (one group: work_queue,
    ``total`` None here otherwise), which sets ``done``."""
    while not done.is_set():
        answer = await client.xreadgroup(group, consumer, {key: ">"}, count=RECEIVE_BATCH, block=REDIS_BLOCK_MS)
        if not answer:
            continue
        async with client.pipeline(transaction=False) as pipe:
            for _stream, entries in answer:
                for entry_id, fields in entries:
                    _ = fields[b"d"]                 # the message, as a handler would take it
                    pipe.xack(key, group, entry_id)
                    received[index] += 1
            await pipe.execute()
        if total is not None:
            total[0] = sum(received)
        if (total[0] if total is not None else received[index]) >= count:
            done.set()
            return


async def _consume_redis(url: str, key: str, count: int, workload: str) -> tuple[float, float]:
    client = _redis(url)
    try:
        await client.ping()
        start, cpu_start = time.perf_counter(), time.process_time()
        if workload == "work_queue":
            await client.xgroup_create(key, "work", id="0")
            received, total, done = [0] * WORK_QUEUE_CONSUMERS, [0], asyncio.Event()
            readers = [_redis_group_reader(client, key, "work", f"worker-{n}", n, received, count, total, done)
                       for n in range(WORK_QUEUE_CONSUMERS)]
            every = done
        else:
            groups = ["drain"] if workload == "drain" else [f"fanout-{n}" for n in range(FANOUT_SUBSCRIPTIONS)]
            for group in groups:
                await client.xgroup_create(key, group, id="0")
            received, dones = [0] * len(groups), [asyncio.Event() for _ in groups]
            readers = [_redis_group_reader(client, key, group, "c0", n, received, count, None, dones[n])
                       for n, group in enumerate(groups)]
            every = asyncio.Event()

            async def all_done() -> None:
                for each in dones:
                    await each.wait()
                every.set()
            readers.append(all_done())
        end, cpu_end = await _until_done([asyncio.create_task(reader) for reader in readers], received, every,
                                         cancel=False)
        return _timed(end - start, cpu_end - cpu_start)
    finally:
        await client.aclose()


async def _fill_redis(url: str, key: str, count: int, size: int) -> None:
    payload = b"y" * size
    client = _redis(url)
    try:
        for base in range(0, count, 5_000):
            async with client.pipeline(transaction=False) as pipe:
                for _ in range(min(5_000, count - base)):
                    pipe.xadd(key, {"d": payload})
                await pipe.execute()
    finally:
        await client.aclose()


def worker(args: argparse.Namespace) -> None:
    """One case, its result printed by ``_timed`` as its timed section ends; CPU is the
    whole process's (the official client's C++ threads too) over the timed section only,
    not the imports and connection before it."""
    if args.workload == "fill":
        fill = _fill_redis if args.client == "redis" else _fill_pulsar
        asyncio.run(fill(args.url, args.topic, args.messages, args.message_bytes))
        print(json.dumps({"filled": args.messages}), flush=True)
    elif args.workload.startswith("produce"):
        if args.client == "redis":
            asyncio.run(_produce_redis(args.url, args.topic, args.messages, args.message_bytes, args.window))
        else:
            asyncio.run(_produce_pulsar(args.client, args.url, args.topic, args.messages, args.message_bytes,
                                        args.window, nowait=args.workload == "produce_nowait"))
    elif args.client == "redis":
        asyncio.run(_consume_redis(args.url, args.topic, args.messages, args.workload))
    else:
        asyncio.run(_consume_pulsar(args.client, args.url, args.topic, args.messages, args.workload,
                                    args.client_per_subscription))


def run_worker(client: str, workload: str, url: str, topic: str, args: argparse.Namespace,
               client_per_subscription: bool = False) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--client", client, "--workload", workload,
               "--url", url, "--topic", topic, "--messages", str(args.messages),
               "--message-bytes", str(args.message_bytes), "--window", str(args.window)]
    if client_per_subscription:
        command.append("--client-per-subscription")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"failed": f"no result within {CASE_TIMEOUT_S} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        # Recorded, not raised: one crashed client process (the official client once
        # died of SIGSEGV against pulsar-lite) must not lose the rest of the run.
        return {"failed": f"exit status {done.returncode}", "stderr_tail": done.stderr[-1500:]}
    result = json.loads(lines[-1])
    if done.returncode != 0:
        # The timed section ended and was printed; the process died after it (closing,
        # exiting): the measurement stands, the crash is recorded beside it.
        result["crashed_after_result"] = {"exit_status": done.returncode, "stderr_tail": done.stderr[-500:]}
    if workload != "fill":
        counted = deliveries(workload, args.messages)
        result["msgs_per_s"] = counted / result["elapsed_s"]
        result["cpu_s_per_100k"] = result["cpu_s"] * 100_000 / counted
        result["load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


# --- the run ---------------------------------------------------------------------------------

def case_order(clients: list[str], repeat: int) -> list[str]:
    """Ours in the middle, so that it runs right beside each other client; reversed on
    every other repeat, so each pair alternates which goes first."""
    order = [client for client in ("official", "ours", "redis") if client in clients]
    return order if repeat % 2 == 0 else order[::-1]


def _ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def summarize(workload: str, runs: dict[str, list[dict]]) -> dict:
    summary: dict = {}
    for client, client_runs in runs.items():
        good = [r for r in client_runs if "failed" not in r]
        summary[client] = {
            "msgs_per_s_median": statistics.median(r["msgs_per_s"] for r in good) if good else None,
            "cpu_s_per_100k_median": statistics.median(r["cpu_s_per_100k"] for r in good) if good else None,
            "failed_runs": len(client_runs) - len(good),
            "crashed_after_result": sum(1 for r in good if "crashed_after_result" in r), "runs": client_runs}
    ours = summary.get("ours", {})
    for other, aim in (("official", AIMS_VS_OFFICIAL.get(workload)), ("redis", AIM_VS_REDIS)):
        if other not in summary:
            continue
        theirs = summary[other]
        ratio = _ratio(ours.get("msgs_per_s_median"), theirs["msgs_per_s_median"])
        summary[f"ratio_ours_to_{other}"] = ratio
        summary[f"cpu_ratio_{other}_to_ours"] = _ratio(theirs["cpu_s_per_100k_median"],
                                                      ours.get("cpu_s_per_100k_median"))
        summary[f"aim_vs_{other}"] = aim
        summary[f"aim_vs_{other}_met"] = None if ratio is None else ratio >= aim
    return summary


def measure(broker: str, url: str, redis_url: str | None, args: argparse.Namespace) -> dict:
    clients = args.clients.split(",")
    results: dict = {}
    for workload in args.workloads.split(","):
        if workload in ONLY_OURS_AND_REDIS:
            clients_here = [client for client in clients if client != "official"]
        else:
            clients_here = clients
        runs: dict[str, list[dict]] = {client: [] for client in clients_here}
        for repeat in range(args.repeat):
            for client in case_order(clients_here, repeat):
                target = redis_url if client == "redis" else url
                topic = (f"bench-{workload}-{uuid.uuid4().hex[:8]}" if client == "redis" else
                         f"persistent://public/default/bench-{workload}-{client}-{uuid.uuid4().hex[:8]}")
                if not workload.startswith("produce"):
                    filled = run_worker("redis" if client == "redis" else "ours", "fill", target, topic, args)
                    if "failed" in filled:
                        raise RuntimeError(f"filling {topic} failed: {filled}")
                result = run_worker(client, workload, target, topic, args,
                                    client_per_subscription=FANOUT_CLIENT_PER_SUBSCRIPTION[broker])
                runs[client].append(result)
                if "failed" in result:
                    print(f"{broker} {workload} {client}: FAILED {result}", file=sys.stderr, flush=True)
                    continue
                print(f"{broker} {workload} {client}: {result['msgs_per_s']:,.0f} msgs/s, "
                      f"{result['cpu_s_per_100k']:.2f} CPU-s per 100k (load {result['load_average_1m']})",
                      file=sys.stderr, flush=True)
        results[workload] = summarize(workload, runs)
    return results


async def with_magnetar(args: argparse.Namespace, redis_url: str | None) -> dict:
    from bench.harness import bench_cluster

    async with bench_cluster("client-bench-", directory=None, keep_data=False) as cluster:
        await cluster.start_bookies(1)
        await cluster.start_brokers(1, extra_args=["--ensemble-size", "1", "--write-quorum", "1",
                                                   "--ack-quorum", "1"])
        return await asyncio.to_thread(measure, "magnetar", cluster.brokers[0].service_url, redis_url, args)


async def with_pulsar_lite(args: argparse.Namespace, redis_url: str | None) -> dict:
    from tests.pulsar_lite import PulsarLiteProcess

    base = tempfile.mkdtemp(prefix="client-bench-lite-")
    lite = PulsarLiteProcess(base)
    try:
        await lite.start()
        return await asyncio.to_thread(measure, "pulsar-lite", lite.service_url, redis_url, args)
    finally:
        lite.kill9()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def redis_server(wanted: bool):
    """redis-server on a free loopback port (bench/peer_servers.py: AOF, ``appendfsync
    always``, no snapshots) for the whole run, stopped with everything it started; its
    URL, or None when Redis is not among the clients."""
    if not wanted:
        yield None, None
        return
    from bench.peer_servers import PeerServer, missing_binaries, server_versions

    missing = missing_binaries(["redis"])
    if missing:
        raise SystemExit(f"client_bench: {', '.join(missing)} not found: `make bench-client` installs "
                         "Debian's redis-server (or leave redis out: --clients ours,official)")
    base = tempfile.mkdtemp(prefix="client-bench-redis-")
    server = PeerServer("redis", base)
    try:
        server.start()
        yield f"redis://127.0.0.1:{server.port}/0", server_versions().get("redis", "")
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def print_table(report: dict) -> int:
    def rate(value) -> str:
        return f"{value:>9,.0f}" if value else "   failed"

    def times(value) -> str:
        return f"{value:5.2f}x" if value else "    -"

    failed = 0
    for broker, results in report["brokers"].items():
        for workload, summary in results.items():
            line = f"{broker:12} {workload:14}"
            for client in CLIENTS:
                if client in summary:
                    failed += summary[client]["failed_runs"]
                    line += f" {client} {rate(summary[client]['msgs_per_s_median'])}"
            for other in ("official", "redis"):
                if f"ratio_ours_to_{other}" in summary:
                    met = summary[f"aim_vs_{other}_met"]
                    verdict = "no result" if met is None else "met" if met else "NOT met"
                    line += (f" | ours/{other} {times(summary[f'ratio_ours_to_{other}'])}"
                             f" (aim {summary[f'aim_vs_{other}']:g}x {verdict}),"
                             f" CPU {times(summary[f'cpu_ratio_{other}_to_ours'])}")
            print(line)
    if failed:
        print(f"{failed} client runs failed (bench/results: 'failed' in their runs)", file=sys.stderr)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/client_bench.json")
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--message-bytes", type=int, default=MESSAGE_BYTES)
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--brokers", default="magnetar,pulsar-lite")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=list(CLIENTS), help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=list(WORKLOADS) + ["fill"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--client-per-subscription", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    for name, given, known in (("client", args.clients, CLIENTS), ("workload", args.workloads, WORKLOADS),
                               ("broker", args.brokers, ("magnetar", "pulsar-lite"))):
        unknown = set(given.split(",")) - set(known)
        if unknown:
            parser.error(f"unknown {name}s {sorted(unknown)}; known: {', '.join(known)}")
    started = time.perf_counter()
    report: dict = {"what": "magnetar.client against pulsar.asyncio (pulsar-client) and redis.asyncio "
                            "(redis-py, Streams), same run",
                    "messages": args.messages, "message_bytes": args.message_bytes, "window": args.window,
                    "fanout_subscriptions": FANOUT_SUBSCRIPTIONS, "work_queue_consumers": WORK_QUEUE_CONSUMERS,
                    "redis_receive_batch": RECEIVE_BATCH, "repeat": args.repeat,
                    "fanout_client_per_subscription": FANOUT_CLIENT_PER_SUBSCRIPTION,
                    "rates_count": "messages per second; fanout: deliveries (messages x subscriptions) per second",
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(), "brokers": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with redis_server("redis" in args.clients.split(",")) as (redis_url, redis_version):
        if redis_url:
            import redis
            from redis.utils import HIREDIS_AVAILABLE

            report["redis"] = {"server": redis_version, "config": "AOF, appendfsync always, no RDB snapshots",
                               "redis_py": redis.__version__, "hiredis_parser": HIREDIS_AVAILABLE}
        for broker in args.brokers.split(","):
            run = {"magnetar": with_magnetar, "pulsar-lite": with_pulsar_lite}[broker]
            report["brokers"][broker] = asyncio.run(run(args, redis_url))
            report["load_average_at_end"] = os.getloadavg()
            report["wall_s"] = round(time.perf_counter() - started, 1)
            with open(args.out, "w") as handle:       # after each broker: a later failure keeps these
                json.dump(report, handle, indent=2)
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
