"""Where a topic's entries are, for ``PersistentTopic``: the position a message id, a
publish time or an entry count puts a reader at (a new subscription's start, a SEEK,
read_compacted subscriptions before the oldest stored entry), and the last message."""

from __future__ import annotations

from common.position import Position
from managed_ledger.compaction import TopicCompaction
from managed_ledger.managed_ledger import ManagedLedger
from protocol.batch import message_count
from protocol.codec import stored_metadata
from protocol.proto import pulsar_api_pb2 as pb


def last_batch_index(metadata: pb.MessageMetadata) -> int:
    """The batch index of an entry's last message (-1: not a batch)."""
    return message_count(metadata) - 1 if metadata.HasField("num_messages_in_batch") else -1


# The clients' MessageId.earliest is (-1, -1) and MessageId.latest (INT64_MAX, INT64_MAX);
# ledger and entry ids are uint64 on the wire.
_EARLIEST_ID = 2**64 - 1
# Below the position of every entry (ledger ids are not negative): where a
# read_compacted subscription from "earliest" starts (compacted_start).
_BEFORE_EVERY_POSITION = Position(-1, 0)
_LATEST_ID = 2**63 - 1
# Publish-time searches read at most this many entries (binary search over a topic).
_TIME_SEARCH_READS_MAX = 200


class TopicPositions:
    def __init__(self, ledger: ManagedLedger, compaction: TopicCompaction) -> None:
        self.ledger = ledger
        self.compaction = compaction

    def before(self, position: Position) -> Position:
        """The mark-delete position that makes ``position`` the next to read."""
        if position.entry_id > 0:
            return Position(position.ledger_id, position.entry_id - 1)
        # The entry before the first of a ledger: the last of the previous ledger, or
        # "nothing" within this one; either way next_position lands on ``position``.
        previous = [l for l in self.ledger.ledger_ids() if l < position.ledger_id]
        if previous:
            return Position(previous[-1], self.ledger.last_entry_of(previous[-1]))
        return Position(position.ledger_id, -1)

    def start_position(self, initial_position: int, start_message_id: pb.MessageIdData | None,
                        durable: bool) -> Position:
        ledger = self.ledger
        if start_message_id is not None and not durable:
            if start_message_id.ledgerId == _EARLIEST_ID:
                return ledger.first_position                             # MessageId.earliest
            if start_message_id.ledgerId == _LATEST_ID:
                return ledger.end_position                               # MessageId.latest
            # Start at the entry itself: the client drops what it should not see
            # (messages before a batch index, or the start message when not inclusive).
            return ledger.normalize(Position(start_message_id.ledgerId, start_message_id.entryId))
        if initial_position == pb.CommandSubscribe.Earliest:
            return ledger.first_position
        return ledger.end_position

    def compacted_start(self, initial_position: int, start_message_id: pb.MessageIdData | None,
                         durable: bool) -> Position | None:
        """Where a new read_compacted subscription starts when that is before the oldest
        entry the topic still stores (else None: where ``start_position`` puts it); see
        ``_compacted_position``."""
        if start_message_id is not None and not durable:
            return self._compacted_position(start_message_id)
        if initial_position == pb.CommandSubscribe.Earliest and self.compaction.record is not None:
            return _BEFORE_EVERY_POSITION
        return None

    def _compacted_position(self, message_id: pb.MessageIdData) -> Position | None:
        """Where ``message_id`` puts a read_compacted subscription (a start or a seek)
        when that is before the oldest entry the topic still stores; None when it is
        where it puts any subscription. The compacted ledger keeps the latest value of
        keys whose ledgers retention has deleted since, at their original positions; a
        position moved onto the topic's stored entries would skip them. So "earliest"
        is before every position, and an id inside the compacted range (a reader back
        after a reconnect) is taken as it is (Pulsar reads both the same way). The
        mark-delete position goes just before it, and the dispatcher reads the compacted
        ledger from right after the mark-delete position (``Dispatcher._compacted_from``),
        also after a rewind."""
        record = self.compaction.record
        if record is None or message_id.ledgerId == _LATEST_ID:
            return None
        if message_id.ledgerId == _EARLIEST_ID:
            return _BEFORE_EVERY_POSITION
        requested = Position(message_id.ledgerId, message_id.entryId)
        if requested <= record.horizon and requested < self.ledger.first_position:
            return requested
        return None

    def seek_position(self, message_id: pb.MessageIdData, *, read_compacted: bool = False) -> Position:
        """Where a SEEK to ``message_id`` puts the cursor (the next entry to deliver):
        MessageId.earliest is the oldest stored entry, MessageId.latest the end of the
        topic, any other id its own entry (the client drops what it should not see
        again: the sought message itself unless it asked for an inclusive start). For a
        read_compacted subscription, what ``_compacted_position`` says first."""
        compacted = self._compacted_position(message_id) if read_compacted else None
        if compacted is not None:
            return compacted
        if message_id.ledgerId == _EARLIEST_ID:
            return self.ledger.first_position
        if message_id.ledgerId == _LATEST_ID:
            return self.ledger.end_position
        return self.ledger.normalize(Position(message_id.ledgerId, message_id.entryId))

    async def last_message_id(self, *, read_compacted: bool = False) -> tuple[Position, int]:
        """The last stored message: (position, batch index; -1 if not a batch). An empty
        topic answers (current ledger, -1). For a read_compacted consumer, when nothing
        follows the compaction horizon, the last message of the compacted ledger: the
        topic's own last may be one compaction dropped (a tombstone, say), and the
        clients' has_message_available would then stay true with nothing left to read
        (what Pulsar fixed in apache/pulsar#18808)."""
        last = self.ledger.last_confirmed
        record = self.compaction.record
        if read_compacted and record is not None and last <= record.horizon:
            compacted = await self.compaction.last_entry()
            if compacted is None:
                return Position(max(self.ledger.current_ledger_id, last.ledger_id), -1), -1
            if compacted.batch_size:
                return compacted.position, compacted.keep_bits.bit_length() - 1
            return compacted.position, last_batch_index(stored_metadata(compacted.stored))
        if last.entry_id < 0:
            return Position(max(self.ledger.current_ledger_id, last.ledger_id), -1), -1
        entries = await self.ledger.read(last, 1, 1)
        if not entries:
            return last, -1
        return last, last_batch_index(stored_metadata(entries[0].data))

    async def publish_time(self, position: Position) -> int:
        entries = await self.ledger.read(position, 1, 1)
        if not entries:
            return -1
        return int(stored_metadata(entries[0].data).publish_time)

    async def find_position_by_time(self, timestamp_ms: int) -> Position:
        """The first entry published at or after ``timestamp_ms`` (binary search over
        the topic's entries by publish time; the end of the topic if none)."""
        ledger = self.ledger
        end = ledger.end_position
        positions: list[tuple[int, int]] = []   # (ledger_id, entry count)
        for ledger_id in ledger.ledger_ids():
            count = ledger.last_entry_of(ledger_id) + 1
            if count > 0:
                positions.append((ledger_id, count))
        total = sum(count for _, count in positions)
        if total == 0:
            return end

        def at(index: int) -> Position:
            for ledger_id, count in positions:
                if index < count:
                    return Position(ledger_id, index)
                index -= count
            raise AssertionError(index)

        low, high = 0, total
        reads = 0
        while low < high and reads < _TIME_SEARCH_READS_MAX:
            middle = (low + high) // 2
            reads += 1
            if await self.publish_time(at(middle)) >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        return at(low) if low < total else end

    def position_after(self, position: Position, count: int) -> Position:
        """The entry ``count`` entries after ``position`` (position + count), or the end
        of the topic if there are fewer."""
        assert count > 0
        ledger = self.ledger
        for ledger_id in ledger.ledger_ids():
            if ledger_id < position.ledger_id:
                continue
            last = ledger.last_entry_of(ledger_id)
            first = position.entry_id + 1 if ledger_id == position.ledger_id else 0
            available = last - first + 1
            if available >= count:
                return Position(ledger_id, first + count - 1)
            if available > 0:
                count -= available
        return ledger.end_position
