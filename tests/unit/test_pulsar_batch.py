"""Batch payloads (broker/batch.py), with no sockets.

Proves that: a hand-assembled batch splits into the messages it spells and encode_batch
writes the same bytes; batches of any size round-trip, including through a SEND frame
and the frame decoder; the payloads returned are views, not copies; a payload counts as
a batch exactly when num_messages_in_batch is set (a batch of one included); compressed
(any codec, even one newer than our .proto) and encrypted payloads are refused with a
typed error naming why; every inconsistent size or count raises MalformedFrame; and
seeded random mutations of batches raise nothing but MalformedFrame. The client's
hand-read plain records (``plain=True``: only payload_size and sequence_id) give what
protobuf gives, for plain records in every varint length, for the records that must go
to protobuf (other fields, a field twice, fields out of order, long varints), and
for mutated batches: the same messages or the same refusal.
"""

from __future__ import annotations

import random
import struct

import pytest

from protocol.batch import (
    EncryptedPayload,
    PlainRecord,
    SingleMessage,
    UnsupportedCompression,
    encode_batch,
    is_batch,
    message_count,
    parse_batch,
)
from protocol.codec import NEED_DATA, CommandDecoder, encode_payload_command, wrap
from protocol.proto import pulsar_api_pb2 as pb
from common.errors import MalformedFrame


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace("|", " "))


def batch_metadata(count: int, **fields) -> pb.MessageMetadata:
    return pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                              num_messages_in_batch=count, **fields)


def items(count: int, rng: random.Random | None = None) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    rng = rng or random.Random(count)
    result = []
    for index in range(count):
        single = pb.SingleMessageMetadata(sequence_id=index, event_time=index * 10)
        if index % 3 == 0:
            single.partition_key = f"key-{index}"
            single.properties.add(key="n", value=str(index))
        result.append((single, rng.randbytes(rng.randint(0, 40))))
    return result


# Two messages, "a" and the empty message: metadata_size | SingleMessageMetadata | bytes.
GOLDEN_BATCH = h("00000002 | 1801 | 61 | 00000004 | 1800 4001 | ")


def test_golden_batch_splits_and_encodes_byte_for_byte():
    messages = parse_batch(batch_metadata(2), GOLDEN_BATCH)
    assert [(m.batch_index, bytes(m.payload)) for m in messages] == [(0, b"a"), (1, b"")]
    assert messages[1].metadata.sequence_id == 1
    assert encode_batch([(pb.SingleMessageMetadata(), b"a"),
                         (pb.SingleMessageMetadata(sequence_id=1), b"")]) == GOLDEN_BATCH


@pytest.mark.parametrize("count", [1, 2, 3, 17, 1000])
def test_batches_round_trip(count):
    source = items(count)
    payload = encode_batch(source)
    messages = parse_batch(batch_metadata(count), payload)
    assert len(messages) == count
    for index, (message, (single, body)) in enumerate(zip(messages, source)):
        assert isinstance(message, SingleMessage)
        assert message.batch_index == index
        assert bytes(message.payload) == body
        assert message.metadata.payload_size == len(body)
        assert message.metadata.partition_key == single.partition_key
        assert message.payload.obj is payload                # a view, not a copy


def test_encode_batch_leaves_caller_metadata_alone():
    single = pb.SingleMessageMetadata(partition_key="k")
    encode_batch([(single, b"abc")])
    assert not single.HasField("payload_size")
    with pytest.raises(AssertionError):
        encode_batch([(pb.SingleMessageMetadata(payload_size=2), b"abc")])


def test_batch_through_a_send_frame_fed_bytewise():
    """A batched SEND decodes byte by byte and its payload splits into the messages."""
    source = items(5)
    metadata = batch_metadata(5)
    frame_bytes = encode_payload_command(wrap(pb.CommandSend(producer_id=1, sequence_id=0, num_messages=5)),
                                         metadata, encode_batch(source))
    decoder = CommandDecoder()
    frames = []
    for index in range(len(frame_bytes)):
        decoder.feed(frame_bytes[index:index + 1])
        while (frame := decoder.next_command()) is not NEED_DATA:
            frames.append(frame)
    (frame,) = frames
    assert message_count(frame.payload.metadata) == 5
    messages = parse_batch(frame.payload.metadata, frame.payload.payload)
    assert [bytes(m.payload) for m in messages] == [body for _single, body in source]


def test_batch_of_one_is_still_a_batch():
    """num_messages_in_batch=1 present means the batch layout; absent means a plain
    message, although both read 1."""
    single = batch_metadata(1)
    plain = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    assert is_batch(single) and message_count(single) == 1
    assert not is_batch(plain) and message_count(plain) == 1
    assert plain.num_messages_in_batch == 1
    assert len(parse_batch(single, encode_batch(items(1)))) == 1
    with pytest.raises(MalformedFrame, match="not a batch"):
        parse_batch(plain, encode_batch(items(1)))


def test_message_count_reads_compressed_batches_without_parsing():
    assert message_count(batch_metadata(250, compression=pb.ZSTD)) == 250
    with pytest.raises(MalformedFrame, match="below 1"):
        message_count(batch_metadata(0))
    with pytest.raises(MalformedFrame, match="below 1"):
        message_count(batch_metadata(-5))


@pytest.mark.parametrize("codec_value, codec_name", [
    (pb.LZ4, "LZ4"), (pb.ZLIB, "ZLIB"), (pb.ZSTD, "ZSTD"), (pb.SNAPPY, "SNAPPY")])
def test_compressed_batches_are_refused_naming_the_codec(codec_value, codec_name):
    with pytest.raises(UnsupportedCompression, match=codec_name) as caught:
        parse_batch(batch_metadata(2, compression=codec_value), encode_batch(items(2)))
    assert isinstance(caught.value, MalformedFrame)
    assert caught.value.codec == codec_name


def test_codec_newer_than_our_proto_is_refused_too():
    """An unknown compression value is kept as an unknown field and ``compression``
    reads NONE; parse_batch still notices."""
    raw = batch_metadata(2).SerializeToString() + h("4009")   # field 8 = 9
    metadata = pb.MessageMetadata.FromString(raw)
    assert metadata.compression == pb.NONE
    with pytest.raises(UnsupportedCompression, match="unknown codec 9"):
        parse_batch(metadata, encode_batch(items(2)))


def test_encrypted_batches_are_refused():
    metadata = batch_metadata(2)
    metadata.encryption_keys.add(key="k", value=b"v")
    with pytest.raises(EncryptedPayload):
        parse_batch(metadata, encode_batch(items(2)))


def record(single: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(single)) + single + body


INVALID = [
    ("count beyond bytes", 1000, encode_batch(items(2)), "declares 1000"),
    ("count zero", 0, encode_batch(items(2)), "below 1"),
    ("count negative", -1, encode_batch(items(2)), "below 1"),
    ("fewer messages than count", 3, encode_batch(items(2)), "truncated|exceeds|does not"),
    ("trailing bytes", 1, encode_batch(items(2)), "bytes after its 1 messages"),
    ("truncated size", 2, record(h("1803"), b"abc") + h("000000"), "truncated before its size"),
    ("metadata_size too large", 1, h("000000ff 1800"), "metadata_size 255"),
    ("metadata garbage", 1, record(h("ffff")), "does not parse"),
    ("payload_size missing", 1, record(h("1001")) + h("0000"), "required"),
    ("payload_size negative", 1, record(h("18ffffffffffffffffff01")), "payload_size -1"),
    ("payload_size too large", 1, record(h("1805"), b"abc"), "payload_size 5"),
    ("invalid utf-8 key", 1, record(h("1800 1201ff")), "UTF-8"),
    # properties (field 1) holding KeyValue(key="k", value=b"\xff"): a nested string.
    ("invalid utf-8 property value", 1, record(h("0a06 0a016b 1201ff 1800")), "UTF-8"),
    ("invalid utf-8 property key", 1, record(h("0a06 0a01ff 12016b 1800")), "UTF-8"),
    ("empty payload", 1, b"", "declares 1"),
]


@pytest.mark.parametrize("name, count, payload, message", INVALID, ids=[case[0] for case in INVALID])
def test_inconsistent_batches_raise_malformed_frame(name, count, payload, message):
    with pytest.raises(MalformedFrame, match=message):
        parse_batch(batch_metadata(count), payload)


def test_mutated_batches_raise_only_malformed_frame():
    rng = random.Random(4004)
    sources = [(count, encode_batch(items(count, rng))) for count in (1, 2, 5, 12)]
    parsed_any = False
    for _attempt in range(20_000):
        count, payload = rng.choice(sources)
        data = bytearray(payload)
        for _mutation in range(rng.randint(1, 3)):
            index = rng.randrange(len(data))
            roll = rng.random()
            if roll < 0.6:
                data[index] = rng.randrange(256)
            elif roll < 0.8:
                del data[index]
            else:
                data.insert(index, rng.randrange(256))
        declared = count if rng.random() < 0.8 else rng.randint(-2, count + 3)
        try:
            parse_batch(batch_metadata(declared), bytes(data))
            parsed_any = True
        except MalformedFrame:
            pass
    assert parsed_any


def _outcome(metadata: pb.MessageMetadata, data: bytes, plain: bool):
    """What parse_batch makes of ``data``: each message's (index, payload, size,
    sequence id or None), or the refusal's type."""
    try:
        messages = parse_batch(metadata, data, plain=plain)
    except MalformedFrame as error:
        return type(error)
    result = []
    for message in messages:
        single = message.metadata
        if isinstance(single, PlainRecord):
            sequence_id = single.sequence_id
        else:
            sequence_id = single.sequence_id if single.HasField("sequence_id") else None
        result.append((message.batch_index, bytes(message.payload), single.payload_size, sequence_id,
                       bytes(message.metadata_bytes)))
    return result


def test_plain_records_read_by_hand_are_what_protobuf_reads():
    def varint(value: int, pad: int = 0) -> bytes:
        out = bytearray()
        while True:
            out.append(value & 0x7F | (0x80 if value >= 0x80 or pad else 0))
            value >>= 7
            if value == 0 and not pad:
                break
            if value == 0:
                pad -= 1
                if not pad:
                    out[-1] &= 0x7F
                    break
        return bytes(out)

    def batch(record: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(record)) + record + payload

    cases = []
    for size in (0, 1, 127, 128, 300, 16_383, 16_384, 100_000):
        payload = bytes(size % 251 for _ in range(size))
        for sequence_id in (None, 0, 1, 127, 128, 2**21, 2**35, 2**62, 2**63 - 1, 2**63, 2**64 - 1):
            record = b"\x18" + varint(size) + (b"" if sequence_id is None else b"\x40" + varint(sequence_id))
            cases.append(batch(record, payload))
    cases += [
        batch(b"\x18" + varint(3, pad=2) + b"\x40\x05", b"abc"),                  # non-canonical size
        batch(b"\x18\x83\x80\x80\x80\x00", b"abc"),                            # a 5-byte size: protobuf's
        batch(b"\x18\x83\x80\x80\x80\x10", b"abc"),                            # size past 32 bits
        batch(b"\x18\x03\x40" + varint(5, pad=9), b"abc"),                      # 9-byte sequence id
        batch(b"\x18\x03\x40" + varint(5, pad=10), b"abc"),                     # 10-byte: protobuf's
        batch(b"\x18\x03\x40\x05\x40\x06", b"abc"),                            # sequence_id twice
        batch(b"\x18\x01\x18\x03", b"abc"),                                    # payload_size twice
        batch(b"\x40\x05\x18\x03", b"abc"),                                    # out of order
        batch(b"\x18\x03\x30\x07", b"abc"),                                    # event_time
        batch(b"\x18\x03\x40\x05\x30\x07", b"abc"),                            # then event_time
        batch(b"\x18\x03\x40", b"abc"),                                        # sequence id cut
        batch(b"\x18\x83", b"abc"),                                            # size cut
        batch(b"\x18", b""),                                                   # no value
        batch(b"\x18\x03\x12\x01k", b"abc"),                                   # a key
    ]
    for data in cases:
        assert _outcome(batch_metadata(1), data, True) == _outcome(batch_metadata(1), data, False), data.hex()

    # Mutated plain batches (as the client's producer writes them): same messages or
    # the same refusal.
    rng = random.Random(3803)
    plain = [(pb.SingleMessageMetadata(sequence_id=index), rng.randbytes(rng.randint(0, 300))) for index in range(6)]
    source = encode_batch(plain)
    assert all(isinstance(m.metadata, PlainRecord) for m in parse_batch(batch_metadata(6), source, plain=True))
    for _attempt in range(5_000):
        data = bytearray(source)
        for _mutation in range(rng.randint(1, 2)):
            index = rng.randrange(len(data))
            if rng.random() < 0.7:
                data[index] = rng.randrange(256)
            else:
                del data[index]
        assert _outcome(batch_metadata(6), bytes(data), True) == _outcome(batch_metadata(6), bytes(data), False)
