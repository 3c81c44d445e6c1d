"""Compaction (broker/compaction.py, subscriptions/compacted_view.py): the latest value
of each key survives, a tombstone (null value or empty payload) drops its key, keyless
messages stay, a partly surviving batch keeps the bits of its survivors; the view
round-trips through its encoding and serves entries from a position on."""

from __future__ import annotations

import pytest

from broker.compaction import compact
from common.errors import MalformedFrame
from common.position import ManagedEntry, Position
from protocol.batch import encode_batch
from protocol.codec import encode_stored
from protocol.proto.pulsar_api_pb2 import MessageMetadata, SingleMessageMetadata
from subscriptions.compacted_view import CompactedEntry, CompactedView


def _single(key: str | None, payload: bytes, *, null: bool = False) -> bytes:
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    if key is not None:
        metadata.partition_key = key
    if null:
        metadata.null_value = True
    return encode_stored(metadata, payload)


def _batch(messages: list[tuple[str | None, bytes]]) -> bytes:
    singles = []
    for key, payload in messages:
        single = SingleMessageMetadata(payload_size=len(payload))
        if key is not None:
            single.partition_key = key
        singles.append((single, payload))
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                               num_messages_in_batch=len(messages))
    return encode_stored(metadata, encode_batch(singles))


class _Ledger:
    name = "persistent://t/n/topic"

    def __init__(self, payloads: list[bytes]) -> None:
        self.entries = [ManagedEntry(Position(7, i), data) for i, data in enumerate(payloads)]
        self.last_confirmed = Position(7, len(payloads) - 1)
        self.first_position = Position(7, 0)

    def next_position(self, position: Position) -> Position:
        return Position(7, position.entry_id + 1)

    async def read(self, start: Position, count_max: int, bytes_max: int) -> list[ManagedEntry]:
        return self.entries[start.entry_id:start.entry_id + count_max]


async def test_latest_per_key_tombstones_keyless_and_batches():
    ledger = _Ledger([
        _single("a", b"a1"),
        _single("b", b"b1"),
        _single("a", b"a2"),
        _single("b", b"", null=True),
        _batch([("d", b"d1"), ("d", b"d2"), (None, b"keyless")]),
        _single("c", b""),                           # an empty payload is a tombstone too
    ])
    view = await compact(ledger)
    assert view.horizon == Position(7, 5)
    assert view.entries == [CompactedEntry(Position(7, 2)), CompactedEntry(Position(7, 4), 3, 0b110)]


def test_view_round_trips_and_serves_from_a_position():
    view = CompactedView(Position(3, 9), [CompactedEntry(Position(3, 1)), CompactedEntry(Position(3, 5), 4, 0b1010)])
    again = CompactedView.decode(view.encode())
    assert again.entries == view.entries and again.horizon == view.horizon
    assert again.entries_from(Position(3, 2), 10) == [CompactedEntry(Position(3, 5), 4, 0b1010)]
    assert again.entries_from(Position(3, 0), 1) == [CompactedEntry(Position(3, 1))]
    assert again.first_position == Position(3, 1)


@pytest.mark.parametrize("bad", ["", "{}", '{"horizon": [1, 2], "entries": [[1, 5, 0, null], [1, 2, 0, null]]}'])
def test_bad_views_raise_our_error(bad):
    with pytest.raises(MalformedFrame):
        CompactedView.decode(bad)
