"""The ``magnetar`` PySpark data source on real processes (etcd, three bookies, a
broker archiving every closed ledger), one local SparkSession for the test run.

Proves:
- messages produced with keys, properties and event times and archived are returned by
  ``spark.read.format("magnetar")`` exactly: one row per message, the same ids, keys,
  properties, payloads; start/end by position and by time select the right rows;
- a publish-time range given as options opens only the files in range (the reader's
  own counters); the same range as a filter returns the same rows (every file read:
  pushed filters never prune, spark/reader.py); an unfiltered count on the same
  DataFrame afterwards returns every row; the same with filter pushdown off;
  ledger/entry and key filters return the right rows; queries sharing one DataFrame
  (planned together, a union of two scans, threads) each get exactly their rows;
- a truncated or corrupted archive file fails the Spark job with an error naming the
  file, never returning rows of it.

``SPARK_TEST_MESSAGES`` sets the message count (``make test`` 10,000; ``make
test-spark-full`` 100,000).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import threading
import uuid

import pulsar
import pytest

from spark import metrics
from tests.cluster import Cluster, wait_until
from tests.integration.spark_helpers import BROKER_ARGS, MESSAGES, POLICY, http, produce

# The default 300 s per test is for make test's 10,000 messages; make test-spark-full's
# 100,000 make each query ten times longer (a timeout inside a py4j call also breaks the
# session for every test after it).
pytestmark = pytest.mark.timeout(300 if MESSAGES <= 10_000 else 1800)


@pytest.fixture(scope="module")
def archived(etcd_process, tmp_path_factory):
    """A cluster whose topic holds MESSAGES archived messages. Yields (cluster, topic, sent)."""
    base = tmp_path_factory.mktemp("spark-cluster")
    cluster = Cluster(etcd_process, str(base))
    archive_dir = os.path.join(str(base), "archive")
    client = None
    try:
        asyncio.run(cluster.start_bookies(3))
        asyncio.run(cluster.start_brokers(1, extra_args=[*BROKER_ARGS, "--archive-url", archive_dir]))
        broker = cluster.brokers[0]
        admin = f"{broker.web_service_url}/admin/v2"
        http("POST", f"{admin}/namespaces/public/default/offloadPolicies", POLICY)
        local = f"spark-{uuid.uuid4().hex[:8]}"
        topic = f"persistent://public/default/{local}"
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=60)
        # A subscription that acknowledges nothing keeps the topic loaded (its owner
        # archives it) and its ledgers in the topic.
        holder = client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
        sent = produce(client, topic, MESSAGES)
        http("PUT", f"{admin}/persistent/public/default/{local}/unload")      # closes the last ledger
        holder.close()
        holder = client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
        ledgers = {key[0] for key in sent}

        def all_archived() -> bool:
            manifest = http("GET", f"{admin}/persistent/public/default/{local}/archive")
            return ledgers <= {ledger["ledger_id"] for ledger in manifest["ledgers"]}

        wait_until(all_archived, 120, "every produced ledger archived")
        cluster.admin_url = broker.web_service_url
        cluster.client = client
        yield cluster, topic, sent
    finally:
        if client is not None:
            client.close()
        asyncio.run(cluster.stop())


def read(spark_session, cluster, topic: str, **options):
    reader = spark_session.read.format("magnetar").option("adminUrl", cluster.admin_url).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def rows_by_id(rows) -> dict:
    return {(r.ledger_id, r.entry_id, r.batch_index): r for r in rows}


def test_spark_returns_exactly_the_archived_messages(spark_session, archived):
    """Every produced message is one row with its id, key, properties, payload and
    event time; start/end by position and by time select exactly the rows in range."""
    cluster, topic, sent = archived
    df = read(spark_session, cluster, topic)
    rows = rows_by_id(df.collect())
    assert len(rows) == len(sent) and rows.keys() == sent.keys()
    for message_id, (payload, key, properties, event_ms) in sent.items():
        row = rows[message_id]
        assert (bytes(row.payload), row.key, row.properties, row.topic) == (payload, key, properties, topic)
        assert row.partition == -1
        assert int(row.event_time.replace(tzinfo=dt.timezone.utc).timestamp() * 1000) == event_ms
    assert df.count() == len(sent)

    ordered = sorted(sent)
    start, end = ordered[len(ordered) // 4], ordered[3 * len(ordered) // 4]
    ranged = read(spark_session, cluster, topic, startingOffsets=f"{start[0]}:{start[1]}",
                  endingOffsets=f"{end[0]}:{end[1]}").collect()
    expected = {i for i in sent if start[:2] <= i[:2] < end[:2]}
    assert set(rows_by_id(ranged)) == expected

    times = sorted(int(r.publish_time.replace(tzinfo=dt.timezone.utc).timestamp() * 1000) for r in rows.values())
    t0, t1 = times[len(times) // 3], times[2 * len(times) // 3]
    by_time = read(spark_session, cluster, topic, startingTimestamp=t0, endingTimestamp=t1).collect()
    expected = {i for i, r in rows.items()
                if t0 <= int(r.publish_time.replace(tzinfo=dt.timezone.utc).timestamp() * 1000) < t1}
    assert set(rows_by_id(by_time)) == expected and expected


def test_options_prune_files_and_filters_never_leak_into_a_later_query(spark_session, archived, tmp_path):
    """A publish-time range given as options opens only the files whose time range
    meets it (the reader's counters) and returns exactly the rows in range; the same
    range as a filter returns the same rows, and an unfiltered count on the same
    DataFrame after it returns every row; then ledger/entry and key filters, and all of
    it again with pushdown off."""
    cluster, topic, sent = archived
    manifest = http("GET", f"{cluster.admin_url}/admin/v2/{topic.replace('://', '/')}/archive")
    files = [f for ledger in manifest["ledgers"] for f in ledger["files"]]
    assert len(files) >= 10
    middle = files[len(files) // 2]
    low_ms, high_ms = middle["publish_time_ms_min"], middle["publish_time_ms_max"]
    overlapping = {f["url"] for f in files
                   if f["publish_time_ms_max"] >= low_ms and f["publish_time_ms_min"] <= high_ms}
    assert len(overlapping) < len(files) / 2
    low = dt.datetime.fromtimestamp(low_ms / 1000, dt.timezone.utc)
    high = dt.datetime.fromtimestamp(high_ms / 1000, dt.timezone.utc)

    metrics_dir = str(tmp_path / "metrics")
    # Only the columns the checks need: turning 10,000 whole rows into Python objects
    # costs more than the reads on a loaded machine.
    ids = ("ledger_id", "entry_id", "batch_index")
    df = read(spark_session, cluster, topic, metricsDir=metrics_dir)
    all_rows = rows_by_id(df.select(*ids, "publish_time").collect())
    expected = {i for i, r in all_rows.items()
                if low <= r.publish_time.replace(tzinfo=dt.timezone.utc) <= high}
    assert expected and len(all_rows) == len(sent)

    ranged_dir = str(tmp_path / "ranged")
    ranged = read(spark_session, cluster, topic, metricsDir=ranged_dir, includeUnarchived="false",
                  startingTimestamp=low_ms, endingTimestamp=high_ms + 1)
    assert set(rows_by_id(ranged.select(*ids).collect())) == expected
    opened = {t["url"] for t in metrics.collect(ranged_dir, "task")}
    assert opened <= overlapping, "a file outside the options' time range was opened"
    assert len(opened) < len(files)

    shutil.rmtree(metrics_dir)
    filtered = df.filter((df.publish_time >= low) & (df.publish_time <= high))
    assert set(rows_by_id(filtered.select(*ids).collect())) == expected
    assert {t["url"] for t in metrics.collect(metrics_dir, "task")} == {f["url"] for f in files}
    # The trap: the same DataFrame, no filter, after the filtered query.
    assert df.count() == len(sent)

    # Ledger/entry ranges and keys.
    ledger_id = sorted(sent)[len(sent) // 2][0]
    by_ledger = df.filter((df.ledger_id == ledger_id) & (df.entry_id >= 10) & (df.entry_id < 20)).select(*ids).collect()
    assert set(rows_by_id(by_ledger)) == {i for i in sent if i[0] == ledger_id and 10 <= i[1] < 20}
    by_key = df.filter(df.key == "key-7").select(*ids).collect()
    assert set(rows_by_id(by_key)) == {i for i, v in sent.items() if v[1] == "key-7"}

    spark_session.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        plain = read(spark_session, cluster, topic)
        assert plain.filter((plain.publish_time >= low) & (plain.publish_time <= high)).count() == len(expected)
        assert plain.filter(plain.key == "key-7").count() == len(by_key)
    finally:
        spark_session.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def test_queries_sharing_one_dataframe_each_get_exactly_their_own_rows(spark_session, archived):
    """Queries with different filters on one DataFrame never get each other's rows.

    pyspark (4.1-4.3) keeps one planned read per DataFrame source, replaced by every
    filter pushdown and used by every scan of that source planned after it. So (1)
    queries planned before any of them runs (as concurrent queries are: each is
    optimized, which is when Spark pushes its filters, before the others run; forced
    here through each query's own QueryExecution) all run the read planned last; (2) one
    query scanning the DataFrame twice (a union of two filters, a filtered and an
    unfiltered branch) runs one planned read in both scans; (3) three queries at once
    on threads."""
    cluster, topic, sent = archived
    df = read(spark_session, cluster, topic)
    wanted_a = {i for i, v in sent.items() if v[1] == "key-3"}
    wanted_b = {i for i, v in sent.items() if v[1] == "key-11"}
    assert wanted_a and wanted_b

    wrong: list[str] = []             # every case is run; all wrong ones are reported

    def exact(rows, wanted, what: str) -> None:
        got = rows_by_id(rows)
        if len(rows) != len(wanted) or set(got) != wanted:
            wrong.append(f"{what}: {len(rows)} rows, {len(set(got) & wanted)} of the {len(wanted)} wanted")

    columns = ("ledger_id", "entry_id", "batch_index", "key")
    query_a = df.filter(df.key == "key-3").select(*columns)
    query_b = df.filter(df.key == "key-11").select(*columns)
    query_all = df.select(*columns)
    for query in (query_a, query_b, query_all):
        query._jdf.queryExecution().optimizedPlan()          # filters pushed, read planned
    exact(query_all.collect(), set(sent), "unfiltered query planned with two filtered ones")
    exact(query_a.collect(), wanted_a, "query A planned before query B")
    exact(query_b.collect(), wanted_b, "query B")

    # One query, two scans of the DataFrame.
    exact(query_a.unionByName(query_b).collect(), wanted_a | wanted_b, "union of the two filters")
    both = query_a.unionByName(query_all).collect()
    if len(both) != len(wanted_a) + len(sent):
        wrong.append(f"a filter's branch and the whole DataFrame: {len(both)} rows, not {len(wanted_a) + len(sent)}")

    # Threads: two filtered queries and a count at once, two rounds.
    results: dict = {}

    def run(name, query) -> None:
        try:
            results[name] = len(query.collect())
        except Exception as error:       # noqa: BLE001 - asserted below
            results[name] = repr(error)

    for round_ in range(2):
        results.clear()
        threads = [threading.Thread(target=run, args=(name, query)) for name, query in
                   (("a", df.filter(df.key == "key-3")), ("b", df.filter(df.key == "key-11")),
                    ("all", df.select("ledger_id")))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=240)
        if results != {"a": len(wanted_a), "b": len(wanted_b), "all": len(sent)}:
            wrong.append(f"threads, round {round_}: {results}")
    assert not wrong, wrong


def test_a_corrupt_or_truncated_file_fails_the_job_naming_the_file(spark_session, archived, tmp_path):
    """A copy of the archive with one file truncated, then one with a flipped byte:
    the Spark job fails with ArchiveCorrupt naming that file, and returns no rows."""
    cluster, topic, sent = archived
    manifest = http("GET", f"{cluster.admin_url}/admin/v2/{topic.replace('://', '/')}/archive")
    victim = manifest["ledgers"][1]["files"][0]
    path = victim["url"].removeprefix("file://")
    original = str(tmp_path / "original.arrow")
    shutil.copyfile(path, original)
    try:
        with open(path, "r+b") as handle:          # truncated
            handle.truncate(victim["size_bytes"] - 100)
        with pytest.raises(Exception) as failure:
            read(spark_session, cluster, topic).collect()
        assert victim["url"] in str(failure.value) and "ArchiveCorrupt" in str(failure.value)

        shutil.copyfile(original, path)            # a flipped byte in a payload
        n = sorted(sent)[len(sent) // 2]
        with open(path, "r+b") as handle:
            data = bytearray(handle.read())
            payload = next(v[0] for k, v in sent.items() if k[0] == manifest["ledgers"][1]["ledger_id"]
                           and len(v[0]) > 20)
            offset = data.index(payload) + 10
            handle.seek(offset)
            handle.write(bytes([data[offset] ^ 0x01]))
        assert n
        with pytest.raises(Exception) as failure:
            read(spark_session, cluster, topic).collect()
        assert victim["url"] in str(failure.value) and "is corrupt" in str(failure.value)
    finally:
        shutil.copyfile(original, path)
    assert read(spark_session, cluster, topic).count() == len(sent)


def test_include_unarchived_adds_the_tail_without_duplicates(spark_session, archived, tmp_path):
    """A topic with archived ledgers and a tail the archiver has not reached (the open
    ledger): with includeUnarchived every produced message is one row, some from
    archive files and some through the broker (the reader's counters), none twice;
    the default (no includeUnarchived, no serviceUrl: the broker found through the
    admin URL's lookup) reads the same whole topic; includeUnarchived=false only the
    archived rows."""
    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-tail-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    try:
        sent = produce(cluster.client, topic, 2000)
        admin = f"{cluster.admin_url}/admin/v2/{topic.replace('://', '/')}"
        wait_until(lambda: len(http("GET", f"{admin}/archive")["ledgers"]) >= 2, 120, "two ledgers archived")
        # Three messages stored alone land in the open ledger: the tail is never empty.
        sent.update(produce(cluster.client, topic, 3, base=2000, batching=False))
        metrics_dir = str(tmp_path / "metrics")
        df = read(spark_session, cluster, topic, includeUnarchived="true",
                  serviceUrl=cluster.brokers[0].service_url, metricsDir=metrics_dir)
        rows = df.collect()
        ids = [(r.ledger_id, r.entry_id, r.batch_index) for r in rows]
        assert len(ids) == len(set(ids)), "a message was read twice"
        assert set(ids) == set(sent)
        by_id = rows_by_id(rows)
        for message_id, (payload, key, properties, event_ms) in sent.items():
            row = by_id[message_id]
            assert (bytes(row.payload), row.key, row.properties) == (payload, key, properties)
            assert int(row.event_time.replace(tzinfo=dt.timezone.utc).timestamp() * 1000) == event_ms
        tail_rows = sum(t["rows"] for t in metrics.collect(metrics_dir, "tail"))
        archive_rows = sum(t["rows"] for t in metrics.collect(metrics_dir, "task"))
        assert tail_rows >= 3 and archive_rows > 0
        assert tail_rows + archive_rows == len(sent)
        whole = [(r.ledger_id, r.entry_id, r.batch_index) for r in read(spark_session, cluster, topic).collect()]
        assert sorted(whole) == sorted(ids)
        archived_only = read(spark_session, cluster, topic, includeUnarchived="false").count()
        assert 0 < archived_only < len(sent)
    finally:
        holder.close()


def test_a_dataframe_written_to_a_topic_is_consumed_by_the_official_client(spark_session, archived, tmp_path):
    """A DataFrame of 2,000 rows (payload, key, properties, event time) in four
    partitions is written to a topic; the official client reads every row back intact
    and once; the commit reports the count stored."""
    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-write-{uuid.uuid4().hex[:8]}"
    count = 2000
    base_time = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [(f"payload-{i}".encode() + bytes(i % 50), f"k{i % 13}", {"i": str(i)},
             base_time + dt.timedelta(milliseconds=i)) for i in range(count)]
    df = spark_session.createDataFrame(rows, "payload binary, key string, properties map<string,string>, "
                                             "event_time timestamp").repartition(4)
    metrics_dir = str(tmp_path / "metrics")
    # Subscribed first: a durable cursor keeps the ledgers (this cluster archives and
    # then retires every closed ledger nobody needs).
    consumer = cluster.client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    (df.write.format("magnetar").mode("append").option("serviceUrl", cluster.brokers[0].service_url)
       .option("topic", topic).option("metricsDir", metrics_dir).save())
    commits = metrics.collect(metrics_dir, "write")
    assert [(c["messages"], c["committed"]) for c in commits] == [(count, True)]

    try:
        received = {}
        while len(received) < count:
            message = consumer.receive(timeout_millis=30_000)
            i = int(message.properties()["i"])
            assert i not in received, f"row {i} stored twice"
            received[i] = (message.data(), message.partition_key(), message.properties(), message.event_timestamp())
            consumer.acknowledge(message)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        consumer.close()
    for i, (payload, key, properties, event_time) in enumerate(rows):
        expected_ms = int(event_time.timestamp() * 1000)
        assert received[i] == (payload, key, properties, expected_ms), i


def test_rows_written_to_a_partitioned_topic_go_to_their_partition_or_their_keys_partition(
        spark_session, archived, tmp_path):
    """Rows written to a topic of 3 partitions: keyed rows land in the partition the
    official client picks for the same key, rows with a ``partition`` column in that
    partition, rows without either spread over the partitions; each row once."""
    from client.routing import key_partition

    cluster, _topic, _sent = archived
    local = f"spark-parts-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{local}"
    http("PUT", f"{cluster.admin_url}/admin/v2/persistent/public/default/{local}/partitions", 3)
    consumer = cluster.client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    official = cluster.client.create_producer(topic)
    official_partition = {f"k{i}": official.send(b"official", partition_key=f"k{i}").partition() for i in range(17)}
    official.close()
    service_url = cluster.brokers[0].service_url

    rows = ([(f"keyed-{i}".encode(), f"k{i % 17}", None) for i in range(300)]
            + [(f"placed-{i}".encode(), "same", i % 3) for i in range(30)]
            + [(f"loose-{i}".encode(), None, None) for i in range(100)])
    df = spark_session.createDataFrame(rows, "payload binary, key string, partition int").repartition(2)
    (df.write.format("magnetar").mode("append").option("serviceUrl", service_url).option("topic", topic)
       .option("batchMessages", 20).save())
    try:
        received: dict = {}
        while len(received) < 300 + 30 + 100 + 17:
            message = consumer.receive(timeout_millis=30_000)
            name = message.data().decode() + ("" if message.data() != b"official" else message.partition_key())
            assert name not in received, f"{name} stored twice"
            received[name] = (message.partition_key(), message.message_id().partition())
            consumer.acknowledge(message)
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        consumer.close()
    for i in range(300):
        key, partition = received[f"keyed-{i}"]
        assert partition == official_partition[key] == key_partition(key, 3), (key, partition)
    assert all(received[f"placed-{i}"][1] == i % 3 for i in range(30))
    assert {received[f"loose-{i}"][1] for i in range(100)} == {0, 1, 2}


def test_the_tail_reader_unpacks_batches_of_every_codec_the_official_client_writes(archived):
    """The official client produces batches compressed with LZ4, ZSTD, SNAPPY and ZLIB;
    the tail reader (spark/tail.py, through client/) returns one row per message with
    its payload, key and batch index, as the archive would."""
    from spark.tail import TailReader

    cluster, _topic, _sent = archived
    topic = f"persistent://public/default/spark-codecs-{uuid.uuid4().hex[:8]}"
    holder = cluster.client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
    expected: dict = {}
    try:
        for codec in ("LZ4", "ZSTD", "SNAPPY", "ZLib"):
            producer = cluster.client.create_producer(
                topic, compression_type=getattr(pulsar.CompressionType, codec), batching_enabled=True,
                batching_max_messages=50, batching_max_publish_delay_ms=50)
            done = []
            for i in range(100):
                payload = f"{codec}-{i}-".encode() + bytes(i % 7) * 40      # compressible
                producer.send_async(payload, lambda result, message_id, payload=payload, key=f"{codec}-{i % 3}":
                                    done.append((result, message_id, payload, key)), partition_key=f"{codec}-{i % 3}")
            producer.flush()
            producer.close()
            assert len(done) == 100 and all(result == pulsar.Result.Ok for result, *_ in done)
            for _result, message_id, payload, key in done:
                expected[(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())] = (payload, key)
        end = max(expected)[:2]
        rows = {}
        for batch in TailReader(cluster.brokers[0].service_url, topic, None, end, 60_000).batches():
            for row in batch.to_pylist():
                rows[(row["ledger_id"], row["entry_id"], row["batch_index"])] = (row["payload"], row["key"])
        assert rows == expected
        assert any(index > 0 for _ledger, _entry, index in rows), "the producers did not batch"
    finally:
        holder.close()
