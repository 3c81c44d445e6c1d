"""The archive inside a broker (broker/archiver.py, managed_ledger/managed_ledger.py,
broker/topic.py), on the in-memory metadata store, the fake ledger client and fsspec's
in-memory filesystem.

Proves: under an enabled offload policy ack-based retention deletes only archived
ledgers, oldest first, never past the first unarchived one; an archived ledger whose
bookie copy is released is read by the managed ledger from the archive, entry for entry
the bytes it stored; the operator's request archives closed ledgers up to a position
and reports SUCCESS; the open ledger is never archived; the default deletion lag keeps
the bookie copy.
How: a real BrokerService; the archiver's pass is driven by calling ``check_topic``.
"""

from __future__ import annotations

import asyncio
import uuid

from broker.archiver_config import ArchiverConfig
from broker.config import BrokerConfig
from managed_ledger.managed_ledger import ManagedLedgerConfig
from broker.service import BrokerService
from common.position import Position
from common.topic_name import NamespaceName, TopicName
from metadata.memory_store import MemoryStore
from tests.unit import archive_entries
from tests.unit.fake_ledger_client import FakeLedgerClient
from tests.unit.test_broker_service import GatedOwnership

TOPIC = TopicName.parse("persistent://public/default/archived")
NAMESPACE = NamespaceName.parse("public/default")
TIMEOUT_S = 10.0


async def started() -> BrokerService:
    config = BrokerConfig(metadata_url="memory://", port=0, http_port=0,
                          managed_ledger=ManagedLedgerConfig(ledger_entries_max=3))
    archive_url = f"memory://archive-{uuid.uuid4().hex[:8]}"
    service = BrokerService(config, MemoryStore(), FakeLedgerClient(), topic_ownership=GatedOwnership(),
                            archiver_config=ArchiverConfig(location_url=archive_url, check_interval_s=3600))
    await service.start()
    return service


async def topic_with_closed_ledgers(service: BrokerService, entries: int = 9):
    topic = await service.get_topic(TOPIC, create=True)
    stored = [archive_entries.batch(i) if i % 2 else archive_entries.single(i) for i in range(entries)]
    async with asyncio.timeout(TIMEOUT_S):
        positions = [await topic.ledger.append(data) for data in stored]
        while len([i for i in topic.ledger.ledger_infos() if i.known]) < entries // 3:
            await asyncio.sleep(0.01)     # rolled-over ledgers finish closing
    return topic, dict(zip(positions, stored))


async def set_policy(service: BrokerService, **fields) -> None:
    await service.resources.update_policies(NAMESPACE, lambda p: setattr(p, "offload_policies", fields))


async def test_retention_deletes_only_archived_ledgers_under_a_policy():
    """Every ledger is consumed (no subscription), but with an enabled policy only the
    archived prefix may go."""
    service = await started()
    topic, _stored = await topic_with_closed_ledgers(service)
    closed = [i.ledger_id for i in topic.ledger.ledger_infos() if i.known]
    assert len(closed) >= 3
    await set_policy(service, managedLedgerOffloadThresholdInBytes=-1, managedLedgerOffloadThresholdInSeconds=3600)
    gate = await service.archiver.retention_gate(topic)
    assert gate is not None
    assert await topic.trim_ledgers(0, 0, gate) == []                 # nothing archived yet
    archive = service.archiver.topic_archive(TOPIC)
    service.archiver.request(TOPIC, Position(closed[0], 10**9))       # archive the first ledger only
    await service.archiver.check_topic(topic)
    assert list(archive.records) == [closed[0]]
    assert await topic.trim_ledgers(0, 0, await service.archiver.retention_gate(topic)) == [closed[0]]
    assert closed[1] in topic.ledger.ledger_ids()
    await service.close()


async def test_released_ledgers_are_read_from_the_archive_byte_for_byte():
    """Threshold 0 and no lag: every closed ledger is archived and its bookie copy
    deleted; reads of the whole topic give back the stored bytes at their positions."""
    service = await started()
    topic, stored = await topic_with_closed_ledgers(service)
    closed = [i.ledger_id for i in topic.ledger.ledger_infos() if i.known]
    await set_policy(service, managedLedgerOffloadThresholdInBytes=0, managedLedgerOffloadDeletionLagInMillis=0)
    await service.archiver.check_topic(topic)
    archive = service.archiver.topic_archive(TOPIC)
    assert set(closed) <= {l for l, r in archive.records.items() if r.bookie_deleted_ms > 0}
    assert topic.ledger.current_ledger_id not in archive.records
    for ledger_id in closed:
        assert ledger_id not in service.ledger_client.ledgers
    async with asyncio.timeout(TIMEOUT_S):
        read = await topic.ledger.read(Position(-1, 0), 100, 10**9)
    assert {entry.position: bytes(entry.data) for entry in read} == stored
    assert archive.status.state == "SUCCESS"
    await service.close()


async def test_an_operator_request_archives_and_keeps_the_bookie_copy_by_default():
    """No policy: PUT …/offload archives the closed ledgers; the default lag (4 h)
    keeps their bookie copies, and reads still come from the bookies."""
    service = await started()
    topic, _stored = await topic_with_closed_ledgers(service, entries=6)
    closed = [i.ledger_id for i in topic.ledger.ledger_infos() if i.known]
    service.archiver.request(TOPIC, topic.ledger.last_confirmed)
    assert service.archiver.topic_archive(TOPIC).status.state == "RUNNING"
    await service.archiver.check_topic(topic)
    archive = service.archiver.topic_archive(TOPIC)
    assert set(archive.records) == set(closed)
    assert all(r.bookie_deleted_ms == 0 for r in archive.records.values())
    assert not any(archive.serves(l) for l in closed)
    assert set(closed) <= set(service.ledger_client.ledgers)
    assert archive.status.to_json(-1)["status"] == "SUCCESS"
    await service.close()


async def test_a_deleted_topics_archive_is_collected_after_its_retention():
    """Deleting a topic keeps its archive for the archive retention (here 10 minutes,
    counted from the deletion), then the records and every file go, orphans (a write
    the deletion interrupted) too; a topic with retention -1 is collected at once."""
    import fsspec

    from metadata import keys

    service = await started()
    topic, _stored = await topic_with_closed_ledgers(service)
    await set_policy(service, managedLedgerOffloadThresholdInBytes=0, managedLedgerOffloadDeletionLagInMillis=0,
                     archiveRetentionTimeInMinutes=10)
    await service.archiver.check_topic(topic)
    records = dict(service.archiver.topic_archive(TOPIC).records)
    assert records
    urls = [f.url for r in records.values() for f in r.files]
    fs, _ = fsspec.core.url_to_fs(urls[0])
    orphan = urls[0].rsplit("/", 1)[0] + "/.00000000000000000099-00000000000000000000-orphan.arrow.tmp"
    fs.pipe(orphan, b"half a file")
    assert all(fs.exists(u) for u in [*urls, orphan])

    now = [service.archiver._clock()]
    service.archiver._clock = lambda: now[0]
    await service.delete_topic(TOPIC, force=True)
    assert await service.store.get(keys.archive_deleted_topic(TOPIC.key_path)) is not None
    await service.archiver._collect_deleted_topics()
    assert await service.archiver.manifest.ledgers(TOPIC.key_path)          # kept: within retention
    assert all(fs.exists(u) for u in urls)

    now[0] += 11 * 60
    await service.archiver._collect_deleted_topics()
    assert await service.archiver.manifest.ledgers(TOPIC.key_path) == {}
    assert not any(fs.exists(u) for u in [*urls, orphan])
    assert await service.store.get(keys.archive_deleted_topic(TOPIC.key_path)) is None

    # Retention -1 ("as long as the topic keeps it"): collected with the topic.
    await set_policy(service, managedLedgerOffloadThresholdInBytes=0, managedLedgerOffloadDeletionLagInMillis=0,
                     archiveRetentionTimeInMinutes=-1)
    topic, _stored = await topic_with_closed_ledgers(service)
    await service.archiver.check_topic(topic)
    urls = [f.url for r in service.archiver.topic_archive(TOPIC).records.values() for f in r.files]
    assert urls
    await service.delete_topic(TOPIC, force=True)
    await service.archiver._collect_deleted_topics()
    assert await service.archiver.manifest.ledgers(TOPIC.key_path) == {}
    assert not any(fs.exists(u) for u in urls)
    await service.close()
