"""Batch entries split once for several subscriptions of one topic on one connection
(client/split_cache.py, client/messages.py ``decode_entry``, client/connection.py).

What it proves:
- the cache's bounds: entries, bytes (a split bigger than the bound alone is not
  kept), age (at a put and at the connection's keep-alive tick), oldest first out;
- sharing keeps each consumer's own view: different ack sets give different messages,
  redelivery counts stay each MESSAGE's, no ReceivedMessage or property dict is
  shared (one consumer changing its dict leaves the other's alone), compressed batches
  are shared after inflating;
- bytes decide: a damaged copy of an entry (no checksum, as pulsar-lite sends) neither
  takes the good split nor poisons the cache, whichever comes first; the same ledger and
  entry ids on another topic are another entry; encrypted and unreadable entries are
  never kept;
- a MESSAGE whose CRC32C does not match never reaches the cache: the codec refuses it
  and the connection closes, before any consumer or the cache sees it;
- the connection shares only while two or more subscriptions of a topic are read
  through it (not for one subscription's several consumers) and drops a topic's splits
  when that ends.
Pure (no servers); about a second.
"""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest

from client.config import ClientConfig
from client.connection import ClientConnection
from client.messages import OutgoingMessage, SplitBatch, batch_payload, decode_entry
from client.split_cache import RECORD_OVERHEAD_BYTES, SplitCache
from common.errors import ConfigError
from protocol.codec import decode_frame, encode_command, encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb

TOPIC = "persistent://public/default/fan"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frame_of(metadata: pb.MessageMetadata, payload: bytes, *, entry_id: int = 9, ack_set: list[int] | None = None,
             redelivery_count: int = 0, consumer_id: int = 1) -> bytes:
    command = wrap(pb.CommandMessage(consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=7, entryId=entry_id),
                                     redelivery_count=redelivery_count, ack_set=ack_set or []))
    return encode_payload_command(command, metadata, payload)


def unchecked(frame: bytes) -> bytes:
    """The frame as a broker that leaves out the payload checksum sends it (pulsar-lite):
    magic and CRC32C dropped, sizes fixed."""
    total, command_size = struct.unpack_from(">II", frame, 0)
    head_end = 8 + command_size
    rest = frame[head_end + 6:]                      # skip magic (2) and checksum (4)
    return struct.pack(">II", total - 6, command_size) + frame[8:head_end] + rest


def decode(raw: bytes, cache: SplitCache | None, topic: str = TOPIC):
    frame = decode_frame(raw)
    return decode_entry(frame.command.message, frame.payload.metadata, frame.payload.payload, -1, cache, topic,
                        frame.payload.stored)


def batch(count: int = 5, size: int = 10) -> tuple[pb.MessageMetadata, bytes]:
    return batch_payload("p", 100, 1000, [OutgoingMessage(bytes([65 + i]) * size, key=f"k{i}",
                                                          properties={"i": str(i)}, event_time_ms=i + 1)
                                          for i in range(count)])


def split_of(count: int) -> SplitBatch:
    return SplitBatch(count, tuple((None, b"", None, None, (), 0, i) for i in range(count)), 0, "p", None, 0)


# --- the bounds ------------------------------------------------------------------------------

def test_entries_bytes_and_age_bound_the_cache_oldest_first():
    clock = Clock()
    cache = SplitCache(entries_max=3, bytes_max=10_000, age_max_s=5.0, clock=clock)
    for entry_id in range(5):
        cache.put((TOPIC, -1, 7, entry_id), b"s" * 100, split_of(1))
    assert len(cache) == 3 and cache.evictions == 2
    assert cache.get((TOPIC, -1, 7, 0), b"s" * 100) is None and cache.get((TOPIC, -1, 7, 4), b"s" * 100) is not None
    assert cache.bytes == 3 * (100 + RECORD_OVERHEAD_BYTES)

    # Bytes: each of these is 1,000 + 10 × 300 = 4,000; two fit in 10,000, not three.
    cache = SplitCache(entries_max=100, bytes_max=10_000, age_max_s=5.0, clock=clock)
    for entry_id in range(4):
        cache.put((TOPIC, -1, 7, entry_id), b"s" * 1_000, split_of(10))
        assert cache.bytes <= 10_000
    assert len(cache) == 2 and cache.bytes == 8_000
    # One bigger than the bound alone is not kept, and drops nothing.
    cache.put((TOPIC, -1, 7, 99), b"s" * 10_001, split_of(1))
    assert len(cache) == 2 and cache.get((TOPIC, -1, 7, 99), b"s" * 10_001) is None

    # Age: at a put, and by expire (the keep-alive tick); all gone when idle.
    cache = SplitCache(entries_max=100, bytes_max=100_000, age_max_s=5.0, clock=clock)
    cache.put((TOPIC, -1, 7, 0), b"a", split_of(1))
    clock.now += 3
    cache.put((TOPIC, -1, 7, 1), b"b", split_of(1))
    clock.now += 2.5
    cache.put((TOPIC, -1, 7, 2), b"c", split_of(1))
    assert [cache.get((TOPIC, -1, 7, n), s) is not None for n, s in enumerate((b"a", b"b", b"c"))] == [False, True, True]
    cache.expire(clock.now + 10)
    assert len(cache) == 0 and cache.bytes == 0


def test_the_config_refuses_bad_bounds():
    with pytest.raises(ConfigError, match="split_cache_entries_max"):
        ClientConfig(split_cache_entries_max=-1)
    with pytest.raises(ConfigError, match="split_cache_bytes_max"):
        ClientConfig(split_cache_bytes_max=0)


# --- sharing keeps each consumer's view ----------------------------------------------------------

def test_consumers_with_different_ack_sets_and_redelivery_counts_share_only_the_split():
    cache = SplitCache(64, 1 << 20, 5.0)
    metadata, payload = batch()
    # Consumer A has acknowledged nothing; B has acknowledged messages 1 and 3 (bits
    # still set: 0, 2, 4) and gets the entry again (redelivery count 2).
    a = decode(frame_of(metadata, payload), cache)
    b = decode(frame_of(metadata, payload, ack_set=[0b10101], redelivery_count=2), cache)
    assert (cache.misses, cache.hits) == (1, 1)
    assert [m.payload for m in a.messages] == [bytes([65 + i]) * 10 for i in range(5)]
    assert [m.message_id.batch_index for m in b.messages] == [0, 2, 4]
    assert (a.redelivery_count, b.redelivery_count, a.batch_size, b.batch_size) == (0, 2, 5, 5)
    assert [(m.key, m.properties, m.event_time_ms, m.sequence_id) for m in b.messages] == \
        [(f"k{i}", {"i": str(i)}, i + 1, 100 + i) for i in (0, 2, 4)]
    # Nothing mutable is shared: the first message of each is its own object with its
    # own properties dict; changing A's leaves B's, and a third consumer's, alone.
    assert a.messages[0] is not b.messages[0] and a.messages[0].properties is not b.messages[0].properties
    a.messages[0].properties["i"] = "changed"
    a.messages[0].payload = b"replaced"
    assert b.messages[0].properties == {"i": "0"} and b.messages[0].payload == b"A" * 10
    c = decode(frame_of(metadata, payload), cache)
    assert c.messages[0].properties == {"i": "0"} and c.messages[0].payload == b"A" * 10
    # Without the cache the same entry decodes to the same messages.
    plain = decode(frame_of(metadata, payload, ack_set=[0b10101], redelivery_count=2), None)
    assert plain == b


def test_compressed_batches_are_shared_after_inflating():
    cache = SplitCache(64, 1 << 20, 5.0)
    metadata, payload = batch(20, 50)
    metadata.compression = pb.ZLIB
    metadata.uncompressed_size = len(payload)
    compressed = zlib.compress(payload)
    first = decode(frame_of(metadata, compressed), cache)
    second = decode(frame_of(metadata, compressed, ack_set=[1 << 19]), cache)
    assert cache.hits == 1
    assert [m.payload for m in first.messages] == [bytes([65 + i]) * 50 for i in range(20)]
    assert [m.message_id.batch_index for m in second.messages] == [19] and second.messages[0].compression is None


def test_a_damaged_copy_neither_takes_nor_poisons_the_split():
    """Without a checksum (a broker that leaves it out), a copy damaged in flight is
    different bytes: it is split on its own, whichever arrives first."""
    metadata, payload = batch()
    good = unchecked(frame_of(metadata, payload))
    # Message 2's payload_size made to overrun: the batch no longer splits.
    broken_payload = bytearray(payload)
    record_2 = payload.index(b"C" * 10)
    size_at = payload.rindex(b"\x18", 0, record_2) + 1
    broken_payload[size_at] = 0x7F
    bad = unchecked(frame_of(metadata, bytes(broken_payload)))

    cache = SplitCache(64, 1 << 20, 5.0)
    assert len(decode(good, cache).messages) == 5
    damaged = decode(bad, cache)
    assert cache.mismatches == 1 and cache.hits == 0
    assert [m.compression for m in damaged.messages] == ["UNREADABLE"]
    assert len(decode(good, cache).messages) == 5 and cache.hits == 1

    cache = SplitCache(64, 1 << 20, 5.0)
    assert [m.compression for m in decode(bad, cache).messages] == ["UNREADABLE"]
    assert len(cache) == 0                        # an entry handed over whole is not kept
    assert [m.payload for m in decode(good, cache).messages] == [bytes([65 + i]) * 10 for i in range(5)]

    # Same bytes but another payload byte changed (still splits): each gets its own.
    cache = SplitCache(64, 1 << 20, 5.0)
    altered = unchecked(frame_of(metadata, payload.replace(b"E" * 10, b"e" * 10)))
    decode(good, cache)
    assert decode(altered, cache).messages[4].payload == b"e" * 10 and cache.mismatches == 1


def test_another_topic_and_entries_not_split_are_their_own():
    cache = SplitCache(64, 1 << 20, 5.0)
    metadata, payload = batch()
    decode(frame_of(metadata, payload), cache)
    # pulsar-lite numbers ledgers per topic: the same ids on another topic are another entry.
    other = decode(frame_of(metadata, payload), cache, topic=TOPIC + "-other")
    assert cache.hits == 0 and len(other.messages) == 5 and len(cache) == 2
    encrypted, _ = batch()
    encrypted.encryption_keys.add(key="k", value=b"v")
    for _ in range(2):
        entry = decode(frame_of(encrypted, payload, entry_id=10), cache)
        assert [m.compression for m in entry.messages] == ["ENCRYPTED"]
    assert len(cache) == 2 and cache.hits == 0


# --- the connection --------------------------------------------------------------------------------

class Handler:
    def __init__(self) -> None:
        self.frames = []
        self.lost = 0

    def on_frame(self, frame) -> None:
        self.frames.append(frame)

    def on_connection_lost(self) -> None:
        self.lost += 1


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_the_connection_shares_for_two_subscriptions_of_a_topic_only():
    connection = ClientConnection("127.0.0.1:1", ClientConfig())
    one = connection.register_consumer(Handler(), TOPIC, "s1")
    same_subscription = connection.register_consumer(Handler(), TOPIC, "s1")
    assert connection.splits_for(TOPIC) is None          # a shared subscription's consumers
    two = connection.register_consumer(Handler(), TOPIC, "s2")
    assert connection.splits_for(TOPIC) is connection.splits and connection.splits_for("other") is None
    connection.splits.put((TOPIC, -1, 7, 9), b"x", split_of(1))
    connection.splits.put(("other", -1, 7, 9), b"x", split_of(1))
    connection.unregister_consumer(two)
    assert connection.splits_for(TOPIC) is None and len(connection.splits) == 1   # TOPIC's dropped
    connection.unregister_consumer(one)
    connection.unregister_consumer(same_subscription)
    assert connection._subscriptions_of == {}
    assert ClientConnection("127.0.0.1:1", ClientConfig(split_cache_entries_max=0)).splits is None


async def test_a_message_failing_its_checksum_never_reaches_the_cache():
    connection = ClientConnection("127.0.0.1:1", ClientConfig())
    connection.connection_made(Transport())
    connection.data_received(encode_command(wrap(pb.CommandConnected(server_version="test", protocol_version=pb.v20))))
    try:
        first, second = Handler(), Handler()
        first_id = connection.register_consumer(first, TOPIC, "s1")
        second_id = connection.register_consumer(second, TOPIC, "s2")
        metadata, payload = batch()
        good = frame_of(metadata, payload, consumer_id=first_id)
        # The same entry for the second consumer, one payload byte changed after the
        # checksum was computed.
        corrupt = bytearray(frame_of(metadata, payload, consumer_id=second_id))
        corrupt[-1] ^= 0xFF
        connection.data_received(good)
        assert len(first.frames) == 1
        splits = connection.splits_for(TOPIC)
        frame = first.frames[0]
        decode_entry(frame.command.message, frame.payload.metadata, frame.payload.payload, -1, splits, TOPIC,
                     frame.payload.stored)
        assert len(splits) == 1
        connection.data_received(bytes(corrupt))
        # Refused by the codec: nothing handed to the second consumer, the connection
        # closing (its splits go when it is lost).
        assert second.frames == [] and connection.transport.closed
        connection.connection_lost(None)
        assert len(splits) == 0 and first.lost == second.lost == 1
    finally:
        connection.connection_lost(None)
        await asyncio.sleep(0)
