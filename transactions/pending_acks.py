"""A subscription's acknowledgements pending in open transactions (pure): Pulsar's
pending-ack state.

An ACK that carries a transaction id does not move the cursor: it is held here until
the coordinator ends the transaction. Commit applies it to the cursor; abort drops it
and the messages are delivered again. While it is held, the message is neither
delivered nor redelivered to any consumer of the subscription (``holds``: the
dispatcher asks, subscriptions/ports.HeldAcks): a consumer that leaves, a client that
asks for its unacknowledged messages again, a broker that loads the topic after a
restart — none of them brings it back before the transaction ends.

Two kinds, as in Pulsar:

- **individual** (every subscription mode): a message is pending in at most one
  transaction at a time; a second transaction acknowledging it gets
  TransactionConflict (Pulsar's rule), which is what makes consume-transform-produce
  exactly once when a message is delivered twice (only one of the two transactions
  that processed it can commit its acknowledgement).
- **cumulative** (exclusive and failover only; the caller checks the mode): at most
  one transaction per subscription holds one, a position; everything up to it is held.
  Pulsar's conflicts: a position at or before the mark-delete position, a second
  transaction's cumulative acknowledgement, or the same transaction's not past its
  own. Stricter than Pulsar (which does not cross-check the two kinds): an individual
  acknowledgement under another transaction's cumulative one, or a cumulative one over
  another transaction's individual ones, conflicts too — else both transactions could
  commit the same message.

Entries are (position, ack_set words or None, batch_size) as the ACK carried them;
``ack_set`` words are the batch's messages left unacknowledged (the cursor's meaning).
A batch acknowledged only in part is still delivered, without the messages held
(``unheld_bits``: the dispatcher masks them out of the ack set it sends); conflicts are
checked per entry, not per message of a batch (stricter than Pulsar).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from common.errors import MetadataError, NotAllowed, TransactionConflict
from common.position import Position
from transactions.records import TxnId

PendingAck = tuple[Position, tuple[int, ...] | None, int]
# Per transaction and subscription: 10,000 acknowledged entries keep the etcd record
# (about 40 bytes an entry) near 400 KiB, under etcd's 1.5 MiB value limit.
ACKS_PER_TXN_MAX = 10_000


@dataclass(frozen=True, slots=True)
class TxnAcks:
    """One transaction's pending acknowledgements on one subscription (its etcd record)."""

    individual: tuple[PendingAck, ...] = ()
    cumulative: PendingAck | None = None


def _whole(ack: PendingAck) -> bool:
    """Whether the acknowledgement covers its whole entry (no batch message left)."""
    ack_set = ack[1]
    return ack_set is None or not any(ack_set)


def _bits(words: tuple[int, ...]) -> int:
    """Ack-set words (int64s, as on the wire) as one int, bit i for message i."""
    value = 0
    for index, word in enumerate(words):
        value |= (word & 0xFFFFFFFFFFFFFFFF) << (64 * index)
    return value


def _merged(old: PendingAck | None, new: PendingAck) -> PendingAck:
    """The same transaction acknowledging more of one entry: the messages left are
    those neither left (the ack-set words AND-ed; None is the whole entry)."""
    if old is None:
        return new
    if old[1] is None or new[1] is None:
        return (new[0], None, max(old[2], new[2]))
    words = max(len(old[1]), len(new[1]))
    a = old[1] + (0,) * (words - len(old[1]))
    b = new[1] + (0,) * (words - len(new[1]))
    return (new[0], tuple(x & y for x, y in zip(a, b)), max(old[2], new[2]))


class PendingAcks:
    def __init__(self) -> None:
        self.by_txn: dict[TxnId, dict[Position, PendingAck]] = {}
        self._owner: dict[Position, TxnId] = {}
        # The one cumulative acknowledgement pending on the subscription, if any.
        self.cumulative: tuple[TxnId, PendingAck] | None = None

    def __len__(self) -> int:
        return len(self._owner) + (self.cumulative is not None)

    @property
    def txns(self) -> set[TxnId]:
        found = set(self.by_txn)
        if self.cumulative is not None:
            found.add(self.cumulative[0])
        return found

    # --- individual ------------------------------------------------------------------------

    def check(self, txn_id: TxnId, acks: list[PendingAck]) -> None:
        """TransactionConflict if another open transaction holds one of ``acks``."""
        held = self.by_txn.get(txn_id, {})
        cumulative = self.cumulative
        for position, _ack_set, _size in acks:
            owner = self._owner.get(position)
            if owner is not None and owner != txn_id:
                raise TransactionConflict(f"message {position} is acknowledged in transaction {owner} already")
            if cumulative is not None and cumulative[0] != txn_id and position <= cumulative[1][0]:
                raise TransactionConflict(f"message {position} is within transaction {cumulative[0]}'s cumulative "
                                          f"acknowledgement (up to {cumulative[1][0]})")
        fresh = {position for position, _a, _s in acks if position not in held}
        if len(held) + len(fresh) > ACKS_PER_TXN_MAX:
            raise NotAllowed(f"transaction {txn_id} would hold more than {ACKS_PER_TXN_MAX} acknowledgements "
                             "on one subscription")

    def add(self, txn_id: TxnId, acks: list[PendingAck]) -> list[PendingAck | None]:
        """Holds ``acks`` (after ``check``); returns what each replaced, for ``undo``."""
        self.check(txn_id, acks)
        held = self.by_txn.setdefault(txn_id, {})
        replaced: list[PendingAck | None] = []
        for ack in acks:
            previous = held.get(ack[0])
            replaced.append(previous)
            held[ack[0]] = _merged(previous, ack)
            self._owner[ack[0]] = txn_id
        return replaced

    def undo(self, txn_id: TxnId, acks: list[PendingAck], replaced: list[PendingAck | None]) -> None:
        """Takes back an ``add`` that could not be made durable."""
        held = self.by_txn.get(txn_id, {})
        for ack, previous in reversed(list(zip(acks, replaced))):
            if previous is not None:
                held[ack[0]] = previous
            elif held.pop(ack[0], None) is not None:
                del self._owner[ack[0]]
        if not held:
            self.by_txn.pop(txn_id, None)

    def remove(self, txn_id: TxnId, positions: list[Position]) -> None:
        """Drops positions held by ``txn_id``."""
        held = self.by_txn.get(txn_id, {})
        for position in positions:
            if held.pop(position, None) is not None:
                del self._owner[position]
        if not held:
            self.by_txn.pop(txn_id, None)

    # --- cumulative ------------------------------------------------------------------------

    def check_cumulative(self, txn_id: TxnId, ack: PendingAck, mark_delete: Position) -> None:
        position = ack[0]
        if position <= mark_delete:
            raise TransactionConflict(f"cumulative acknowledgement of {position} in transaction {txn_id}: the "
                                      f"subscription has acknowledged up to {mark_delete} already")
        cumulative = self.cumulative
        if cumulative is not None:
            owner, held = cumulative
            if owner != txn_id:
                raise TransactionConflict(f"transaction {owner} holds a cumulative acknowledgement (up to "
                                          f"{held[0]}) on this subscription")
            if position < held[0] or (position == held[0] and (held[1] is None or ack[1] is not None
                                                               and _merged(held, ack) == held)):
                raise TransactionConflict(f"cumulative acknowledgement of {position} in transaction {txn_id} is "
                                          f"not past its own (up to {held[0]})")
        for held_position, owner in self._owner.items():
            if owner != txn_id and mark_delete < held_position <= position:
                raise TransactionConflict(f"message {held_position} is acknowledged in transaction {owner}, "
                                          f"within the cumulative acknowledgement of {position}")

    def add_cumulative(self, txn_id: TxnId, ack: PendingAck, mark_delete: Position
                       ) -> tuple[TxnId, PendingAck] | None:
        """Holds a cumulative acknowledgement (after ``check_cumulative``); returns the
        one it replaced (``restore_cumulative`` puts it back)."""
        self.check_cumulative(txn_id, ack, mark_delete)
        previous = self.cumulative
        self.cumulative = (txn_id, ack)
        return previous

    def restore_cumulative(self, previous: tuple[TxnId, PendingAck] | None) -> None:
        self.cumulative = previous

    # --- ends ------------------------------------------------------------------------------

    def take(self, txn_id: TxnId) -> TxnAcks:
        held = self.by_txn.pop(txn_id, {})
        for position in held:
            del self._owner[position]
        cumulative = None
        if self.cumulative is not None and self.cumulative[0] == txn_id:
            cumulative, self.cumulative = self.cumulative[1], None
        return TxnAcks(tuple(held.values()), cumulative)

    def restore(self, txn_id: TxnId, acks: TxnAcks) -> None:
        """A recovered record (loading the topic): held again as written."""
        if acks.individual:
            held = self.by_txn.setdefault(txn_id, {})
            for ack in acks.individual:
                held[ack[0]] = _merged(held.get(ack[0]), ack)
                self._owner[ack[0]] = txn_id
        if acks.cumulative is not None and (self.cumulative is None or self.cumulative[1][0] < acks.cumulative[0]):
            self.cumulative = (txn_id, acks.cumulative)

    # --- what the dispatcher asks ----------------------------------------------------------

    def is_pending(self, position: Position) -> bool:
        return position in self._owner

    def holds(self, position: Position) -> bool:
        """Whether ``position`` is acknowledged whole in an open transaction: not to be
        delivered (nor redelivered) until it ends."""
        if self.cumulative is not None:
            held = self.cumulative[1]
            if position < held[0] or (position == held[0] and _whole(held)):
                return True
        txn_id = self._owner.get(position)
        if txn_id is None:
            return False
        return _whole(self.by_txn[txn_id][position])

    def unheld_bits(self, position: Position) -> int | None:
        """For a batch acknowledged in part in open transactions: its messages left to
        deliver, as ack-set bits (bit i set: message i is not held); None when no part
        of it is held (``holds`` answers for whole entries)."""
        bits = None
        txn_id = self._owner.get(position)
        if txn_id is not None:
            ack = self.by_txn[txn_id][position]
            if not _whole(ack):
                bits = _bits(ack[1])
        if self.cumulative is not None:
            held = self.cumulative[1]
            if position == held[0] and not _whole(held):
                bits = _bits(held[1]) if bits is None else bits & _bits(held[1])
        return bits

    # --- the etcd record -------------------------------------------------------------------

    def encode(self, txn_id: TxnId) -> bytes:
        """The record of ``txn_id``: a list of its individual acknowledgements (the first
        format), or an object when it holds a cumulative one."""
        individual = [_encode_ack(ack) for ack in self.by_txn.get(txn_id, {}).values()]
        if self.cumulative is None or self.cumulative[0] != txn_id:
            return json.dumps(individual, separators=(",", ":")).encode()
        return json.dumps({"individual": individual, "cumulative": _encode_ack(self.cumulative[1])},
                          separators=(",", ":")).encode()


def _encode_ack(ack: PendingAck) -> list:
    position, ack_set, size = ack
    return [position.ledger_id, position.entry_id, list(ack_set) if ack_set else None, size]


def _decode_ack(item) -> PendingAck:
    ledger_id, entry_id, ack_set, size = item
    return (Position(int(ledger_id), int(entry_id)), tuple(int(w) for w in ack_set) if ack_set else None, int(size))


def decode_acks(data: bytes) -> TxnAcks:
    try:
        value = json.loads(data)
        if isinstance(value, list):
            return TxnAcks(tuple(_decode_ack(item) for item in value))
        if not isinstance(value, dict):
            raise TypeError(f"a {type(value).__name__}, not a list or an object")
        cumulative = value.get("cumulative")
        return TxnAcks(tuple(_decode_ack(item) for item in value.get("individual", [])),
                       _decode_ack(cumulative) if cumulative is not None else None)
    except (ValueError, TypeError) as error:
        raise MetadataError(f"undecodable pending acknowledgements: {error}") from None
