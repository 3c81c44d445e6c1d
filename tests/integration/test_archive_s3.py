"""The archive on a real S3-compatible object store (SeaweedFS, tests/object_store.py)
through s3fs, with real etcd, bookies, brokers and the official Pulsar client
(docs/archive.md, "Object stores").

Proves:
- with ``--archive-url s3://bucket/prefix``, the endpoint and the credentials in the
  brokers' environment (never a flag), closed ledgers are archived as objects, their
  bookie copies deleted, and an official consumer reads every message from the object
  store with the same ids and contents; the objects are exactly those the manifest
  names; ``magnetar archive verify`` reads and checks them on the store; the store
  refuses a wrong secret and no broker log line holds the secret;
- ``kill -9`` of the archiving broker at each step of a commit on the object store
  (before the rename, between the rename's copy and its delete, after the rename,
  before the manifest compare-and-swap, before the bookie delete) leaves the archive
  consistent: no record names a missing or partial object, objects no record names
  are collected, every ledger is archived exactly once, a consumer reads every
  message exactly once, and asking to archive again changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import time
import uuid

import pulsar
import pyarrow.ipc as ipc
import pytest

from archive.format import SCHEMA
from tests.cluster import archive_at_once_policy, archiving_broker_args, http_json, run_cli, wait_until
from tests.integration.test_archive import consume_all, ledgers_on_bookies, manifest_records, produce
from tests.object_store import ObjectStore

LEDGER_ENTRIES_MAX = 400
BROKER_ARGS = archiving_broker_args(LEDGER_ENTRIES_MAX)
POLICY = archive_at_once_policy(1000)
http = http_json


@pytest.fixture(scope="module")
def object_store(tmp_path_factory):
    store = ObjectStore(str(tmp_path_factory.mktemp("object-store")))
    try:
        store.start()
        yield store
    finally:
        store.stop()


def objects_of_topic(store: ObjectStore, bucket: str, prefix: str, local: str) -> set[str]:
    """Object names under the topic's directory, listed on the store now."""
    try:
        listed = store.filesystem().ls(f"{bucket}/{prefix}/persistent/public/default/{local}", refresh=True)
    except FileNotFoundError:
        return set()
    return {posixpath.basename(path) for path in listed}


async def start_broker(cluster, store: ObjectStore, name: str, location: str, *extra: str):
    broker = cluster.broker(name, extra_args=[*BROKER_ARGS, "--archive-url", location, *extra])
    broker.env = store.client_env()
    await broker.start()
    return broker


async def test_archive_on_s3_is_read_back_and_verified(cluster, object_store):
    store = object_store
    bucket = store.make_bucket(f"archive-{uuid.uuid4().hex[:8]}")
    prefix = "magnetar"
    await cluster.start_bookies(3)
    broker = await start_broker(cluster, store, "broker-s3", f"s3://{bucket}/{prefix}")
    local = f"on-s3-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://public/default/{local}"
    admin = f"{broker.web_service_url}/admin/v2"
    await asyncio.to_thread(http, "POST", f"{admin}/namespaces/public/default/offloadPolicies", POLICY)

    def produce_all() -> dict:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest).close()
            sent = produce(client, topic, 2000, batching=True, base=0)
            sent.update(produce(client, topic, 600, batching=False, base=2000))
            return sent
        finally:
            client.close()

    sent = await asyncio.to_thread(produce_all)
    produced_ledgers = {key[0] for key in sent}
    await asyncio.to_thread(http, "PUT", f"{admin}/persistent/public/default/{local}/unload")
    await asyncio.to_thread(http, "GET", f"{admin}/persistent/public/default/{local}/stats")   # load it again

    def released() -> bool:
        manifest = http("GET", f"{admin}/persistent/public/default/{local}/archive")
        return produced_ledgers <= {l["ledger_id"] for l in manifest["ledgers"] if l["bookie_deleted_ms"] > 0}

    await asyncio.to_thread(wait_until, released, 120, "every ledger archived on S3 and its bookie copy deleted")
    assert not produced_ledgers & await ledgers_on_bookies(cluster.metadata_url)

    # Served from the object store: the bookies no longer have these ledgers.
    def read_back() -> dict:
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
        try:
            return consume_all(client, topic, "from-s3", len(sent), timeout_s=90)
        finally:
            client.close()

    received = await asyncio.to_thread(read_back)
    assert received.keys() == sent.keys()
    for key, value in received.items():
        assert value[:3] == sent[key], key

    manifest = await asyncio.to_thread(http, "GET", f"{admin}/persistent/public/default/{local}/archive")
    files = [f for ledger in manifest["ledgers"] for f in ledger["files"]]
    assert all(f["url"].startswith(f"s3://{bucket}/{prefix}/persistent/public/default/{local}/") for f in files)
    assert objects_of_topic(store, bucket, prefix, local) == {posixpath.basename(f["url"]) for f in files}
    assert sum(f["row_count"] for f in files) == len(sent)
    # Plain Arrow on the store, read with the test's own S3 client.
    with store.filesystem().open(files[0]["url"].removeprefix("s3://"), "rb") as handle:
        table = ipc.open_file(handle).read_all()
    assert table.schema.equals(SCHEMA, check_metadata=False)
    assert table.num_rows == files[0]["row_count"]

    # The tool verifies every object on the store (endpoint and credentials from its environment).
    code, out, err = await run_cli("archive", "--admin-url", broker.web_service_url, "verify", topic,
                                   env=store.client_env())
    assert code == 0, out + err
    verified = json.loads(out)
    assert verified["corrupt"] == 0 and len(verified["files"]) == len(files), verified
    assert all(result["ok"] and result["url"].startswith("s3://") for result in verified["files"])

    # The store demands the credentials: a wrong secret is refused.
    with pytest.raises(PermissionError, match="signature"):
        store.filesystem(secret="not-the-secret").ls(bucket, refresh=True)
    # ... and no broker wrote it anywhere in its log.
    assert store.secret_key not in broker.log_text(since_spawn=False)
    await broker.terminate()


# step: (a temporary object left, a final object left, the ledger recorded in the manifest)
STEP_EXPECTATIONS = {
    "before-rename": (True, False, False),
    "mid-rename": (True, True, False),
    "after-rename": (False, True, False),
    "before-manifest": (False, True, False),
    "before-bookie-delete": (False, True, True),
}


@pytest.mark.long
async def test_kill_9_at_each_commit_step_on_s3_leaves_a_consistent_archive(cluster, object_store):
    store = object_store
    bucket = store.make_bucket(f"crash-{uuid.uuid4().hex[:8]}")
    prefix = "archive"
    location = f"s3://{bucket}/{prefix}"
    await cluster.start_bookies(3)
    # A short lease: the killed broker's bundles move to the restarted one quickly.
    common = ["--archive-orphan-grace-s", "1", "--archive-gc-interval-s", "0.5", "--lease-ttl-s", "2"]
    timings = {}
    for step, (temp_left, final_left, recorded) in STEP_EXPECTATIONS.items():
        started = time.monotonic()
        broker = await start_broker(cluster, store, f"broker-{step}", location, *common, "--archive-pause-at", step)
        local = f"crash-{step}-{uuid.uuid4().hex[:6]}"
        topic = f"persistent://public/default/{local}"
        admin = f"{broker.web_service_url}/admin/v2"
        await asyncio.to_thread(http, "POST", f"{admin}/namespaces/public/default/offloadPolicies", POLICY)

        def produce_some() -> dict:
            client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
            try:
                client.subscribe(topic, "holder", initial_position=pulsar.InitialPosition.Earliest).close()
                return produce(client, topic, 1200, batching=True, base=0)
            finally:
                client.close()

        sent = await asyncio.to_thread(produce_some)
        await asyncio.to_thread(http, "PUT", f"{admin}/persistent/public/default/{local}/unload")
        await asyncio.to_thread(http, "GET", f"{admin}/persistent/public/default/{local}/stats")
        paused = await broker.wait_for_log(re.compile(rf"archive paused at step: step={step} "
                                                      r"topic=\S+ ledger_id=(\d+)"), timeout_s=60)
        ledger_id = int(paused.group(1))
        broker.kill9()

        names = objects_of_topic(store, bucket, prefix, local)
        assert any(n.endswith(".tmp") for n in names) == temp_left, (step, names)
        assert any(n.endswith(".arrow") for n in names) == final_left, (step, names)
        records = await manifest_records(cluster.metadata_url, f"persistent/public/default/{local}")
        assert (ledger_id in records) == recorded, (step, records.keys())
        # No record names an object that is not whole on the store.
        for record in records.values():
            for f in record["files"]:
                assert store.filesystem().size(f["url"].removeprefix("s3://")) == f["size_bytes"], (step, f)
        assert ledger_id in await ledgers_on_bookies(cluster.metadata_url), step

        restarted = await start_broker(cluster, store, f"broker-{step}-again", location, *common)
        admin = f"{restarted.web_service_url}/admin/v2"
        produced_ledgers = {key[0] for key in sent}

        async def settled() -> bool:
            try:
                await asyncio.to_thread(http, "GET", f"{admin}/persistent/public/default/{local}/stats")
            except OSError:
                return False
            records = await manifest_records(cluster.metadata_url, f"persistent/public/default/{local}")
            named = {posixpath.basename(f["url"]) for r in records.values() for f in r["files"]}
            return (produced_ledgers <= {l for l, r in records.items() if r["bookie_deleted_ms"] > 0}
                    and objects_of_topic(store, bucket, prefix, local) == named
                    and not produced_ledgers & await ledgers_on_bookies(cluster.metadata_url))

        deadline = time.monotonic() + 90
        while not await settled():
            assert time.monotonic() < deadline, \
                f"{step}: archive did not settle: {objects_of_topic(store, bucket, prefix, local)}"
            await asyncio.sleep(0.5)
        records = await manifest_records(cluster.metadata_url, f"persistent/public/default/{local}")
        # Exactly once: the rows of the records add up to what was sent, no more.
        assert sum(f["row_count"] for r in records.values() for f in r["files"]) == len(sent), step

        def read_back() -> dict:
            client = pulsar.Client(restarted.service_url, operation_timeout_seconds=30)
            try:
                return consume_all(client, topic, "check", len(sent), timeout_s=60)
            finally:
                client.close()

        received = await asyncio.to_thread(read_back)
        assert received.keys() == sent.keys(), step
        for key, value in received.items():
            assert value[:3] == sent[key], (step, key)

        # A retried commit is a no-op: asking to archive again changes neither the
        # manifest nor the objects.
        objects_before = objects_of_topic(store, bucket, prefix, local)
        code, out, err = await run_cli("archive", "--admin-url", restarted.web_service_url, "run", topic,
                                       "--wait-s", "60", env=store.client_env())
        assert code == 0, out + err
        await asyncio.sleep(1.5)                      # a few archive passes and GC listings
        assert await manifest_records(cluster.metadata_url, f"persistent/public/default/{local}") == records, step
        assert objects_of_topic(store, bucket, prefix, local) == objects_before, step
        await restarted.terminate()
        timings[step] = round(time.monotonic() - started, 1)
    print(f"seconds per crash step on S3: {timings}")
