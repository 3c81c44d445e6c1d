"""The live tail of a topic: the entries not yet archived, read through a broker as a
non-durable reader over the Pulsar protocol (client/), never through bookies or broker
internals. Shell (sockets), driven from a Spark task's generator.

A tail read covers a fixed range planned on the driver: from just after the last
archived entry of the partition (or the first entry, with nothing archived) to the
partition's last message at planning time, inclusive. So archived rows and tail rows
never overlap, and a re-run of the task (Spark's retry) reads the same rows.

The reader asks the broker for a bounded number of messages at a time (flow permits),
hands rows over in Arrow record batches of at most ``ROWS_PER_BATCH`` rows, drops
entries at or before the start, and stops at the end. After a reconnection it resumes
from the last entry it saw (the broker starts a non-durable reader at the entry named,
and what was seen is dropped again). A read that gets nothing for ``timeout_ms`` fails
naming the topic and position where it stalled.

Skipped entries. A non-durable reader holds no data back (Pulsar's rule): with no
durable subscription, ack-based retention deletes a ledger from the topic as soon as it
is archived, and a reader placed in it — at the start, or still reading it — goes on at
the next ledger's first entry. The range's entries of that ledger are then only in the
archive (tests/integration/test_reader_start_in_archived_ledger.py). So a read that the
broker takes past the range's end without delivering the end, or to a later ledger
without showing that nothing was skipped (``skips_entries``: the ledger it left ended
at the last entry seen, and no archived ledger between them left the topic; asked of
the admin API, ``ledgers_now``, only when the ledger changes, and at the first entry
of a range from the partition's first entry), raises TailGap after the
rows before the gap, with the last entry it saw: never a short range returned as whole.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Callable, Iterator, Sequence

import pyarrow as pa

from client.client import PulsarClient
from client.messages import MessageId, ReceivedEntry
from common.errors import MagnetarError, OperationTimeout, TailGap
from spark.schema import ARROW_SCHEMA

Position = tuple[int, int]
# The partition's ledgers now: the topic's, oldest first, as (ledger_id, entries or None
# while unknown) (spark/manifest.py ``topic_ledgers``), and the archive manifest's
# records (``manifest.ledgers``: JSON objects with topic, ledger_id, entry_count).
LedgersNow = Callable[[], tuple[Sequence[tuple[int, int | None]], Sequence[dict]]]
# Rows per record batch handed to Spark, and messages granted to the broker at once:
# a few MiB of 1 KiB messages, and the official clients' receiver queue (1,000).
ROWS_PER_BATCH = 8192
PERMITS = 1000


class _TailListener:
    def __init__(self) -> None:
        self.entries: collections.deque[ReceivedEntry] = collections.deque()
        self.arrived = asyncio.Event()
        self.failure: MagnetarError | None = None
        self.reconnected = False

    def on_entry(self, entry: ReceivedEntry) -> None:
        self.entries.append(entry)        # bounded by the permits granted
        self.arrived.set()

    def on_disconnected(self) -> None:
        pass

    def on_reconnected(self) -> None:
        self.reconnected = True
        self.arrived.set()

    def on_failed(self, error: MagnetarError) -> None:
        self.failure = error
        self.arrived.set()


def _rows_to_batch(topic: str, rows: list[tuple]) -> pa.RecordBatch:
    columns = list(zip(*rows)) if rows else [[] for _ in ARROW_SCHEMA]
    arrays = [pa.array(list(values), type=field.type) for values, field in zip(columns, ARROW_SCHEMA)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _rows_of(topic: str, entry: ReceivedEntry) -> list[tuple]:
    rows = []
    for message in entry.messages:
        batch_index = message.message_id.batch_index if entry.batch_size else -1
        rows.append((topic, entry.partition, entry.ledger_id, entry.entry_id, batch_index,
                     message.publish_time_ms * 1000,
                     message.event_time_ms * 1000 if message.event_time_ms else None,
                     message.key, message.ordering_key, list(message.properties.items()),
                     message.producer_name, message.sequence_id, message.payload))
    return rows


def skips_entries(topic: str, last_seen: Position | None, delivered: Position,
                  topic_ledgers: Sequence[tuple[int, int | None]], archived: Sequence[dict]) -> bool:
    """Whether the broker, delivering ``delivered`` (in a later ledger) right after
    ``last_seen`` (None: as the first entry of a range from the partition's first
    entry), may have skipped entries between them. Pure.

    The broker leaves a ledger the topic still lists only after its last entry
    (ManagedLedger.normalize), so a listed ``last_seen`` ledger skipped nothing; one the
    topic no longer lists (retention removed it) skipped nothing only if the archive
    shows ``last_seen`` was its last entry. A ledger between the two that the topic no
    longer lists and the archive holds entries of was skipped whole (for a range from
    the first entry: any such ledger before ``delivered``, archived after the range was
    planned); a later ledger is entered at entry 0."""
    listed = {ledger_id for ledger_id, _entries in topic_ledgers}
    counts = {record["ledger_id"]: record["entry_count"] for record in archived if record["topic"] == topic}
    if delivered[1] != 0:
        return True
    if last_seen is None:
        ledger_id = -1
    else:
        assert delivered[0] > last_seen[0], (last_seen, delivered)
        ledger_id, entry_id = last_seen
        if ledger_id not in listed and (ledger_id not in counts or entry_id < counts[ledger_id] - 1):
            return True
    return any(ledger_id < other < delivered[0] and other not in listed and count > 0
               for other, count in counts.items())


class TailReader:
    """Reads one partition's tail between two positions; ``batches()`` yields record
    batches of spark/schema.py's ARROW_SCHEMA."""

    def __init__(self, service_url: str, topic: str, start_after: Position | None, end: Position,
                 timeout_ms: int, *, ledgers_now: LedgersNow | None = None) -> None:
        """``ledgers_now`` (None: not checked) tells, when the broker moves the read to
        another ledger, whether entries were skipped (``skips_entries``)."""
        assert start_after is None or start_after < end, (start_after, end)
        self.ledgers_now = ledgers_now
        self.service_url = service_url
        self.topic = topic
        self.start_after = start_after
        self.end = end
        self.timeout_s = timeout_ms / 1000
        self.last_seen: Position | None = start_after
        self.entries_read = 0
        self._pending_gap: TailGap | None = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        loop = asyncio.new_event_loop()
        try:
            client, consumer, listener = loop.run_until_complete(self._open())
            try:
                while True:
                    rows, done = loop.run_until_complete(self._next_rows(consumer, listener))
                    if rows:
                        yield _rows_to_batch(self.topic, rows)
                    if self._pending_gap is not None:
                        raise self._pending_gap      # after the rows before the gap
                    if done:
                        return
            finally:
                loop.run_until_complete(client.close())
        finally:
            # The pool's close cancels its connections' keep-alive tasks without
            # awaiting them: let them finish before the loop goes.
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _open(self):
        client = PulsarClient(self.service_url)
        listener = _TailListener()
        # The broker starts at the entry named (inclusive; dropped as seen): entry -1,
        # "before the ledger's first entry", is asked for as entry 0.
        start = None if self.start_after is None else MessageId(self.start_after[0], max(self.start_after[1], 0))
        try:
            consumer = await client.subscribe(self.topic, f"spark-tail-{uuid.uuid4().hex[:12]}",
                                              sub_type="exclusive", durable=False, initial_position="earliest",
                                              start_message_id=start, listener=listener)
        except BaseException:
            await client.close()
            raise
        consumer.flow(PERMITS)
        return client, consumer, listener

    async def _next_rows(self, consumer, listener: _TailListener) -> tuple[list[tuple], bool]:
        rows: list[tuple] = []
        while len(rows) < ROWS_PER_BATCH:
            if not listener.entries:
                if rows:
                    return rows, False
                listener.arrived.clear()
                try:
                    async with asyncio.timeout(self.timeout_s):
                        await listener.arrived.wait()
                except TimeoutError:
                    raise OperationTimeout(f"tail read stalled: topic={self.topic} after={self.last_seen} "
                                           f"end={self.end} timeout_s={self.timeout_s}") from None
                if listener.failure is not None:
                    raise listener.failure
                if listener.reconnected:
                    listener.reconnected = False
                    consumer.flow(PERMITS)
                continue
            entry = listener.entries.popleft()
            if consumer.permits_outstanding <= PERMITS // 2:
                consumer.flow(PERMITS)
            position = entry.position
            if self.last_seen is not None and position <= self.last_seen:
                continue                       # before the start, or seen before a reconnection
            # ``end`` is a stored entry (the partition's last message when the range was
            # planned): passing it unseen means the broker skipped entries of the range;
            # so may a move to another ledger. Never a short range: the caller reads the
            # rest elsewhere.
            if position > self.end or await self._skipped_to(position):
                if rows:
                    self._pending_gap = TailGap(self.topic, self.last_seen, self.end, position)
                    return rows, True
                raise TailGap(self.topic, self.last_seen, self.end, position)
            self.last_seen = position
            # A reconnection starts again from here (inclusive; dropped above).
            consumer.start_message_id = MessageId(*position)
            self.entries_read += 1
            rows.extend(_rows_of(self.topic, entry))
            if position == self.end:
                return rows, True
        return rows, False

    async def _skipped_to(self, position: Position) -> bool:
        """Whether entries were skipped on the way to ``position`` from the last entry
        seen, when that was in an earlier ledger, or to the first entry of a range from
        the partition's first entry (asked of the admin API off the loop)."""
        last_seen = self.last_seen
        if self.ledgers_now is None or (last_seen is not None and position[0] == last_seen[0]):
            return False
        topic_ledgers, archived = await asyncio.to_thread(self.ledgers_now)
        return skips_entries(self.topic, last_seen, position, topic_ledgers, archived)
