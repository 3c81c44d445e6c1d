"""Traffic through a fault: an official-client producer (sync sends; what was
acknowledged recorded, and when) and a consumer (what it received recorded, each
acknowledged), in threads. The tests of bundle moves, the proxy and metadata outages
start it, cause their fault, then check that nothing acknowledged was lost and how long
publishing stalled."""

from __future__ import annotations

import threading
import time

import pulsar

from tests.cluster import created_retrying


class Traffic:
    def __init__(self, url: str, topic: str, consumer_type=pulsar.ConsumerType.Exclusive, *,
                 subscription: str = "traffic", send_timeout_ms: int = 90_000, **client_args) -> None:
        self.client = pulsar.Client(url, operation_timeout_seconds=30, **client_args)
        self.topic = topic
        # Brokers that just joined take bundles over: creation may race a move.
        self.consumer = created_retrying(lambda: self.client.subscribe(
            topic, subscription, consumer_type=consumer_type, initial_position=pulsar.InitialPosition.Earliest))
        self.producer = created_retrying(lambda: self.client.create_producer(
            topic, send_timeout_millis=send_timeout_ms, batching_enabled=False))
        self.acked: list[int] = []
        self.acked_at: list[float] = []
        self.received: list[int] = []
        self.errors: list[str] = []
        self.started_at = 0.0
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]

    def _produce(self) -> None:
        sequence = 0
        while not self.stop_producing.is_set():
            try:
                self.producer.send(str(sequence).encode())
            except Exception as error:  # recorded: the tests assert none happened
                self.errors.append("send: " + repr(error))
                time.sleep(0.2)
                continue
            self.acked_at.append(time.monotonic())
            self.acked.append(sequence)
            sequence += 1
            time.sleep(0.002)

    def _consume(self) -> None:
        while not self.stop_consuming.is_set():
            try:
                message = self.consumer.receive(timeout_millis=300)
            except pulsar.Timeout:
                continue
            except Exception as error:  # recorded: the tests assert none happened
                self.errors.append("receive: " + repr(error))
                time.sleep(0.2)
                continue
            self.received.append(int(message.data()))
            self.consumer.acknowledge(message)

    def start(self) -> "Traffic":
        self.started_at = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def wait_acked(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked)} acknowledged, errors {self.errors[:3]}"
            time.sleep(0.02)

    @property
    def gaps(self) -> list[float]:
        """The times between successive acknowledgements (the first from the start)."""
        times = [self.started_at, *self.acked_at]
        return [later - earlier for earlier, later in zip(times, times[1:])]

    def stall_after(self, moment: float) -> float:
        """The longest gap between receipts from the last one before ``moment`` on."""
        times = self.acked_at[:]
        first = max((i for i, t in enumerate(times) if t < moment), default=0)
        return max((b - a for a, b in zip(times[first:], times[first + 1:])), default=0.0)

    def finish(self, timeout_s: float = 60) -> None:
        """Stops sending, waits (at most ``timeout_s``) until everything acknowledged
        was received, then stops receiving and closes the client."""
        self.stop_producing.set()
        self._threads[0].join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while not set(self.acked) <= set(self.received) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop_consuming.set()
        self._threads[1].join(timeout_s)
        self.client.close()

    def lost(self) -> set[int]:
        return set(self.acked) - set(self.received)
