"""Consume-transform-produce in transactions under seeded kills (issue 37's aim):
``make bench-transactions`` → bench/results/transactions_chaos.json.

A ``magnetar standalone`` (1 broker, 3 bookies, 2 copies); N inputs produced up front
with the official client; two workers (tests/txn_wire.py: the official Python client
has no transaction API) each loop: receive an input, open a transaction, send its
output, acknowledge the input in it, commit. Meanwhile, at seeded random moments, one of
three kills: a **client** (a worker's task cancelled mid-whatever, its connection
dropped, a new worker started), the **broker** (SIGKILL; the standalone starts it
again) or a **bookie** (SIGKILL; started again). A worker whose connection fails starts
over; a commit whose answer was lost is not retried (its outcome is the coordinator's:
committed, or aborted by the timeout, and the input then comes again).

Checked: an official consumer of the output topic reads every input's output, each
stored once (one message id; the checker itself may get a message again when its own
acknowledgement was lost in a broker kill — the same id, counted apart), within a bound
after the last kill. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pulsar  # noqa: E402

from bench.fanout_check import running_standalone  # noqa: E402
from tests.integration.test_standalone_supervision import children_of  # noqa: E402
from tests.txn_wire import TxnError, WireConnection  # noqa: E402

TXN_TIMEOUT_MS = 5000
KINDS = ("client", "broker", "bookie")


async def worker(url: str, source: str, sink: str, stats: collections.Counter) -> None:
    while True:
        connection = None
        try:
            connection = WireConnection(url)
            await connection.open()
            await connection.connect_coordinators()
            consumer = await connection.subscribe(source, "transform", permits=20)
            producer = await connection.producer(sink)
            stats["worker_connections"] += 1
            while True:
                try:
                    message = await consumer.receive(timeout_s=1.0)
                except TimeoutError:
                    continue
                txn = await connection.new_txn(timeout_ms=TXN_TIMEOUT_MS)
                await producer.send(b"out-" + message.payload, txn)
                try:
                    await consumer.ack(message, txn)
                except TxnError as error:
                    if "TransactionConflict" not in str(error):
                        raise
                    stats["conflicts"] += 1
                    await connection.end(txn, commit=False)
                    continue
                await connection.end(txn, commit=True)
                stats["commits"] += 1
        except (TxnError, OSError, ConnectionError, TimeoutError) as error:
            stats["worker_failures"] += 1
            stats[f"failure:{type(error).__name__}"] += 1
        finally:
            if connection is not None:
                await connection.close()
        await asyncio.sleep(0.5)


def child_pids(standalone_pid: int, kind: str) -> list[int]:
    return sorted(pid for pid, argv in children_of(standalone_pid).items() if kind in argv)


def restarts_logged(process, kind: str) -> int:
    marker = f"child restarted: process={kind}".encode()
    return sum(marker in line for line in process.output_lines)


async def restarted(process, kind: str, logged_before: int, timeout_s: float = 120) -> float:
    """Seconds until the standalone says it started the killed ``kind`` again (ready:
    the supervisor waits for its health check), so that the next kill does not hit a
    process still starting (the supervisor gives up on a child that fails its starts)."""
    started = time.monotonic()
    while restarts_logged(process, kind) <= logged_before:
        if process.returncode is not None:
            tail = b"".join(list(process.output_lines)[-30:]).decode(errors="replace")
            raise RuntimeError(f"the standalone exited ({process.returncode}):\n{tail}")
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the standalone did not start the {kind} again in {timeout_s} s")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def read_outputs(client: pulsar.Client, sink: str, seen: list[tuple[bytes, str]], stop: list[bool]) -> None:
    """Every (payload, message id) the checker receives. The checker's own
    acknowledgements may be lost in a broker kill (the cursor is flushed every second),
    so it may get a message again: the same id. An output stored twice has two ids."""
    consumer = client.subscribe(sink, "check", initial_position=pulsar.InitialPosition.Earliest)
    while not stop:
        try:
            message = consumer.receive(timeout_millis=500)
        except pulsar.Timeout:
            continue
        seen.append((message.data(), str(message.message_id())))
        consumer.acknowledge(message)
    consumer.close()


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    data_dir = args.data_dir or f"/tmp/magnetar-txn-chaos-{uuid.uuid4().hex[:8]}"
    async with running_standalone(data_dir, bookies=3, copies=2, brokers=1) as (process, ready):
        url = ready["service_url"]
        source = f"persistent://public/default/chaos-in-{uuid.uuid4().hex[:8]}"
        sink = f"persistent://public/default/chaos-out-{uuid.uuid4().hex[:8]}"
        client = pulsar.Client(url, operation_timeout_seconds=60)
        inputs = [f"in-{i:05d}".encode() for i in range(args.inputs)]
        producer = client.create_producer(source)
        for payload in inputs:
            producer.send(payload)
        seen: list[tuple[bytes, str]] = []
        stop: list[bool] = []
        reader = asyncio.ensure_future(asyncio.to_thread(read_outputs, client, sink, seen, stop))
        stats: collections.Counter = collections.Counter()
        workers = [asyncio.ensure_future(worker(url, source, sink, stats)) for _ in range(2)]
        kills: list[dict] = []
        started = time.monotonic()
        try:
            for number in range(args.kills):
                await asyncio.sleep(rng.uniform(0.5, 3.0))
                kind = rng.choice(KINDS)
                entry = {"number": number, "kind": kind, "at_s": round(time.monotonic() - started, 1),
                         "outputs_seen": len(seen)}
                if kind == "client":
                    index = rng.randrange(len(workers))
                    workers[index].cancel()
                    await asyncio.gather(workers[index], return_exceptions=True)
                    workers[index] = asyncio.ensure_future(worker(url, source, sink, stats))
                else:
                    logged = restarts_logged(process, kind)
                    victim = rng.choice(child_pids(process.pid, kind))
                    os.kill(victim, signal.SIGKILL)
                    entry["back_after_s"] = round(await restarted(process, kind, logged), 1)
                kills.append(entry)
                print(json.dumps(entry), flush=True)
            last_kill = time.monotonic()
            deadline = last_kill + args.settle_s
            while len({payload for payload, _id in seen}) < len(inputs) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            all_after_s = time.monotonic() - last_kill
            # Late duplicates would come from a transaction still ending: wait past the
            # transaction timeout before counting.
            await asyncio.sleep(TXN_TIMEOUT_MS / 1000 + 5)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            stop.append(True)
            await reader
            client.close()
        ids: dict[bytes, set[str]] = collections.defaultdict(set)
        for payload, message_id in seen:
            ids[payload].add(message_id)
        expected = {b"out-" + p for p in inputs}
        missing = sorted(expected - set(ids))
        duplicated = sorted(p for p, stored in ids.items() if len(stored) > 1)
        unexpected = sorted(set(ids) - expected)
        return {
            "seed": args.seed, "inputs": len(inputs), "kills": len(kills),
            "kills_by_kind": dict(collections.Counter(k["kind"] for k in kills)),
            "outputs_read": len(seen), "checker_redeliveries": len(seen) - len(set(seen)),
            "distinct_outputs": len(ids),
            "missing": len(missing), "duplicated": len(duplicated), "unexpected": len(unexpected),
            "missing_examples": [m.decode() for m in missing[:10]],
            "duplicated_examples": [d.decode() for d in duplicated[:10]],
            "all_outputs_after_last_kill_s": round(all_after_s, 1),
            "run_s": round(time.monotonic() - started, 1),
            "worker": dict(stats), "kill_log": kills,
            "exactly_once": not missing and not duplicated and not unexpected,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=300)
    parser.add_argument("--settle-s", type=float, default=180.0,
                        help="how long after the last kill every output may take to appear")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--out", default="bench/results/transactions_chaos.json")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "kill_log"}, indent=2))
    return 0 if result["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
