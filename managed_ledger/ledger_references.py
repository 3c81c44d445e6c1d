"""Where ledgers are recorded: every place a topic (a managed ledger) keeps the id of a
ledger it created, read from etcd in one function, ``read_references``. The ledger
collector (managed_ledger/ledger_gc.py) keeps every ledger named here.

Every ledger a broker creates is tagged in its metadata's ``custom`` with its owner and
purpose (``ownership_tags`` in managed_ledger/managed_ledger_info.py). The sources, checked
for every ledger of the owner whatever its purpose (a ledger named anywhere is kept):

| purpose     | created by                                   | recorded in (etcd)                                          |
|-------------|----------------------------------------------|-------------------------------------------------------------|
| `ledger`    | `ManagedLedger._start_new_ledger` (open, rollover) | `/managed-ledgers/<topic>`: the ledger list            |
| `compacted` | `compact` (managed_ledger/compaction.py) via `create_side_ledger` | the same record's property `magnetar.compaction`  |
| `cursor`    | `LedgerCursorStore._save_snapshot` (subscriptions/cursor_store.py) | `/cursors/<topic>/<subscription>`: `cursor_ledger` |
| any         | —                                            | `/archive/<topic>/<ledger id>`: an archive manifest record  |

The archive row is there to be safe: the archiver lists only ledgers the topic lists,
and deletes the bookie copy (the metadata) of an archived ledger itself, after marking
its record; a ledger with a record is left to it.

Looked at and holding no ledger of their own (2026-11): deduplication snapshots (a
property of the managed-ledger record naming a position of the topic's own ledgers),
the topic epoch (a property), schemas (`/schemas/<topic>`, in etcd), delayed delivery
and its overflow (in memory, over the topic's own entries), retention and TTL (they
delete the topic's ledgers), `magnetar shell simpletest` (untagged ledgers).

A new kind of ledger must get a purpose in managed_ledger/managed_ledger_info.py and a row
here: the collector refuses purposes it does not know (``KNOWN_PURPOSES``), so a ledger
kind nobody taught it about leaks instead of being deleted.

Each reference set comes with ``guards``: the etcd version of every record that could
come to name any ledger of the owner, as read (0: absent): the managed-ledger record
and each cursor pointer (archive records name only their own ledger; the delete
compares that one's absence). The collector deletes a ledger in one transaction with these
compares, so a record changed after the references were read (a reference added)
makes the delete fail. See managed_ledger/ledger_gc.py for the whole race analysis.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from managed_ledger.compacted_ledger import CompactionRecord
from managed_ledger.compaction import COMPACTION_PROPERTY
from managed_ledger.managed_ledger_info import PURPOSE_COMPACTED, PURPOSE_CURSOR, PURPOSE_LEDGER, ManagedLedgerInfo
from common.errors import InvalidArgument, MalformedFrame
from common.topic_name import TopicName
from metadata import keys
from metadata.store import Compare, MetadataStore

# The purposes whose references read_references knows.
KNOWN_PURPOSES = frozenset({PURPOSE_LEDGER, PURPOSE_COMPACTED, PURPOSE_CURSOR})
# etcd refuses a transaction of more than 128 compares or operations (its default
# --max-txn-ops); a topic whose references span more records than this cannot be
# guarded and its ledgers are not collected (more than ~117 durable subscriptions).
GUARDS_MAX = 120


@dataclass(frozen=True)
class References:
    """What one owner references, and the record versions it was read at."""

    owner: str
    exists: bool                    # the managed-ledger record exists (the topic was not deleted)
    ledger_ids: frozenset[int]
    guards: tuple[Compare, ...]     # every record read, at the version read (0: absent)


def owner_topic(owner: str) -> TopicName | None:
    """The topic an owner tag names, or None when it names none (never collected)."""
    try:
        topic = TopicName.parse(owner)
    except InvalidArgument:
        return None
    return topic if str(topic) == owner else None


async def read_references(store: MetadataStore, topic: TopicName, *, call_timeout_s: float = 10.0) -> References:
    """Every ledger ``topic`` references (the table above). Raises MalformedFrame when a
    record cannot be decoded, TimeoutError when one of its etcd calls takes longer than
    ``call_timeout_s``, and lets store errors through: the caller then knows nothing
    and must keep the ledger."""
    path = topic.key_path
    ledger_ids: set[int] = set()
    guards: list[Compare] = []

    # The managed-ledger record: its ledger list and the compaction property.
    async with asyncio.timeout(call_timeout_s):
        record = await store.get(keys.managed_ledger(path))
    guards.append(Compare(keys.managed_ledger(path), record.version if record is not None else 0))
    if record is not None:
        info = ManagedLedgerInfo.decode(record.value)
        ledger_ids.update(ledger.ledger_id for ledger in info.ledgers)
        compaction = info.properties.get(COMPACTION_PROPERTY)
        if compaction is not None:
            compacted = CompactionRecord.decode(compaction)   # None: a version-1 record, no ledger
            if compacted is not None:
                ledger_ids.add(compacted.ledger_id)

    # The cursor pointers of its subscriptions.
    async with asyncio.timeout(call_timeout_s):
        pointers = await store.get_prefix(keys.cursors_of_topic(path))
    for pointer in pointers:
        guards.append(Compare(pointer.key, pointer.version))
        ledger_ids.add(_cursor_ledger(pointer.key, pointer.value))

    # Its archive manifest: one record per archived ledger, keyed by the ledger id. No
    # guard per record: a record names only its own ledger, so the delete compares the
    # absence of the deleted ledger's own record instead (ledger_gc.delete_guards).
    async with asyncio.timeout(call_timeout_s):
        archived_records = await store.get_prefix(keys.archive_of_topic(path), keys_only=True)
    for archived in archived_records:
        suffix = archived.key.rsplit("/", 1)[-1]
        if not suffix.isdigit():
            raise MalformedFrame(f"archive manifest key {archived.key} does not end in a ledger id")
        ledger_ids.add(int(suffix))
    ledger_ids.discard(-1)
    return References(str(topic), record is not None, frozenset(ledger_ids), tuple(guards))


def _cursor_ledger(key: str, value: bytes) -> int:
    """The cursor ledger a pointer names (-1: its state is inline)."""
    try:
        pointer = json.loads(value)
        return int(pointer.get("cursor_ledger", -1))
    except (ValueError, TypeError, AttributeError) as error:
        raise MalformedFrame(f"bad cursor pointer {key}: {error}") from None
