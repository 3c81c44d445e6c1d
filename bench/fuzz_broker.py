"""A live fuzz of a running broker (``make fuzz-broker``): many connections sending
random and mutated frames while the official client produces and consumes beside them.

1. A cluster: etcd, one bookie, one broker with topic auto-creation off (fuzzed topic
   names cannot create topics, so memory measures the broker, not a growing topic
   count). Two topics are made through the admin API: one the fuzzers may name (the
   capture's) and one only the official client knows.
2. A capture: the official client produces, consumes and acknowledges on the capture
   topic through a recording proxy; the client-to-broker bytes, cut into frames, join
   our encoders' seed frames (tests/fuzz_inputs.py) as the corpus.
3. The fuzz: ``--connections`` asyncio connections, each sending CONNECT (from the
   capture) and then frames from the corpus: 80% with fuzzed field values and valid
   framing (tests/fuzz_inputs.mutate_fields), 0.5% byte-mutated or random (each such
   frame ends its connection, as it must), the rest as captured, in
   writes of up to 64 frames, reading and discarding whatever comes back; when the
   broker closes a connection (as it must for a malformed frame) it reconnects.
   Meanwhile the official client sends ``--messages`` messages to its own topic and a
   consumer receives and acknowledges them; every one must arrive, in order, with no
   error on either side. ``frames_sent`` counts frames written; ``frames_decoded_whole``
   those a copy of the broker's decoder decodes before each connection's first
   malformed frame (where the broker stops reading): the frames its handlers saw. The
   run goes on until ``--frames`` of those.
4. The broker's RSS is sampled every second: the run fails if it ever exceeds the
   RSS after warm-up (the capture) by more than ``--rss-growth-mib-max`` (default
   256 MiB), or if the broker dies.

    python bench/fuzz_broker.py --frames 1000000 --out bench/results/fuzz_broker.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import struct
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

from bench.harness import bench_cluster  # noqa: E402
from common.errors import MalformedFrame  # noqa: E402
from protocol.codec import (  # noqa: E402
    FRAME_BYTES_MAX_DEFAULT,
    NEED_DATA,
    CommandDecoder,
    PayloadChecksumMismatch,
    decode_frame,
    encode_command,
    encode_payload_command,
)
from protocol.proto import pulsar_api_pb2 as pb  # noqa: E402
from tests.fuzz_inputs import mutate, mutate_fields, seed_frames  # noqa: E402

MIB = 1024 * 1024
FRAMES_PER_WRITE_MAX = 32
# A pause between one connection's writes: many connections at a steady pace rather
# than a flood that only measures how long the broker's request queues grow.
WRITE_PAUSE_S = 0.005
# The broker's frame limit with its default max_message_size.
BROKER_FRAME_BYTES_MAX = FRAME_BYTES_MAX_DEFAULT


def _admin_put(web_url: str, path: str) -> None:
    request = urllib.request.Request(f"{web_url}{path}", method="PUT")
    with urllib.request.urlopen(request, timeout=30):
        pass


def _topic_summary(web_url: str, topic: str) -> dict:
    """What the fuzzers left on the topic they may name (state the broker keeps)."""
    try:
        path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/stats"
        with urllib.request.urlopen(f"{web_url}{path}", timeout=30) as response:
            stats = json.loads(response.read())
    except OSError as error:
        return {"error": str(error)}
    subscriptions = stats.get("subscriptions", {})
    return {"subscriptions": len(subscriptions), "publishers": len(stats.get("publishers", [])),
            "consumers": sum(len(s.get("consumers", [])) for s in subscriptions.values()),
            "backlog": sum(s.get("msgBacklog", 0) for s in subscriptions.values()),
            "unacked": sum(s.get("unackedMessages", 0) for s in subscriptions.values()),
            "msg_in_counter": stats.get("msgInCounter")}


def split_frames(stream: bytes) -> list[bytes]:
    frames, offset = [], 0
    while offset + 4 <= len(stream):
        (total,) = struct.unpack_from(">I", stream, offset)
        if offset + 4 + total > len(stream):
            break
        frames.append(stream[offset:offset + 4 + total])
        offset += 4 + total
    return frames


async def capture(broker_host: str, broker_port: int, topic: str) -> list[bytes]:
    """The frames an official client sends for a produce / consume / ack session. The
    proxy marks lookup answers ``proxy_through_service_url``, so the client keeps every
    connection (lookup, producer, consumer) through it and all of it is recorded."""
    recorded = bytearray()

    def rewrite_lookups(pending: bytearray) -> bytes:
        out = bytearray()
        for frame in split_frames(bytes(pending)):
            del pending[:len(frame)]
            decoded = decode_frame(frame)
            if decoded.command.type == pb.BaseCommand.LOOKUP_RESPONSE:
                decoded.command.lookupTopicResponse.proxy_through_service_url = True
                frame = encode_command(decoded.command)
            out.extend(frame)
        return bytes(out)

    async def handle(client_reader, client_writer):
        upstream_reader, upstream_writer = await asyncio.open_connection(broker_host, broker_port)

        async def pipe(reader, writer, record):
            pending = bytearray()
            try:
                while data := await reader.read(65536):
                    if record:
                        recorded.extend(data)
                    else:
                        pending.extend(data)
                        data = rewrite_lookups(pending)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_reader, upstream_writer, True), pipe(upstream_reader, client_writer, False))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    def session() -> None:
        import pulsar

        client = pulsar.Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=30)
        try:
            consumer = client.subscribe(topic, "capture-sub", consumer_type=pulsar.ConsumerType.Shared)
            producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)
            for index in range(50):
                producer.send_async(f"capture-{index}".encode(), None, properties={"k": str(index)},
                                   partition_key=f"key-{index % 3}")
            producer.flush()
            plain = client.create_producer(topic)
            for index in range(10):
                plain.send(f"plain-{index}".encode())
            for _ in range(60):
                consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            consumer.seek(pulsar.MessageId.earliest)
            consumer.close()
            producer.close()
            plain.close()
        finally:
            client.close()

    async with server:
        await asyncio.to_thread(session)
    return split_frames(bytes(recorded))


# SEND frames of the corpus name this producer id, which no PRODUCER frame of the
# corpus creates: unmutated they are refused (no such producer), so the fuzzers do not
# turn into a flood of valid publishes that fills the one bookie's bandwidth and the
# broker's pending-send bounds (capacity, not hostile input, which is what this tests).
UNPAIRED_PRODUCER_ID = 2**40


def _unpaired_send(frame: bytes) -> bytes:
    decoded = decode_frame(frame)
    if decoded.command.type != pb.BaseCommand.SEND:
        return frame
    decoded.command.send.producer_id = UNPAIRED_PRODUCER_ID
    return encode_payload_command(decoded.command, decoded.payload.metadata, bytes(decoded.payload.payload))


class Fuzzers:
    def __init__(self, host: str, port: int, corpus: list[bytes], connect: bytes, seed: int) -> None:
        self.host, self.port = host, port
        self.corpus = corpus
        self.connect = connect
        self.seed = seed
        self.frames_sent = 0
        # Frames a copy of the broker's decoder decodes whole before the first
        # malformed one of each connection: what reached the broker's handlers at
        # most (after a malformed frame the broker closes and reads no further).
        self.frames_decoded = 0
        self.bytes_sent = 0
        self.connections = 0
        self.closed_by_broker = 0
        self.stop = asyncio.Event()

    def _frame(self, rng: random.Random) -> bytes:
        """Mostly structure-aware mutations (valid framing, fuzzed field values: they
        reach the handlers); rarely raw byte mutations or random bytes, which the
        decoder refuses and which end the connection, so they are kept rare enough
        for each connection to carry hundreds of frames first."""
        choice = rng.random()
        frame = rng.choice(self.corpus)
        if choice < 0.002:
            return rng.randbytes(rng.randint(1, 64))
        if choice < 0.005:
            return mutate(rng, frame, self.corpus)
        if choice < 0.80:
            return mutate_fields(rng, frame)
        return frame

    async def _one(self, index: int, target: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while not self.stop.is_set() and self.frames_decoded < target:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            self.connections += 1

            async def drain_replies() -> None:
                try:
                    while await reader.read(65536):
                        pass
                except (ConnectionError, OSError):
                    pass

            reading = asyncio.create_task(drain_replies())
            mirror: CommandDecoder | None = CommandDecoder(frame_bytes_max=BROKER_FRAME_BYTES_MAX)
            try:
                writer.write(self.connect)
                while not self.stop.is_set() and self.frames_decoded < target and not reading.done():
                    frames = [self._frame(rng) for _ in range(rng.randint(1, FRAMES_PER_WRITE_MAX))]
                    data = b"".join(frames)
                    writer.write(data)
                    await writer.drain()
                    self.frames_sent += len(frames)
                    if mirror is not None:
                        mirror = self._mirror(mirror, data)
                    self.bytes_sent += len(data)
                    await asyncio.sleep(WRITE_PAUSE_S)
                if reading.done():
                    self.closed_by_broker += 1
            except (ConnectionError, OSError):
                self.closed_by_broker += 1
            finally:
                writer.close()
                reading.cancel()
                try:
                    await reading
                except asyncio.CancelledError:
                    pass

    def _mirror(self, decoder: CommandDecoder, data: bytes) -> CommandDecoder | None:
        """Feeds ``data`` to the connection's copy of the broker's decoder; None once a
        frame is malformed (the broker closes the connection there)."""
        try:
            decoder.feed(data)
        except MalformedFrame:
            return None
        while True:
            try:
                frame = decoder.next_command()
            except PayloadChecksumMismatch:
                self.frames_decoded += 1
                continue
            except MalformedFrame:
                return None
            if frame is NEED_DATA:
                return decoder
            self.frames_decoded += 1

    async def run(self, connections: int, target: int) -> None:
        await asyncio.gather(*(self._one(index, target) for index in range(connections)))


def official_traffic(service_url: str, topic: str, messages: int, result: dict, done: threading.Event,
                     fuzz_over: threading.Event, ready: threading.Event) -> None:
    """Produces to ``topic`` (at least ``messages``, and on until the fuzz is over) and
    receives every message, in order; records errors."""
    import pulsar

    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    errors: list[str] = []
    received: list[bytes] = []
    index = 0
    try:
        consumer = client.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        ready.set()   # the fuzzers start now
        started = time.monotonic()
        while index < messages or not fuzz_over.is_set():
            try:
                producer.send(f"official-{index}".encode())
            except Exception as error:   # noqa: BLE001 - any error is a failure of the run
                errors.append(f"send {index}: {error!r}")
            try:
                message = consumer.receive(timeout_millis=30_000)
                received.append(message.data())
                consumer.acknowledge(message)
            except Exception as error:   # noqa: BLE001
                errors.append(f"receive {index}: {error!r}")
            index += 1
        result.update(official_elapsed_s=round(time.monotonic() - started, 1))
    finally:
        client.close()
        expected = [f"official-{i}".encode() for i in range(index)]
        result.update(official_sent=index, official_received=len(received),
                      official_in_order_and_complete=received == expected, official_errors=errors[:20])
        done.set()


async def main_async(args: argparse.Namespace) -> dict:
    async with bench_cluster("magnetar-fuzz-broker-", directory=args.dir, keep_data=args.keep_data) as cluster:
        await cluster.start_bookies(1)
        (broker,) = await cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1", "--no-auto-topic-creation",
            # A small entry cache, so that RSS measures leaks, not a cache filling up to
            # its (512 MiB) default with whatever the fuzzers manage to publish.
            "--entry-cache-mib", "32"])
        capture_topic = "persistent://public/default/fuzz-capture"
        official_topic = f"persistent://public/default/official-{os.urandom(8).hex()}"
        for topic in (capture_topic, official_topic):
            await asyncio.to_thread(_admin_put, broker.web_service_url,
                                    "/admin/v2/persistent/" + topic.removeprefix("persistent://"))
        host, port = broker.service_url.removeprefix("pulsar://").rsplit(":", 1)
        captured = await capture(host, int(port), capture_topic)
        connect = next(f for f in captured if f[8:10] == b"\x08\x02")   # BaseCommand.type = CONNECT (2)
        # MESSAGE is what a broker sends: to a broker it is an unknown command without a
        # request id, which ends the connection at once (the codec fuzz keeps it).
        excluded = {pb.BaseCommand.Type.Value(name) for name in args.exclude}
        corpus = [_unpaired_send(f) for f in
                  captured + [f for f in seed_frames() if decode_frame(f).command.type != pb.BaseCommand.MESSAGE]
                  if decode_frame(f).command.type not in excluded]
        process = psutil.Process(broker.process.pid)
        rss_start = process.memory_info().rss
        fuzzers = Fuzzers(host, int(port), corpus, connect, args.seed)
        result: dict = {"frames_target": args.frames, "connections": args.connections,
                        "captured_frames": len(captured), "corpus_frames": len(corpus)}
        official_done, fuzz_over, official_ready = threading.Event(), threading.Event(), threading.Event()
        official = threading.Thread(target=official_traffic, args=(broker.service_url, official_topic,
                                                                   args.messages, result, official_done, fuzz_over,
                                                                   official_ready), daemon=True)
        samples: list[int] = []
        started = time.monotonic()

        async def sample() -> None:
            while not fuzzers.stop.is_set():
                samples.append(process.memory_info().rss)
                if samples[-1] - rss_start > args.rss_growth_mib_max * MIB or not broker.running:
                    fuzzers.stop.set()
                await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample())
        official.start()
        # The official client subscribes and attaches its producer first; then the fuzz.
        await asyncio.to_thread(official_ready.wait, 60)
        try:
            await fuzzers.run(args.connections, args.frames)
        finally:
            fuzz_over.set()   # the official client stops too, whatever happened
        elapsed = time.monotonic() - started
        await asyncio.to_thread(official_done.wait, 600)
        fuzzers.stop.set()
        await sampler
        rss_peak = max(samples) if samples else rss_start
        result["capture_topic"] = await asyncio.to_thread(_topic_summary, broker.web_service_url, capture_topic)
        result["rss_samples_mib"] = [round(sample / MIB) for sample in samples[::max(1, len(samples) // 20)]]
        rss_end = process.memory_info().rss if broker.running else 0
        result.update(
            frames_sent=fuzzers.frames_sent, frames_decoded_whole=fuzzers.frames_decoded,
            bytes_sent=fuzzers.bytes_sent, fuzz_connections=fuzzers.connections,
            connections_closed_by_broker=fuzzers.closed_by_broker, elapsed_s=round(elapsed, 1),
            frames_per_s=round(fuzzers.frames_sent / elapsed), broker_alive=broker.running,
            rss_start_mib=round(rss_start / MIB, 1), rss_peak_mib=round(rss_peak / MIB, 1),
            rss_end_mib=round(rss_end / MIB, 1), rss_growth_bound_mib=args.rss_growth_mib_max)
        result["ok"] = bool(
            broker.running and fuzzers.frames_decoded >= args.frames
            and rss_peak - rss_start <= args.rss_growth_mib_max * MIB
            and result.get("official_in_order_and_complete") and not result.get("official_errors"))
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--messages", type=int, default=2_000, help="the official client's messages")
    parser.add_argument("--rss-growth-mib-max", type=int, default=256)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--exclude", nargs="*", default=[], metavar="COMMAND",
                        help="leave these commands (e.g. LOOKUP) out of the corpus, to find what grows")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
