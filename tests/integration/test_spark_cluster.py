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
- two queries with different pushed filters run at once each get exactly their own
  rows, some tasks pruned with their filters (the plan's claim is in the metadata
  store, spark/plan_guard.py: nothing on any worker's disk), and an unfiltered count
  reusing a filtered query's DataFrame afterwards counts every row. (Two concurrent
  queries on one DataFrame share pyspark's cached plan: docs/spark.md, "Not done yet".)

Marked ``spark_full``: three Spark JVMs plus a driver and two executors take minutes to
start on a loaded 2-core machine; ``make test-spark-cluster`` runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pulsar
import pytest

from metadata import keys, open_store
from spark import metrics
from tests.cluster import archive_at_once_policy, archiving_broker_args, http_json, wait_until
from tests.integration.test_archive import produce
from tests.object_store import ObjectStore
from tests.spark_standalone import SparkStandalone

# Three Spark JVMs, a driver and two executors start on a loaded 2-core machine.
pytestmark = [pytest.mark.spark_full, pytest.mark.timeout(900)]

LEDGER_ENTRIES_MAX = 40
DRIVER = os.path.join(os.path.dirname(__file__), "spark_cluster_driver.py")


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
    assert result["after_filters_count"] == len(sent)
    assert any(r.get("filtered") for r in tasks), "no task pruned with its query's filters"
    # The claims are in the metadata store, not on any machine.
    store_client = open_store(cluster.metadata_url)
    try:
        assert await store_client.get_prefix(keys.SPARK_PLANS, keys_only=True)
    finally:
        await store_client.close()
