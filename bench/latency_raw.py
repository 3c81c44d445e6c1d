"""The issue-16 workloads through the project's raw protocol client (bench/rawclient.py),
for bench/latency_client.py: one asyncio process, no client threads and no callback per
message, so what it measures is what the broker and the bookies serve when the client
is not the limit (the official client's figures beside them are the user's view).

Workloads (1 KiB messages; the official ones are described in bench/latency_client.py):
- ``raw_e2e``: end to end at the fixed rate, on the shared schedule (load_shapes.FixedRate:
  message i due at t0 + i / rate, its due time in the payload, no coordinated omission).
  Each message is a SEND of a one-message batch written at its due time: the raw client
  has no batch timer, so this is the servers' share of the official e2e (which adds the
  client's 1 ms batch delay and its threads). A consumer on its own connection, same
  process and clock, records receive time minus due time and acknowledges what it got
  every 100 ms (the official client's acknowledgement grouping).
- ``raw_publish``: SENDs of ``PUBLISH_BATCH``-message batches with at most ``MAX_PENDING``
  messages awaiting their receipt (the official driver's window), for the publish
  seconds; it writes the raw backlog the next three read (their subscriptions are made
  first).
- ``raw_drain``: one exclusive consumer reads the raw backlog, one cumulative ack every
  1,000 messages (the official driver acknowledges each ``batch_receive`` of up to
  1,000 cumulatively).
- ``raw_work_queue``: 4 consumers of one shared subscription, each acknowledging every
  entry it gets (grouped per socket read; an entry's ack covers its messages), until
  the backlog is read between them.
- ``raw_fanout``: 4 subscriptions, one exclusive consumer each, as ``raw_drain``.

Every consumer grants 1,000 permits (the official driver's receiver queue) and tops
them up as the official clients do; every count is checked against what was published
(``complete``), and a duplicate, a SEND_ERROR or an out-of-order receipt fails the run.
"""

from __future__ import annotations

import asyncio
import time

import rawclient
from load_shapes import (FANOUT_SUBSCRIPTIONS, MAX_PENDING, MESSAGE_BYTES, PUBLISH_BATCH, RECEIVE_IDLE_S,
                         WARMUP_MESSAGES, WORK_QUEUE_CONSUMERS, FixedRate, due_of, payload)
from magnetar.tools.latency_histogram import LatencyHistogram
from protocol.batch import parse_batch

# Permits per consumer: the official driver's receiver_queue_size.
PERMITS = 1000
# Cumulative acknowledgements of drain and fan-out: one per this many messages.
CUMULATIVE_ACK_MESSAGES = 1000
# A consumer workload never runs longer than this.
CONSUME_LIMIT_S = 120.0
# The e2e consumer acknowledges what it received at most this often (the official
# client's default acknowledgement grouping).
ACK_GROUPING_S = 0.1
# The e2e consumer waits at most this long for the last message after the last send.
E2E_DRAIN_S = 30.0
# A raw message carries its index in the batch (4 bytes, rawclient.build_batch) before
# its body: the due time comes right after.
_BODY_OFFSET = 4


def raw_backlog_topic(prefix: str) -> str:
    return f"{prefix}-raw-backlog"


def subscriptions() -> list[tuple[str, str]]:
    """The raw backlog's subscriptions (name, type), made before it is written."""
    return ([("drain", "exclusive"), ("work-queue", "shared")]
            + [(f"fanout-{n}", "exclusive") for n in range(FANOUT_SUBSCRIPTIONS)])


async def raw_publish(service_url: str, prefix: str, seconds: float) -> dict:
    topic = raw_backlog_topic(prefix)
    await rawclient.create_subscriptions(service_url, topic, subscriptions())
    result = await rawclient.produce(rawclient.ProduceSettings(
        service_url, topic, messages=None, seconds=seconds, batch_messages=PUBLISH_BATCH,
        message_bytes=MESSAGE_BYTES, window_entries=max(1, MAX_PENDING // PUBLISH_BATCH)))
    return {"messages": result["messages"], "entries": result["entries"], "errors": result["errors"],
            "msgs_per_s": result["msgs_per_s"], "batch_messages": PUBLISH_BATCH,
            "max_pending": MAX_PENDING, "started_unix_s": result["started_unix_s"],
            "ended_unix_s": result["ended_unix_s"]}


def _settings(service_url: str, prefix: str, subscription: str, sub_type: str, messages: int | None,
              cumulative: bool, consumer_name: str = "", idle_s: float = RECEIVE_IDLE_S) -> rawclient.ConsumeSettings:
    return rawclient.ConsumeSettings(
        service_url, raw_backlog_topic(prefix), subscription, sub_type=sub_type, messages=messages,
        seconds=CONSUME_LIMIT_S, idle_timeout_s=idle_s, permits=PERMITS, cumulative=cumulative,
        ack_group_entries=max(1, CUMULATIVE_ACK_MESSAGES // PUBLISH_BATCH) if cumulative else 1_000_000,
        consumer_name=consumer_name)


def _combined(results: list[dict], expected: int) -> dict:
    """One workload's figures from its consumers' summaries (their wall-clock windows)."""
    messages = sum(r["messages"] for r in results)
    firsts = [r["first_message_unix_s"] for r in results if r["first_message_unix_s"]]
    lasts = [r["last_message_unix_s"] for r in results if r["last_message_unix_s"]]
    first, last = (min(firsts), max(lasts)) if firsts and lasts else (None, None)
    seconds = (last - first) if first and last and last > first else None
    duplicates = sum(r["duplicates"] for r in results)
    return {"messages": messages, "expected": expected, "complete": messages >= expected and duplicates == 0,
            "duplicates": duplicates, "per_consumer": [r["messages"] for r in results],
            "ack_confirmed": all(r["ack_confirmed"] for r in results),
            "msgs_per_s": round(messages / seconds, 1) if seconds else None,
            "errors": 0 if all(r["ack_confirmed"] for r in results) else 1,
            "started_unix_s": first, "ended_unix_s": last}


async def raw_drain(service_url: str, prefix: str, backlog: int) -> dict:
    summary, _ = await rawclient.consume(_settings(service_url, prefix, "drain", "exclusive", backlog, True))
    return _combined([summary], backlog)


async def raw_fanout(service_url: str, prefix: str, backlog: int) -> dict:
    runs = await asyncio.gather(*(rawclient.consume(_settings(service_url, prefix, f"fanout-{n}", "exclusive",
                                                              backlog, True))
                                  for n in range(FANOUT_SUBSCRIPTIONS)))
    return _combined([summary for summary, _ in runs], backlog * FANOUT_SUBSCRIPTIONS)


async def raw_work_queue(service_url: str, prefix: str, backlog: int, idle_s: float = RECEIVE_IDLE_S) -> dict:
    """4 shared consumers, each until the backlog is read between them (then it idles
    out after ``idle_s``): a message read twice counts as a duplicate."""
    runs = await asyncio.gather(*(rawclient.consume(_settings(service_url, prefix, "work-queue", "shared", None,
                                                              False, consumer_name=f"work-{n}", idle_s=idle_s))
                                  for n in range(WORK_QUEUE_CONSUMERS)))
    result = _combined([summary for summary, _ in runs], backlog)
    seen: set = set()
    overlap = 0
    for _, positions in runs:
        overlap += len(seen & positions)
        seen |= positions
    result["duplicates"] += overlap
    result["complete"] = result["complete"] and overlap == 0
    return result


async def raw_e2e(service_url: str, prefix: str, rate: int, seconds: float, filler: bytes) -> dict:
    topic = f"{prefix}-raw-e2e"
    total = WARMUP_MESSAGES + int(rate * seconds)
    schedule = FixedRate(rate, total, WARMUP_MESSAGES)
    histogram = LatencyHistogram()
    received = [0]
    all_in = asyncio.Event()
    body = filler[:MESSAGE_BYTES - _BODY_OFFSET - 8]

    consumer = await rawclient.RawConnection.open(service_url)
    producer = await rawclient.RawConnection.open(service_url)
    try:
        consumer_id, producer_id = 1, 1
        request_id = consumer.request_id()
        await consumer.request(rawclient.subscribe_command(topic, "e2e", rawclient.SUB_TYPES["exclusive"],
                                                           consumer_id, request_id), request_id, "SUBSCRIBE")
        tally = rawclient.ConsumeTally(PERMITS)
        acks = rawclient.AckGrouper(cumulative=False, group_entries_max=1_000_000)

        def on_message(frame) -> None:
            now = time.perf_counter_ns()
            message = frame.command.message
            assert frame.payload is not None
            single = parse_batch(frame.payload.metadata, frame.payload.payload)[0]
            due = due_of(bytes(single.payload[_BODY_OFFSET:_BODY_OFFSET + 8]))
            if schedule.counted(due):
                histogram.record((now - due) // 1000)
            position = (message.message_id.ledgerId, message.message_id.entryId)
            grant = tally.on_message(position, 1, message.redelivery_count)
            acks.add(position)
            if grant:
                consumer.write_command(rawclient.flow_command(consumer_id, grant))
            received[0] += 1
            if received[0] >= total:
                all_in.set()

        last_ack_s = [time.monotonic()]

        def on_read_done(force: bool = False) -> None:
            # Grouped as the official client groups acknowledgements (every 100 ms).
            now_s = time.monotonic()
            if not force and now_s - last_ack_s[0] < ACK_GROUPING_S:
                return
            last_ack_s[0] = now_s
            positions = acks.take()
            if positions:
                consumer.write_command(rawclient.ack_command(consumer_id, positions, cumulative=False))

        consumer.on_message = on_message
        consumer.on_read_done = on_read_done
        consumer.write_command(rawclient.flow_command(consumer_id, PERMITS))

        request_id = producer.request_id()
        answer = await producer.request(rawclient.producer_command(topic, producer_id, request_id), request_id,
                                        "PRODUCER")
        producer_name = answer.command.producer_success.producer_name
        window = rawclient.SendWindow(MAX_PENDING)
        producer.on_receipt = lambda receipt: window.on_receipt(
            receipt.sequence_id, (receipt.message_id.ledgerId, receipt.message_id.entryId))
        over_window = [0]

        def send(index: int, due: int) -> None:
            if not window.has_room:
                over_window[0] += 1        # counted as an error: the window is the bound
                return
            batch = rawclient.build_batch(1, MESSAGE_BYTES, filler=payload(due, body))
            producer.write(rawclient.send_frame(producer_id, producer_name, index, batch, int(time.time() * 1000)))
            window.on_sent(index, 1)

        await schedule.run_async(send)
        try:
            async with asyncio.timeout(E2E_DRAIN_S):
                while not all_in.is_set():
                    consumer.check()
                    producer.check()
                    try:
                        async with asyncio.timeout(rawclient.POLL_S):
                            await all_in.wait()
                    except TimeoutError:
                        pass
        except TimeoutError:
            pass
        ended_unix = time.time()
        on_read_done(force=True)
    finally:
        consumer.close()
        producer.close()
    return {"rate_target": rate, "messages": histogram.count, "errors": over_window[0],
            "received": received[0] - WARMUP_MESSAGES, "complete": received[0] >= total and tally.duplicates == 0,
            "duplicates": tally.duplicates, "sender_late_max_ms": schedule.late_max_ms(),
            "latency_ms": histogram.summary_ms(), "started_unix_s": schedule.started_unix_s,
            "ended_unix_s": ended_unix}
