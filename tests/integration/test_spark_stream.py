"""Streaming with the ``magnetar`` source: history read from archive files then the
tail; and, marked ``spark_full`` (`make test-spark-full`, not `make test`: each runs
several queries or Spark processes), a query killed with SIGKILL mid-run and restarted
from its checkpoint (its sink holds every message exactly once), failOnDataLoss both
ways, starting at latest or at a time, and the streaming writer replayed from its
checkpoint. In a module of
its own (a cluster of its own: etcd, a bookie, an archiving broker), so that `make test`'s
workers can run it beside the batch tests of test_spark.py."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid

import pulsar
import pytest

from spark import metrics

from tests.cluster import Cluster, wait_until
from tests.integration.spark_helpers import BROKER_ARGS, POLICY, committed_sink_ids, http, produce


@pytest.fixture(scope="module")
def archived(etcd_process, tmp_path_factory):
    """A cluster whose broker archives every closed ledger of public/default at once.
    Yields (cluster, None, None), the shape of test_spark.py's fixture of that name."""
    base = tmp_path_factory.mktemp("spark-stream-cluster")
    cluster = Cluster(etcd_process, str(base))
    client = None
    try:
        asyncio.run(cluster.start_bookies(1))
        asyncio.run(cluster.start_brokers(1, extra_args=[
            *BROKER_ARGS, "--archive-url", os.path.join(str(base), "archive"),
            "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"]))
        broker = cluster.brokers[0]
        http("POST", f"{broker.web_service_url}/admin/v2/namespaces/public/default/offloadPolicies", POLICY)
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=60)
        cluster.admin_url = broker.web_service_url
        cluster.client = client
        yield cluster, None, None
    finally:
        if client is not None:
            client.close()
        asyncio.run(cluster.stop())


@pytest.mark.spark_full        # two Spark processes, ~2 minutes: make test-spark-full
@pytest.mark.timeout(900)
def test_a_streaming_query_killed_and_restarted_from_its_checkpoint_sinks_every_message_once(
        archived, tmp_path):
    """A streaming query (its own process; at most 1,000 messages per trigger) reads a
    topic while it is produced to, into a Parquet sink with a checkpoint; it is killed
    with SIGKILL once a batch has committed, and restarted from the checkpoint; the sink
    then holds every produced message exactly once."""
    import subprocess
    import sys
    import time

    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-stream-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    argv = [sys.executable, os.path.join(os.path.dirname(__file__), "spark_stream_worker.py"), cluster.admin_url,
            cluster.brokers[0].service_url, topic, sink, checkpoint, "1000"]
    sent: dict = {}
    producing = threading.Thread(target=lambda: sent.update(produce(cluster.client, topic, 3000)))
    log_path = str(tmp_path / "worker.log")
    workers = []
    try:
        sent.update(produce(cluster.client, topic, 500, base=100_000))
        with open(log_path, "ab") as log:
            workers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        producing.start()
        commits = os.path.join(checkpoint, "commits")
        wait_until(lambda: os.path.isdir(commits) and len(os.listdir(commits)) >= 2, 240,
                   "two micro-batches committed")
        workers[0].kill()                                   # SIGKILL, mid-run
        workers[0].wait()
        producing.join(timeout=120)
        assert len(sent) == 3500
        with open(log_path, "ab") as log:
            workers.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

        def sink_ids() -> list:
            return committed_sink_ids(sink)

        deadline = time.monotonic() + 240
        ids = sink_ids()
        while len(ids) < len(sent) and time.monotonic() < deadline:
            assert workers[1].poll() is None, open(log_path).read()[-3000:]
            time.sleep(2)
            ids = sink_ids()
        assert len(ids) == len(set(ids)), "a message was written to the sink twice"
        assert set(ids) == set(sent)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        holder.close()


def stream_once(spark_session, cluster, topic: str, checkpoint: str, progress: list | None = None, **options) -> set:
    """Runs a streaming query over ``topic`` from ``checkpoint`` until it has processed
    everything available, stops it, and returns the (ledger, entry, batch index) it read
    (asserting it read none twice); ``progress`` gets the query's progress reports."""
    reader = (spark_session.readStream.format("magnetar").option("adminUrl", cluster.admin_url)
              .option("serviceUrl", cluster.brokers[0].service_url).option("topic", topic))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    read: list = []

    def collect(batch, _batch_id) -> None:
        read.extend(tuple(row) for row in batch.collect())

    query = (reader.load().select("ledger_id", "entry_id", "batch_index").writeStream.foreachBatch(collect)
             .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        if progress is not None:
            progress.extend(query.recentProgress)
    finally:
        query.stop()
    assert len(read) == len(set(read)), "a message was read twice"
    return set(read)


@pytest.mark.spark_full
def test_fail_on_data_loss_when_retention_deleted_what_the_checkpoint_points_at(spark_session, archived, tmp_path):
    """A stream reads a topic of a namespace that does not archive; then retention
    deletes its ledgers up to the current one, including messages the stream had not
    read. Restarted from its checkpoint the query fails naming the topic and the
    offset (failOnDataLoss defaults to true); with failOnDataLoss=false it skips the
    deleted messages and reads exactly what is still stored."""
    cluster, _topic, _sent = archived
    admin = f"{cluster.admin_url}/admin/v2"
    try:
        http("PUT", f"{admin}/namespaces/public/lossy")
    except Exception:                                        # noqa: BLE001 - created by an earlier run
        pass
    local = f"spark-loss-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/lossy/{local}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    checkpoint = str(tmp_path / "checkpoint")
    try:
        first = produce(cluster.client, topic, 60, batching=False)
        assert stream_once(spark_session, cluster, topic, checkpoint) == set(first)
        second = produce(cluster.client, topic, 65, base=60, batching=False)
        http("POST", f"{admin}/persistent/public/lossy/{local}/subscription/holder/skip_all")
        first_unread_ledger = min(second)[0]

        def stored() -> set:
            return {ledger["ledgerId"] for ledger in http("GET", f"{admin}/persistent/public/lossy/{local}/internalStats")["ledgers"]}

        wait_until(lambda: first_unread_ledger not in stored(), 60, "retention deleted unread ledgers")
        offset = max(first)[:2]
        with pytest.raises(Exception) as failure:
            stream_once(spark_session, cluster, topic, checkpoint)
        message = str(failure.value)
        assert "MessagesDeleted" in message and topic in message and f"after {offset[0]}:{offset[1]}" in message
        left = stored()
        rest = stream_once(spark_session, cluster, topic, checkpoint, failOnDataLoss="false")
        assert rest == {i for i in second if i[0] in left}
        assert rest and len(rest) < len(second)
    finally:
        holder.close()


@pytest.mark.spark_full
def test_streams_start_at_a_time_or_at_latest(spark_session, archived, tmp_path):
    """A new query with startingTimestamp (or startingOffsetsByTimestamp naming the topic)
    reads exactly the messages published from that time on; one with
    startingOffsets=latest reads none of what was there when it started and every
    message produced after its first read, once."""
    import json
    import time

    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-start-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    try:
        before = produce(cluster.client, topic, 100)
        time.sleep(0.05)
        start_ms = int(time.time() * 1000)
        time.sleep(0.05)
        after = produce(cluster.client, topic, 100, base=100)
        assert stream_once(spark_session, cluster, topic, str(tmp_path / "c1"), startingTimestamp=start_ms) == set(after)
        assert stream_once(spark_session, cluster, topic, str(tmp_path / "c2"),
                           startingOffsetsByTimestamp=json.dumps({topic: start_ms})) == set(after)

        read: set = set()
        stream = (spark_session.readStream.format("magnetar").option("adminUrl", cluster.admin_url)
                  .option("serviceUrl", cluster.brokers[0].service_url).option("topic", topic)
                  .option("startingOffsets", "latest").load())
        query = (stream.select("ledger_id", "entry_id", "batch_index").writeStream
                 .foreachBatch(lambda batch, _id: read.update(tuple(row) for row in batch.collect()))
                 .option("checkpointLocation", str(tmp_path / "c3")).trigger(processingTime="200 milliseconds")
                 .start())
        later: dict = {}
        try:
            for round_index in range(120):
                later.update(produce(cluster.client, topic, 5, base=1000 + 5 * round_index))
                if read:
                    break
                time.sleep(0.5)
            query.processAllAvailable()
        finally:
            query.stop()
        assert read and not read & (set(before) | set(after))
        ordered = sorted(later)
        assert read == set(ordered[len(ordered) - len(read):]), "not every message after the start was read"
    finally:
        holder.close()


def test_a_stream_behind_the_archive_reads_the_files_then_the_tail(spark_session, archived, tmp_path):
    """A stream starting before the archived ledgers of a topic reads them from the
    archive files (the reader's counters) and then the unarchived tail through the
    broker, micro-batches of at most 700 messages crossing from one to the other: every
    message once, none missing."""
    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-history-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    try:
        sent = produce(cluster.client, topic, 2000)
        admin = f"{cluster.admin_url}/admin/v2/{topic.replace('://', '/')}"
        wait_until(lambda: len(http("GET", f"{admin}/archive")["ledgers"]) >= 2, 120, "two ledgers archived")
        sent.update(produce(cluster.client, topic, 3, base=2000, batching=False))   # the open ledger
        metrics_dir = str(tmp_path / "metrics")
        progress: list = []
        read = stream_once(spark_session, cluster, topic, str(tmp_path / "checkpoint"), progress=progress,
                           maxMessagesPerTrigger=700, metricsDir=metrics_dir)
        assert read == set(sent)
        # The lag shows in the progress: the first micro-batch ends (endOffset) before
        # the topic's newest message (latestOffset); the last one reaches it.
        ranges = [(source.endOffset, source.latestOffset) for report in progress for source in report.sources
                  if source.endOffset and source.endOffset != source.startOffset]
        assert ranges and all(latest for _end, latest in ranges), ranges
        assert json.loads(ranges[0][0]) != json.loads(ranges[0][1]), ranges
        assert json.loads(ranges[-1][0]) == json.loads(ranges[-1][1]), ranges
        archive_rows = sum(task["rows"] for task in metrics.collect(metrics_dir, "stream-archive"))
        tail_rows = sum(task["rows"] for task in metrics.collect(metrics_dir, "stream-tail"))
        assert archive_rows > 0 and tail_rows >= 3
        assert archive_rows + tail_rows == len(sent)
    finally:
        holder.close()


@pytest.mark.timeout(600)
def test_min_messages_per_trigger_puts_a_micro_batch_off_until_the_minimum_is_there(
        spark_session, archived, tmp_path):
    """minMessagesPerTrigger 5 with a maxTriggerDelay of 10 minutes (so no batch in this
    test can be let through by the delay): the first trigger reads the 3 messages there
    at once (a reader's first batch is never put off); 2 more make no micro-batch for 4 s
    (a query without the option reads them within a trigger of 0.3 s); 3 more reach the
    minimum and the 5 come in one micro-batch."""
    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-min-trigger-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    batches: list[set] = []
    lock = threading.Lock()

    def sink(batch, _batch_id) -> None:
        rows = {tuple(row) for row in batch.collect()}
        if rows:
            with lock:
                batches.append(rows)

    def count() -> int:
        with lock:
            return len(batches)

    def start():
        stream = (spark_session.readStream.format("magnetar").option("adminUrl", cluster.admin_url)
                  .option("serviceUrl", cluster.brokers[0].service_url).option("topic", topic)
                  .option("minMessagesPerTrigger", "5").option("maxTriggerDelay", "10m").load())
        return (stream.select("ledger_id", "entry_id", "batch_index").writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(processingTime="300 milliseconds").start())

    def batches_or_failure(query, wanted: int):
        """True once ``wanted`` micro-batches came; the query's error once it died."""
        if count() >= wanted:
            return True
        return None if query.isActive else (query.exception() or "the query stopped")

    try:
        first = produce(cluster.client, topic, 3, batching=False)
        query = start()
        try:
            outcome = wait_until(lambda: batches_or_failure(query, 1), 120, "the first micro-batch")
            if outcome is not True and "failed to connect back" in str(outcome):
                # Spark waits a fixed 10 s for the source's Python worker to start, which
                # a loaded 2-core machine has missed: started again from the checkpoint
                # (nothing ran yet, so the first trigger is still this reader's first).
                query = start()
                outcome = wait_until(lambda: batches_or_failure(query, 1), 120, "the first micro-batch")
            assert outcome is True, f"the query failed: {outcome}"
            second = produce(cluster.client, topic, 2, base=3, batching=False)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                assert count() == 1, f"a micro-batch of fewer than 5 messages ran: {batches}"
                time.sleep(0.1)
            third = produce(cluster.client, topic, 3, base=5, batching=False)
            outcome = wait_until(lambda: batches_or_failure(query, 2), 120, "the micro-batch of 5 messages")
            assert outcome is True, f"the query failed: {outcome}"
        finally:
            query.stop()
        assert batches[0] == set(first)
        assert batches[1] == set(second) | set(third), batches
        assert len(batches) == 2, batches
    finally:
        holder.close()


@pytest.mark.spark_full
def test_a_streaming_write_replayed_from_its_checkpoint_stores_each_row_once(spark_session, archived, tmp_path):
    """writeStream.format("magnetar") with idempotent=true into a namespace with
    deduplication on: a query copies a topic in micro-batches of at most 100 messages;
    its last commit is removed from the checkpoint (a crash after the sink stored the
    batch, before Spark recorded it) and the query restarted: the batch runs again, the
    broker drops every row of it as a duplicate, and the official client reads each
    row exactly once."""
    cluster, _topic, _sent = archived
    admin = f"{cluster.admin_url}/admin/v2"
    try:
        http("PUT", f"{admin}/namespaces/public/dedup")
    except Exception:                                        # noqa: BLE001 - created by an earlier run
        pass
    http("POST", f"{admin}/namespaces/public/dedup/deduplication", True)
    source = f"persistent://public/default/spark-copy-src-{uuid.uuid4().hex[:8]}"
    target = f"persistent://public/dedup/spark-copy-dst-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(source, "holder", initial_position=pulsar.InitialPosition.Earliest)
    check = cluster.client.subscribe(target, "check", initial_position=pulsar.InitialPosition.Earliest)
    checkpoint, metrics_dir = str(tmp_path / "checkpoint"), str(tmp_path / "metrics")

    def run() -> None:
        stream = (spark_session.readStream.format("magnetar").option("adminUrl", cluster.admin_url)
                  .option("serviceUrl", cluster.brokers[0].service_url).option("topic", source)
                  .option("maxMessagesPerTrigger", 100).load())
        query = (stream.select("payload", "key", "properties", "event_time").writeStream.format("magnetar")
                 .option("serviceUrl", cluster.brokers[0].service_url).option("topic", target)
                 .option("idempotent", "true").option("metricsDir", metrics_dir)
                 .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    try:
        sent = produce(cluster.client, source, 300)
        run()
        commits = os.path.join(checkpoint, "commits")
        last = max(int(name) for name in os.listdir(commits) if name.isdigit())
        os.remove(os.path.join(commits, str(last)))
        for name in os.listdir(commits):
            if name.startswith(f".{last}."):
                os.remove(os.path.join(commits, name))
        run()
        writes = metrics.collect(metrics_dir, "stream-write")
        replayed = sorted((w["messages"], w["duplicates"]) for w in writes if w["batch_id"] == last)
        size = replayed[-1][0]
        assert size > 0 and replayed == [(0, size), (size, 0)], replayed    # the second run stored nothing
        assert sum(w["messages"] for w in writes) == len(sent)

        expected = {payload: (key, properties) for payload, key, properties, _event_ms in sent.values()}
        received: dict = {}
        while len(received) < len(expected):
            message = check.receive(timeout_millis=30_000)
            assert message.data() not in received, "a row was stored twice"
            received[message.data()] = (message.partition_key(), message.properties())
            check.acknowledge(message)
        with pytest.raises(pulsar.Timeout):
            check.receive(timeout_millis=500)
        assert received == expected
    finally:
        check.close()
        holder.close()


@pytest.mark.spark_full
def test_trigger_available_now_reads_what_is_stored_and_stops(spark_session, archived, tmp_path):
    """Trigger.AvailableNow (the reader's prepareForTriggerAvailableNow) with
    maxMessagesPerTrigger 70: the query reads every message stored when it started, in
    several micro-batches, then stops by itself."""
    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-available-now-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    try:
        sent = produce(cluster.client, topic, 200, batching=False)
        batches: list[int] = []
        read: set = set()

        def sink(batch, _batch_id) -> None:
            rows = [tuple(row) for row in batch.collect()]
            batches.append(len(rows))
            read.update(rows)

        stream = (spark_session.readStream.format("magnetar").option("adminUrl", cluster.admin_url)
                  .option("serviceUrl", cluster.brokers[0].service_url).option("topic", topic)
                  .option("maxMessagesPerTrigger", "70").load())
        query = (stream.select("ledger_id", "entry_id", "batch_index").writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(300), "an AvailableNow query did not stop by itself"
        finally:
            query.stop()
        assert read == set(sent)
        assert len([n for n in batches if n]) >= 3 and max(batches) <= 70, batches
    finally:
        holder.close()
