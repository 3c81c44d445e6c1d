"""What etcd keeps of a managed ledger under ``/managed-ledgers/<topic>``. Pure (JSON).

The list of the topic's ledgers in order, with each closed ledger's entry count and
size once known (-1 while a ledger is open or its count is not yet recorded; the
ledger's own metadata is the authority) and when it was created and closed, whether
the topic is terminated and at which position, and free-form properties. Only the
owner writes it, by compare-and-swap.

Versions:
    1  first version. ``closed_ms`` (an object from ledger id to close time, for
       retention) was added later without a version bump: brokers that predate it
       ignore it, so they can still read records written by newer ones during a
       rolling upgrade; a record without it reads a closed ledger's creation time as
       its close time (what retention used before).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from common.position import Position
from common.errors import MalformedFrame

FORMAT_VERSION = 1

# Who owns a ledger, written into its metadata's ``custom`` when it is created: the
# managed ledger (topic name, as ``str(TopicName)``) and what the ledger is for. The
# ledger collector (managed_ledger/ledger_gc.py) deletes only ledgers tagged with both, with a
# purpose it knows the references of (managed_ledger/ledger_references.py): a ledger kind
# added without teaching the collector where it is recorded is never collected.
OWNER_TAG = "managed-ledger"
PURPOSE_TAG = "purpose"
PURPOSE_LEDGER = "ledger"          # one of the topic's ledgers (the ledger list)
PURPOSE_COMPACTED = "compacted"    # a compacted ledger (the magnetar.compaction property)
PURPOSE_CURSOR = "cursor"          # a subscription's cursor ledger (its etcd pointer)


def ownership_tags(owner: str, purpose: str) -> dict[str, str]:
    """The ``custom`` metadata of a ledger ``owner`` creates for ``purpose``."""
    assert owner, "a ledger's owner is a topic name"
    assert purpose in (PURPOSE_LEDGER, PURPOSE_COMPACTED, PURPOSE_CURSOR), purpose
    return {OWNER_TAG: owner, PURPOSE_TAG: purpose}


@dataclass
class LedgerInfo:
    ledger_id: int
    entries: int = -1        # -1: unknown (open, or not yet recorded)
    size_bytes: int = -1
    created_ms: int = 0
    closed_ms: int = 0       # 0: not closed yet (or closed before this was recorded)

    @property
    def known(self) -> bool:
        return self.entries >= 0


@dataclass
class ManagedLedgerInfo:
    ledgers: list[LedgerInfo] = field(default_factory=list)
    terminated_position: Position | None = None
    properties: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0

    def encode(self) -> bytes:
        return json.dumps({
            "format_version": FORMAT_VERSION,
            "ledgers": [[i.ledger_id, i.entries, i.size_bytes, i.created_ms] for i in self.ledgers],
            "closed_ms": {str(i.ledger_id): i.closed_ms for i in self.ledgers if i.closed_ms > 0},
            "terminated_position": list(self.terminated_position) if self.terminated_position else None,
            "properties": self.properties,
            "created_ms": self.created_ms,
        }, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "ManagedLedgerInfo":
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format_version", 0) > FORMAT_VERSION:
                raise ValueError("unknown format")
            ledgers = [LedgerInfo(int(a), int(b), int(c), int(d)) for a, b, c, d in doc["ledgers"]]
            closed_ms = doc.get("closed_ms") or {}
            if not isinstance(closed_ms, dict):
                raise ValueError("closed_ms must be an object")
            for info in ledgers:
                if info.known:
                    info.closed_ms = int(closed_ms.get(str(info.ledger_id), info.created_ms))
            terminated = doc.get("terminated_position")
            properties = doc.get("properties") or {}
            if not isinstance(properties, dict):
                raise ValueError("properties must be an object")
            ids = [i.ledger_id for i in ledgers]
            if ids != sorted(set(ids)):
                raise ValueError("ledger ids must increase")
            return cls(ledgers=ledgers,
                       terminated_position=Position(int(terminated[0]), int(terminated[1])) if terminated else None,
                       properties={str(k): str(v) for k, v in properties.items()},
                       created_ms=int(doc.get("created_ms", 0)))
        except (ValueError, KeyError, TypeError) as error:
            raise MalformedFrame(f"bad managed ledger record: {error}") from None
