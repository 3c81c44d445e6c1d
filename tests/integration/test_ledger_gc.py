"""The ledger collector against real processes (etcd, bookies, brokers, ``magnetar
autorecovery``) and the official client.

Proves: a broker killed with kill -9 in the middle of a compaction run (stopped at the
compaction's pause point, its compacted ledger written but neither closed nor
committed) leaves that ledger behind, tagged ``purpose: compacted``; a second broker
takes the topic over and compacts it successfully; an auto-recovery process with a
short grace period then deletes the orphan (and logs it with its owner, purpose and
age) while every other ledger — the topic's own, the successful compacted ledger —
is untouched after further passes, and the official client still reads every message
(and a read_compacted reader each key's latest value).
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pulsar

from managed_ledger.compacted_ledger import CompactionRecord
from managed_ledger.compaction import COMPACTION_PROPERTY
from managed_ledger.managed_ledger_info import ManagedLedgerInfo
from common.topic_name import TopicName
from ledger.metadata import LedgerMetadata
from metadata import keys, open_store
from tests.cluster import ManagedProcess, created_retrying, http_json, python_command, wait_until_async

_AUTORECOVERY_READY = re.compile(r"autorecovery listening: id=(\S+) http_address=(\S+)")
_PAUSED = re.compile(r"compaction paused: point=after-ledger-written topic=\S+ ledger_id=(\d+)")
# A short lease: the killed broker's bundle moves to the second one within seconds.
BROKER_ARGS = ["--lease-ttl-s", "2"]
MESSAGES = 60
KEYS = 7
RECEIVE_TIMEOUT_MS = 10_000


def _produce(service_url: str, topic: str) -> None:
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        # A durable subscription that acknowledges nothing: ack-based retention keeps
        # every ledger of the topic (it would trim the first one otherwise).
        # (Created right after the broker started: see created_retrying.)
        created_retrying(lambda: client.subscribe(topic, "holder",
                                                  initial_position=pulsar.InitialPosition.Earliest)).close()
        producer = created_retrying(lambda: client.create_producer(topic, batching_enabled=False))
        for index in range(MESSAGES):
            producer.send(f"value-{index}".encode(), partition_key=f"key-{index % KEYS}")
        producer.close()
    finally:
        client.close()


def _read_all(service_url: str, topic: str) -> tuple[list[bytes], list[bytes]]:
    client = pulsar.Client(service_url, operation_timeout_seconds=30)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        everything = [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(MESSAGES)]
        assert not reader.has_message_available()
        reader.close()
        compacted_reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        latest = [compacted_reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(KEYS)]
        assert not compacted_reader.has_message_available()
        compacted_reader.close()
        return everything, latest
    finally:
        client.close()


async def _ledgers(store) -> dict[int, LedgerMetadata]:
    return {keys.ledger_id_from_key(r.key): LedgerMetadata.decode(r.value)
            for r in await store.get_prefix(keys.LEDGERS)}


async def test_a_kill_9_mid_compaction_leaves_an_orphan_that_is_collected(cluster):
    local = f"gc-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{local}"
    compaction = f"/admin/v2/persistent/public/default/{local}/compaction"
    await cluster.start_bookies(2)
    store = open_store(cluster.metadata_url)
    autorecovery = None
    try:
        doomed = cluster.broker("broker-paused", extra_args=[*BROKER_ARGS, "--compaction-pause-at",
                                                              "after-ledger-written"])
        await doomed.start()
        await asyncio.to_thread(_produce, doomed.service_url, topic)
        await asyncio.to_thread(http_json, "PUT", f"{doomed.web_service_url}{compaction}")
        orphan = int((await doomed.wait_for_log(_PAUSED, timeout_s=60)).group(1))
        doomed.kill9()
        metadata = (await _ledgers(store))[orphan]
        assert metadata.custom == {"managed-ledger": topic, "purpose": "compacted"}
        assert metadata.created_ms > 0 and not metadata.is_closed

        broker = cluster.broker("broker-2", extra_args=BROKER_ARGS)
        await broker.start()

        async def compacted() -> bool:
            try:
                await asyncio.to_thread(http_json, "PUT", f"{broker.web_service_url}{compaction}")
            except OSError:
                return False        # the dead broker still owns the bundle (its lease runs on)
            return True

        await wait_until_async(compacted, 30, "the topic taken over and a compaction started", interval_s=0.3)

        async def succeeded() -> bool:
            status = await asyncio.to_thread(http_json, "GET", f"{broker.web_service_url}{compaction}")
            assert status["status"] in ("RUNNING", "SUCCESS"), status
            return status["status"] == "SUCCESS"

        await wait_until_async(succeeded, 30, "the second compaction run")
        record = await store.get(keys.managed_ledger(TopicName.parse(topic).key_path))
        info = ManagedLedgerInfo.decode(record.value)
        committed = CompactionRecord.decode(info.properties[COMPACTION_PROPERTY])
        assert committed is not None and committed.ledger_id != orphan
        before = set(await _ledgers(store))
        assert orphan in before
        assert {i.ledger_id for i in info.ledgers} | {committed.ledger_id} <= before

        autorecovery = ManagedProcess("autorecovery", python_command(
            "autorecovery", "--metadata", cluster.metadata_url, "--http-port", "0", "--audit-interval-s", "0.5",
            "--lease-ttl-s", "3", "--ledger-gc-grace-s", "1", "--ledger-gc-interval-s", "0.5"),
            f"{cluster.base_dir}/autorecovery.log")
        autorecovery.spawn()
        await autorecovery.wait_for_log(_AUTORECOVERY_READY)
        collected = await autorecovery.wait_for_log(re.compile(
            rf"orphan ledger collected: ledger_id={orphan} owner=(\S+) purpose=compacted age_s=(\d+)"), timeout_s=30)
        assert collected.group(1) == topic

        # Two more passes after the collection: nothing else goes.
        async def two_more_passes() -> bool:
            return _metric(autorecovery, "magnetar_autorecovery_ledger_gc_passes_total") >= 3

        await wait_until_async(two_more_passes, 30, "two more collector passes")
        assert set(await _ledgers(store)) == before - {orphan}
        assert _metric(autorecovery, "magnetar_autorecovery_ledger_gc_ledgers_collected_total") == 1

        everything, latest = await asyncio.to_thread(_read_all, broker.service_url, topic)
        assert everything == [f"value-{index}".encode() for index in range(MESSAGES)]
        assert latest == [f"value-{index}".encode() for index in range(MESSAGES - KEYS, MESSAGES)]
    finally:
        if autorecovery is not None and autorecovery.running:
            await autorecovery.terminate(timeout_s=15)
        await store.close()


def _metric(process: ManagedProcess, name: str) -> float:
    """A counter of the process's /metrics, found through its logged HTTP address."""
    import urllib.request

    address = _AUTORECOVERY_READY.search(process.log_text()).group(2)
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    match = re.search(rf"^{name} (\S+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
