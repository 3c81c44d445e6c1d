"""A streaming query over the ``magnetar`` source, killed with SIGKILL mid-run and
restarted from its checkpoint: its sink holds every message exactly once. In a module of
its own (a cluster of its own: etcd, a bookie, an archiving broker), so that `make test`'s
workers can run it beside the batch tests of test_spark.py."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid

import pulsar
import pytest

from tests.cluster import Cluster, wait_until
from tests.integration.spark_helpers import BROKER_ARGS, POLICY, http, produce


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


def committed_sink_ids(sink: str) -> list[tuple[int, int, int]]:
    """(ledger_id, entry_id, batch_index) of every row in the file sink's committed
    files, as Spark reads the sink: the files its ``_spark_metadata`` log adds (from
    the latest compacted log file on), not the part files a killed batch left behind.
    Read with pyarrow: no JVM in the test process, none polling while the stream runs."""
    import json
    import urllib.parse

    import pyarrow.parquet as pq

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
