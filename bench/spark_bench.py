"""The Spark data source's scan speed (docs/spark.md), against a baseline of the same run:

A real cluster (etcd, 2 bookies, 1 broker archiving every closed ledger) takes
``--messages`` messages of 1 KiB (bench/raw_producer.py, batches of
``--batch-messages``); once every closed ledger is archived, the same rows are written
once more as one plain Parquet file (pyarrow, snappy: Spark's default) from the
archive's own record batches. Then the same query runs ``--runs`` times over each, in
one local SparkSession (spark/session.py's settings):

    SELECT count(*), sum(length(payload)) FROM <source>

(it must read every payload: a bare count() over Parquet reads only the footers). The
result is rows/s of the median run, and the ratio archive / Parquet. Aim: the archive
scan at >= 50% of Parquet's rows/s.

    python bench/spark_bench.py --out bench/results/spark.json

Streaming: the same topic read by a streaming query (one trigger of everything
available, through the broker; a no-op sink), in messages/s end to end (query start to
its end, planning included), as a ratio to the batch archive scan.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.parse

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from archive.reader import ArchiveFile  # noqa: E402
from archive_bench import http, run_process  # noqa: E402
from harness import bench_cluster  # noqa: E402
from spark.schema import ARROW_SCHEMA, to_spark_batch  # noqa: E402
from spark.session import local_session  # noqa: E402

MESSAGE_BYTES = 1024
AIM_RATIO = 0.5
ARCHIVE_TIMEOUT_S = 600.0
QUERY = "count(*) AS rows, sum(length(payload)) AS payload_bytes"


def timed_query(df) -> tuple[float, int]:
    started = time.perf_counter()
    [row] = df.selectExpr(*QUERY.split(", ")).collect()
    return time.perf_counter() - started, row["rows"]


async def prepare(args: argparse.Namespace, cluster) -> tuple[str, str, int, list[dict]]:
    archive_dir = os.path.join(cluster.base_dir, "archive")
    await cluster.start_bookies(2)
    [broker] = await cluster.start_brokers(1, extra_args=[
        "--ensemble-size", "2", "--write-quorum", "2", "--ack-quorum", "2",
        "--ledger-max-entries", str(args.ledger_entries), "--archive-url", archive_dir,
        "--archive-check-interval-s", "0.5"])
    admin = f"{broker.web_service_url}/admin/v2"
    http("POST", f"{admin}/namespaces/public/default/offloadPolicies",
         {"managedLedgerOffloadThresholdInBytes": 0, "archiveBatchRows": args.batch_rows})
    local = f"spark-bench-{int(time.time())}"
    topic = f"persistent://public/default/{local}"
    topic_path = f"{admin}/persistent/public/default/{urllib.parse.quote(local)}"
    http("PUT", topic_path)
    http("PUT", f"{topic_path}/subscription/holder", {"ledgerId": -1, "entryId": -1})
    messages = -(-args.messages // args.batch_messages) * args.batch_messages
    produced = await run_process([
        sys.executable, os.path.join(BENCH_DIR, "raw_producer.py"), topic, "--service-url", broker.service_url,
        "--messages", str(messages), "--batch-messages", str(args.batch_messages),
        "--message-bytes", str(MESSAGE_BYTES), "--window-entries", "64"])
    print(json.dumps({"part": "produce", **{k: produced.get(k) for k in ("messages", "seconds", "msgs_per_s")}}),
          flush=True)
    http("PUT", f"{topic_path}/unload")
    http("GET", f"{topic_path}/stats")                    # loads the topic again: its owner archives it
    deadline = time.monotonic() + ARCHIVE_TIMEOUT_S
    while True:
        manifest = http("GET", f"{topic_path}/archive")
        rows = sum(f["row_count"] for ledger in manifest["ledgers"] for f in ledger["files"])
        if rows >= messages:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"archiving did not finish: {rows} of {messages} rows")
        await asyncio.sleep(0.5)
    files = [f for ledger in manifest["ledgers"] for f in ledger["files"]]
    return broker.web_service_url, topic, messages, files


def broker_service_url(cluster) -> str:
    return cluster.brokers[0].service_url


def timed_stream(spark, admin_url: str, service_url: str, topic: str) -> float:
    """Seconds for a streaming query to read everything available once (no-op sink)."""
    stream = (spark.readStream.format("magnetar").option("adminUrl", admin_url).option("serviceUrl", service_url)
              .option("topic", topic).load())
    started = time.perf_counter()
    query = stream.writeStream.format("noop").trigger(once=True).start()
    query.awaitTermination()
    return time.perf_counter() - started


def write_parquet(files: list[dict], path: str) -> int:
    """The archive's rows as one Parquet file of the Spark schema (row groups of the
    archive's record batches)."""
    rows = 0
    with pq.ParquetWriter(path, ARROW_SCHEMA) as writer:
        for record in files:
            with ArchiveFile.open(record["url"], size_bytes=record["size_bytes"]) as archive_file:
                for _index, batch in archive_file.iter_batches():
                    spark_batch = to_spark_batch(batch)
                    writer.write_table(pa.Table.from_batches([spark_batch]))
                    rows += spark_batch.num_rows
    return rows


async def main_async(args: argparse.Namespace) -> dict:
    async with bench_cluster("magnetar-spark-bench-", directory=args.dir, keep_data=args.keep_data) as cluster:
        admin_url, topic, messages, files = await prepare(args, cluster)
        parquet_path = os.path.join(cluster.base_dir, "same-rows.parquet")
        started = time.perf_counter()
        parquet_rows = write_parquet(files, parquet_path)
        parquet_write_s = time.perf_counter() - started
        assert parquet_rows == messages, (parquet_rows, messages)
        spark = local_session("magnetar-spark-bench")
        try:
            archive_df = (spark.read.format("magnetar").option("adminUrl", admin_url).option("topic", topic)
                          .option("includeUnarchived", "false").load())   # the archive scan alone
            parquet_df = spark.read.parquet(parquet_path)
            timed_query(archive_df)                           # warm: Python workers, JIT
            timed_query(parquet_df)
            results: dict[str, list[float]] = {"archive": [], "parquet": []}
            for _ in range(args.runs):                        # interleaved: the machine's load hits both
                for name, df in (("archive", archive_df), ("parquet", parquet_df)):
                    seconds, rows = timed_query(df)
                    assert rows == messages, (name, rows, messages)
                    results[name].append(seconds)
                    print(json.dumps({"part": "scan", "source": name, "seconds": round(seconds, 3)}), flush=True)
            stream_seconds = None
            if args.stream:
                stream_seconds = timed_stream(spark, admin_url, broker_service_url(cluster), topic)
                print(json.dumps({"part": "stream", "seconds": round(stream_seconds, 3)}), flush=True)
        finally:
            spark.stop()
        medians = {name: statistics.median(values) for name, values in results.items()}
        rates = {name: messages / seconds for name, seconds in medians.items()}
        ratio = rates["archive"] / rates["parquet"]
        stream = {} if stream_seconds is None else {
            "stream_seconds": round(stream_seconds, 3), "stream_msgs_per_s": round(messages / stream_seconds),
            "stream_over_batch_archive_scan": round(messages / stream_seconds / rates["archive"], 3)}
        return {
            "messages": messages, "message_bytes": MESSAGE_BYTES, "archive_files": len(files),
            "archive_bytes": sum(f["size_bytes"] for f in files),
            "parquet_bytes": os.path.getsize(parquet_path), "parquet_write_seconds": round(parquet_write_s, 2),
            "query": f"SELECT {QUERY}", "runs": args.runs,
            "archive_seconds": [round(s, 3) for s in results["archive"]],
            "parquet_seconds": [round(s, 3) for s in results["parquet"]],
            "archive_rows_per_s": round(rates["archive"]), "parquet_rows_per_s": round(rates["parquet"]),
            "archive_over_parquet": round(ratio, 3), "aim": AIM_RATIO, "meets_aim": ratio >= AIM_RATIO,
            **stream,
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch-messages", type=int, default=100)
    parser.add_argument("--ledger-entries", type=int, default=200)
    parser.add_argument("--batch-rows", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="leave out the streaming read (the batch scans and their ratio only)")
    parser.add_argument("--dir", default=None, help="directory for the cluster's data (default: the temp dir)")
    parser.add_argument("--keep-data", action="store_true")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    results = asyncio.run(main_async(args))
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
