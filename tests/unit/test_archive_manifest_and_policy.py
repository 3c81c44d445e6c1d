"""The archive's manifest records (archive/manifest.py, on the in-memory metadata store),
its selection rules (archive/policy.py) and the namespace's offload policy
(metadata/policies.py, broker/admin/policy_codec.py).

Proves: a ledger is recorded once (a second create loses with MetadataKeyExists, so
two archivers never both count), a record is changed and removed only by
compare-and-swap on the version read, and records that do not tile their ledger or
come from a newer format are refused; ledgers are chosen for archiving by size and
age thresholds and by an operator's request exactly as documented, never the open
ledger; bookie copies are released only after the lag; the archive's retention never
collects a ledger the topic still lists; bad policies are refused naming the field.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from archive.manifest import FileRecord, LedgerRecord, Manifest
from archive.policy import ArchivedLedger, LedgerState, ledgers_to_archive, ledgers_to_collect, ledgers_to_release
from broker.admin.policy_codec import offload_policies_of
from common.errors import InvalidArgument, MalformedFrame, MetadataKeyExists, MetadataVersionConflict
from metadata.memory_store import MemoryStore
from metadata.policies import NamespacePolicies, OffloadPolicies

TOPIC_PATH = "persistent/public/default/orders"


def record(ledger_id: int, entries: int = 100, files: int = 2) -> LedgerRecord:
    step = entries // files
    bounds = [(i * step, (i + 1) * step - 1 if i < files - 1 else entries - 1) for i in range(files)]
    return LedgerRecord(
        topic="persistent://public/default/orders", ledger_id=ledger_id, entry_count=entries,
        files=tuple(FileRecord(url=f"file:///a/{ledger_id}-{first}.arrow", first_entry_id=first, last_entry_id=last,
                               row_count=(last - first + 1) * 2, size_bytes=1000, crc32c=7,
                               publish_time_ms_min=first, publish_time_ms_max=last, format_version=1)
                    for first, last in bounds),
        archived_ms=1000)


async def test_a_ledger_is_recorded_once_and_changed_only_by_compare_and_swap():
    """create, then a second create loses; mark and remove need the version read."""
    manifest = Manifest(MemoryStore())
    created = await manifest.create(TOPIC_PATH, record(5))
    assert created.version > 0
    with pytest.raises(MetadataKeyExists):
        await manifest.create(TOPIC_PATH, record(5))
    marked = await manifest.mark_bookie_deleted(TOPIC_PATH, created, now_ms=2000)
    assert marked.bookie_deleted_ms == 2000
    with pytest.raises(MetadataVersionConflict):
        await manifest.mark_bookie_deleted(TOPIC_PATH, created, now_ms=3000)     # stale version
    await manifest.create(TOPIC_PATH, record(9))
    ledgers = await manifest.ledgers(TOPIC_PATH)
    assert list(ledgers) == [5, 9] and ledgers[5] == marked
    assert await manifest.topics() == [TOPIC_PATH]
    with pytest.raises(MetadataVersionConflict):
        await manifest.remove(TOPIC_PATH, created)
    await manifest.remove(TOPIC_PATH, marked)
    assert list(await manifest.ledgers(TOPIC_PATH)) == [9]


def test_records_must_tile_their_ledger_and_be_of_a_known_format():
    """Files with a gap, short of the last entry, or a newer format version: refused."""
    good = record(3)
    assert LedgerRecord.decode(good.encode()) == good
    assert good.file_for_entry(99).first_entry_id == 50 and good.file_for_entry(100) is None
    with pytest.raises(ValueError):
        dataclasses.replace(good, entry_count=101)
    with pytest.raises(ValueError):
        dataclasses.replace(good, files=(good.files[1],))
    doc = good.to_json()
    doc["format_version"] = 9
    newer = json.dumps(doc).encode()
    with pytest.raises(MalformedFrame):
        LedgerRecord.decode(newer)
    with pytest.raises(MalformedFrame):
        LedgerRecord.decode(b"not json")


def states(*specs) -> list[LedgerState]:
    return [LedgerState(ledger_id, last, size, closed, archived) for ledger_id, last, size, closed, archived in specs]


def test_ledgers_are_chosen_by_size_age_and_request():
    """Size: oldest first until the unarchived size is back under the threshold (0:
    all closed); age: closed long enough; request: up to a position; never open or
    archived ledgers; -1 turns a trigger off."""
    ledgers = states((1, 99, 100, 1_000, False), (2, 99, 100, 5_000, True), (3, 99, 100, 8_000, False),
                     (4, 99, 100, 9_000, False), (5, 10, 50, 0, False))
    now = 10_000
    assert ledgers_to_archive(ledgers, threshold_bytes=0, threshold_seconds=-1, requested_upto=None,
                              now_ms=now) == [1, 3, 4]
    assert ledgers_to_archive(ledgers, threshold_bytes=200, threshold_seconds=-1, requested_upto=None,
                              now_ms=now) == [1, 3]
    assert ledgers_to_archive(ledgers, threshold_bytes=-1, threshold_seconds=5, requested_upto=None,
                              now_ms=now) == [1]
    assert ledgers_to_archive(ledgers, threshold_bytes=-1, threshold_seconds=-1, requested_upto=(3, 99),
                              now_ms=now) == [1, 3]
    assert ledgers_to_archive(ledgers, threshold_bytes=-1, threshold_seconds=-1, requested_upto=(3, 50),
                              now_ms=now) == [1]
    assert ledgers_to_archive(ledgers, threshold_bytes=-1, threshold_seconds=-1, requested_upto=None,
                              now_ms=now) == []


def test_nothing_after_a_ledger_still_closing_is_archived():
    """Ledger 2 rolled over and its close is still under way (no close time yet): 3 and
    4, closed, wait for it, so the archive stays the oldest part of the topic (a reader
    of archive + tail reads the tail from after the last archived ledger; with 3 and 4
    archived first it skipped 2). An empty closed ledger does not stop the walk."""
    ledgers = states((1, 99, 100, 1_000, False), (2, 99, 100, 0, False), (3, 99, 100, 8_000, False),
                     (4, 99, 100, 9_000, False), (5, 10, 50, 0, False))
    assert ledgers_to_archive(ledgers, threshold_bytes=0, threshold_seconds=-1, requested_upto=None,
                              now_ms=10_000) == [1]
    assert ledgers_to_archive(ledgers, threshold_bytes=-1, threshold_seconds=-1, requested_upto=(4, 99),
                              now_ms=10_000) == [1]
    with_empty = states((1, -1, 0, 1_000, False), (2, 99, 100, 2_000, False), (3, 10, 50, 0, False))
    assert ledgers_to_archive(with_empty, threshold_bytes=0, threshold_seconds=-1, requested_upto=None,
                              now_ms=10_000) == [2]


def archived(*specs) -> list[ArchivedLedger]:
    return [ArchivedLedger(ledger_id, size, archived_ms, deleted_ms, in_topic)
            for ledger_id, size, archived_ms, deleted_ms, in_topic in specs]


def test_bookie_copies_are_released_after_the_lag_only():
    ledgers = archived((1, 10, 1_000, 0, True), (2, 10, 9_000, 0, True), (3, 10, 1_000, 5_000, True))
    assert ledgers_to_release(ledgers, deletion_lag_ms=5_000, now_ms=10_000) == [1]
    assert ledgers_to_release(ledgers, deletion_lag_ms=0, now_ms=10_000) == [1, 2]


def test_archive_retention_never_collects_a_ledger_the_topic_lists():
    """Only ledgers gone from the topic are collected: by age, then by total size,
    oldest first; -1 and -1 keep everything."""
    mib = 1024 * 1024
    ledgers = archived((1, 4 * mib, 0, 1, False), (2, 4 * mib, 100_000, 1, False), (3, 4 * mib, 0, 1, True))
    assert ledgers_to_collect(ledgers, retention_minutes=-1, retention_mb=-1, now_ms=200_000) == []
    assert ledgers_to_collect(ledgers, retention_minutes=1, retention_mb=-1, now_ms=120_000) == [1]
    assert ledgers_to_collect(ledgers, retention_minutes=-1, retention_mb=4, now_ms=0) == [1]
    assert ledgers_to_collect(ledgers, retention_minutes=0, retention_mb=0, now_ms=200_000) == [1, 2]


def test_offload_policies_have_pulsars_shape_and_refuse_bad_values():
    """The REST body keeps Pulsar's field names, drops fields Magnetar has no use for,
    and refuses bad values naming the field."""
    stored = offload_policies_of({"managedLedgerOffloadThresholdInBytes": 0,
                                  "managedLedgerOffloadBucket": "ignored", "archiveCompression": "zstd"})
    assert stored["managedLedgerOffloadThresholdInBytes"] == 0 and stored["archiveCompression"] == "zstd"
    assert "managedLedgerOffloadBucket" not in stored
    policies = NamespacePolicies(offload_policies=stored)
    assert policies.offload().enabled
    assert NamespacePolicies().offload() is None
    assert not OffloadPolicies().enabled
    for field, value in [("managedLedgerOffloadThresholdInBytes", -2), ("archiveCompression", "gzip"),
                         ("archiveBatchRows", 0), ("managedLedgerOffloadDeletionLagInMillis", -1),
                         ("managedLedgerOffloadDriver", "aws-s3"), ("archiveRetentionSizeInMB", True)]:
        with pytest.raises(InvalidArgument) as raised:
            offload_policies_of({field: value})
        assert field in str(raised.value)
