"""A chaos run: 3 brokers and 4 bookies (and etcd) on this machine under official-client
load, seeded faults one at a time, and every acknowledged message checked against what
the consumers received.

    python bench/chaos.py --faults 50 --seed 1 --out bench/results/chaos.json   (make chaos)

Load: one batched producer (``send_async``; a message counts as acknowledged when its
callback reports Ok) and two consumers on one shared subscription, acknowledging each
message, all in one official client whose service URL names the three brokers. Every
payload carries a sequence number.

Faults (one at a time, chosen by the seed; after each, the harness waits until
acknowledgements flow again before the next): kill -9 of a bookie (restarted after a
pause), of a broker (restarted), of etcd (restarted within 8 s); SIGSTOP of a bookie
or a broker for a few seconds (then SIGCONT); a bookie's disk "filling": the bookie
is restarted with a disk-usage threshold below its disk's current usage, so it turns
read-only as a full disk would, and is restarted normally afterwards. The harness
starts and restarts the processes itself (tests/cluster.py), not through the
standalone supervisor.

Report (``--out``): faults with their times and how long acknowledgements paused
after each; messages acknowledged, received, lost (acknowledged, never received: must
be 0), duplicates (received more than once: counted, allowed: at-least-once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

from harness import bench_cluster  # noqa: E402
from tests.cluster import Cluster, ManagedProcess, wait_for_etcd  # noqa: E402

FAULT_KINDS = ("kill-bookie", "kill-broker", "kill-etcd", "pause-bookie", "pause-broker", "bookie-read-only")
TOPIC = "persistent://public/default/chaos"
SUBSCRIPTION = "chaos-shared"
# After the last fault: how long the consumers may go without a new message before
# the run stops waiting for the rest.
DRAIN_QUIET_S = 60.0


class Load:
    """The producer and consumers, on the client's own threads."""

    def __init__(self, service_url: str, rate_per_s: int) -> None:
        import pulsar

        self._pulsar = pulsar
        self.client = pulsar.Client(service_url, operation_timeout_seconds=30,
                                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        self.lock = threading.Lock()
        self.acked: set[int] = set()
        self.send_errors = 0
        self.received: dict[int, int] = {}
        self.last_ack_at = time.monotonic()
        self.ack_gaps: list[float] = []
        self._rate = rate_per_s
        self._stopping = threading.Event()
        self._producing = threading.Event()
        self._producing.set()
        self.consumers = [self.client.subscribe(TOPIC, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared,
                                                receiver_queue_size=1000) for _ in range(2)]
        self.producer = self.client.create_producer(
            TOPIC, batching_enabled=True, batching_max_messages=100, batching_max_publish_delay_ms=5,
            block_if_queue_full=True, max_pending_messages=5000, send_timeout_millis=60_000)
        self.next_seq = 0
        self.last_receive_at = time.monotonic()
        self._threads = [threading.Thread(target=self._produce, daemon=True)]
        self._threads += [threading.Thread(target=self._consume, args=(c,), daemon=True) for c in self.consumers]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _on_sent(self, seq: int):
        def callback(result, _message_id) -> None:
            now = time.monotonic()
            with self.lock:
                if result == self._pulsar.Result.Ok:
                    self.acked.add(seq)
                    gap = now - self.last_ack_at
                    if gap > 0.5:
                        self.ack_gaps.append(round(gap, 2))
                    self.last_ack_at = now
                else:
                    self.send_errors += 1
        return callback

    def _produce(self) -> None:
        interval = 1.0 / self._rate
        next_at = time.monotonic()
        while not self._stopping.is_set():
            if not self._producing.is_set():
                time.sleep(0.05)
                continue
            seq = self.next_seq
            self.next_seq += 1
            try:
                self.producer.send_async(str(seq).encode(), self._on_sent(seq))
            except Exception:   # noqa: BLE001 (the client raises its own classes)
                with self.lock:
                    self.send_errors += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()

    def _consume(self, consumer) -> None:
        while not self._stopping.is_set():
            try:
                message = consumer.receive(timeout_millis=500)
            except Exception:   # noqa: BLE001 (timeouts and reconnects)
                continue
            seq = int(message.data())
            with self.lock:
                self.received[seq] = self.received.get(seq, 0) + 1
                self.last_receive_at = time.monotonic()
            try:
                consumer.acknowledge(message)
            except Exception:   # noqa: BLE001
                pass

    def stop_producing(self) -> None:
        self._producing.clear()
        try:
            self.producer.flush()
        except Exception:   # noqa: BLE001
            pass

    def close(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.client.close()

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)


async def _wait_acks_flow(load: Load, more: int, timeout_s: float) -> float:
    """Seconds until ``more`` new acknowledgements arrived (or the timeout passed)."""
    started = time.monotonic()
    target = load.acked_count() + more
    while time.monotonic() - started < timeout_s:
        if load.acked_count() >= target:
            break
        await asyncio.sleep(0.1)
    return round(time.monotonic() - started, 2)


def _signal(process: ManagedProcess, sig: int) -> None:
    if process.running:
        assert process.process is not None
        os.killpg(process.process.pid, sig)


async def _restart_etcd(cluster: Cluster) -> None:
    etcd = cluster.etcd
    etcd.spawn()
    await asyncio.to_thread(wait_for_etcd, etcd.client_port, 60.0, etcd.process)


async def _inject(kind: str, rng: random.Random, cluster: Cluster) -> dict:
    """Applies one fault and undoes it; returns what was done."""
    if kind == "kill-bookie":
        bookie = rng.choice(cluster.bookies)
        bookie.kill9()
        down_s = rng.uniform(1.0, 6.0)
        await asyncio.sleep(down_s)
        await bookie.start()
        return {"target": bookie.name, "down_s": round(down_s, 2)}
    if kind == "kill-broker":
        broker = rng.choice(cluster.brokers)
        broker.kill9()
        down_s = rng.uniform(0.5, 4.0)
        await asyncio.sleep(down_s)
        await broker.start()
        return {"target": broker.name, "down_s": round(down_s, 2)}
    if kind == "kill-etcd":
        cluster.etcd.kill9()
        down_s = rng.uniform(1.0, 6.0)
        await asyncio.sleep(down_s)
        await _restart_etcd(cluster)
        return {"target": "etcd", "down_s": round(down_s, 2)}
    if kind in ("pause-bookie", "pause-broker"):
        process = rng.choice(cluster.bookies if kind == "pause-bookie" else cluster.brokers)
        paused_s = rng.uniform(0.5, 4.0)
        _signal(process, signal.SIGSTOP)
        try:
            await asyncio.sleep(paused_s)
        finally:
            _signal(process, signal.SIGCONT)
        return {"target": process.name, "paused_s": round(paused_s, 2)}
    if kind == "bookie-read-only":
        bookie = rng.choice(cluster.bookies)
        usage = shutil.disk_usage(bookie.journal_dir)
        ratio = (usage.total - usage.free) / usage.total
        threshold = max(0.01, round(ratio - 0.01, 4))
        saved = list(bookie.extra_args)
        await bookie.terminate()
        bookie.extra_args = saved + ["--disk-usage-threshold", str(threshold),
                                     "--disk-usage-lwm-threshold", str(round(threshold / 2, 4))]
        await bookie.start()
        held_s = rng.uniform(2.0, 6.0)
        await asyncio.sleep(held_s)
        await bookie.terminate()
        bookie.extra_args = saved
        await bookie.start()
        return {"target": bookie.name, "read_only_s": round(held_s, 2), "threshold": threshold}
    raise AssertionError(kind)


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    async with bench_cluster("magnetar-chaos-", directory=args.data_dir, keep_data=args.keep_data) as cluster:
        # As `magnetar standalone` and the Kubernetes manifests run them: adds on the
        # bookies' add sockets (bookie/add_socket.py), everything else on gRPC.
        await cluster.start_bookies(4, extra_args=["--add-socket-port", "0"])
        await cluster.start_brokers(3, extra_args=["--bookie-add-transport", "socket"])
        service_url = "pulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in cluster.brokers)
        load = await asyncio.to_thread(Load, service_url, args.rate)
        load.start()
        started = time.monotonic()
        faults: list[dict] = []
        try:
            await _wait_acks_flow(load, 200, 60)
            for index in range(args.faults):
                kind = rng.choice(FAULT_KINDS)
                at = round(time.monotonic() - started, 2)
                acked_before = load.acked_count()
                try:
                    detail = await _inject(kind, rng, cluster)
                    error = None
                except Exception as failure:   # noqa: BLE001 (a harness failure is reported, the run goes on)
                    detail, error = {}, f"{type(failure).__name__}: {failure}"
                    for process in [*cluster.bookies, *cluster.brokers]:
                        if not process.running:
                            await process.start()
                resumed_s = await _wait_acks_flow(load, 100, 90)
                faults.append({"index": index, "kind": kind, "at_s": at, **detail, "error": error,
                               "acked_during": load.acked_count() - acked_before,
                               "acks_resumed_after_s": resumed_s})
                print(json.dumps(faults[-1]), flush=True)
                await asyncio.sleep(rng.uniform(0.5, 2.0))
            load.stop_producing()
            await asyncio.sleep(2.0)
            # Drain: until every acknowledged message was received, or no message came
            # for DRAIN_QUIET_S.
            while True:
                with load.lock:
                    missing = len(load.acked - load.received.keys())
                    quiet = time.monotonic() - load.last_receive_at
                if missing == 0 or quiet > DRAIN_QUIET_S:
                    break
                await asyncio.sleep(0.5)
        finally:
            await asyncio.to_thread(load.close)
        with load.lock:
            acked = set(load.acked)
            received = dict(load.received)
        lost = sorted(acked - received.keys())
        duplicates = sum(count - 1 for count in received.values() if count > 1)
        return {
            "seed": args.seed, "faults_requested": args.faults, "faults": faults,
            "fault_counts": {kind: sum(1 for f in faults if f["kind"] == kind) for kind in FAULT_KINDS},
            "harness_errors": sum(1 for f in faults if f["error"]),
            "seconds": round(time.monotonic() - started, 1), "rate_per_s": args.rate,
            "sent": load.next_seq, "acknowledged": len(acked), "send_errors": load.send_errors,
            "received_unique": len(received), "received_unacknowledged": len(received.keys() - acked),
            "lost": len(lost), "lost_first": lost[:50], "duplicates": duplicates,
            "ack_gaps_over_0_5_s": sorted(load.ack_gaps, reverse=True)[:20],
            "longest_ack_gap_s": max(load.ack_gaps, default=0.0),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=int, default=500, help="messages per second produced")
    parser.add_argument("--out", default="bench/results/chaos.json")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--keep-data", action="store_true")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    summary = {k: v for k, v in report.items() if k not in ("faults", "lost_first")}
    print(json.dumps(summary), flush=True)
    return 0 if report["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
