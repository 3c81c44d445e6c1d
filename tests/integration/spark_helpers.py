"""What the Spark integration tests share: the archiving broker's settings, the
namespace offload policy that archives every closed ledger at once, an HTTP helper and a
batched producer that records each message's id, and the ids in a Parquet file sink's
committed files."""

from __future__ import annotations

import json
import os
import threading
import urllib.parse

import pulsar
import pyarrow.parquet as pq

from tests.cluster import archive_at_once_policy, archiving_broker_args, http_json

MESSAGES = int(os.environ.get("SPARK_TEST_MESSAGES", "10000"))
LEDGER_ENTRIES_MAX = 20
BROKER_ARGS = archiving_broker_args(LEDGER_ENTRIES_MAX)
POLICY = archive_at_once_policy(500)
http = http_json


def produce(client, topic: str, count: int, *, base: int = 0, batching: bool = True) -> dict:
    """Sends ``count`` batched messages; returns {(ledger, entry, batch index): (payload, key, properties, event ms)}."""
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_messages=25,
                                      batching_max_publish_delay_ms=5, block_if_queue_full=True,
                                      max_pending_messages=5000)
    sent: dict = {}
    errors: list = []
    done = threading.Semaphore(0)
    lock = threading.Lock()

    def callback_for(record):
        def callback(result, message_id):
            with lock:
                if result != pulsar.Result.Ok:
                    errors.append(result)
                else:
                    sent[(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())] = record
            done.release()
        return callback

    for i in range(count):
        n = base + i
        payload = n.to_bytes(8, "big") + bytes([n % 251]) * (n % 100)
        key = f"key-{n % 37}"
        properties = {"n": str(n)}
        event_ms = 10**12 + n
        producer.send_async(payload, callback_for((payload, key, properties, event_ms)), properties=properties,
                            partition_key=key, event_timestamp=event_ms)
    producer.flush()
    for _ in range(count):
        assert done.acquire(timeout=120)
    producer.close()
    assert not errors, errors[:5]
    assert len(sent) == count
    return sent


def committed_sink_ids(sink: str) -> list[tuple[int, int, int]]:
    """(ledger_id, entry_id, batch_index) of every row in the file sink's committed
    files, as Spark reads the sink: the files its ``_spark_metadata`` log adds (from
    the latest compacted log file on), not the part files a killed batch left behind.
    Read with pyarrow: no JVM in the test process, none polling while the stream runs."""
    log_dir = os.path.join(sink, "_spark_metadata")
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    batches = sorted((int(n.split(".")[0]), n) for n in names if n.split(".")[0].isdigit())
    compacted = [i for i, (_, n) in enumerate(batches) if n.endswith(".compact")]
    files: set[str] = set()
    for _, name in batches[compacted[-1] if compacted else 0:]:
        with open(os.path.join(log_dir, name)) as handle:
            lines = handle.read().splitlines()
        for line in lines[1:]:                               # the first line is the log version
            entry = json.loads(line)
            path = urllib.parse.unquote(urllib.parse.urlparse(entry["path"]).path)    # file:/… or file:///…
            if entry.get("action", "add") == "add":
                files.add(path)
            else:
                files.discard(path)
    ids: list[tuple[int, int, int]] = []
    for path in sorted(files):
        table = pq.read_table(path, columns=["ledger_id", "entry_id", "batch_index"])
        ids.extend(zip(*(table.column(c).to_pylist() for c in ("ledger_id", "entry_id", "batch_index"))))
    return ids
