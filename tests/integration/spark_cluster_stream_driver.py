"""A streaming query's driver on a Spark standalone cluster, as its own process (a test
kills it with SIGKILL and starts it again on the same checkpoint): reads a topic with
the ``magnetar`` source into a Parquet file sink.

    python spark_cluster_stream_driver.py CONFIG_JSON

CONFIG_JSON: master_url, admin_url, service_url, topic, sink, checkpoint, metrics_dir,
per_trigger (maxMessagesPerTrigger), executors (how many to wait for before the query
starts), and mode: "run" (a micro-batch every second until killed) or "available_now"
(Trigger.AvailableNow: what the topic holds when the query starts, then exit 0).
Prints "query started" once the query runs.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

QUERY_TIMEOUT_S = 600


def main() -> None:
    config = json.loads(sys.argv[1])
    from spark.session import local_session

    extra = {"spark.master": config["master_url"], "spark.executor.memory": "512m", "spark.executor.cores": "1",
             "spark.cores.max": "2", "spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "2",
             "spark.default.parallelism": "2", "spark.locality.wait": "0s"}
    spark = local_session("magnetar-cluster-stream-test", extra)
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    started = time.monotonic()
    while len(tracker.getExecutorInfos()) < config["executors"] + 1:       # the driver counts itself
        assert time.monotonic() - started < 240, "executors did not register"
        time.sleep(0.5)

    stream = (spark.readStream.format("magnetar").option("adminUrl", config["admin_url"])
              .option("serviceUrl", config["service_url"]).option("topic", config["topic"])
              .option("maxMessagesPerTrigger", str(config["per_trigger"]))
              .option("metricsDir", config["metrics_dir"]).load())
    writer = (stream.select("ledger_id", "entry_id", "batch_index", "key", "payload").writeStream
              .format("parquet").option("path", config["sink"]).option("checkpointLocation", config["checkpoint"]))
    if config["mode"] == "available_now":
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime="1 second").start()
    print("query started", flush=True)
    if config["mode"] == "available_now":
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
        assert finished, f"the AvailableNow query did not finish in {QUERY_TIMEOUT_S} s"
        assert query.exception() is None, query.exception()
        print(json.dumps({"batches": query.lastProgress["batchId"] if query.lastProgress else None}), flush=True)
        spark.stop()
    else:
        query.awaitTermination()          # until killed; a failed query exits non-zero


if __name__ == "__main__":
    main()
