"""A subscription's acknowledgements pending in open transactions (pure).

An ACK that carries a transaction id does not move the cursor: it is held here until
the coordinator ends the transaction. Commit applies it to the cursor; abort drops it
and the messages are delivered again. A message is pending in at most one transaction
at a time: a second transaction acknowledging it gets TransactionConflict (Pulsar's
rule), which is what makes consume-transform-produce exactly once when a message is
delivered twice (a redelivery after a crash): only one of the two transactions that
processed it can commit its acknowledgement.

Entries are (position, ack_set words or None, batch_size) as the ACK carried them.
"""

from __future__ import annotations

import json

from common.errors import MetadataError, NotAllowed, TransactionConflict
from common.position import Position
from transactions.records import TxnId

PendingAck = tuple[Position, tuple[int, ...] | None, int]
# Per transaction and subscription: 10,000 acknowledged entries keep the etcd record
# (about 40 bytes an entry) near 400 KiB, under etcd's 1.5 MiB value limit.
ACKS_PER_TXN_MAX = 10_000


class PendingAcks:
    def __init__(self) -> None:
        self.by_txn: dict[TxnId, dict[Position, PendingAck]] = {}
        self._owner: dict[Position, TxnId] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def check(self, txn_id: TxnId, acks: list[PendingAck]) -> None:
        """TransactionConflict if another open transaction holds one of ``acks``."""
        held = self.by_txn.get(txn_id, {})
        for position, _ack_set, _size in acks:
            owner = self._owner.get(position)
            if owner is not None and owner != txn_id:
                raise TransactionConflict(f"message {position} is acknowledged in transaction {owner} already")
        if len(held) + len(acks) > ACKS_PER_TXN_MAX:
            raise NotAllowed(f"transaction {txn_id} would hold more than {ACKS_PER_TXN_MAX} acknowledgements "
                             "on one subscription")

    def add(self, txn_id: TxnId, acks: list[PendingAck]) -> None:
        self.check(txn_id, acks)
        held = self.by_txn.setdefault(txn_id, {})
        for ack in acks:
            held[ack[0]] = ack
            self._owner[ack[0]] = txn_id

    def remove(self, txn_id: TxnId, positions: list[Position]) -> None:
        """Undoes an ``add`` that could not be made durable."""
        held = self.by_txn.get(txn_id, {})
        for position in positions:
            if held.pop(position, None) is not None:
                del self._owner[position]
        if not held:
            self.by_txn.pop(txn_id, None)

    def take(self, txn_id: TxnId) -> list[PendingAck]:
        held = self.by_txn.pop(txn_id, {})
        for position in held:
            del self._owner[position]
        return list(held.values())

    def is_pending(self, position: Position) -> bool:
        return position in self._owner

    def encode(self, txn_id: TxnId) -> bytes:
        held = self.by_txn.get(txn_id, {})
        return json.dumps([[p.ledger_id, p.entry_id, list(a) if a else None, size]
                           for p, a, size in held.values()], separators=(",", ":")).encode()


def decode_acks(data: bytes) -> list[PendingAck]:
    try:
        return [(Position(int(ledger_id), int(entry_id)), tuple(int(w) for w in ack_set) if ack_set else None,
                 int(size)) for ledger_id, entry_id, ack_set, size in json.loads(data)]
    except (ValueError, TypeError) as error:
        raise MetadataError(f"undecodable pending acknowledgements: {error}") from None
