"""A reader given a start message id in a ledger that has just rolled over, been
archived and had its bookie copy deleted, on real processes (etcd, a bookie, a broker
with an at-once archive policy) with the official Pulsar client.

Why: the Spark tail reader (spark/tail.py), asked to start after 1:9 for a range ending
at 1:19, was handed 2:0 first. The cause, pinned down here: not the broker's placing of
the start (managed_ledger/managed_ledger.py ``normalize``; tests/unit/
test_managed_ledger_normalize.py walks it through every state of a rollover), but
ack-based retention. With no durable subscription everything stored counts as
consumed, and under an archive policy retention deletes a ledger from the topic as
soon as it is archived; a non-durable reader holds nothing back (Pulsar's rule: a
reader's cursor "doesn't prevent entries to be deleted", apache/pulsar#366, #6787), so
a reader placed in that ledger afterwards starts at the next one. The ledger's entries
are then only in the archive, which Spark reads from files.

Proves:
- while a durable subscription holds the ledger in the topic, a reader started after
  entry 9 of the archived, released ledger receives entry 10 (read from the archive);
- once nothing holds it, retention removes it from the topic and the same reader
  starts at the next ledger's entry 0 (Pulsar's behaviour for trimmed data);
- the Spark tail reader over a range that spans into the next ledger, (L:9, L+1:2],
  read after the trim, does not return the range short: it raises TailGap (6006), which
  a stream answers by reading the rest from the archive (spark/stream.py). Before,
  the range ended at L+1:2 and L:10..L:19 were lost without a word.
"""

from __future__ import annotations

import asyncio
import uuid

import pulsar
import pytest

from common.errors import TailGap
from spark import manifest
from spark.tail import TailReader
from tests.cluster import archive_at_once_policy, archiving_broker_args, http_json, wait_until

LEDGER_ENTRIES_MAX = 20


def _produce(client, topic: str, count: int) -> list[tuple[int, int]]:
    producer = client.create_producer(topic, batching_enabled=False)
    try:
        ids = []
        for n in range(count):
            message_id = producer.send(n.to_bytes(4, "big"))
            ids.append((message_id.ledger_id(), message_id.entry_id()))
        return ids
    finally:
        producer.close()


def _first_after(client, topic: str, ledger_id: int, entry_id: int) -> tuple[int, int]:
    """The first message a reader starting after ledger_id:entry_id receives."""
    reader = client.create_reader(topic, pulsar.MessageId(-1, ledger_id, entry_id, -1))
    try:
        message = reader.read_next(timeout_millis=20_000)
        return message.message_id().ledger_id(), message.message_id().entry_id()
    finally:
        reader.close()


def _listed(admin: str, local: str) -> list[int]:
    stats = http_json("GET", f"{admin}/persistent/public/default/{local}/internalStats")
    return [ledger["ledgerId"] for ledger in stats["ledgers"]]


async def test_a_reader_placed_in_an_archived_ledger_reads_it_until_retention_trims_it(cluster, tmp_path):
    await cluster.start_bookies(1)
    await cluster.start_brokers(1, extra_args=[
        *archiving_broker_args(LEDGER_ENTRIES_MAX), "--archive-url", str(tmp_path / "archive"),
        "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"])
    broker = cluster.brokers[0]
    admin = f"{broker.web_service_url}/admin/v2"
    await asyncio.to_thread(http_json, "POST", f"{admin}/namespaces/public/default/offloadPolicies",
                            archive_at_once_policy(100))
    local = f"reader-archived-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{local}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        # A durable subscription that acknowledges nothing holds every ledger in the topic.
        holder = await asyncio.to_thread(client.subscribe, topic, "holder",
                                         initial_position=pulsar.InitialPosition.Earliest)
        ids = await asyncio.to_thread(_produce, client, topic, LEDGER_ENTRIES_MAX + 5)
        first_ledger, second_ledger = ids[0][0], ids[LEDGER_ENTRIES_MAX][0]
        assert ids[LEDGER_ENTRIES_MAX - 1] == (first_ledger, LEDGER_ENTRIES_MAX - 1), ids
        assert second_ledger > first_ledger, ids

        def released() -> bool:
            records = http_json("GET", f"{admin}/persistent/public/default/{local}/archive")["ledgers"]
            return any(r["ledger_id"] == first_ledger and r["bookie_deleted_ms"] > 0 for r in records)

        await asyncio.to_thread(wait_until, released, 60, "the first ledger archived, its bookie copy deleted")
        await asyncio.sleep(1.5)       # retention runs every 0.5 s: it must keep the held ledger
        assert first_ledger in await asyncio.to_thread(_listed, admin, local)
        first = await asyncio.to_thread(_first_after, client, topic, first_ledger, 9)
        assert first == (first_ledger, 10), f"held, archived ledger: the reader started at {first}"

        # Nothing holds the ledger any more: retention deletes it from the topic.
        await asyncio.to_thread(holder.unsubscribe)
        await asyncio.to_thread(wait_until, lambda: first_ledger not in _listed(admin, local), 30,
                                "retention removed the archived ledger from the topic")
        first = await asyncio.to_thread(_first_after, client, topic, first_ledger, 9)
        assert first == (second_ledger, 0), f"trimmed ledger: the reader started at {first}"

        # The Spark tail reader over a range reaching into the next ledger, after the trim.
        def ledgers_now():
            return manifest.topic_ledgers(broker.web_service_url, topic), \
                manifest.ledgers(broker.web_service_url, topic)

        def read_tail() -> list[tuple[int, int]]:
            reader = TailReader(broker.service_url, topic, (first_ledger, 9), (second_ledger, 2), 20_000,
                                ledgers_now=ledgers_now)
            rows = []
            for batch in reader.batches():
                rows.extend(zip(batch.column("ledger_id").to_pylist(), batch.column("entry_id").to_pylist()))
            return rows

        with pytest.raises(TailGap) as raised:
            await asyncio.to_thread(read_tail)
        assert raised.value.last_seen == (first_ledger, 9) and raised.value.delivered == (second_ledger, 0)
    finally:
        client.close()
