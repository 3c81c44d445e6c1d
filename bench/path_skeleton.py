"""The durable ack's path with no work in it: what its hops alone cost on this machine,
measured beside the system (bench/peers.py takes it as a baseline of every repeat).

A Magnetar durable ack crosses three processes and a thread: the client's request goes
to the broker's loop, on to the bookie's loop, to the journal's IO thread (write and
fdatasync), back to the bookie's loop, the broker's, and the client. Each crossing is a
wake-up of a process or thread that was asleep (one message at a time, a millisecond
apart), and on this 2-core VM a wake-up costs more than the work between. This
benchmark builds that path with nothing on it:

- ``three_process``: client → relay process (the broker's place) → store process (the
  bookie's), whose IO thread (a plain thread fed by a ``queue.SimpleQueue``, as
  bookie/io_thread.py) writes the 1 KiB and fdatasyncs it, then hands back to the
  store's loop with ``call_soon_threadsafe``, which replies; the relay passes the reply
  on. The floor of Magnetar's design on this machine: no framing, no checksum, no
  protobuf, no bookkeeping.
- ``one_process``: client → store process writing and fdatasyncing on its loop's thread
  before replying (what Redis does with ``appendfsync always``).

And the end-to-end path's shape (``e2e_skeleton``): a producer sends at a fixed rate
(1,000/s) to the relay, which passes each message to the store and, once the store
says it is durable, answers the producer and forwards the message to a consumer
connected to it — Pulsar's rule, a message is dispatched only once it is persisted. The
consumer (the same process, the same clock) takes receive time minus the message's due
time (no coordinated omission). With ``hold_ms`` each message leaves that long after it
is due, as the official client's batch timer holds a message that starts a batch
(bench/latency_client.py uses 1 ms); the producer and the consumer are plain threads
with blocking sockets so the hold is timed by ``clock_nanosleep``, not by the event
loop's millisecond poll. This is the floor of the e2e row: the design's hops, the
fdatasync before dispatch and the client's batch wait, with nothing else on the way.

Both use the standard asyncio loop (the servers' default), TCP over loopback with
TCP_NODELAY, 1 KiB requests and 8-byte replies, the client an asyncio process of its own
(the caller's), one request at a time with ``rest_ms`` between; the two are interleaved in
rounds so the machine's other load falls on both.

    python bench/path_skeleton.py --out /tmp/skeleton.json     # alone, for a look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time

REQUEST_BYTES = 1024
REPLY = b"durable!"
# Requests per round and skeleton; rounds alternate the two skeletons.
ROUND_REQUESTS = 250
# e2e: messages sent and not counted at the start of each round (connections warming).
E2E_WARMUP = 20
# A child process prints its port within this long, or the benchmark gives up.
CHILD_START_S = 20.0


# --- the child processes ---------------------------------------------------------------------

class _Requests(asyncio.Protocol):
    """Cuts the byte stream into fixed-size requests and hands each to ``on_request``."""

    def __init__(self, size: int, on_request) -> None:
        self.size = size
        self.on_request = on_request
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= self.size:
            request = bytes(self.buffer[:self.size])
            del self.buffer[:self.size]
            self.on_request(self, request)


async def _store(directory: str, inline: bool) -> None:
    """Writes and fdatasyncs each request, replies when it is durable."""
    loop = asyncio.get_running_loop()
    fd, path = tempfile.mkstemp(prefix="skeleton-", dir=directory)
    os.unlink(path)
    work: queue.SimpleQueue = queue.SimpleQueue()

    def io_thread() -> None:
        while (item := work.get()) is not None:
            transport, request = item
            os.write(fd, request)
            os.fdatasync(fd)
            loop.call_soon_threadsafe(transport.write, REPLY)

    def on_request(protocol: _Requests, request: bytes) -> None:
        if inline:
            os.write(fd, request)
            os.fdatasync(fd)
            protocol.transport.write(REPLY)
        else:
            work.put((protocol.transport, request))

    threading.Thread(target=io_thread, name="skeleton-io", daemon=True).start()
    server = await loop.create_server(lambda: _Requests(REQUEST_BYTES, on_request), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await _until_stdin_closes()


async def _relay(store_port: int) -> None:
    """Passes each request to the store and its reply back, as a broker passes an add;
    once the store has it, the request also goes to every consumer connected to the
    second port (printed after the first), as a broker dispatches a persisted entry."""
    loop = asyncio.get_running_loop()
    waiting: list[tuple[asyncio.Transport, bytes]] = []
    consumers: list[asyncio.Transport] = []

    def on_reply(_protocol: _Requests, reply: bytes) -> None:
        producer, request = waiting.pop(0)
        producer.write(reply)
        for consumer in consumers:
            consumer.write(request)

    _, upstream = await loop.create_connection(lambda: _Requests(len(REPLY), on_reply), "127.0.0.1", store_port)

    def on_request(protocol: _Requests, request: bytes) -> None:
        waiting.append((protocol.transport, request))
        upstream.transport.write(request)

    class _Consumer(_Requests):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            consumers.append(transport)

        def connection_lost(self, exc) -> None:
            consumers.remove(self.transport)

    server = await loop.create_server(lambda: _Requests(REQUEST_BYTES, on_request), "127.0.0.1", 0)
    consumer_server = await loop.create_server(lambda: _Consumer(1, lambda *_: None), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], consumer_server.sockets[0].getsockname()[1], flush=True)
    await _until_stdin_closes()


async def _until_stdin_closes() -> None:
    """A child lives until its parent closes its stdin (or dies)."""
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# --- the client (the caller's process) -------------------------------------------------------

class _Child:
    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = _readline_within(self.process.stdout, CHILD_START_S)
        self.ports = [int(word) for word in line.split()]
        self.port = self.ports[0]

    def cpu_s(self) -> float:
        """The child's CPU time so far (user + system), from /proc."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(5)


def _readline_within(stream, seconds: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    if not lines or not lines[0].strip():
        raise RuntimeError("a skeleton process did not start")
    return lines[0]


async def _timed_requests(port: int, count: int, rest_s: float) -> list[int]:
    """Microseconds from each request's send to its reply, one at a time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = os.urandom(REQUEST_BYTES)
    samples = []
    try:
        for _ in range(count):
            await asyncio.sleep(rest_s)
            started = time.perf_counter_ns()
            writer.write(request)
            await asyncio.wait_for(reader.readexactly(len(REPLY)), 10)
            samples.append((time.perf_counter_ns() - started) // 1000)
    finally:
        writer.close()
    return samples


def _summary_ms(samples: list[int], p999: bool = False) -> dict:
    ordered = sorted(samples)
    if not ordered:
        raise RuntimeError("a skeleton run measured nothing")

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] / 1000, 3)

    summary = {"count": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}
    if p999:
        summary["p999"] = at(0.999)
    return summary


def skeleton_baseline(directory: str, requests: int = 1000, rest_ms: float = 1.0) -> dict:
    """Both skeletons, interleaved in rounds: {name: {count, p50, p90, p99} in ms}, and
    ``cpu_ms_per_request`` of each process (user + system, in clock ticks: coarse)."""
    store = _Child("--role", "store", "--dir", directory)
    inline_store = _Child("--role", "store-inline", "--dir", directory)
    relay = _Child("--role", "relay", "--store-port", str(store.port))
    samples: dict[str, list[int]] = {"three_process": [], "one_process": []}
    cpu: dict[str, float] = {}
    try:
        async def rounds() -> None:
            # A first round each, not kept: connections, page cache, the file's first blocks.
            await _timed_requests(relay.port, 50, rest_ms / 1000)
            await _timed_requests(inline_store.port, 50, rest_ms / 1000)
            while len(samples["three_process"]) < requests:
                size = min(ROUND_REQUESTS, requests - len(samples["three_process"]))
                samples["three_process"] += await _timed_requests(relay.port, size, rest_ms / 1000)
                samples["one_process"] += await _timed_requests(inline_store.port, size, rest_ms / 1000)

        before = {child: child.cpu_s() for child in (store, inline_store, relay)}
        asyncio.run(rounds())
        cpu = {name: round((child.cpu_s() - before[child]) * 1e3 / (requests + 50), 3)
               for name, child in (("relay", relay), ("store", store), ("one_process_store", inline_store))}
    finally:
        for child in (relay, store, inline_store):
            child.stop()
    return {**{name: _summary_ms(values) for name, values in samples.items()}, "cpu_ms_per_request": cpu}


def _e2e_samples(relay: _Child, messages: int, rate: float, hold_s: float) -> list[int]:
    """Microseconds from each message's due time to its arrival at the consumer, the
    first ``E2E_WARMUP`` left out; the producer sends message i at t0 + i / rate +
    ``hold_s`` (sleeping until then, or at once when late)."""
    producer = socket.create_connection(("127.0.0.1", relay.ports[0]), timeout=10)
    consumer = socket.create_connection(("127.0.0.1", relay.ports[1]), timeout=10)
    samples: list[int] = []
    try:
        for sock in (producer, consumer):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        time.sleep(0.05)    # the relay has registered the consumer
        total = E2E_WARMUP + messages

        def consume() -> None:
            buffer = bytearray()
            seen = 0
            while seen < total:
                chunk = consumer.recv(1 << 16)
                now = time.perf_counter_ns()
                if not chunk:
                    return
                buffer += chunk
                while len(buffer) >= REQUEST_BYTES:
                    due = int.from_bytes(buffer[:8], "big")
                    del buffer[:REQUEST_BYTES]
                    seen += 1
                    if seen > E2E_WARMUP:
                        samples.append((now - due) // 1000)

        def drain_receipts() -> None:
            expected = total * len(REPLY)
            while expected > 0:
                chunk = producer.recv(1 << 16)
                if not chunk:
                    return
                expected -= len(chunk)

        readers = [threading.Thread(target=consume, daemon=True), threading.Thread(target=drain_receipts, daemon=True)]
        for reader in readers:
            reader.start()
        filler = os.urandom(REQUEST_BYTES - 8)
        interval_ns = int(1e9 / rate)
        hold_ns = int(hold_s * 1e9)
        started = time.perf_counter_ns() + 5_000_000
        for index in range(total):
            due = started + index * interval_ns
            delay_ns = due + hold_ns - time.perf_counter_ns()
            if delay_ns > 0:
                time.sleep(delay_ns / 1e9)
            producer.sendall(due.to_bytes(8, "big") + filler)
        for reader in readers:
            reader.join(10)
    finally:
        producer.close()
        consumer.close()
    return samples


def e2e_skeleton(directory: str, seconds: float = 4.0, rate: float = 1000.0,
                 holds_ms: tuple[float, ...] = (1.0, 0.0)) -> dict:
    """The end-to-end path's shape at ``rate`` for ``seconds`` per hold: {"hold_<ms>ms":
    {count, p50, p90, p99, p999} in ms}. The holds alternate in rounds of a second."""
    store = _Child("--role", "store", "--dir", directory)
    relay = _Child("--role", "relay", "--store-port", str(store.port))
    samples: dict[float, list[int]] = {hold: [] for hold in holds_ms}
    try:
        _e2e_samples(relay, 200, rate, 0.0)     # not kept: connections, page cache, first blocks
        per_round = int(rate)
        for _ in range(max(1, round(seconds))):
            for hold in holds_ms:
                samples[hold] += _e2e_samples(relay, per_round, rate, hold / 1000)
    finally:
        for child in (relay, store):
            child.stop()
    return {f"hold_{hold:g}ms": _summary_ms(values, p999=True) for hold, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["client", "store", "store-inline", "relay"], default="client")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the store writes (the data disk)")
    parser.add_argument("--store-port", type=int, default=0)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rest-ms", type=float, default=1.0)
    parser.add_argument("--e2e-seconds", type=float, default=4.0, help="per hold, for the end-to-end shape")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.role == "store":
        asyncio.run(_store(args.dir, inline=False))
    elif args.role == "store-inline":
        asyncio.run(_store(args.dir, inline=True))
    elif args.role == "relay":
        asyncio.run(_relay(args.store_port))
    else:
        result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "rest_ms": args.rest_ms,
                  **skeleton_baseline(args.dir, args.requests, args.rest_ms),
                  "e2e_at_1000_per_s": e2e_skeleton(args.dir, args.e2e_seconds)}
        text = json.dumps(result, indent=2)
        if args.out:
            with open(args.out, "w") as out:
                out.write(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
