"""Under-replicated ledgers: what the auditor records in etcd and replication workers
act on. The record and the pure rule deciding which fragments of a ledger lack copies.

    /autorecovery/under-replicated/<ledger_id>  ->  UnderReplicatedRecord (JSON)

A fragment is under-replicated when one of its ensemble's bookies is *missing*: gone
(unregistered for longer than the grace period) or marked for decommissioning. Only
closed ledgers are recorded: an open ledger's last fragment is its writer's to change
(an ensemble change), and changing it under the writer would race its adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.metadata import LedgerMetadata
from metadata import json_record


@dataclass(frozen=True)
class UnderReplicatedRecord:
    ledger_id: int
    # Indices (into the ledger's fragment list) of fragments that name a missing bookie.
    fragment_indices: list[int]
    # The missing bookies those fragments name, as the auditor saw them.
    missing_bookies: list[str]
    marked_at_ms: int = 0
    auditor_id: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json_record.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> "UnderReplicatedRecord":
        return json_record.decode(cls, data, "under-replicated record")

    def same_finding(self, other: "UnderReplicatedRecord") -> bool:
        return (self.fragment_indices == other.fragment_indices
                and self.missing_bookies == other.missing_bookies)


def under_replicated_fragments(metadata: LedgerMetadata, missing: set[str]) -> tuple[list[int], list[str]]:
    """(fragment indices naming a missing bookie, those bookies sorted) of a closed
    ledger; empty for an open one or when nothing is missing. Pure."""
    if not metadata.is_closed or not missing:
        return [], []
    indices: list[int] = []
    named: set[str] = set()
    for index, fragment in enumerate(metadata.fragments):
        here = missing.intersection(fragment.bookies)
        if here:
            indices.append(index)
            named |= here
    return indices, sorted(named)


def fragment_entry_range(metadata: LedgerMetadata, index: int) -> range:
    """The entry ids fragment ``index`` of a closed ledger holds (may be empty: an
    ensemble change that no entry followed)."""
    assert metadata.is_closed
    first = metadata.fragments[index].first_entry_id
    last = metadata.fragment_last_entry_id(index, metadata.last_entry_id)
    return range(first, last + 1)
