"""A topic's transaction buffer (pure): which of its stored entries readers may see.

Transactional sends are appended to the topic's managed ledger like any other, with
the transaction id in their message metadata. What keeps them from consumers until
the commit is the **max read position**: no subscription reads past the entry before
the first one the oldest open transaction may own. When a transaction first sends to
the topic, its *bound* is the topic's last confirmed position at that moment (every
later entry may be its); readers stop at the smallest bound of the open transactions,
and at the last confirmed entry when none is open. (Pulsar's TopicTransactionBuffer
does the same; later non-transactional entries wait behind an open transaction too,
for at most its timeout.)

Ending a transaction on the topic appends a **marker** entry (MessageMetadata
``marker_type`` TXN_COMMIT or TXN_ABORT with the transaction id), so the outcome is in
the topic itself and a new owner rebuilds this buffer by reading the entries after the
slowest cursor (``replay``). An aborted transaction's id is kept in ``aborted`` with
its marker's position, so dispatch skips (and acknowledges for the subscription) its
entries; it is forgotten once the ledgers before its marker are trimmed (no entry of
it can be read then). Markers are skipped the same way.

Invariants: the max read position never passes an open transaction's bound; an id is
in at most one of ``open``, ``aborted`` and ``committed``; ``committed`` (recently
committed ids, bounded) and ``aborted`` refuse a late send of an ended transaction,
which would otherwise open it again with no coordinator left to end it.
"""

from __future__ import annotations

import collections

from common.errors import InvalidTxnStatus, Overloaded
from common.position import Position
from transactions.records import TxnId

# MessageMetadata.marker_type values (Pulsar's MarkerType).
MARKER_TXN_COMMIT = 21
MARKER_TXN_ABORT = 22
TXN_MARKERS = frozenset((MARKER_TXN_COMMIT, MARKER_TXN_ABORT))
# Committed ids remembered per topic to refuse late sends (each a few dozen bytes).
COMMITTED_REMEMBERED = 10_000


class TransactionBuffer:
    def __init__(self, *, open_max: int, aborted_max: int) -> None:
        assert open_max > 0 and aborted_max > 0
        self._open_max = open_max
        self._aborted_max = aborted_max
        # Open transactions that sent here, in order of their first send: id -> bound.
        self.open: dict[TxnId, Position] = {}
        self.aborted: dict[TxnId, Position] = {}
        self.committed: collections.OrderedDict[TxnId, None] = collections.OrderedDict()
        # Set once any transactional entry or marker is known in the topic: until then
        # readers need not look at entries' metadata at all.
        self.used = False

    # --- sends --------------------------------------------------------------------------------

    def begin(self, txn_id: TxnId, last_confirmed: Position) -> bool:
        """A transactional send to this topic; True when it opens ``txn_id`` here (the
        caller records that the topic holds transactional entries)."""
        if txn_id in self.open:
            return False
        if txn_id in self.aborted or txn_id in self.committed:
            raise InvalidTxnStatus(f"transaction {txn_id} has ended on this topic")
        if len(self.open) >= self._open_max:
            raise Overloaded(f"{len(self.open)} transactions are open on this topic, the most allowed")
        self.open[txn_id] = last_confirmed
        self.used = True
        return True

    def max_read_position(self, last_confirmed: Position) -> Position:
        for bound in self.open.values():   # the first is the oldest bound (insertion order)
            return min(bound, last_confirmed)
        return last_confirmed

    # --- ends ---------------------------------------------------------------------------------

    def end(self, txn_id: TxnId, *, commit: bool) -> None:
        """The coordinator's decision for ``txn_id`` on this topic (before its marker is
        appended: an aborted transaction's entries are hidden from that moment, a
        committed one's readable). A repeated decision is no change; the opposite one
        InvalidTxnStatus."""
        if commit and txn_id in self.aborted:
            raise InvalidTxnStatus(f"transaction {txn_id} was aborted on this topic")
        if not commit and txn_id in self.committed:
            raise InvalidTxnStatus(f"transaction {txn_id} was committed on this topic")
        self.open.pop(txn_id, None)
        self.used = True
        if commit:
            self._remember_committed(txn_id)
        elif txn_id not in self.aborted:
            if len(self.aborted) >= self._aborted_max:
                raise Overloaded(f"{len(self.aborted)} aborted transactions are kept on this topic, the most "
                                 "allowed (they are forgotten as the topic's ledgers are trimmed)")
            # The marker's position is not known yet: until it is, the topic's end.
            self.aborted[txn_id] = Position(2**63 - 1, 2**63 - 1)

    def marker_stored(self, txn_id: TxnId, position: Position) -> None:
        if txn_id in self.aborted:
            self.aborted[txn_id] = position

    def _remember_committed(self, txn_id: TxnId) -> None:
        self.committed[txn_id] = None
        self.committed.move_to_end(txn_id)
        while len(self.committed) > COMMITTED_REMEMBERED:
            self.committed.popitem(last=False)

    def forget_trimmed(self, first_position: Position) -> int:
        """Drops aborted ids whose marker lies before the topic's first kept entry."""
        gone = [txn_id for txn_id, marker in self.aborted.items() if marker < first_position]
        for txn_id in gone:
            del self.aborted[txn_id]
        return len(gone)

    # --- reading ------------------------------------------------------------------------------

    def hides(self, txn_id: TxnId | None, marker_type: int) -> bool:
        """Whether an entry (its transaction id, its marker type) is never delivered."""
        return marker_type in TXN_MARKERS or (txn_id is not None and txn_id in self.aborted)

    # --- recovery -----------------------------------------------------------------------------

    def replay(self, txn_id: TxnId | None, marker_type: int, position: Position, before: Position) -> None:
        """One stored entry, read in order by a new owner; ``before`` is the position
        just before it."""
        if txn_id is None:
            return
        self.used = True
        if marker_type == MARKER_TXN_COMMIT:
            self.open.pop(txn_id, None)
            self.aborted.pop(txn_id, None)
            self._remember_committed(txn_id)
        elif marker_type == MARKER_TXN_ABORT:
            self.open.pop(txn_id, None)
            self.aborted[txn_id] = position
        elif txn_id not in self.open and txn_id not in self.aborted and txn_id not in self.committed:
            self.open[txn_id] = before
