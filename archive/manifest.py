"""The archive manifest: which ledgers of a topic are archived, in which files, kept in
etcd (the metadata store) under ``/archive/<topic>/<ledger_id>``, one record per
archived ledger. The records are JSON (LedgerRecord below); the store calls are the
shell around them.

A file counts as archived only once its ledger's record names it: the record is
created by compare-and-swap (``create``: the key must not exist) after every file of
the ledger was written, renamed and verified. So a crash at any earlier point leaves
no record (the files are orphans the GC removes, and a re-run archives the ledger
again under new names), and a record always names complete, verified files.

The record then changes twice at most, each time by compare-and-swap on the version
read: ``bookie_deleted_ms`` is set before the ledger's bookie copy is deleted (readers
switch to the archive first; a crash between the two leaves a bookie copy that the
next pass deletes again), and the record is deleted by the archive's GC before its
files are (a crash between leaves orphan files, never a record naming missing files).

Versions:
    1  first version: LedgerRecord and FileRecord as below.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from common.errors import MalformedFrame, MetadataKeyExists, MetadataVersionConflict
from metadata import keys
from metadata.store import MetadataStore

FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1
# A ledger's record lists its files; bounded so the record stays far below etcd's
# 1.5 MiB value limit (a FileRecord is about 300 bytes of JSON).
FILES_PER_LEDGER_MAX = 1024


@dataclass(frozen=True)
class FileRecord:
    url: str
    first_entry_id: int
    last_entry_id: int
    row_count: int
    size_bytes: int
    crc32c: int                  # of the whole file
    publish_time_ms_min: int
    publish_time_ms_max: int
    format_version: int


@dataclass(frozen=True)
class LedgerRecord:
    topic: str
    ledger_id: int
    entry_count: int
    files: tuple[FileRecord, ...]
    archived_ms: int             # when the record was created (wall clock)
    bookie_deleted_ms: int = 0   # 0: the bookies still hold the ledger
    format_version: int = FORMAT_VERSION
    version: int = field(default=0, compare=False)   # the store's version (not stored)

    def __post_init__(self) -> None:
        if not self.files or len(self.files) > FILES_PER_LEDGER_MAX:
            raise ValueError(f"a ledger record lists 1..{FILES_PER_LEDGER_MAX} files, not {len(self.files)}")
        expected = 0
        for record in self.files:
            if record.first_entry_id != expected or record.last_entry_id < record.first_entry_id:
                raise ValueError(f"files must cover entries 0..{self.entry_count - 1} in order")
            expected = record.last_entry_id + 1
        if expected != self.entry_count:
            raise ValueError(f"files cover {expected} entries, the ledger has {self.entry_count}")

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def row_count(self) -> int:
        return sum(f.row_count for f in self.files)

    @property
    def publish_time_ms_min(self) -> int:
        return min(f.publish_time_ms_min for f in self.files)

    @property
    def publish_time_ms_max(self) -> int:
        return max(f.publish_time_ms_max for f in self.files)

    def file_for_entry(self, entry_id: int) -> FileRecord | None:
        for record in self.files:
            if record.first_entry_id <= entry_id <= record.last_entry_id:
                return record
        return None

    def to_json(self) -> dict:
        doc = asdict(self)
        doc.pop("version")
        return doc

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, version: int = 0) -> "LedgerRecord":
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            format_version = doc.get("format_version")
            if not isinstance(format_version, int) or not FORMAT_VERSION_MIN <= format_version <= FORMAT_VERSION:
                raise ValueError(f"format_version {format_version!r} is not one this broker reads")
            files = tuple(FileRecord(**f) for f in doc.pop("files"))
            return cls(files=files, version=version, **doc)
        except (ValueError, TypeError, KeyError) as error:
            raise MalformedFrame(f"bad archive manifest record: {error}") from None


class Manifest:
    """The records of the topics' archives, in the metadata store."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def ledgers(self, topic_key_path: str) -> dict[int, LedgerRecord]:
        """Every archived ledger of a topic, by ledger id (ascending)."""
        records = await self._store.get_prefix(keys.archive_of_topic(topic_key_path))
        found = {}
        for record in records:
            ledger = LedgerRecord.decode(record.value, record.version)
            found[ledger.ledger_id] = ledger
        return dict(sorted(found.items()))

    async def topics(self) -> list[str]:
        """The key paths of every topic with an archive record."""
        records = await self._store.get_prefix(keys.ARCHIVE, keys_only=True)
        found = {record.key[len(keys.ARCHIVE):].rsplit("/", 1)[0] for record in records}
        return sorted(found)

    async def get(self, topic_key_path: str, ledger_id: int) -> LedgerRecord | None:
        record = await self._store.get(keys.archive_ledger(topic_key_path, ledger_id))
        return None if record is None else LedgerRecord.decode(record.value, record.version)

    async def create(self, topic_key_path: str, ledger: LedgerRecord) -> LedgerRecord:
        """Records an archived ledger; MetadataKeyExists if it already is (another
        attempt won: its files count, this attempt's are orphans)."""
        version = await self._store.create(keys.archive_ledger(topic_key_path, ledger.ledger_id), ledger.encode())
        return replace(ledger, version=version)

    async def mark_bookie_deleted(self, topic_key_path: str, ledger: LedgerRecord, now_ms: int) -> LedgerRecord:
        """Records that the bookie copy is (about to be) deleted; MetadataVersionConflict
        if the record changed since it was read."""
        assert ledger.version > 0, "a record read from the store"
        updated = replace(ledger, bookie_deleted_ms=now_ms)
        version = await self._store.compare_and_set(keys.archive_ledger(topic_key_path, ledger.ledger_id),
                                                    updated.encode(), expected_version=ledger.version)
        return replace(updated, version=version)

    async def remove(self, topic_key_path: str, ledger: LedgerRecord) -> None:
        """Deletes a ledger's record (its files are deleted after, by the caller)."""
        assert ledger.version > 0, "a record read from the store"
        await self._store.compare_and_delete(keys.archive_ledger(topic_key_path, ledger.ledger_id),
                                             expected_version=ledger.version)


__all__ = ["FileRecord", "LedgerRecord", "Manifest", "MetadataKeyExists", "MetadataVersionConflict"]
