"""One topic's archive as its owner sees it (for broker/archiver.py): the manifest
records of its archived ledgers, the status of the last offload, and reads of ledgers
whose bookie copy is gone."""

from __future__ import annotations

from dataclasses import dataclass, field

from archive.manifest import LedgerRecord
from common.position import ManagedEntry, Position
from common.topic_name import TopicName
from managed_ledger.archive_reads import ArchiveReads


@dataclass
class OffloadStatus:
    """Pulsar's OffloadProcessStatus, for GET …/offload."""

    state: str = "NOT_RUN"         # NOT_RUN, RUNNING, SUCCESS, ERROR
    last_error: str = ""
    first_unarchived: Position | None = None
    ledgers_archived: int = 0

    def to_json(self, partition_index: int) -> dict:
        first = self.first_unarchived or Position(-1, -1)
        return {"status": self.state, "lastError": self.last_error,
                "firstUnoffloadedMessage": {"ledgerId": first.ledger_id, "entryId": first.entry_id,
                                            "partitionIndex": partition_index},
                "ledgersArchived": self.ledgers_archived}


@dataclass
class TopicArchive:
    """One topic's archive as its owner sees it: the manifest records, read-through to
    the archive for ledgers the bookies no longer hold (the managed ledger's
    ``ArchivedLedgers``)."""

    name: TopicName
    reads: ArchiveReads
    records: dict[int, LedgerRecord] = field(default_factory=dict)
    status: OffloadStatus = field(default_factory=OffloadStatus)
    requested_upto: Position | None = None
    # Records marked bookie_deleted whose bookie copy is known gone.
    released: set[int] = field(default_factory=set)
    # When the archive's directory was last listed for orphans (monotonic seconds).
    listed_at: float = float("-inf")

    def archived(self, ledger_id: int) -> bool:
        return ledger_id in self.records

    def serves(self, ledger_id: int) -> bool:
        record = self.records.get(ledger_id)
        return record is not None and record.bookie_deleted_ms > 0

    def _following(self, ledger_id: int) -> LedgerRecord | None:
        later = [r for l, r in self.records.items() if l > ledger_id and r.bookie_deleted_ms > 0]
        return later[0] if later else None

    async def read(self, ledger_id: int, first: int, last: int, bytes_max: int) -> list[ManagedEntry]:
        record = self.records[ledger_id]
        return await self.reads.read(record, first, min(last, record.entry_count - 1), bytes_max, self._following)
