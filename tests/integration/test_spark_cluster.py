"""The ``magnetar`` Spark source on a Spark standalone cluster (a master and two
workers, pyspark's own ``spark-class``, tests/spark_standalone.py) reading a topic whose
archive is on a real S3-compatible store (SeaweedFS, tests/object_store.py) and whose
tail is on the brokers: the driver is its own process on the master
(tests/integration/spark_cluster_driver.py).

Proves:
- a batch read returns every message of the topic exactly once, archived ledgers from
  the object store (endpoint from the ``archiveEndpointUrl`` option, credentials from
  the workers' environment only) and the rest through a broker;
- its tasks ran in executors on both workers (each task records its working
  directory, which is its executor's work directory on its worker);
- two queries with different filters and an unfiltered count, at once on one
  DataFrame (pyspark shares its planned read between them), each get exactly their own
  rows, and an unfiltered count reusing a filtered query's DataFrame afterwards counts
  every row;
- a streaming query (tests/integration/spark_cluster_stream_driver.py) goes on when a
  worker is killed with SIGKILL under it (its later tasks on the other worker), and
  after its driver is killed with SIGKILL and started again on the checkpoint its
  Parquet sink holds every message exactly once.

Marked ``spark_full``: three Spark JVMs plus a driver and two executors take minutes to
start on a loaded 2-core machine; ``make test-spark-cluster`` runs the module.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pulsar
import pytest

from spark import metrics
from tests.cluster import archive_at_once_policy, archiving_broker_args, http_json, wait_until
from tests.integration.spark_helpers import committed_sink_ids
from tests.integration.spark_helpers import produce as stream_produce
from tests.integration.test_archive import produce
from tests.object_store import ObjectStore
from tests.spark_standalone import SparkStandalone

# Three Spark JVMs, a driver and two executors start on a loaded 2-core machine.
pytestmark = [pytest.mark.spark_full, pytest.mark.timeout(900)]

LEDGER_ENTRIES_MAX = 40
DRIVER = os.path.join(os.path.dirname(__file__), "spark_cluster_driver.py")
STREAM_DRIVER = os.path.join(os.path.dirname(__file__), "spark_cluster_stream_driver.py")


@pytest.fixture
def object_store(tmp_path):
    store = ObjectStore(str(tmp_path / "object-store"))
    try:
        store.start()
        yield store
    finally:
        store.stop()


async def test_a_spark_cluster_reads_the_s3_archive_and_the_tail_on_both_workers(cluster, object_store, tmp_path):
    store = object_store
    bucket = store.make_bucket(f"spark-{uuid.uuid4().hex[:8]}")
    await cluster.start_bookies(3)
    broker = cluster.broker("broker-0", extra_args=[*archiving_broker_args(LEDGER_ENTRIES_MAX),
                                                     "--archive-url", f"s3://{bucket}/archive"])
    broker.env = store.client_env()
    await broker.start()
    admin = f"{broker.web_service_url}/admin/v2"
    local = f"spark-cluster-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://public/default/{local}"
    await asyncio.to_thread(http_json, "POST", f"{admin}/namespaces/public/default/offloadPolicies",
                            archive_at_once_policy(100))

    def produce_all() -> tuple[dict, dict]:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest).close()
            archived = produce(client, topic, 400, batching=False, base=0)
            http_json("PUT", f"{admin}/persistent/public/default/{local}/unload")
            http_json("GET", f"{admin}/persistent/public/default/{local}/stats")     # load it again
            wanted = {key[0] for key in archived}

            def all_archived() -> bool:
                manifest = http_json("GET", f"{admin}/persistent/public/default/{local}/archive")
                return wanted <= {l["ledger_id"] for l in manifest["ledgers"] if l["bookie_deleted_ms"] > 0}

            wait_until(all_archived, 120, "the first 400 messages archived on S3, bookie copies deleted")
            tail = produce(client, topic, 30, batching=False, base=400)   # the open ledger: the tail
            return archived, tail
        finally:
            client.close()

    archived, tail = await asyncio.to_thread(produce_all)
    sent = {**archived, **tail}
    key_of = {k: v[1] for k, v in sent.items()}
    keys_asked = ["key-3", "key-11"]

    worker_env = {name: value for name, value in store.client_env().items() if name.startswith("AWS_")}
    base_env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")
                and name != "MAGNETAR_ARCHIVE_ENDPOINT_URL"}
    spark = SparkStandalone(str(tmp_path / "spark"), workers=2, worker_env=worker_env)
    metrics_dir = str(tmp_path / "metrics")
    try:
        await asyncio.to_thread(spark.start)
        config = {"master_url": spark.master_url, "admin_url": broker.web_service_url,
                  "service_url": broker.service_url, "topic": topic, "endpoint_url": store.endpoint_url,
                  "metrics_dir": metrics_dir, "keys": keys_asked}
        # The driver has no object store credentials: only the executors read files.
        driver = await asyncio.to_thread(subprocess.run, [sys.executable, DRIVER, json.dumps(config)],
                                         env={**base_env, "SPARK_LOCAL_IP": "127.0.0.1"}, capture_output=True,
                                         text=True, timeout=900)
        assert driver.returncode == 0, driver.stderr[-6000:]
        result = json.loads(driver.stdout.strip().splitlines()[-1])
    finally:
        await asyncio.to_thread(spark.stop)
    print(f"spark cluster: executors up in {result['executors_s']} s, whole-topic read in {result['whole_s']} s")

    ids = [tuple(i) for i in result["ids"]]
    assert len(ids) == len(set(ids)) == len(sent), (len(ids), len(set(ids)), len(sent))
    assert set(ids) == set(sent)
    assert result["executors"] == 2 and not result["errors"], result["errors"]

    tasks = metrics.collect(metrics_dir, "task")
    tails = metrics.collect(metrics_dir, "tail")
    assert tasks and tails
    ran_in = {os.path.realpath(r["cwd"]) for r in tasks + tails}
    workers_used = {d for d in map(os.path.realpath, spark.work_dirs) if any(c.startswith(d + os.sep) for c in ran_in)}
    assert len(workers_used) == 2, f"tasks ran only in {ran_in}"

    for key in keys_asked:
        expected = {k for k, v in key_of.items() if v == key}
        got = [tuple(row[:3]) for row in result["filtered"][key]]
        assert all(row[3] == key for row in result["filtered"][key]), key
        assert sorted(got) == sorted(expected), key
    assert result["trap_rows"] == len([k for k, v in key_of.items() if v == keys_asked[0]])
    assert result["concurrent_counts"] == [len(sent)]
    assert result["after_filters_count"] == len(sent)


def _commits(checkpoint: str) -> list[int]:
    """The micro-batches the query committed (its checkpoint's commits log)."""
    try:
        return sorted(int(name) for name in os.listdir(os.path.join(checkpoint, "commits")) if name.isdigit())
    except FileNotFoundError:
        return []


@pytest.mark.timeout(1500)
async def test_a_streaming_query_on_the_cluster_survives_a_worker_kill_and_a_driver_restart_exactly_once(
        cluster, tmp_path):
    """A streaming query (driver: its own process; 250 messages per micro-batch) copies
    a topic into a Parquet sink while messages keep arriving. A worker is killed with
    SIGKILL (its process group: the worker, its executor and that executor's Python
    workers) after two committed micro-batches: the query goes on, its later tasks on the
    other worker. Then the driver is killed with SIGKILL and started again on the same
    checkpoint (Trigger.AvailableNow, once the producer is done): the sink holds every
    produced message exactly once."""
    await cluster.start_bookies(1)
    await cluster.start_brokers(1, extra_args=[
        *archiving_broker_args(LEDGER_ENTRIES_MAX), "--archive-url", str(tmp_path / "archive"),
        "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"])
    broker = cluster.brokers[0]
    admin = f"{broker.web_service_url}/admin/v2"
    await asyncio.to_thread(http_json, "POST", f"{admin}/namespaces/public/default/offloadPolicies",
                            archive_at_once_policy(100))
    topic = f"persistent://public/default/spark-cluster-stream-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    sent: dict = {}
    stop_producing = threading.Event()

    def produce_slowly() -> None:
        # 3,000 messages in chunks of 100, one chunk every two seconds from the first
        # commit on: arriving across the worker's kill.
        for chunk in range(30):
            if stop_producing.is_set():
                return
            sent.update(stream_produce(client, topic, 100, base=1_000 + chunk * 100))
            time.sleep(2.0)

    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    metrics_dir = str(tmp_path / "metrics")
    spark = SparkStandalone(str(tmp_path / "spark"), workers=2)
    base_env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    config = {"admin_url": broker.web_service_url, "service_url": broker.service_url, "topic": topic,
              "sink": sink, "checkpoint": checkpoint, "metrics_dir": metrics_dir, "per_trigger": 250}
    drivers: list[subprocess.Popen] = []
    producing = threading.Thread(target=produce_slowly)
    log_path = str(tmp_path / "stream-driver.log")

    def driver_log() -> str:
        with open(log_path, errors="replace") as handle:
            return handle.read()[-6000:]

    def start_driver(**overrides) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            process = subprocess.Popen([sys.executable, STREAM_DRIVER, json.dumps({**config, **overrides})],
                                       stdout=log, stderr=subprocess.STDOUT, env=base_env, start_new_session=True)
        drivers.append(process)
        return process

    def wait_for_commits(count: int, driver: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + 420
        while len(_commits(checkpoint)) < count:
            assert driver.poll() is None, f"the driver exited ({driver.returncode}) before {what}:\n{driver_log()}"
            assert time.monotonic() < deadline, f"{what}: only {_commits(checkpoint)} committed\n{driver_log()}"
            time.sleep(1)

    try:
        # History first: archived ledgers the query reads from files, then the tail.
        sent.update(await asyncio.to_thread(stream_produce, client, topic, 600, base=0))
        await asyncio.to_thread(spark.start)
        config["master_url"] = spark.master_url
        first = start_driver(mode="run", executors=2)
        await asyncio.to_thread(wait_for_commits, 1, first, "the first micro-batch")
        producing.start()
        await asyncio.to_thread(wait_for_commits, 2, first, "two micro-batches")

        # The worker whose executor ran the latest task is the one killed.
        newest = max((os.path.join(metrics_dir, n) for n in os.listdir(metrics_dir) if n.endswith(".json")),
                     key=os.path.getmtime)
        with open(newest) as handle:
            newest_cwd = os.path.realpath(json.load(handle)["cwd"])
        work_dirs = [os.path.realpath(d) for d in spark.work_dirs]
        victim = next(i for i, d in enumerate(work_dirs) if newest_cwd.startswith(d + os.sep))
        spark.kill_worker(victim)                              # SIGKILL: worker, executor, Python workers
        killed_at = len(_commits(checkpoint))
        before_kill = set(os.listdir(metrics_dir))
        await asyncio.to_thread(wait_for_commits, killed_at + 3, first, "three micro-batches after the worker kill")
        assert first.poll() is None, driver_log()
        after = []
        for name in sorted(set(os.listdir(metrics_dir)) - before_kill):
            if name.endswith(".json"):                       # a task's record (".tmp" while written)
                with open(os.path.join(metrics_dir, name)) as handle:
                    after.append(json.load(handle))
        assert after, "no task recorded after the worker kill"
        survivor = work_dirs[1 - victim]
        assert all(os.path.realpath(r["cwd"]).startswith(survivor + os.sep) for r in after), \
            [r["cwd"] for r in after]

        os.killpg(first.pid, signal.SIGKILL)                  # the driver, mid-run
        first.wait(timeout=30)
        committed_by_first = _commits(checkpoint)
        await asyncio.to_thread(producing.join, 300)
        assert not producing.is_alive() and len(sent) == 3_600
        second = start_driver(mode="available_now", executors=1)
        await asyncio.to_thread(second.wait, 900)
        assert second.returncode == 0, driver_log()
    finally:
        stop_producing.set()
        for driver in drivers:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=30)
        await asyncio.to_thread(spark.stop)
        if producing.is_alive():
            producing.join(timeout=120)
        client.close()

    committed = _commits(checkpoint)
    assert committed[-1] > committed_by_first[-1], "the restarted driver committed nothing"
    ids = committed_sink_ids(sink)
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} messages in the sink twice"
    assert set(ids) == set(sent), (len(set(ids)), len(sent), len(set(sent) - set(ids)))
    print(f"spark cluster stream: {len(sent)} messages, micro-batches {committed[0]}..{committed[-1]}, "
          f"worker killed after {killed_at}, driver killed after {len(committed_by_first)}")
