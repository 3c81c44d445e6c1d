"""The Spark driver of tests/integration/test_spark_cluster.py, run as its own process
(a process has one SparkContext; the test process may hold a local one): a
SparkSession on the standalone master, the ``magnetar`` source registered, reads of
one topic printed as one JSON line.

    python spark_cluster_driver.py CONFIG_JSON

CONFIG_JSON: master_url, admin_url, service_url, topic, endpoint_url, metrics_dir,
keys (two keys the concurrent filtered queries ask for).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def main() -> None:
    config = json.loads(sys.argv[1])
    from spark.session import SETTINGS, local_session

    extra = {"spark.master": config["master_url"], "spark.executor.memory": "512m", "spark.executor.cores": "1",
             "spark.cores.max": "2", "spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "4",
             "spark.default.parallelism": "4", "spark.locality.wait": "0s"}
    assert "spark.master" in SETTINGS
    spark = local_session("magnetar-cluster-test", extra)
    context = spark.sparkContext
    started = time.monotonic()
    # Both executors up before the first job, so its tasks can spread.
    while len(context._jsc.sc().statusTracker().getExecutorInfos()) < 3:      # the driver's own counts
        assert time.monotonic() - started < 240, "executors did not register"
        time.sleep(0.5)
    executors_s = time.monotonic() - started

    def reader():
        return (spark.read.format("magnetar").option("adminUrl", config["admin_url"])
                .option("serviceUrl", config["service_url"]).option("topic", config["topic"])
                .option("archiveEndpointUrl", config["endpoint_url"]).option("metricsDir", config["metrics_dir"])
                .load())

    df = reader()
    t0 = time.monotonic()
    rows = df.select("ledger_id", "entry_id", "batch_index", "key").collect()
    whole_s = time.monotonic() - t0
    ids = [[r.ledger_id, r.entry_id, r.batch_index] for r in rows]

    # Two queries with different filters and an unfiltered count at once, all on the
    # DataFrame just read (pyspark shares its planned read between them: the reader
    # must not prune with one query's filters for another, spark/reader.py); then the
    # trap in sequence: a filtered query, and an unfiltered one reusing its DataFrame.
    answers: dict[str, list] = {}
    counts: list[int] = []
    errors: list = []

    def filtered(key: str) -> None:
        try:
            found = df.filter(df.key == key).select("ledger_id", "entry_id", "batch_index", "key").collect()
            answers[key] = [[r.ledger_id, r.entry_id, r.batch_index, r.key] for r in found]
        except Exception as error:         # noqa: BLE001 - reported to the test
            errors.append(repr(error))

    def count() -> None:
        try:
            counts.append(df.count())
        except Exception as error:         # noqa: BLE001 - reported to the test
            errors.append(repr(error))

    threads = [threading.Thread(target=filtered, args=(key,)) for key in config["keys"]]
    threads.append(threading.Thread(target=count))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    trap = reader()
    trap_rows = trap.filter(trap.key == config["keys"][0]).count()
    after_filters_count = trap.count()
    print(json.dumps({"ids": ids, "whole_s": round(whole_s, 1), "executors_s": round(executors_s, 1),
                      "filtered": answers, "concurrent_counts": counts, "errors": errors, "after_filters_count": after_filters_count,
                      "trap_rows": trap_rows,
                      "executors": len(context._jsc.sc().statusTracker().getExecutorInfos()) - 1}))
    spark.stop()


if __name__ == "__main__":
    main()
