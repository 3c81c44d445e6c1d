"""The pure parts of transactions: the coordinator's record (states, decisions, bounds,
encoding), a topic's transaction buffer (max read position, ends, markers, replay) and
pending acknowledgements (conflicts, take, encoding)."""

from __future__ import annotations

import pytest

from common.errors import InvalidTxnStatus, MetadataError, NotAllowed, Overloaded, TransactionConflict
from common.position import Position
from transactions.buffer import MARKER_TXN_ABORT, MARKER_TXN_COMMIT, TransactionBuffer
from transactions.pending_acks import PendingAcks, TxnAcks, decode_acks
from transactions.records import (
    PARTITIONS_PER_TXN_MAX,
    TIMEOUT_S_MAX,
    TxnId,
    TxnRecord,
    TxnStatus,
    timeout_ms_for,
)

A, B, C = TxnId(0, 1), TxnId(0, 2), TxnId(1, 1)


def p(entry_id: int, ledger_id: int = 5) -> Position:
    return Position(ledger_id, entry_id)


# --- records ---------------------------------------------------------------------------------


def test_a_decision_is_taken_once_and_a_repeat_is_the_same_record():
    record = TxnRecord(A, TxnStatus.OPEN, 1000).with_partitions(["t1", "t2", "t1"])
    assert record.partitions == ("t1", "t2")
    committing = record.ended_by(True)
    assert committing.committing and committing.ending
    assert committing.ended_by(True) is committing
    with pytest.raises(InvalidTxnStatus):
        committing.ended_by(False)
    with pytest.raises(InvalidTxnStatus):
        committing.with_partitions(["t3"])
    with pytest.raises(InvalidTxnStatus):
        committing.with_subscriptions([("t1", "s")])


def test_a_record_round_trips_and_garbage_is_a_metadata_error():
    record = TxnRecord(C, TxnStatus.ABORTING, 123, ("a", "b"), (("a", "s1"),))
    assert TxnRecord.decode(record.encode()) == record
    for garbage in (b"", b"{}", b'{"version": 9}', b"[1,2]", b'{"version":1,"txn":"x","status":"OPEN"}'):
        with pytest.raises(MetadataError):
            TxnRecord.decode(garbage)


def test_partitions_per_transaction_are_bounded():
    record = TxnRecord(A, TxnStatus.OPEN, 0)
    with pytest.raises(NotAllowed):
        record.with_partitions([f"t{i}" for i in range(PARTITIONS_PER_TXN_MAX + 1)])


def test_expiry_only_of_open_transactions():
    record = TxnRecord(A, TxnStatus.OPEN, 1000)
    assert not record.expired(999) and record.expired(1000)
    assert not record.ended_by(False).expired(10_000)


def test_timeout_is_milliseconds_with_a_default_and_a_cap():
    assert timeout_ms_for(0) == 60_000
    assert timeout_ms_for(2500) == 2500
    assert timeout_ms_for(10**12) == TIMEOUT_S_MAX * 1000


# --- the buffer ------------------------------------------------------------------------------


def buffer() -> TransactionBuffer:
    return TransactionBuffer(open_max=2, aborted_max=2)


def test_readers_stop_before_the_oldest_open_transaction():
    b = buffer()
    assert b.max_read_position(p(9)) == p(9)
    assert b.begin(A, p(3)) and not b.begin(A, p(7))
    b.begin(B, p(5))
    assert b.max_read_position(p(9)) == p(3)
    b.end(A, commit=True)
    assert b.max_read_position(p(9)) == p(5)
    b.end(B, commit=False)
    assert b.max_read_position(p(9)) == p(9)


def test_an_ended_transaction_cannot_send_again_nor_take_the_other_decision():
    b = buffer()
    b.begin(A, p(1))
    b.end(A, commit=True)
    b.end(A, commit=True)   # a repeat is no change
    with pytest.raises(InvalidTxnStatus):
        b.begin(A, p(2))
    with pytest.raises(InvalidTxnStatus):
        b.end(A, commit=False)
    b.begin(B, p(2))
    b.end(B, commit=False)
    with pytest.raises(InvalidTxnStatus):
        b.end(B, commit=True)


def test_aborted_entries_and_markers_are_hidden_until_trimmed():
    b = buffer()
    b.begin(A, p(1))
    b.end(A, commit=False)
    assert b.hides(A, 0) and b.hides(None, MARKER_TXN_COMMIT) and not b.hides(None, 0) and not b.hides(B, 0)
    b.marker_stored(A, p(4))
    assert b.forget_trimmed(p(4)) == 0 and b.forget_trimmed(p(0, ledger_id=6)) == 1
    assert not b.hides(A, 0)


def test_bounds_refuse_rather_than_grow():
    b = buffer()
    b.begin(A, p(1))
    b.begin(B, p(2))
    with pytest.raises(Overloaded):
        b.begin(C, p(3))
    b.end(A, commit=False)
    b.end(B, commit=False)
    b.begin(C, p(3))
    with pytest.raises(Overloaded):
        b.end(C, commit=False)


def test_replay_rebuilds_open_and_aborted_transactions_from_entries():
    b = buffer()
    entries = [(None, 0), (A, 0), (B, 0), (A, 0), (B, MARKER_TXN_ABORT), (C, 0), (C, MARKER_TXN_COMMIT)]
    before = p(0)
    for index, (txn, marker) in enumerate(entries, start=1):
        b.replay(txn, marker, p(index), before)
        before = p(index)
    assert b.open == {A: p(1)}
    assert b.aborted == {B: p(5)}
    assert C in b.committed
    assert b.max_read_position(p(7)) == p(1)
    assert b.hides(B, 0) and not b.hides(C, 0)


# --- pending acknowledgements ----------------------------------------------------------------


def test_a_message_is_acknowledged_in_one_transaction_at_a_time():
    pending = PendingAcks()
    pending.add(A, [(p(1), None, 0), (p(2), None, 0)])
    pending.add(A, [(p(1), None, 0)])   # the same transaction again: fine
    with pytest.raises(TransactionConflict):
        pending.add(B, [(p(3), None, 0), (p(2), None, 0)])
    assert not pending.is_pending(p(3))   # a refused add holds nothing
    assert decode_acks(pending.encode(A)) == TxnAcks(((p(1), None, 0), (p(2), None, 0)))
    assert sorted(a[0] for a in pending.take(A).individual) == [p(1), p(2)]
    assert len(pending) == 0
    pending.add(B, [(p(2), (7, 0), 64)])
    assert decode_acks(pending.encode(B)) == TxnAcks(((p(2), (7, 0), 64),))
    pending.remove(B, [p(2)])
    assert len(pending) == 0 and not pending.by_txn


def test_undecodable_pending_acks_are_a_metadata_error():
    with pytest.raises(MetadataError):
        decode_acks(b"[[1]]")
    with pytest.raises(MetadataError):
        decode_acks(b'"text"')
    with pytest.raises(MetadataError):
        decode_acks(b'{"cumulative": [1, 2]}')


def test_whole_entries_acknowledged_in_a_transaction_are_held_back_and_batches_in_part_are_not():
    pending = PendingAcks()
    replaced = pending.add(A, [(p(1), None, 0), (p(2), (0b110,), 3)])
    assert pending.holds(p(1)) and not pending.holds(p(2)) and not pending.holds(p(3))
    # The same transaction acknowledges the rest of the batch: the whole entry is held.
    pending.add(A, [(p(2), (0b001,), 3)])
    assert pending.holds(p(2)) and pending.by_txn[A][p(2)][1] == (0,)
    pending.undo(A, [(p(2), (0b001,), 3)], [(p(2), (0b110,), 3)])
    assert not pending.holds(p(2)) and pending.by_txn[A][p(2)][1] == (0b110,)
    pending.undo(A, [(p(1), None, 0), (p(2), (0b110,), 3)], replaced)
    assert len(pending) == 0 and not pending.by_txn and not pending.holds(p(1))
    # What of a batch held in part may still go out (bit i: message i not held).
    assert pending.unheld_bits(p(2)) is None      # undone above
    pending.add(A, [(p(2), (0b110,), 3)])
    assert pending.unheld_bits(p(2)) == 0b110 and pending.unheld_bits(p(1)) is None
    pending.add(A, [(p(2), (-2,), 64)])           # int64 words as on the wire: all but message 0
    assert pending.unheld_bits(p(2)) == 0b110
    pending.remove(A, [p(2)])
    # An ack set with nothing left is the whole entry.
    pending.add(B, [(p(4), (0,), 3)])
    assert pending.holds(p(4))
    assert pending.take(B) == TxnAcks(((p(4), (0,), 3),)) and not pending.holds(p(4))


def test_one_cumulative_acknowledgement_at_a_time_holds_everything_up_to_it():
    pending = PendingAcks()
    mark = p(2)
    with pytest.raises(TransactionConflict):            # acknowledged by the cursor already
        pending.add_cumulative(A, (p(2), None, 0), mark)
    assert pending.add_cumulative(A, (p(5), None, 0), mark) is None
    assert pending.holds(p(3)) and pending.holds(p(5)) and not pending.holds(p(6))
    with pytest.raises(TransactionConflict):            # another transaction's
        pending.add_cumulative(B, (p(7), None, 0), mark)
    with pytest.raises(TransactionConflict):            # not past its own
        pending.add_cumulative(A, (p(5), None, 0), mark)
    with pytest.raises(TransactionConflict):            # an individual ack under A's cumulative one
        pending.add(B, [(p(4), None, 0)])
    pending.add(B, [(p(9), None, 0)])
    with pytest.raises(TransactionConflict):            # a cumulative ack over B's individual one
        pending.add_cumulative(A, (p(10), None, 0), mark)
    previous = pending.add_cumulative(A, (p(8), (0b100,), 3), mark)   # the batch at 8 in part
    assert pending.holds(p(7)) and not pending.holds(p(8)) and pending.unheld_bits(p(8)) == 0b100
    assert decode_acks(pending.encode(A)) == TxnAcks((), (p(8), (0b100,), 3))
    assert decode_acks(pending.encode(B)) == TxnAcks(((p(9), None, 0),))
    pending.restore_cumulative(previous)
    assert pending.cumulative == (A, (p(5), None, 0))
    assert pending.txns == {A, B} and len(pending) == 2
    assert pending.take(A) == TxnAcks((), (p(5), None, 0)) and not pending.holds(p(3))
    # Loading a topic restores both kinds as written.
    again = PendingAcks()
    again.restore(A, TxnAcks(((p(11), None, 0),), (p(5), None, 0)))
    assert again.holds(p(4)) and again.holds(p(11)) and not again.holds(p(6))


def test_the_opener_owns_a_transaction():
    record = TxnRecord(A, TxnStatus.OPEN, 0, owner="alice")
    assert record.owned_by("alice") and not record.owned_by("bob") and not record.owned_by(None)
    assert TxnRecord.decode(record.encode()) == record
    anyone = TxnRecord(A, TxnStatus.OPEN, 0)   # authentication off
    assert anyone.owned_by("bob") and anyone.owned_by(None)
    assert TxnRecord.decode(anyone.encode()).owner is None
