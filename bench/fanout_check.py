"""The fan-out stall check (issue 14): 4 exclusive subscriptions drained at once.

The case: a ``magnetar standalone --bookies 1 --copies 1``; 4 exclusive subscriptions
created before publishing; N (50,000) 1 KiB messages published with batching on (the
official client's defaults: up to 1,000 messages / 128 KiB / 10 ms per batch); then 4
consumers in one official client (its asyncio API when the installed pulsar-client has
``pulsar.asyncio``, else one thread per consumer), receiver queue 1,000, draining at
once, each acknowledging cumulatively the last message of every batch it receives.

What is checked per run: every subscription receives all N messages, and none goes
``--stall-s`` without a message while it still has some to get (a stall: the run ends
there and says which subscription stopped where). After the runs, the brokers'
dispatcher invariant metrics (``magnetar_dispatcher_stalls_total``,
``magnetar_dispatcher_wait_seconds_max``: a consumer with permits and a subscription with
backlog waiting for a read) are read from ``/metrics`` and reported.

Usage: ``python bench/fanout_check.py --runs 20 --messages 50000 --out
bench/results/fanout_check.json`` (``make fanout-check``). Exit code 0 only if every run
delivered everything and no stall was seen by the clients or by the brokers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pulsar  # noqa: E402

from tests.cluster import contiguous_free_ports, free_port, python_command  # noqa: E402

try:
    import pulsar.asyncio as pulsar_asyncio  # pulsar-client >= 3.7
except ImportError:  # pragma: no cover - depends on the installed client
    pulsar_asyncio = None

MESSAGE_BYTES = 1024
SUBSCRIPTIONS = 4
RECEIVER_QUEUE = 1000
# A subscription that gets nothing for this long while it still has messages to get is
# stalled (the issue saw 60 s of nothing; healthy drains deliver every few milliseconds).
STALL_S_DEFAULT = 20.0
STANDALONE_READY_S = 120.0


# --- the standalone --------------------------------------------------------------------------

def standalone_argv(data_dir: str, *, bookies: int = 1, copies: int = 1, brokers: int = 1,
                    extra: list[str] | None = None) -> list[str]:
    return python_command(
        "standalone", "--data-dir", data_dir, "--bookies", str(bookies), "--copies", str(copies),
        "--brokers", str(brokers),
        "--etcd-port", str(free_port()), "--etcd-peer-port", str(free_port()),
        "--bookie-port-base", str(contiguous_free_ports(bookies)),
        "--bookie-http-port-base", str(contiguous_free_ports(bookies)),
        "--broker-port", str(contiguous_free_ports(brokers)),
        "--broker-http-port", str(contiguous_free_ports(brokers + 1)),
        "--gateway-port", str(free_port()), "--autorecovery-http-port", str(free_port()), *(extra or []))


@contextlib.asynccontextmanager
async def running_standalone(data_dir: str, *, env: dict[str, str] | None = None, **kwargs):
    """Starts ``magnetar standalone`` (``env`` added to its environment: e.g. a child's
    flag as MAGNETAR_<FLAG>) and yields (process, the ready event as a dict); stops it
    (SIGTERM, then SIGKILL) whatever happens."""
    process = await asyncio.create_subprocess_exec(*standalone_argv(data_dir, **kwargs),
                                                   stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                                                   env={**os.environ, **(env or {})})
    try:
        assert process.stdout is not None
        ready = None
        async with asyncio.timeout(STANDALONE_READY_S):
            while ready is None:
                line = await process.stdout.readline()
                if not line:
                    raise RuntimeError(f"standalone exited before it was ready (code {await process.wait()})")
                if line.startswith(b"{") and b"standalone ready" in line:
                    ready = json.loads(line)
        # What the standalone prints after it is ready (its own log lines), the latest kept.
        process.output_lines = collections.deque(maxlen=5000)
        drain = asyncio.ensure_future(_drain(process.stdout, process.output_lines))
        try:
            yield process, ready
        finally:
            drain.cancel()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(60):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def _drain(stream: asyncio.StreamReader, lines: collections.deque) -> None:
    while line := await stream.readline():
        lines.append(line)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def metric_values(text: str, name: str) -> list[float]:
    """Every sample of metric ``name`` (any labels) in a Prometheus text page."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return [float(value) for value in pattern.findall(text)]


def dispatcher_invariant(admin_urls: list[str]) -> dict:
    """The brokers' dispatcher invariant: stalls counted and the longest wait seen."""
    stalls = 0.0
    wait_max = 0.0
    for url in admin_urls:
        text = scrape(f"{url}/metrics")
        stall_values = metric_values(text, "magnetar_dispatcher_stalls_total")
        wait_values = metric_values(text, "magnetar_dispatcher_wait_seconds_max")
        # A broker without the metrics must not pass for one without stalls.
        assert stall_values and wait_values, f"{url}/metrics has no dispatcher invariant metrics"
        stalls += sum(stall_values)
        wait_max = max([wait_max, *wait_values])
    return {"stalls": int(stalls), "wait_s_max": round(wait_max, 3)}


# --- one run -----------------------------------------------------------------------------------

def subscription_names(run: int) -> list[str]:
    return [f"fanout-{run}-{index}" for index in range(SUBSCRIPTIONS)]


def create_subscriptions(client: pulsar.Client, topic: str, names: list[str]) -> None:
    """The subscriptions exist before anything is published (they start at the topic's
    beginning): subscribe, then close the consumer (the subscription stays)."""
    for name in names:
        client.subscribe(topic, name, consumer_type=pulsar.ConsumerType.Exclusive,
                         initial_position=pulsar.InitialPosition.Earliest).close()


def publish(client: pulsar.Client, topic: str, messages: int) -> float:
    """Publishes ``messages`` 1 KiB messages, batched; returns the seconds it took."""
    started = time.monotonic()
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True,
                                      max_pending_messages=10_000)
    failures: list[str] = []

    def sent(result, _message_id) -> None:
        if result != pulsar.Result.Ok:
            failures.append(str(result))

    payload = bytes(MESSAGE_BYTES)
    for index in range(messages):
        producer.send_async(payload[:-8] + index.to_bytes(8, "big"), sent)
    producer.flush()
    producer.close()
    assert not failures, failures[:5]
    return time.monotonic() - started


def entry_of(message) -> tuple[int, int]:
    """The entry (batch) a received message came in."""
    message_id = message.message_id()
    return message_id.ledger_id(), message_id.entry_id()


class BatchAcker:
    """One cumulative acknowledgement per received batch: when a message of a new entry
    arrives, the last message of the previous one is acknowledged (the client's message
    ids carry no batch size, so a batch's end shows when the next one starts), and the
    last message when the drain ends."""

    def __init__(self) -> None:
        self.previous = None

    def next(self, message):
        """The message to acknowledge now (None: none)."""
        previous, self.previous = self.previous, message
        if previous is not None and entry_of(previous) != entry_of(message):
            return previous
        return None


class Progress:
    """What each subscription received, and when it last received something."""

    def __init__(self, names: list[str], expected: int) -> None:
        self.expected = expected
        self.counts = {name: 0 for name in names}
        self.last_s = {name: time.monotonic() for name in names}
        self.gap_s_max = {name: 0.0 for name in names}
        self.lock = threading.Lock()

    def received(self, name: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.counts[name] += 1
            self.gap_s_max[name] = max(self.gap_s_max[name], now - self.last_s[name])
            self.last_s[name] = now

    def done(self) -> bool:
        return all(count >= self.expected for count in self.counts.values())

    def stalled(self, stall_s: float) -> list[str]:
        now = time.monotonic()
        with self.lock:
            return [name for name, count in self.counts.items()
                    if count < self.expected and now - self.last_s[name] > stall_s]


async def drain_asyncio(service_url: str, topic: str, names: list[str], progress: Progress,
                        stall_s: float) -> list[str]:
    """4 consumers in one asyncio client; returns the subscriptions that stalled."""
    client = pulsar_asyncio.Client(service_url, operation_timeout_seconds=30)
    try:
        # All four at once, as an asyncio application would.
        consumers = await asyncio.gather(*(client.subscribe(topic, name, consumer_type=pulsar.ConsumerType.Exclusive,
                                                            receiver_queue_size=RECEIVER_QUEUE,
                                                            initial_position=pulsar.InitialPosition.Earliest)
                                           for name in names))
        for name in names:
            progress.last_s[name] = time.monotonic()

        async def drain(consumer, name: str) -> None:
            acker = BatchAcker()
            while progress.counts[name] < progress.expected:
                message = await consumer.receive()
                progress.received(name)
                to_ack = acker.next(message)
                if to_ack is not None:
                    await consumer.acknowledge_cumulative(to_ack)
            await consumer.acknowledge_cumulative(acker.previous)

        tasks = [asyncio.ensure_future(drain(c, n)) for c, n in zip(consumers, names)]
        stalled: list[str] = []
        try:
            while not progress.done():
                done = [task for task in tasks if task.done() and task.exception() is not None]
                if done:
                    raise done[0].exception()
                stalled = progress.stalled(stall_s)
                if stalled:
                    break
                await asyncio.sleep(0.2)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.close()
        return stalled
    finally:
        await client.close()


def drain_threads(service_url: str, topic: str, names: list[str], progress: Progress, stall_s: float) -> list[str]:
    """The same with the synchronous client: one thread per consumer."""
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    stop = threading.Event()
    try:
        consumers = [client.subscribe(topic, name, consumer_type=pulsar.ConsumerType.Exclusive,
                                      receiver_queue_size=RECEIVER_QUEUE,
                                      initial_position=pulsar.InitialPosition.Earliest) for name in names]

        def drain(consumer, name: str) -> None:
            acker = BatchAcker()
            while progress.counts[name] < progress.expected and not stop.is_set():
                try:
                    message = consumer.receive(timeout_millis=500)
                except pulsar.Timeout:
                    continue
                progress.received(name)
                to_ack = acker.next(message)
                if to_ack is not None:
                    consumer.acknowledge_cumulative(to_ack)
            if acker.previous is not None:
                consumer.acknowledge_cumulative(acker.previous)

        threads = [threading.Thread(target=drain, args=(c, n), daemon=True) for c, n in zip(consumers, names)]
        for thread in threads:
            thread.start()
        stalled: list[str] = []
        while not progress.done() and any(t.is_alive() for t in threads):
            stalled = progress.stalled(stall_s)
            if stalled:
                break
            time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        for consumer in consumers:
            with contextlib.suppress(Exception):
                consumer.close()
        return stalled
    finally:
        client.close()


async def fanout_run(service_url: str, run: int, messages: int, *, stall_s: float = STALL_S_DEFAULT,
                     api: str = "auto") -> dict:
    """One run of the case on a fresh topic; returns what each subscription got."""
    topic = f"persistent://public/default/fanout-{os.getpid()}-{run}-{int(time.time() * 1000)}"
    names = subscription_names(run)
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        await asyncio.to_thread(create_subscriptions, client, topic, names)
        publish_s = await asyncio.to_thread(publish, client, topic, messages)
    finally:
        client.close()
    progress = Progress(names, messages)
    started = time.monotonic()
    use_asyncio = pulsar_asyncio is not None if api == "auto" else api == "asyncio"
    if use_asyncio:
        stalled = await drain_asyncio(service_url, topic, names, progress, stall_s)
    else:
        stalled = await asyncio.to_thread(drain_threads, service_url, topic, names, progress, stall_s)
    drain_s = time.monotonic() - started
    return {
        "run": run, "topic": topic, "api": "asyncio" if use_asyncio else "threads",
        "publish_s": round(publish_s, 2), "drain_s": round(drain_s, 2),
        "received": dict(progress.counts), "gap_s_max": {n: round(g, 3) for n, g in progress.gap_s_max.items()},
        "stalled": stalled, "ok": not stalled and progress.done(),
    }


async def main_async(args: argparse.Namespace) -> dict:
    base = tempfile.mkdtemp(prefix="magnetar-fanout-")
    results: list[dict] = []
    try:
        async with running_standalone(os.path.join(base, "standalone"), bookies=1, copies=1) as (_process, ready):
            service_url = ready["service_url"]
            for run in range(args.runs):
                result = await fanout_run(service_url, run, args.messages, stall_s=args.stall_s, api=args.api)
                results.append(result)
                print(json.dumps({k: result[k] for k in ("run", "ok", "received", "stalled", "drain_s")}),
                      flush=True)
                if not result["ok"] and args.stop_on_stall:
                    break
            invariant = dispatcher_invariant([ready["admin_url"]])
    finally:
        if args.keep_data:
            print(f"data kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return {
        "case": "fanout", "messages": args.messages, "subscriptions": SUBSCRIPTIONS,
        "message_bytes": MESSAGE_BYTES, "receiver_queue": RECEIVER_QUEUE, "runs": len(results),
        "runs_ok": sum(r["ok"] for r in results),
        "gap_s_max": max((max(r["gap_s_max"].values()) for r in results), default=0.0),
        "dispatcher": invariant, "results": results,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--stall-s", type=float, default=STALL_S_DEFAULT)
    parser.add_argument("--api", choices=["auto", "asyncio", "threads"], default="auto")
    parser.add_argument("--stop-on-stall", action="store_true")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(main_async(args))
    text = json.dumps(summary, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    print(json.dumps({k: summary[k] for k in ("runs", "runs_ok", "gap_s_max", "dispatcher")}))
    ok = summary["runs_ok"] == args.runs and summary["dispatcher"]["stalls"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
