"""A streaming query in its own process (so a test can kill it with SIGKILL): reads a
topic with the ``magnetar`` source and appends every row to a Parquet file sink, with a
checkpoint. Arguments: admin URL, service URL, topic, sink dir, checkpoint dir, max
messages per trigger. Runs until killed."""

from __future__ import annotations

import sys

from spark.session import SHORT_RUN_SETTINGS, local_session


def main() -> None:
    admin_url, service_url, topic, sink, checkpoint, per_trigger = sys.argv[1:7]
    spark = local_session("magnetar-stream-worker", SHORT_RUN_SETTINGS)
    stream = (spark.readStream.format("magnetar").option("adminUrl", admin_url).option("serviceUrl", service_url)
              .option("topic", topic).option("maxMessagesPerTrigger", per_trigger).load())
    query = (stream.select("ledger_id", "entry_id", "batch_index", "key", "payload").writeStream
             .format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    print("stream started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
