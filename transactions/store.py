"""Transactions' durable state in etcd (the shell of records.py and pending_acks.py).

Why etcd and not a ledger: a coordinator's records are small, short-lived (written at
NEW_TXN, when partitions or subscriptions join, at the decision; deleted once every
participant is told) and need compare-and-swap, so that two brokers that both believe
they serve one coordinator (a hand-over in flight) cannot both decide one transaction.
etcd gives that with one round trip and no log to replay, compact or trim; the cost is
etcd's write rate (a few thousand writes/s for the whole cluster), about four writes per
transaction plus one per transactional acknowledgement batch. A transaction log on the
bookies (Pulsar's ``__transaction_log_N``) scales further and is the way to go past
that; docs/transactions.md says so.
"""

from __future__ import annotations

from common.errors import MetadataError, MetadataVersionConflict, TransactionNotFound
from metadata import keys
from metadata.store import MetadataStore
from transactions.pending_acks import TxnAcks, decode_acks
from transactions.records import TxnId, TxnRecord

# Ids of one coordinator: the counter is 63 bits so that ids stay Java longs.
_SEQUENCE_MAX = 2**63 - 1


class CoordinatorStore:
    def __init__(self, store: MetadataStore, coordinator_id: int) -> None:
        self._store = store
        self.coordinator_id = coordinator_id
        self._versions: dict[TxnId, int] = {}

    async def next_txn_id(self) -> TxnId:
        sequence = await self._store.increment(keys.transaction_id_counter(self.coordinator_id))
        assert 0 < sequence < _SEQUENCE_MAX, sequence
        return TxnId(self.coordinator_id, sequence)

    async def load(self) -> list[TxnRecord]:
        records = []
        for stored in await self._store.get_prefix(keys.transactions_of_coordinator(self.coordinator_id)):
            record = TxnRecord.decode(stored.value)
            if record.txn_id.most != self.coordinator_id:
                raise MetadataError(f"transaction {record.txn_id} is stored under coordinator "
                                    f"{self.coordinator_id}")
            self._versions[record.txn_id] = stored.version
            records.append(record)
        return records

    async def write(self, record: TxnRecord) -> None:
        """Creates or replaces the record, compare-and-swap on the version this store
        last wrote or read: a concurrent writer (another broker serving this
        coordinator for a moment) makes it fail with MetadataVersionConflict."""
        key = keys.transaction(self.coordinator_id, record.txn_id.least)
        expected = self._versions.get(record.txn_id, 0)
        try:
            self._versions[record.txn_id] = await self._store.compare_and_set(
                key, record.encode(), expected_version=expected)
        except MetadataVersionConflict:
            self._versions.pop(record.txn_id, None)
            raise

    async def delete(self, txn_id: TxnId) -> None:
        expected = self._versions.pop(txn_id, None)
        if expected is None:
            raise TransactionNotFound(f"transaction {txn_id} has no record")
        await self._store.compare_and_delete(keys.transaction(self.coordinator_id, txn_id.least),
                                             expected_version=expected)


class PendingAckStore:
    """One record per (subscription, transaction) holding its pending acknowledgements,
    written before the ACK is answered so that a new owner of the topic still knows
    them (a commit after a broker crash applies them; an abort releases them)."""

    def __init__(self, store: MetadataStore, topic_key_path: str) -> None:
        self._store = store
        self._topic_key_path = topic_key_path

    async def write(self, subscription: str, txn_id: TxnId, data: bytes) -> None:
        await self._store.put(keys.pending_acks(self._topic_key_path, subscription, txn_id.text), data)

    async def delete(self, subscription: str, txn_id: TxnId) -> None:
        await self._store.delete(keys.pending_acks(self._topic_key_path, subscription, txn_id.text))

    async def load(self) -> dict[str, dict[TxnId, TxnAcks]]:
        from urllib.parse import unquote

        prefix = keys.pending_acks_of_topic(self._topic_key_path)
        found: dict[str, dict[TxnId, TxnAcks]] = {}
        for stored in await self._store.get_prefix(prefix):
            subscription, _, txn_text = stored.key[len(prefix):].rpartition("/")
            found.setdefault(unquote(subscription), {})[TxnId.parse(txn_text)] = decode_acks(stored.value)
        return found

    async def delete_subscription(self, subscription: str) -> None:
        """Every record of one subscription (it was deleted)."""
        await self._store.delete_prefix(keys.pending_acks_of_subscription(self._topic_key_path, subscription))

    async def delete_all(self) -> None:
        await self._store.delete_prefix(keys.pending_acks_of_topic(self._topic_key_path))
