"""A lean Pulsar binary-protocol client for benchmarks, built on the broker's own
sans-IO codec: it measures what the broker and the bookies can serve without the
official client's per-message costs (one Python call, one callback, one ack per
message), which on this machine cap one client process near 15-20k msgs/s.

Theory of operation:
- Producing: one batch payload (``message_count`` messages of ``message_bytes`` each,
  laid out by protocol.batch.encode_batch) is built once. Each SEND wraps it in fresh
  MessageMetadata (the sequence id and publish time change per send, so the CRC32C over
  metadata and payload is recomputed per frame by encode_payload_command). At most
  ``window_entries`` SENDs are outstanding; the next goes out when a SEND_RECEIPT comes
  back. Receipts must arrive in send order (Pulsar's guarantee per producer) and carry
  increasing positions; a SEND_ERROR or an out-of-order receipt fails the run.
- Consuming: SUBSCRIBE, then FLOW permits (counted in messages, as Pulsar counts them:
  a batch entry of N messages takes N), topped up whenever half of them are used, as the
  official clients do. Each MESSAGE frame is checked by the decoder (its CRC32C covers
  the metadata and payload), counted as one entry and ``num_messages_in_batch``
  messages, and acknowledged: individually (up to ``ack_group_entries`` message ids per
  ACK command, flushed at the end of every socket read at the latest) or cumulatively
  (every ``ack_group_entries`` entries and at the end). The last ACK asks for an
  ACK_RESPONSE, so "acknowledged" means the broker processed every ACK before it.

The protocol pieces (commands, the batch template, the send window, the consumer's
tally and ack grouping) are pure and unit-tested; ``RawConnection`` is the asyncio
shell that owns the socket.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from protocol.batch import encode_batch, message_count
from protocol.codec import NEED_DATA, CommandDecoder, Frame, command_name, encode_command, encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb

CLIENT_VERSION = "magnetar-bench-rawclient"
# What the official clients of 2024 announce; the broker answers with the smaller of
# this and its own.
PROTOCOL_VERSION = pb.v20
T = pb.BaseCommand

SUB_TYPES = {
    "exclusive": pb.CommandSubscribe.Exclusive,
    "shared": pb.CommandSubscribe.Shared,
    "failover": pb.CommandSubscribe.Failover,
    "key_shared": pb.CommandSubscribe.Key_Shared,
}
INITIAL_POSITIONS = {
    "latest": pb.CommandSubscribe.Latest,
    "earliest": pb.CommandSubscribe.Earliest,
}
# Request/response round trips (CONNECT, PRODUCER, SUBSCRIBE, CLOSE_*) on a loopback
# cluster take milliseconds; a topic load may wait on etcd and a ledger creation.
REQUEST_TIMEOUT_S = 30.0


class ProtocolViolation(Exception):
    """The broker answered something the protocol does not allow here (a receipt out of
    order, a SEND_ERROR, an unsolicited close): the run's numbers are not trustworthy."""


class RequestFailed(Exception):
    def __init__(self, what: str, server_error: int, message: str) -> None:
        self.server_error = server_error
        name = pb.ServerError.Name(server_error) if server_error in pb.ServerError.values() else str(server_error)
        super().__init__(f"{what} failed: {name}: {message}")


# --- commands (pure) --------------------------------------------------------------------------

def connect_command(client_version: str = CLIENT_VERSION) -> pb.BaseCommand:
    return wrap(pb.CommandConnect(client_version=client_version, protocol_version=PROTOCOL_VERSION))


def producer_command(topic: str, producer_id: int, request_id: int) -> pb.BaseCommand:
    return wrap(pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=request_id))


def subscribe_command(topic: str, subscription: str, sub_type: int, consumer_id: int, request_id: int, *,
                      initial_position: int = pb.CommandSubscribe.Earliest,
                      consumer_name: str = "") -> pb.BaseCommand:
    body = pb.CommandSubscribe(topic=topic, subscription=subscription, subType=sub_type,
                               consumer_id=consumer_id, request_id=request_id, initialPosition=initial_position)
    if consumer_name:
        body.consumer_name = consumer_name
    return wrap(body)


def flow_command(consumer_id: int, permits: int) -> pb.BaseCommand:
    assert 0 < permits <= 0xFFFF_FFFF, permits
    return wrap(pb.CommandFlow(consumer_id=consumer_id, messagePermits=permits))


def ack_command(consumer_id: int, positions: list[tuple[int, int]], *, cumulative: bool,
                request_id: int | None = None) -> pb.BaseCommand:
    assert positions, "an ACK names at least one message"
    assert not cumulative or len(positions) == 1, "a cumulative ACK names one position"
    ack_type = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
    body = pb.CommandAck(consumer_id=consumer_id, ack_type=ack_type,
                         message_id=[pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id)
                                     for ledger_id, entry_id in positions])
    if request_id is not None:
        body.request_id = request_id
    return wrap(body)


def close_producer_command(producer_id: int, request_id: int) -> pb.BaseCommand:
    return wrap(pb.CommandCloseProducer(producer_id=producer_id, request_id=request_id))


def close_consumer_command(consumer_id: int, request_id: int) -> pb.BaseCommand:
    return wrap(pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=request_id))


# --- the batch a producer sends (pure) ----------------------------------------------------

@dataclass(frozen=True)
class BatchTemplate:
    """One batch payload, built once and sent many times."""
    payload: bytes
    message_count: int
    message_bytes: int


def build_batch(message_count_: int, message_bytes: int, filler: bytes | None = None) -> BatchTemplate:
    """``message_count_`` messages of ``message_bytes`` each. Every message gets the same
    incompressible filler (random unless given), prefixed by its index in the batch so
    the messages differ."""
    assert message_count_ >= 1, message_count_
    assert message_bytes >= 4, message_bytes
    body = filler if filler is not None else os.urandom(message_bytes - 4)
    assert len(body) == message_bytes - 4, (len(body), message_bytes)
    messages = [(pb.SingleMessageMetadata(payload_size=message_bytes), struct.pack(">I", index) + body)
                for index in range(message_count_)]
    return BatchTemplate(encode_batch(messages), message_count_, message_bytes)


def send_frame(producer_id: int, producer_name: str, sequence_id: int, batch: BatchTemplate,
               publish_time_ms: int) -> bytes:
    """The SEND frame of one batch whose first message has ``sequence_id`` (Pulsar's
    convention: a batch carries its first and highest sequence ids)."""
    highest = sequence_id + batch.message_count - 1
    metadata = pb.MessageMetadata(producer_name=producer_name, sequence_id=sequence_id,
                                  publish_time=publish_time_ms, num_messages_in_batch=batch.message_count,
                                  highest_sequence_id=highest)
    command = wrap(pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id,
                                  num_messages=batch.message_count, highest_sequence_id=highest))
    return encode_payload_command(command, metadata, batch.payload)


# --- the producer's window of outstanding sends (pure) ------------------------------------------

class SendWindow:
    """Outstanding SENDs in send order; receipts must come back in that order."""

    def __init__(self, entries_max: int) -> None:
        assert entries_max >= 1, entries_max
        self.entries_max = entries_max
        self._outstanding: deque[tuple[int, int]] = deque()   # (sequence_id, message count)
        self.entries_sent = 0
        self.messages_sent = 0
        self.entries_acked = 0
        self.messages_acked = 0
        self.last_position: tuple[int, int] | None = None

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    @property
    def has_room(self) -> bool:
        return len(self._outstanding) < self.entries_max

    def on_sent(self, sequence_id: int, count: int) -> None:
        assert self.has_room, "send beyond the window"
        assert not self._outstanding or sequence_id > self._outstanding[-1][0], (sequence_id, self._outstanding[-1])
        self._outstanding.append((sequence_id, count))
        self.entries_sent += 1
        self.messages_sent += count

    def on_receipt(self, sequence_id: int, position: tuple[int, int]) -> int:
        """Matches a receipt with the oldest outstanding send; returns its message count.
        Raises ProtocolViolation for a receipt of anything else or a position that does
        not move forward."""
        if not self._outstanding:
            raise ProtocolViolation(f"receipt for sequence_id {sequence_id} with nothing outstanding")
        expected, count = self._outstanding[0]
        if sequence_id != expected:
            raise ProtocolViolation(f"receipt for sequence_id {sequence_id}, expected {expected}")
        if self.last_position is not None and position <= self.last_position:
            raise ProtocolViolation(f"receipt position {position} not after {self.last_position}")
        self._outstanding.popleft()
        self.last_position = position
        self.entries_acked += 1
        self.messages_acked += count
        return count


# --- the consumer's tally, permits and acks (pure) ----------------------------------------------

@dataclass
class ConsumeTally:
    """What a consumer received, and when to grant more permits.

    ``permits_max`` is the receiver queue in messages: granted at start, and topped up by
    what was used once that reaches half of it (the official clients' rule)."""
    permits_max: int
    entries: int = 0
    messages: int = 0
    duplicates: int = 0
    redelivered_entries: int = 0
    _used: int = 0
    # One tuple per entry received (10,000 entries for a million messages in batches of
    # 100): what finds duplicates, and what --positions-out writes.
    _seen: set = field(default_factory=set)

    def __post_init__(self) -> None:
        assert self.permits_max >= 2, self.permits_max

    def on_message(self, position: tuple[int, int], count: int, redelivery_count: int) -> int:
        """Records one MESSAGE frame; returns the permits to grant now (0: none)."""
        assert count >= 1, count
        if position in self._seen:
            self.duplicates += 1
        else:
            self._seen.add(position)
        if redelivery_count:
            self.redelivered_entries += 1
        self.entries += 1
        self.messages += count
        self._used += count
        if self._used >= self.permits_max // 2:
            grant, self._used = self._used, 0
            return grant
        return 0

    @property
    def positions(self) -> set:
        return self._seen


class AckGrouper:
    """Entries received and not yet acknowledged, grouped into ACK commands.

    Individual: each entry is named once, ``group_entries_max`` per command at most.
    Cumulative: one command names the newest entry received, once ``group_entries_max``
    entries arrived since the last one."""

    def __init__(self, *, cumulative: bool, group_entries_max: int) -> None:
        assert group_entries_max >= 1, group_entries_max
        self.cumulative = cumulative
        self.group_entries_max = group_entries_max
        self._pending: list[tuple[int, int]] = []
        self.last_position: tuple[int, int] | None = None
        self.commands = 0
        self.entries_acked = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, position: tuple[int, int]) -> list[tuple[int, int]] | None:
        """Records a received entry; returns the positions of an ACK to send now, if any."""
        self._pending.append(position)
        self.last_position = position
        if len(self._pending) >= self.group_entries_max:
            return self.take()
        return None

    def take(self) -> list[tuple[int, int]] | None:
        """The positions of an ACK covering everything pending (None if nothing is)."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        self.commands += 1
        self.entries_acked += len(pending)
        if self.cumulative:
            return [max(pending)]
        return pending


# --- the asyncio shell ---------------------------------------------------------------------------

def parse_service_url(service_url: str) -> tuple[str, int]:
    """``pulsar://host:port`` → (host, port)."""
    prefix = "pulsar://"
    if not service_url.startswith(prefix):
        raise ValueError(f"service URL {service_url!r} does not start with {prefix}")
    host, _, port = service_url[len(prefix):].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"service URL {service_url!r} lacks host:port")
    return host, int(port)


class RawConnection(asyncio.Protocol):
    """One connection: request/response for the control commands, and callbacks for
    the streams (receipts, messages). Anything unexpected is kept in ``failure`` and
    wakes every waiter, so a run stops instead of counting on."""

    def __init__(self) -> None:
        self.decoder = CommandDecoder()
        self.transport: asyncio.Transport | None = None
        self._requests: dict[int, asyncio.Future[Frame]] = {}
        self._next_request_id = 1
        self._connected: asyncio.Future[pb.CommandConnected] = asyncio.get_running_loop().create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        self.closed = asyncio.Event()
        self.failure: BaseException | None = None
        self.on_receipt = None          # (CommandSendReceipt) -> None
        self.on_message = None          # (Frame) -> None, called for each MESSAGE
        self.on_read_done = None        # () -> None, after each socket read's frames
        self.frames_in = 0

    @classmethod
    async def open(cls, service_url: str) -> "RawConnection":
        host, port = parse_service_url(service_url)
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(cls, host, port)
        connection.write_command(connect_command())
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            await connection._connected
        return connection

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's, or uvloop's (runtime/event_loop.py), which is not a
        # subclass of asyncio.Transport (an isinstance check here refused every connection).
        transport = cast(asyncio.Transport, transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
            while (frame := self.decoder.next_command()) is not NEED_DATA:
                self.frames_in += 1
                self._handle(frame)
            if self.on_read_done is not None:
                self.on_read_done()
        except Exception as error:  # noqa: BLE001 - a bad frame or a check failed: stop the run
            self.fail(error)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.failure is None and exc is not None:
            self.failure = exc
        error = self.failure or ConnectionError("connection closed")
        for future in [self._connected, *self._requests.values()]:
            if not future.done():
                future.set_exception(error)
        self._writable.set()
        self.closed.set()

    # frames

    def _handle(self, frame: Frame) -> None:
        command = frame.command
        kind = command.type
        if kind == T.MESSAGE:
            self.on_message(frame)
        elif kind == T.SEND_RECEIPT:
            self.on_receipt(command.send_receipt)
        elif kind == T.SEND_ERROR:
            error = command.send_error
            raise ProtocolViolation(f"SEND_ERROR for sequence_id {error.sequence_id}: "
                                    f"{pb.ServerError.Name(error.error)}: {error.message}")
        elif kind == T.CONNECTED:
            if not self._connected.done():
                self._connected.set_result(command.connected)
        elif kind == T.PING:
            self.write_command(wrap(pb.CommandPong()))
        elif kind == T.PONG:
            pass
        elif kind in (T.SUCCESS, T.PRODUCER_SUCCESS, T.ERROR, T.ACK_RESPONSE):
            body = {T.SUCCESS: command.success, T.PRODUCER_SUCCESS: command.producer_success,
                    T.ERROR: command.error, T.ACK_RESPONSE: command.ackResponse}[kind]
            future = self._requests.pop(body.request_id, None)
            if future is not None and not future.done():
                future.set_result(frame)
        elif kind in (T.CLOSE_PRODUCER, T.CLOSE_CONSUMER):
            raise ProtocolViolation(f"the broker sent {command_name(kind)} (topic unloaded or broker stopping)")
        else:
            pass  # ACTIVE_CONSUMER_CHANGE, REACHED_END_OF_TOPIC...: nothing to do for a benchmark

    # writing

    def write_command(self, command: pb.BaseCommand) -> None:
        self.write(encode_command(command))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def wait_writable(self) -> None:
        await self._writable.wait()
        self.check()

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    async def request(self, command: pb.BaseCommand, request_id: int, what: str) -> Frame:
        """Sends a command carrying ``request_id`` and waits for its answer; raises
        RequestFailed on ERROR."""
        self.check()
        future = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        self.write_command(command)
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            frame = await future
        if frame.command.type == T.ERROR:
            raise RequestFailed(what, frame.command.error.error, frame.command.error.message)
        return frame


# --- runs -------------------------------------------------------------------------------------

# How often the waiting loops look at the deadline, the idle timer and failures.
POLL_S = 0.05


@dataclass
class ProduceSettings:
    service_url: str
    topic: str
    messages: int | None            # stop after this many (rounded up to whole batches)
    seconds: float | None           # or after this long
    batch_messages: int = 100
    message_bytes: int = 1024
    window_entries: int = 64


async def produce(settings: ProduceSettings) -> dict:
    """Publishes batches until the message count or the time is reached, then waits for
    every receipt. Returns the summary (throughput counted over acknowledged messages)."""
    assert (settings.messages is None) != (settings.seconds is None), "give messages or seconds"
    connection = await RawConnection.open(settings.service_url)
    try:
        producer_id = 1
        request_id = connection.request_id()
        answer = await connection.request(producer_command(settings.topic, producer_id, request_id),
                                          request_id, "PRODUCER")
        producer_name = answer.command.producer_success.producer_name
        batch = build_batch(settings.batch_messages, settings.message_bytes)
        window = SendWindow(settings.window_entries)
        room = asyncio.Event()
        room.set()
        first_receipt_unix_s = last_receipt_unix_s = None

        def on_receipt(receipt: pb.CommandSendReceipt) -> None:
            nonlocal first_receipt_unix_s, last_receipt_unix_s
            window.on_receipt(receipt.sequence_id, (receipt.message_id.ledgerId, receipt.message_id.entryId))
            last_receipt_unix_s = time.time()
            first_receipt_unix_s = first_receipt_unix_s or last_receipt_unix_s
            room.set()

        connection.on_receipt = on_receipt
        started_unix_s = time.time()
        started_s = time.monotonic()
        deadline_s = started_s + settings.seconds if settings.seconds is not None else None
        sequence_id = 0
        while True:
            if settings.messages is not None and window.messages_sent >= settings.messages:
                break
            if deadline_s is not None and time.monotonic() >= deadline_s:
                break
            if not window.has_room:
                room.clear()
                await _wait_event(room, connection)
                continue
            await connection.wait_writable()
            connection.write(send_frame(producer_id, producer_name, sequence_id, batch, int(time.time() * 1000)))
            window.on_sent(sequence_id, batch.message_count)
            sequence_id += batch.message_count
        while window.outstanding:
            room.clear()
            await _wait_event(room, connection, timeout_s=REQUEST_TIMEOUT_S)
        ended_s = time.monotonic()
        request_id = connection.request_id()
        await connection.request(close_producer_command(producer_id, request_id), request_id, "CLOSE_PRODUCER")
    finally:
        connection.close()
    elapsed_s = max(ended_s - started_s, 1e-9)
    return {
        "mode": "raw-produce", "topic": settings.topic, "batch_messages": settings.batch_messages,
        "message_bytes": settings.message_bytes, "window_entries": settings.window_entries,
        "entries": window.entries_acked, "messages": window.messages_acked,
        "seconds": round(elapsed_s, 3), "msgs_per_s": round(window.messages_acked / elapsed_s, 1),
        "entries_per_s": round(window.entries_acked / elapsed_s, 1),
        "MB_per_s": round(window.messages_acked * settings.message_bytes / elapsed_s / 1e6, 3),
        "errors": 0, "started_unix_s": round(started_unix_s, 6),
        "ended_unix_s": round(started_unix_s + elapsed_s, 6),
        "first_receipt_unix_s": first_receipt_unix_s, "last_receipt_unix_s": last_receipt_unix_s,
    }


async def _wait_event(event: asyncio.Event, connection: RawConnection, timeout_s: float | None = None) -> None:
    """Waits for ``event``, waking up to notice a failed or closed connection."""
    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    while not event.is_set():
        connection.check()
        if connection.closed.is_set():
            raise ConnectionError("connection closed")
        if deadline_s is not None and time.monotonic() >= deadline_s:
            raise TimeoutError(f"no progress in {timeout_s} s")
        try:
            async with asyncio.timeout(POLL_S):
                await event.wait()
        except TimeoutError:
            pass
    connection.check()


@dataclass
class ConsumeSettings:
    service_url: str
    topic: str
    subscription: str
    sub_type: str = "exclusive"
    initial_position: str = "earliest"
    messages: int | None = None       # stop after this many
    seconds: float = 60.0             # stop after this long in any case
    idle_timeout_s: float | None = None  # or once nothing came for this long
    # The receiver queue, in messages: ten times the official client's 1,000, so that
    # 100 entries of 100 messages (about 10 MB) can be in flight, near the broker's
    # 8 MiB write-buffer mark toward a consumer.
    permits: int = 10_000
    cumulative: bool = False
    ack_group_entries: int = 1
    consumer_name: str = ""

    def problem(self) -> str | None:
        if self.sub_type not in SUB_TYPES:
            return f"unknown subscription type {self.sub_type!r}"
        if self.initial_position not in INITIAL_POSITIONS:
            return f"unknown initial position {self.initial_position!r}"
        if self.cumulative and self.sub_type in ("shared", "key_shared"):
            return "cumulative acknowledgement is not allowed on shared subscriptions"
        if self.messages is not None and self.messages < 1:
            return "messages must be >= 1"
        if self.permits < 2 or self.ack_group_entries < 1 or self.seconds <= 0:
            return "permits must be >= 2, ack_group_entries >= 1, seconds > 0"
        return None


async def consume(settings: ConsumeSettings, start_gate=None) -> tuple[dict, set]:
    """Receives and acknowledges until a stop condition; returns the summary and the
    positions received (for cross-consumer checks). ``start_gate``, when given, is
    awaited between SUBSCRIBE and the first FLOW: nothing is delivered before it
    returns, and the time limits count from then."""
    problem = settings.problem()
    assert problem is None, problem
    connection = await RawConnection.open(settings.service_url)
    consumer_id = 1
    tally = ConsumeTally(settings.permits)
    acks = AckGrouper(cumulative=settings.cumulative, group_entries_max=settings.ack_group_entries)
    done = asyncio.Event()
    first_message_s = last_message_s = None
    first_message_unix_s = last_message_unix_s = None
    read_had_messages = False

    def send_ack(positions: list[tuple[int, int]] | None) -> None:
        if positions:
            connection.write_command(ack_command(consumer_id, positions, cumulative=settings.cumulative))

    def on_message(frame: Frame) -> None:
        nonlocal read_had_messages
        read_had_messages = True
        message = frame.command.message
        position = (message.message_id.ledgerId, message.message_id.entryId)
        grant = tally.on_message(position, message_count(frame.payload.metadata), message.redelivery_count)
        send_ack(acks.add(position))
        if grant:
            connection.write_command(flow_command(consumer_id, grant))
        if settings.messages is not None and tally.messages >= settings.messages:
            done.set()

    def on_read_done() -> None:
        nonlocal read_had_messages, first_message_s, last_message_s, first_message_unix_s, last_message_unix_s
        if not read_had_messages:
            return
        read_had_messages = False
        # One clock read per socket read, not per frame.
        last_message_s, last_message_unix_s = time.monotonic(), time.time()
        if first_message_s is None:
            first_message_s, first_message_unix_s = last_message_s, last_message_unix_s
        if not settings.cumulative:
            send_ack(acks.take())

    connection.on_message = on_message
    connection.on_read_done = on_read_done
    try:
        request_id = connection.request_id()
        await connection.request(
            subscribe_command(settings.topic, settings.subscription, SUB_TYPES[settings.sub_type], consumer_id,
                              request_id, initial_position=INITIAL_POSITIONS[settings.initial_position],
                              consumer_name=settings.consumer_name),
            request_id, "SUBSCRIBE")
        if start_gate is not None:
            await start_gate()
            connection.check()
        subscribed_s = time.monotonic()
        connection.write_command(flow_command(consumer_id, settings.permits))
        deadline_s = subscribed_s + settings.seconds
        while not done.is_set():
            connection.check()
            if connection.closed.is_set():
                raise ConnectionError("connection closed")
            now_s = time.monotonic()
            if now_s >= deadline_s:
                break
            if settings.idle_timeout_s is not None and now_s - (last_message_s or subscribed_s) >= settings.idle_timeout_s:
                break
            try:
                async with asyncio.timeout(POLL_S):
                    await done.wait()
            except TimeoutError:
                pass
        ended_s = time.monotonic()
        # The last ACK asks for a response: once it comes, every ACK before it was processed.
        final = acks.take() or ([acks.last_position] if acks.last_position is not None else None)
        ack_confirmed = final is None      # nothing received: nothing to confirm
        if final is not None:
            request_id = connection.request_id()
            await connection.request(ack_command(consumer_id, final, cumulative=settings.cumulative,
                                                 request_id=request_id), request_id, "ACK")
            ack_confirmed = True
        request_id = connection.request_id()
        await connection.request(close_consumer_command(consumer_id, request_id), request_id, "CLOSE_CONSUMER")
    finally:
        connection.close()
    if first_message_s is not None and last_message_s > first_message_s:
        elapsed_s = last_message_s - first_message_s
    else:
        elapsed_s = max(ended_s - subscribed_s, 1e-9)
    summary = {
        "mode": "raw-consume", "topic": settings.topic, "subscription": settings.subscription,
        "subscription_type": settings.sub_type, "messages_target": settings.messages,
        "ack": "cumulative" if settings.cumulative else "individual",
        "ack_group_entries": settings.ack_group_entries, "permits": settings.permits,
        "entries": tally.entries, "messages": tally.messages, "duplicates": tally.duplicates,
        "redelivered_entries": tally.redelivered_entries, "ack_commands": acks.commands,
        "ack_confirmed": ack_confirmed,
        "seconds": round(elapsed_s, 3), "run_seconds": round(ended_s - subscribed_s, 3),
        "first_message_after_s": round(first_message_s - subscribed_s, 3) if first_message_s else None,
        "msgs_per_s": round(tally.messages / elapsed_s, 1), "entries_per_s": round(tally.entries / elapsed_s, 1),
        "errors": 0,
        "first_message_unix_s": round(first_message_unix_s, 6) if first_message_unix_s else None,
        "last_message_unix_s": round(last_message_unix_s, 6) if last_message_unix_s else None,
    }
    return summary, tally.positions


async def create_subscriptions(service_url: str, topic: str, subscriptions: list[tuple[str, str]]) -> None:
    """Creates durable subscriptions (name, type) at the start of ``topic`` (creating the
    topic too), then detaches: what a benchmark does before writing a backlog that every
    subscription must see."""
    connection = await RawConnection.open(service_url)
    try:
        for consumer_id, (name, sub_type) in enumerate(subscriptions, start=1):
            request_id = connection.request_id()
            await connection.request(subscribe_command(topic, name, SUB_TYPES[sub_type], consumer_id, request_id,
                                                       initial_position=pb.CommandSubscribe.Earliest),
                                     request_id, f"SUBSCRIBE {name}")
            request_id = connection.request_id()
            await connection.request(close_consumer_command(consumer_id, request_id), request_id,
                                     f"CLOSE_CONSUMER {name}")
    finally:
        connection.close()


POSITION = struct.Struct(">QQ")


def encode_positions(positions: set) -> bytes:
    """Positions as 16 bytes each (ledger_id, entry_id), sorted: for --positions-out."""
    return b"".join(POSITION.pack(ledger_id, entry_id) for ledger_id, entry_id in sorted(positions))


def decode_positions(data: bytes) -> list[tuple[int, int]]:
    assert len(data) % POSITION.size == 0, len(data)
    return [POSITION.unpack_from(data, offset) for offset in range(0, len(data), POSITION.size)]
