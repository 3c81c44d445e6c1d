"""The client's pure parts: messages (client/messages.py), ack ids
(client/consumer.ack_message_ids), its config and service URLs.

What it proves: a message and a batch encoded for sending decode back with payloads,
keys, ordering keys, properties, event and deliver-at times and sequence ids intact
(through the real frame codec, as a MESSAGE); a MESSAGE's ack set drops the messages
acknowledged already; ZLIB payloads inflate (and a lying size is caught); payloads the
client cannot split (LZ4, encrypted, a broken batch) are handed over whole, never
dropped; Pulsar's ack-set words clear exactly the acknowledged indexes; message ids
print and parse; config and service URLs refuse bad values naming them.
"""

from __future__ import annotations

import zlib

import pytest

from client.config import ClientConfig
from client.consumer import ack_message_ids
from client.messages import (
    MessageId,
    OutgoingMessage,
    ack_set_bits,
    ack_set_without,
    batch_payload,
    decode_entry,
    single_metadata,
)
from client.pool import service_addresses
from common.errors import ConfigError, InvalidArgument
from protocol.codec import decode_frame, encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb


def received(metadata: pb.MessageMetadata, payload: bytes, *, ack_set: list[int] | None = None,
             redelivery_count: int = 0):
    """Through the real codec: a MESSAGE frame built and decoded, then split."""
    command = wrap(pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=7, entryId=9),
                                     redelivery_count=redelivery_count, ack_set=ack_set or []))
    frame = decode_frame(encode_payload_command(command, metadata, payload))
    return decode_entry(frame.command.message, frame.payload.metadata, frame.payload.payload, partition=-1)


def test_a_single_message_round_trips():
    message = OutgoingMessage(b"\x00payload", key="k", ordering_key=b"o", properties={"a": "b"},
                              event_time_ms=123, deliver_at_ms=456)
    entry = received(single_metadata("p", 5, 1000, message), message.payload, redelivery_count=2)
    (got,) = entry.messages
    assert entry.batch_size == 0 and entry.redelivery_count == 2 and entry.position == (7, 9)
    assert got.message_id == MessageId(7, 9)
    assert (got.payload, got.key, got.ordering_key, got.properties) == (b"\x00payload", "k", b"o", {"a": "b"})
    assert (got.event_time_ms, got.deliver_at_ms, got.publish_time_ms, got.sequence_id) == (123, 456, 1000, 5)


def test_a_batch_round_trips_and_the_ack_set_drops_acknowledged_messages():
    messages = [OutgoingMessage(f"m{i}".encode(), key=f"k{i}", properties={"i": str(i)}, event_time_ms=i + 1)
                for i in range(5)]
    metadata, payload = batch_payload("p", 100, 1000, messages)
    assert metadata.num_messages_in_batch == 5 and metadata.highest_sequence_id == 104
    entry = received(metadata, payload)
    assert [m.payload for m in entry.messages] == [f"m{i}".encode() for i in range(5)]
    assert [m.message_id for m in entry.messages] == [MessageId(7, 9, -1, i, 5) for i in range(5)]
    assert [m.sequence_id for m in entry.messages] == list(range(100, 105))
    assert [(m.key, m.properties, m.event_time_ms) for m in entry.messages][3] == ("k3", {"i": "3"}, 4)
    partly = received(metadata, payload, ack_set=ack_set_without(5, [0, 3]))
    assert [m.message_id.batch_index for m in partly.messages] == [1, 2, 4]


@pytest.mark.parametrize("first_sequence_id", [0, 126, 127, 128, 16_383, 16_384, 2**21 - 1, 2**35, 2**63 - 10])
def test_a_plain_batch_is_laid_out_byte_for_byte_as_protobuf_lays_it_out(first_sequence_id):
    # batch_payload writes a plain message's record itself (no key, ordering key,
    # properties or event time): the same bytes as SingleMessageMetadata's serializer,
    # across varint lengths; a mixed batch keeps both layouts in order.
    import struct

    messages = [OutgoingMessage(b"p" * size) for size in (0, 1, 127, 128, 300, 16_384, 70_000)]
    messages.insert(3, OutgoingMessage(b"keyed", key="k", event_time_ms=5))
    _, payload = batch_payload("p", first_sequence_id, 1000, messages)
    expected = b""
    for index, message in enumerate(messages):
        single = pb.SingleMessageMetadata(payload_size=len(message.payload), sequence_id=first_sequence_id + index)
        if message.key is not None:
            single.partition_key = message.key
        if message.event_time_ms:
            single.event_time = message.event_time_ms
        record = single.SerializeToString()
        expected += struct.pack(">I", len(record)) + record + message.payload
    assert payload == expected


def test_plain_and_keyed_messages_of_one_batch_decode_alike():
    """Plain records (size and sequence id only, read without protobuf) beside keyed
    ones; a record without a sequence id takes the batch's first plus its index."""
    import struct

    messages = [OutgoingMessage(b"a"), OutgoingMessage(b"b", key="k", properties={"x": "y"}),
                OutgoingMessage(b"c", event_time_ms=9), OutgoingMessage(b"d")]
    metadata, payload = batch_payload("p", 40, 1000, messages)
    entry = received(metadata, payload)
    assert [(m.payload, m.key, m.properties, m.event_time_ms, m.sequence_id) for m in entry.messages] == [
        (b"a", None, {}, 0, 40), (b"b", "k", {"x": "y"}, 0, 41), (b"c", None, {}, 9, 42), (b"d", None, {}, 0, 43)]
    no_sequence_ids = b"".join(struct.pack(">I", 2) + bytes((0x18, len(data))) + data for data in (b"e", b"f"))
    metadata.num_messages_in_batch = 2
    assert [(m.payload, m.sequence_id) for m in received(metadata, no_sequence_ids).messages] == \
        [(b"e", 40), (b"f", 41)]


def test_zlib_payloads_inflate_and_a_lying_size_is_caught():
    metadata, payload = batch_payload("p", 0, 1000, [OutgoingMessage(b"x" * 100)] * 3)
    metadata.compression = pb.ZLIB
    metadata.uncompressed_size = len(payload)
    entry = received(metadata, zlib.compress(payload))
    assert [m.payload for m in entry.messages] == [b"x" * 100] * 3
    metadata.uncompressed_size = len(payload) - 1
    (opaque,) = received(metadata, zlib.compress(payload)).messages
    assert opaque.compression == "UNREADABLE"


@pytest.mark.parametrize("codec", [pb.LZ4, pb.ZSTD, pb.SNAPPY, pb.ZLIB])
def test_payloads_of_every_codec_decompress_and_a_lying_size_is_caught(codec):
    import cramjam

    compress = {pb.LZ4: lambda data: cramjam.lz4.compress_block(data, store_size=False),
                pb.ZSTD: cramjam.zstd.compress, pb.SNAPPY: cramjam.snappy.compress_raw, pb.ZLIB: zlib.compress}[codec]
    metadata, payload = batch_payload("p", 0, 1000, [OutgoingMessage(b"y" * 300), OutgoingMessage(b"z")])
    metadata.compression = codec
    metadata.uncompressed_size = len(payload)
    compressed = bytes(compress(payload))
    assert [m.payload for m in received(metadata, compressed).messages] == [b"y" * 300, b"z"]
    for size in (len(payload) - 1, len(payload) + 1):
        metadata.uncompressed_size = size
        (opaque,) = received(metadata, compressed).messages
        assert opaque.compression == "UNREADABLE" and opaque.payload == compressed


@pytest.mark.parametrize("change, compression", [
    (lambda m: setattr(m, "compression", pb.LZ4), "UNREADABLE"),      # not LZ4 bytes
    (lambda m: m.encryption_keys.add(key="k", value=b"v"), "ENCRYPTED"),
    (lambda m: setattr(m, "num_messages_in_batch", 4), "UNREADABLE"),
])
def test_what_cannot_be_split_is_handed_over_whole(change, compression):
    metadata, payload = batch_payload("p", 0, 1000, [OutgoingMessage(b"abc")] * 3)
    change(metadata)
    entry = received(metadata, payload)
    (message,) = entry.messages
    assert message.payload == payload and message.compression == compression
    assert message.message_id == MessageId(7, 9)


def test_ack_sets_clear_exactly_the_acknowledged_indexes():
    assert ack_set_bits(ack_set_without(3, [1])) == 0b101
    assert ack_set_bits(ack_set_without(70, [0, 64, 69])) == ((1 << 70) - 1) & ~(1 | 1 << 64 | 1 << 69)
    assert all(-(2**63) <= word < 2**63 for word in ack_set_without(128, []))
    (data,) = ack_message_ids([MessageId(1, 2, -1, 0, 4), MessageId(1, 2, -1, 2, 4)])
    assert (data.ledgerId, data.entryId, data.batch_size) == (1, 2, 4)
    assert ack_set_bits(data.ack_set) == 0b1010
    whole, partition = ack_message_ids([MessageId(1, 3), MessageId(1, 4, 2)])
    assert not whole.ack_set and partition.partition == 2


def test_message_ids_print_and_parse():
    message_id = MessageId(12, 34, 5, 6, 7)
    assert str(message_id) == "12:34:5:6"
    assert MessageId.parse("12:34:5:6") == MessageId(12, 34, 5, 6)
    for text in ("1:2:3", "a:b:c:d", "-5:1:-1:-1", "1:2:-2:-1"):
        with pytest.raises(InvalidArgument):
            MessageId.parse(text)


def test_config_and_service_urls_refuse_bad_values():
    with pytest.raises(ConfigError, match="operation_timeout_ms"):
        ClientConfig(operation_timeout_ms=0)
    with pytest.raises(ConfigError, match="reconnect_backoff_ms_min"):
        ClientConfig(reconnect_backoff_ms_min=10, reconnect_backoff_ms_max=5)
    assert ClientConfig().backoff_s(0) == 0.1 and ClientConfig().backoff_s(40) == 5.0
    with pytest.raises(ConfigError, match="reconnect_attempts_max"):
        ClientConfig(reconnect_attempts_max=0)
    # Without end by default (the public client); a bound when one is given.
    assert ClientConfig().reconnect_attempts_left(10**9)
    assert ClientConfig(reconnect_attempts_max=10).reconnect_attempts_left(9)
    assert not ClientConfig(reconnect_attempts_max=10).reconnect_attempts_left(10)
    assert service_addresses("pulsar://a:1,b:2/") == ["a:1", "b:2"]
    for url in ("http://a:1", "pulsar://a", "pulsar://a:x"):
        with pytest.raises(ValueError):
            service_addresses(url)
