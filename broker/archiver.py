"""The archiver: the broker's part of the archive (docs/archive.md). For each topic this
broker owns it archives closed ledgers as Arrow files when the namespace's offload
policy (or an operator) asks, deletes their bookie copies after the policy's lag,
serves reads of ledgers whose bookie copy is gone, and collects the archive's garbage.

Theory of operation:
- One task (``run``, owned by the broker service) visits the loaded topics every
  ``check_interval_s``, or at once when an operator asks (``request``). Topics and
  ledgers are archived one at a time, so the work in flight is bounded: one ledger
  slice in memory (``file_bytes_max``) and the next chunk of entries being read.
- Archiving a ledger: entries are read from the bookies in chunks of
  ``read_entries_max`` (the next chunk is read while the previous one is unpacked);
  unpacking into rows, Arrow encoding, writing, fsync and verification run in the
  archive's bounded executor (``threads``), never on the event loop. Each slice is
  written temp → fsync → rename → fsync dir and verified (archive/writer.py); then the
  ledger's manifest record is created by compare-and-swap (archive/manifest.py). Only
  that makes the ledger archived. A crash before it leaves files no record names (the
  orphan GC removes them after ``orphan_grace_s``) and the ledger is archived again on
  the next pass, under new names: nothing is lost and nothing is counted twice.
- Deleting bookie copies: once an archived ledger's deletion lag has passed, its files
  are verified again in full (size, whole-file CRC32C, every batch), the record is
  marked ``bookie_deleted_ms`` (from then on the managed ledger reads that ledger from
  the archive), and only then is the ledger deleted from the bookies. A crash between
  the mark and the delete leaves a bookie copy that the next pass deletes.
- Ack-based retention and archiving agree: under an enabled policy, retention deletes
  only ledgers already archived (``retention_gate``); the archive keeps its own files
  until the archive's retention lets them go (archive/policy.py), and never a ledger
  the topic still lists.
- Crash points for tests: with ``pause_at_step`` set, the archiver logs
  ``archive paused at step: step=<name>`` and waits there for ever, so a test can
  kill -9 the broker at exactly that step (STEPS, broker/archiver_config.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable

from archive.format import FORMAT_VERSION, is_temp_name
from archive.location import ArchiveLocation, delete_file, endpoint_url, use_endpoint
from archive.manifest import FileRecord, LedgerRecord, Manifest
from archive.policy import ArchivedLedger, LedgerState, ledgers_to_archive, ledgers_to_collect, ledgers_to_release
from archive.reader import verify_file
from archive.writer import SliceBuilder, WriterConfig, publish, write_temp
from managed_ledger.archive_reads import ArchiveReads
from broker.archiver_config import ArchiverConfig
from broker.topic import PersistentTopic
from broker.topic_archive import TopicArchive
from common.errors import (
    ArchiveError,
    ConfigError,
    MagnetarError,
    MetadataKeyExists,
    MetadataVersionConflict,
    NoSuchLedger,
)
from common.position import Position
from common.topic_name import NamespaceName, TopicName
from ledger.client import LedgerClient
from metadata.policies import NamespacePolicies, OffloadPolicies
from metadata import keys
from metadata.store import MetadataStore

log = logging.getLogger(__name__)

# Deleted topics' archives looked at per pass (the rest wait for the next).
DELETED_TOPICS_PER_PASS = 64


class Archiver:
    def __init__(self, config: ArchiverConfig, store: MetadataStore, ledger_client: LedgerClient,
                 policies: Callable[[NamespaceName], Awaitable[NamespacePolicies]], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._store = store
        self._ledger_client = ledger_client
        self._policies = policies
        self._clock = clock
        if config.endpoint_url:
            use_endpoint(config.endpoint_url)
        self.manifest = Manifest(store)
        self._executor = ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="archive")
        self.reads = ArchiveReads(self._executor, cache_bytes_max=config.read_cache_bytes_max,
                                  read_ahead_batches=config.read_ahead_batches)
        self._topics: dict[str, TopicArchive] = {}
        self._locations: dict[str, ArchiveLocation] = {}
        self._wake: asyncio.Event | None = None
        # Names of files this broker is writing (never orphans while listed).
        self._writing: set[str] = set()
        self._deleted_checked_at = 0.0
        log.info("archiver configured: location_url=%s endpoint_url=%s check_interval_s=%g file_bytes_max=%d threads=%d "
                 "read_cache_bytes_max=%d read_ahead_batches=%d orphan_grace_s=%g gc_interval_s=%g pause_at_step=%s",
                 config.location_url or "-", endpoint_url() or "-", config.check_interval_s, config.file_bytes_max, config.threads,
                 config.read_cache_bytes_max, config.read_ahead_batches, config.orphan_grace_s, config.gc_interval_s,
                 config.pause_at_step or "-")

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # --- topics ------------------------------------------------------------------------------

    async def open_topic(self, name: TopicName) -> TopicArchive:
        """The topic's archive view, with its manifest read from the store (at load)."""
        records = await self.manifest.ledgers(name.key_path)
        archive = TopicArchive(name, self.reads, records)
        self._topics[str(name)] = archive
        return archive

    def close_topic(self, name: TopicName, archive: TopicArchive | None = None) -> None:
        current = self._topics.get(str(name))
        if current is not None and (archive is None or current is archive):
            self._topics.pop(str(name), None)
            self.reads.forget({f.url for record in current.records.values() for f in record.files})

    def topic_archive(self, name: TopicName) -> TopicArchive | None:
        return self._topics.get(str(name))

    def request(self, name: TopicName, upto: Position) -> None:
        """An operator asks to archive every closed ledger up to ``upto``."""
        archive = self._topics.get(str(name))
        assert archive is not None, name
        archive.requested_upto = upto
        archive.status.state = "RUNNING"
        archive.status.last_error = ""
        if self._wake is not None:
            self._wake.set()

    async def retention_gate(self, topic: PersistentTopic) -> Callable[[int], bool] | None:
        """Under an enabled archive policy, retention may delete only archived ledgers."""
        policy = (await self._policies(topic.name.namespace_name)).offload()
        archive = self._topics.get(topic.full_name)
        if policy is None or not policy.enabled or archive is None:
            return None
        return archive.archived

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, topics: Callable[[], list[PersistentTopic]]) -> None:
        self._wake = asyncio.Event()
        while True:
            try:
                async with asyncio.timeout(self.config.check_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            for topic in topics():
                if topic.closing:
                    continue
                await self.check_topic(topic)
            if time.monotonic() - self._deleted_checked_at >= self.config.gc_interval_s:
                self._deleted_checked_at = time.monotonic()
                await self._collect_deleted_topics()

    # --- deleted topics ------------------------------------------------------------------------

    async def topic_deleted(self, name: TopicName) -> None:
        """After a topic's deletion: its archive is collected once the namespace's archive
        retention has passed since now (at once when that retention is -1, "as long as
        the topic keeps it", or 0), by whichever broker looks first (records go by
        compare-and-delete, so two brokers collecting at once delete each file once)."""
        if not await self.manifest.ledgers(name.key_path):
            return
        policy = (await self._policies(name.namespace_name)).offload() or OffloadPolicies()
        now_ms = self._now_ms()
        collect_at_ms = now_ms + max(policy.archiveRetentionTimeInMinutes, 0) * 60_000
        marker = {"topic": str(name), "deleted_ms": now_ms, "collect_at_ms": collect_at_ms,
                  "location_url": policy.managedLedgerOffloadLocation or self.config.location_url}
        await self._store.put(keys.archive_deleted_topic(name.key_path), json.dumps(marker).encode())
        log.info("archive of a deleted topic to be collected: topic=%s collect_at_ms=%d", name, collect_at_ms)
        if self._wake is not None and collect_at_ms <= now_ms:
            self._deleted_checked_at = 0.0
            self._wake.set()

    async def _collect_deleted_topics(self) -> None:
        try:
            markers = await self._store.get_prefix(keys.ARCHIVE_DELETED, limit=DELETED_TOPICS_PER_PASS)
        except MagnetarError as error:
            log.warning("listing deleted topics' archives failed: error=%s", error)
            return
        now_ms = self._now_ms()
        for marker_record in markers:
            try:
                marker = json.loads(marker_record.value)
                if marker["collect_at_ms"] > now_ms:
                    continue
                await self._collect_deleted_topic(marker_record.key[len(keys.ARCHIVE_DELETED):], marker)
                await self._store.compare_and_delete(marker_record.key, expected_version=marker_record.version)
            except MetadataVersionConflict:
                continue            # another broker collected it, or the topic was deleted again
            except (MagnetarError, ValueError, KeyError) as error:
                log.warning("collecting a deleted topic's archive failed: key=%s error=%s", marker_record.key, error)

    async def _collect_deleted_topic(self, topic_path: str, marker: dict) -> None:
        records = await self.manifest.ledgers(topic_path)
        collected = 0
        for ledger_id, record in records.items():
            if record.archived_ms > marker["deleted_ms"]:
                continue            # a topic of the same name, created again since
            try:
                await self.manifest.remove(topic_path, record)
            except MetadataVersionConflict:
                continue
            await self._delete_files([f.url for f in record.files])
            collected += 1
        # Files no record names (a write the deletion interrupted), unless the topic
        # exists again: then its owner's GC judges its directory.
        orphans = 0
        if marker.get("location_url") and await self._store.get(keys.managed_ledger(topic_path)) is None:
            loop = asyncio.get_running_loop()
            location = self._location_of(marker["location_url"])
            directory = location.topic_directory(topic_path)
            listed = await loop.run_in_executor(self._executor, location.list_directory, directory)
            named = {f.url for r in (await self.manifest.ledgers(topic_path)).values() for f in r.files}
            doomed = [info.url for info in listed if info.url not in named
                      and (info.name.endswith(".arrow") or is_temp_name(info.name))
                      and (int(info.modified_s * 1000) <= marker["deleted_ms"]
                           or self._clock() - info.modified_s >= self.config.orphan_grace_s)]
            await self._delete_files(doomed)
            orphans = len(doomed)
        log.info("archive of a deleted topic collected: topic=%s ledgers=%d orphan_files=%d",
                 marker.get("topic", topic_path), collected, orphans)

    async def check_topic(self, topic: PersistentTopic) -> None:
        """One pass over a topic: archive, release bookie copies, collect garbage."""
        archive = self._topics.get(topic.full_name)
        if archive is None:
            return
        try:
            policies = await self._policies(topic.name.namespace_name)
            policy = policies.offload()
            if policy is None and archive.requested_upto is None and not archive.records:
                return
            effective = policy or OffloadPolicies()
            await self._archive_ledgers(topic, archive, policy, effective)
            await self._release_bookie_copies(topic, archive, effective)
            await self._collect_garbage(topic, archive, effective)
        except MagnetarError as error:
            archive.status.state = "ERROR"
            archive.status.last_error = str(error)
            log.warning("archive pass failed: topic=%s error=%s", topic.full_name, error)
        except AssertionError:
            raise                   # a broken invariant crashes the broker (STYLE.md)
        except Exception as error:  # the archive's storage or a library failed: keep serving
            archive.status.state = "ERROR"
            archive.status.last_error = repr(error)
            log.error("archive pass failed unexpectedly: topic=%s error=%r", topic.full_name, error, exc_info=error)

    def _location(self, policy: OffloadPolicies) -> ArchiveLocation:
        url = policy.managedLedgerOffloadLocation or self.config.location_url
        if not url:
            raise ConfigError("no archive location: set the namespace's managedLedgerOffloadLocation or the "
                              "broker's --archive-url")
        return self._location_of(url)

    def _location_of(self, url: str) -> ArchiveLocation:
        location = self._locations.get(url)
        if location is None:
            location = ArchiveLocation(url)
            self._locations[url] = location
        return location

    async def _archive_ledgers(self, topic: PersistentTopic, archive: TopicArchive, policy: OffloadPolicies | None,
                               effective: OffloadPolicies) -> None:
        ledger = topic.ledger
        current = ledger.current_ledger_id
        states = [LedgerState(info.ledger_id, info.entries - 1, max(info.size_bytes, 0),
                              info.closed_ms if info.known and info.ledger_id != current else 0,
                              archive.archived(info.ledger_id))
                  for info in ledger.ledger_infos()]
        requested = archive.requested_upto
        chosen = ledgers_to_archive(
            states,
            threshold_bytes=policy.managedLedgerOffloadThresholdInBytes if policy else -1,
            threshold_seconds=policy.managedLedgerOffloadThresholdInSeconds if policy else -1,
            requested_upto=tuple(requested) if requested is not None else None, now_ms=self._now_ms())
        if chosen:
            archive.status.state = "RUNNING"
        for ledger_id in chosen:
            if topic.closing:
                return
            info = next((i for i in ledger.ledger_infos() if i.ledger_id == ledger_id), None)
            if info is None or archive.archived(ledger_id):
                continue       # trimmed meanwhile, or archived by another pass
            record = await self._archive_ledger(topic, archive, ledger_id, effective)
            archive.records[ledger_id] = record
            archive.records = dict(sorted(archive.records.items()))
            archive.status.ledgers_archived += 1
        unarchived = [s for s in states if not archive.archived(s.ledger_id) and s.last_entry_id >= 0]
        archive.status.first_unarchived = Position(unarchived[0].ledger_id, 0) if unarchived else None
        if requested is not None and archive.requested_upto == requested:
            archive.requested_upto = None
        if chosen or requested is not None:
            archive.status.state = "SUCCESS"
            archive.status.last_error = ""

    async def _archive_ledger(self, topic: PersistentTopic, archive: TopicArchive, ledger_id: int,
                              policy: OffloadPolicies) -> LedgerRecord:
        """Archives one closed ledger: its files written and verified, then its record
        created. Returns the record (another broker's, if it won the race)."""
        loop = asyncio.get_running_loop()
        location = self._location(policy)
        started = time.monotonic()
        reader = await self._ledger_client.open_ledger(ledger_id, recovery=False)
        metadata = reader.metadata
        assert metadata.is_closed, ledger_id
        last = metadata.last_entry_id
        assert last >= 0, ledger_id
        writer_config = WriterConfig(batch_rows_max=policy.archiveBatchRows,
                                     batch_bytes_max=self.config.batch_bytes_max,
                                     file_bytes_max=self.config.file_bytes_max,
                                     compression=policy.archiveCompression)
        topic_path = topic.name.key_path
        partition = topic.name.partition_index
        files: list[FileRecord] = []
        written_urls: list[str] = []
        builder = SliceBuilder(writer_config, topic.full_name, partition, ledger_id)
        chunk_max = self.config.read_entries_max

        def read_from(first: int) -> asyncio.Task:
            return loop.create_task(reader.read(first, min(last, first + chunk_max - 1)))

        pending: asyncio.Task | None = read_from(0)
        try:
            while pending is not None:
                chunk = await pending
                following = chunk[-1].entry_id + 1
                pending = read_from(following) if following <= last else None
                index = 0
                while index < len(chunk):
                    index = await loop.run_in_executor(self._executor, _add_entries, builder, chunk, index)
                    if builder.full:
                        files.append(await self._write_slice(location, topic_path, builder, written_urls))
                        builder = SliceBuilder(writer_config, topic.full_name, partition, ledger_id)
            if not builder.empty:
                files.append(await self._write_slice(location, topic_path, builder, written_urls))
            record = LedgerRecord(topic=topic.full_name, ledger_id=ledger_id, entry_count=last + 1,
                                  files=tuple(files), archived_ms=self._now_ms())
            await self._step("before-manifest", topic, ledger_id)
            try:
                record = await self.manifest.create(topic_path, record)
            except MetadataKeyExists:
                winner = await self.manifest.get(topic_path, ledger_id)
                assert winner is not None, (topic_path, ledger_id)
                log.info("ledger archived by another attempt, dropping this one's files: topic=%s ledger_id=%d",
                         topic.full_name, ledger_id)
                await self._delete_files(written_urls)
                return winner
        except BaseException:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            raise
        finally:
            for url in written_urls:
                self._writing.discard(url.rsplit("/", 1)[-1])
        log.info("ledger archived: topic=%s ledger_id=%d entries=%d rows=%d files=%d size_bytes=%d seconds=%.2f",
                 topic.full_name, ledger_id, record.entry_count, record.row_count, len(record.files),
                 record.size_bytes, time.monotonic() - started)
        return record

    async def _write_slice(self, location: ArchiveLocation, topic_path: str, builder: SliceBuilder,
                           written_urls: list[str]) -> FileRecord:
        loop = asyncio.get_running_loop()
        batches, metadata = await loop.run_in_executor(self._executor, builder.finish)
        written = await loop.run_in_executor(self._executor, lambda: write_temp(location, topic_path, batches,
                                                                                  metadata))
        name = written.path.rsplit("/", 1)[-1]
        self._writing.add(name)
        written_urls.append(written.url)
        await self._step("before-rename", None, metadata.ledger_id, written.url)
        between = None
        if self.config.pause_at_step == "mid-rename":
            def between() -> None:
                log.warning("archive paused at step: step=mid-rename topic=- ledger_id=%d url=%s",
                            metadata.ledger_id, written.url)
                threading.Event().wait()        # tests only: the broker is killed here
        await loop.run_in_executor(self._executor, lambda: publish(location, written, between=between))
        await self._step("after-rename", None, metadata.ledger_id, written.url)
        await loop.run_in_executor(self._executor, lambda: verify_file(written.url, size_bytes=written.size_bytes,
                                                                       crc32c_expected=written.crc32c))
        log.info("archive file written: url=%s ledger_id=%d entries=%d..%d rows=%d size_bytes=%d",
                 written.url, metadata.ledger_id, metadata.first_entry_id, metadata.last_entry_id,
                 metadata.row_count, written.size_bytes)
        return FileRecord(url=written.url, first_entry_id=metadata.first_entry_id,
                          last_entry_id=metadata.last_entry_id, row_count=metadata.row_count,
                          size_bytes=written.size_bytes, crc32c=written.crc32c,
                          publish_time_ms_min=metadata.publish_time_ms_min,
                          publish_time_ms_max=metadata.publish_time_ms_max, format_version=FORMAT_VERSION)

    async def _step(self, step: str, topic: PersistentTopic | None, ledger_id: int, url: str = "") -> None:
        if self.config.pause_at_step != step:
            return
        log.warning("archive paused at step: step=%s topic=%s ledger_id=%d url=%s", step,
                    topic.full_name if topic is not None else "-", ledger_id, url or "-")
        await asyncio.Event().wait()

    async def _delete_files(self, urls: list[str]) -> None:
        loop = asyncio.get_running_loop()
        for url in urls:
            try:
                await loop.run_in_executor(self._executor, delete_file, url)
            except ArchiveError as error:
                log.warning("deleting an archive file failed: url=%s error=%s", url, error)

    # --- bookie copies ----------------------------------------------------------------------

    def _archived_ledgers(self, topic: PersistentTopic, archive: TopicArchive) -> list[ArchivedLedger]:
        in_topic = set(topic.ledger.ledger_ids())
        return [ArchivedLedger(r.ledger_id, r.size_bytes, r.archived_ms, r.bookie_deleted_ms, r.ledger_id in in_topic)
                for r in archive.records.values()]

    async def _release_bookie_copies(self, topic: PersistentTopic, archive: TopicArchive,
                                     policy: OffloadPolicies) -> None:
        loop = asyncio.get_running_loop()
        topic_path = topic.name.key_path
        # Marked before a crash, perhaps not deleted yet: delete again (idempotent).
        for ledger_id, record in list(archive.records.items()):
            if record.bookie_deleted_ms > 0 and ledger_id not in archive.released:
                await self._delete_from_bookies(topic, ledger_id)
                archive.released.add(ledger_id)
        due = ledgers_to_release(self._archived_ledgers(topic, archive),
                                 deletion_lag_ms=policy.managedLedgerOffloadDeletionLagInMillis, now_ms=self._now_ms())
        for ledger_id in due:
            if topic.closing:
                return
            record = archive.records[ledger_id]
            try:
                for file in record.files:
                    await loop.run_in_executor(self._executor, lambda f=file: verify_file(
                        f.url, size_bytes=f.size_bytes, crc32c_expected=f.crc32c))
            except ArchiveError as error:
                log.error("archive of a ledger fails verification, its bookie copy is kept: topic=%s ledger_id=%d "
                          "error=%s", topic.full_name, ledger_id, error)
                archive.status.state = "ERROR"
                archive.status.last_error = str(error)
                continue
            try:
                record = await self.manifest.mark_bookie_deleted(topic_path, record, self._now_ms())
            except MetadataVersionConflict:
                fresh = await self.manifest.get(topic_path, ledger_id)
                if fresh is None:
                    archive.records.pop(ledger_id, None)
                    continue
                record = fresh
            archive.records[ledger_id] = record
            await self._step("before-bookie-delete", topic, ledger_id)
            await self._delete_from_bookies(topic, ledger_id)
            archive.released.add(ledger_id)
            log.info("bookie copy of an archived ledger deleted: topic=%s ledger_id=%d", topic.full_name, ledger_id)

    async def _delete_from_bookies(self, topic: PersistentTopic, ledger_id: int) -> None:
        try:
            await self._ledger_client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass

    # --- garbage ------------------------------------------------------------------------------

    async def _collect_garbage(self, topic: PersistentTopic, archive: TopicArchive, policy: OffloadPolicies) -> None:
        """The archive's retention, then files no record names (orphans)."""
        loop = asyncio.get_running_loop()
        topic_path = topic.name.key_path
        doomed = ledgers_to_collect(self._archived_ledgers(topic, archive),
                                    retention_minutes=policy.archiveRetentionTimeInMinutes,
                                    retention_mb=policy.archiveRetentionSizeInMB, now_ms=self._now_ms())
        for ledger_id in doomed:
            record = archive.records[ledger_id]
            try:
                await self.manifest.remove(topic_path, record)
            except MetadataVersionConflict:
                continue
            archive.records.pop(ledger_id, None)
            await self._delete_files([f.url for f in record.files])
            log.info("archived ledger collected by archive retention: topic=%s ledger_id=%d files=%d",
                     topic.full_name, ledger_id, len(record.files))
        if time.monotonic() - archive.listed_at < self.config.gc_interval_s:
            return
        archive.listed_at = time.monotonic()
        try:
            location = self._location(policy)
        except ConfigError:
            return
        directory = location.topic_directory(topic_path)
        listed = await loop.run_in_executor(self._executor, location.list_directory, directory)
        named = {f.url for record in archive.records.values() for f in record.files}
        now_s = self._clock()
        for info in listed:
            if info.url in named or info.name in self._writing:
                continue
            if is_temp_name(info.name) and info.name[1:-4] in self._writing:
                continue
            if info.modified_s and now_s - info.modified_s < self.config.orphan_grace_s:
                continue
            if info.name.endswith(".arrow") or is_temp_name(info.name):
                # Re-read the manifest before deleting: another broker may have just
                # recorded this file (a topic that moved here).
                fresh = await self.manifest.ledgers(topic_path)
                if any(f.url == info.url for r in fresh.values() for f in r.files):
                    archive.records = fresh
                    continue
                await self._delete_files([info.url])
                log.info("orphan archive file deleted: url=%s age_s=%.0f", info.url, now_s - info.modified_s)

    async def close(self) -> None:
        self.reads.close()
        self._executor.shutdown(wait=True, cancel_futures=True)


def _add_entries(builder: SliceBuilder, chunk: list, index: int) -> int:
    """Adds ledger entries (read from the bookies) from ``chunk[index]`` on to a slice
    until it is full; returns the index of the first entry not added. Runs in a worker
    thread."""
    while index < len(chunk) and not builder.full:
        entry = chunk[index]
        builder.add_entry(entry.entry_id, entry.payload)
        index += 1
    return index
