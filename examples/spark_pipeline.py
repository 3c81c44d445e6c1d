"""A pipeline you can run (`make pipeline`): Magnetar and Spark end to end on this
machine.

1. starts etcd, two bookies and a broker that archives every closed ledger (fresh
   directory under the temp dir, removed at the end);
2. produces ``--events`` click events (key: the user, event time spread over ten
   minutes, a JSON payload) with the official client, and waits until they are archived;
3. batch: Spark reads the topic (archive files and tail) and counts clicks per user per
   minute of event time;
4. streaming: a streaming query over the topic (from its first message: history, then
   the live tail) counts each micro-batch's clicks per user and writes the counts to the
   topic ``click-counts`` (foreachBatch + the batch writer: at-least-once), while
   ``--live-events`` more clicks are produced; the counts are read back with the
   official client until they add up to every click;
5. prints both results.

    python examples/spark_pipeline.py --events 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import pulsar  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from archive_bench import http  # noqa: E402
from harness import bench_cluster  # noqa: E402
from spark.session import local_session  # noqa: E402

USERS = 20
EVENT_SPAN_MS = 10 * 60 * 1000


def produce_clicks(client, topic: str, count: int, base_ms: int, first: int = 0) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True)
    for i in range(first, first + count):
        user = f"user-{i % USERS}"
        payload = json.dumps({"user": user, "page": f"/page/{i % 7}", "n": i}).encode()
        producer.send_async(payload, None, partition_key=user, properties={"page": f"/page/{i % 7}"},
                            event_timestamp=base_ms + (i * EVENT_SPAN_MS) // max(count, 1))
    producer.flush()
    producer.close()


async def run(args: argparse.Namespace) -> None:
    async with bench_cluster("magnetar-pipeline-", directory=None, keep_data=False) as cluster:
        await cluster.start_bookies(2)
        [broker] = await cluster.start_brokers(1, extra_args=[
            "--ensemble-size", "2", "--write-quorum", "2", "--ack-quorum", "2", "--ledger-max-entries", "50",
            "--archive-url", os.path.join(cluster.base_dir, "archive"), "--archive-check-interval-s", "0.5"])
        admin = f"{broker.web_service_url}/admin/v2"
        http("POST", f"{admin}/namespaces/public/default/offloadPolicies",
             {"managedLedgerOffloadThresholdInBytes": 0})
        topic, counts_topic = "persistent://public/default/clicks", "persistent://public/default/click-counts"
        topic_path = f"{admin}/persistent/public/default/{urllib.parse.quote('clicks')}"
        client = pulsar.Client(broker.service_url)
        try:
            holder = client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
            counts_consumer = client.subscribe(counts_topic, "pipeline",
                                               initial_position=pulsar.InitialPosition.Earliest)
            base_ms = int(time.time() * 1000) - EVENT_SPAN_MS
            produce_clicks(client, topic, args.events, base_ms)
            print(f"produced {args.events} click events", flush=True)
            http("PUT", f"{topic_path}/unload")
            holder.close()
            holder = client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest)
            deadline = time.monotonic() + 300
            while sum(f["row_count"] for l in http("GET", f"{topic_path}/archive")["ledgers"]
                      for f in l["files"]) < args.events:
                if time.monotonic() > deadline:
                    raise RuntimeError("archiving did not finish in 300 s")
                await asyncio.sleep(0.5)
            print("archived", flush=True)

            spark = local_session("magnetar-pipeline")
            try:
                clicks = (spark.read.format("magnetar").option("adminUrl", broker.web_service_url)
                          .option("serviceUrl", broker.service_url).option("includeUnarchived", "true")
                          .option("topic", topic).load())
                per_minute = (clicks.groupBy("key", F.date_trunc("minute", "event_time").alias("minute"))
                              .count().orderBy("minute", "key"))
                print("batch: clicks per user per minute of event time (first 20 rows)", flush=True)
                per_minute.show(20, truncate=False)
                print(f"batch: {clicks.count()} clicks, {per_minute.count()} (user, minute) groups", flush=True)

                def write_counts(batch_df, batch_id: int) -> None:
                    counts = batch_df.groupBy("key").count()
                    out = counts.selectExpr(
                        "key", f"cast(to_json(named_struct('user', key, 'clicks', count, 'batch', {batch_id}))"
                               " as binary) as payload")
                    (out.write.format("magnetar").mode("append").option("serviceUrl", broker.service_url)
                        .option("topic", counts_topic).save())

                stream = (spark.readStream.format("magnetar").option("adminUrl", broker.web_service_url)
                          .option("serviceUrl", broker.service_url).option("topic", topic)
                          .option("maxMessagesPerTrigger", "10000").load())
                query = (stream.writeStream.foreachBatch(write_counts)
                         .option("checkpointLocation", os.path.join(cluster.base_dir, "pipeline-checkpoint"))
                         .trigger(processingTime="1 second").start())
                produce_clicks(client, topic, args.live_events, int(time.time() * 1000), first=args.events)
                print(f"produced {args.live_events} live click events", flush=True)
                totals: dict[str, int] = {}
                deadline = time.monotonic() + 300
                expected = args.events + args.live_events
                while sum(totals.values()) < expected and time.monotonic() < deadline:
                    if query.exception() is not None:
                        raise RuntimeError(f"the streaming query failed: {query.exception()}")
                    try:
                        message = counts_consumer.receive(timeout_millis=2000)
                    except pulsar.Timeout:
                        continue
                    record = json.loads(message.data())
                    totals[record["user"]] = totals.get(record["user"], 0) + record["clicks"]
                    counts_consumer.acknowledge(message)
                # Let the micro-batch under way finish before stopping: a stop interrupts
                # it (its write aborts; Spark logs the interrupted stream thread).
                query.processAllAvailable()
                query.stop()
                print("streaming: clicks per user written to click-counts and read back:", flush=True)
                for user in sorted(totals):
                    print(f"  {user}: {totals[user]}")
                print(f"streaming: {sum(totals.values())} of {expected} clicks counted", flush=True)
                if sum(totals.values()) != expected:
                    raise RuntimeError(f"the streaming counts add up to {sum(totals.values())}, not {expected}")
            finally:
                spark.stop()
            holder.close()
            counts_consumer.close()
        finally:
            client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--live-events", type=int, default=2_000)
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
