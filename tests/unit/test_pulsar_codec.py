"""The Pulsar frame codec (broker/codec.py), with no sockets.

Proves that: hand-assembled frames decode to the commands they spell and our encoder
writes those same bytes; every command type the codec models survives encode -> decode;
every valid frame decodes identically when fed whole, in two halves at every split
point, and one byte at a time; payloads are views of the fed chunk (no copy) and a
stored payload is re-framed as MESSAGE without re-encoding; each kind of invalid input
(garbage, truncation, oversize, bad sizes, bad magic, bad CRC, bad protobuf, missing
required fields, invalid UTF-8) raises MalformedFrame or a subclass and nothing else,
including under seeded random and mutated input.
"""

from __future__ import annotations

import random
import struct

import crc32c
import pytest

from protocol import codec
from protocol.codec import (
    NEED_DATA,
    CommandDecoder,
    Frame,
    FrameTooLarge,
    PayloadChecksumMismatch,
    decode_frame,
    decode_stored,
    encode_command,
    encode_message_frame,
    encode_payload_command,
    encode_stored,
    message_frame_buffers,
    wrap,
)
from protocol.proto import pulsar_api_pb2 as pb
from common.errors import MalformedFrame

BC = pb.BaseCommand


def h(text: str) -> bytes:
    """Hex with spaces and | allowed as separators, to keep the layouts readable."""
    return bytes.fromhex(text.replace("|", " "))


def decode_all(chunks: list[bytes], frame_bytes_max: int = codec.FRAME_BYTES_MAX_DEFAULT) -> list[Frame]:
    decoder = CommandDecoder(frame_bytes_max=frame_bytes_max)
    frames = []
    for chunk in chunks:
        decoder.feed(chunk)
        while (frame := decoder.next_command()) is not NEED_DATA:
            frames.append(frame)
    assert decoder.buffered_bytes == 0
    return frames


def splits(data: bytes):
    """Whole, then two halves at every split point, then one byte at a time."""
    yield "whole", [data]
    for index in range(1, len(data)):
        yield f"split@{index}", [data[:index], data[index:]]
    yield "bytewise", [data[index:index + 1] for index in range(len(data))]


def same_frame(left: Frame, right: Frame) -> bool:
    if left.command != right.command or left.size_bytes != right.size_bytes:
        return False
    if (left.payload is None) != (right.payload is None):
        return False
    if left.payload is None:
        return True
    a, b = left.payload, right.payload
    return (a.metadata == b.metadata and bytes(a.payload) == bytes(b.payload)
            and bytes(a.stored) == bytes(b.stored) and a.checksum == b.checksum
            and a.broker_entry_metadata == b.broker_entry_metadata)


# --- hand-assembled frames ---------------------------------------------------------------

# A SEND of "hi" from producer 1: the payload section is spelled out field by field and
# only the CRC32C is computed (by the crc32c package, over the bytes after the checksum).
_SEND_CHECKED = h("00000007 | 0a0170 1000 1801 | 6869")   # metadata_size, metadata, payload
_SEND_GOLDEN = (h("0000001f 00000008 | 0806 3204 0801 1000 | 0e01")
                + struct.pack(">I", crc32c.crc32c(_SEND_CHECKED)) + _SEND_CHECKED)

GOLDEN = [
    # total_size, command_size, BaseCommand{type=PING(18), ping{}}: field 18 is tag 0x92 0x01.
    ("ping", h("00000009 00000005 | 0812 920100"), wrap(pb.CommandPing()), None),
    ("pong", h("00000009 00000005 | 0813 9a0100"), wrap(pb.CommandPong()), None),
    ("success", h("0000000a 00000006 | 080d 6a02 0807"), wrap(pb.CommandSuccess(request_id=7)), None),
    ("flow", h("0000000d 00000009 | 080b 5a05 0801 10e807"),
     wrap(pb.CommandFlow(consumer_id=1, messagePermits=1000)), None),
    ("connected", h("0000000d 00000009 | 0803 1a05 0a016d 1014"),
     wrap(pb.CommandConnected(server_version="m", protocol_version=20)), None),
    ("send", _SEND_GOLDEN, wrap(pb.CommandSend(producer_id=1, sequence_id=0)),
     (pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"hi")),
]


@pytest.mark.parametrize("name, data, command, payload", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_frames_decode_and_encode_byte_for_byte(name, data, command, payload):
    """Each hand-assembled frame decodes to its command, and our encoder produces exactly
    those bytes: the layout is fixed by the table, not by our own encoder."""
    frame = decode_frame(data)
    assert frame.command == command
    assert frame.size_bytes == len(data)
    if payload is None:
        assert frame.payload is None
        assert encode_command(command) == data
    else:
        metadata, body = payload
        assert frame.payload.metadata == metadata
        assert bytes(frame.payload.payload) == body
        assert encode_payload_command(command, metadata, body) == data


def test_ping_without_body_field_is_accepted():
    """PING and PONG have empty bodies; a frame that omits the body field still decodes."""
    frame = decode_frame(h("00000006 00000002 | 0812"))
    assert frame.command.type == BC.PING


# --- every modelled command round-trips --------------------------------------------------

_MID = pb.MessageIdData(ledgerId=12, entryId=34)
_SCHEMA = pb.Schema(name="s", schema_data=b"{}", type=pb.Schema.Json)

SAMPLE_BODIES = {
    BC.CONNECT: pb.CommandConnect(client_version="Pulsar-CPP-v3.5", protocol_version=20,
                                  feature_flags=pb.FeatureFlags(supports_auth_refresh=True,
                                                                supports_broker_entry_metadata=True)),
    BC.CONNECTED: pb.CommandConnected(server_version="magnetar", protocol_version=20,
                                      max_message_size=5 * 1024 * 1024),
    BC.SUBSCRIBE: pb.CommandSubscribe(topic="persistent://t/n/a", subscription="sub",
                                      subType=pb.CommandSubscribe.Key_Shared, consumer_id=3, request_id=4,
                                      initialPosition=pb.CommandSubscribe.Earliest, start_message_id=_MID,
                                      keySharedMeta=pb.KeySharedMeta(keySharedMode=pb.STICKY,
                                                                     hashRanges=[pb.IntRange(start=0, end=9)]),
                                      schema=_SCHEMA, metadata=[pb.KeyValue(key="k", value="v")]),
    BC.PRODUCER: pb.CommandProducer(topic="persistent://t/n/a", producer_id=1, request_id=2,
                                    producer_access_mode=pb.ExclusiveWithFencing),
    BC.SEND: pb.CommandSend(producer_id=1, sequence_id=2, num_messages=3),
    BC.SEND_RECEIPT: pb.CommandSendReceipt(producer_id=1, sequence_id=2, message_id=_MID),
    BC.SEND_ERROR: pb.CommandSendError(producer_id=1, sequence_id=2, error=pb.ChecksumError, message="crc"),
    BC.MESSAGE: pb.CommandMessage(consumer_id=3, message_id=_MID, redelivery_count=1),
    BC.ACK: pb.CommandAck(consumer_id=3, ack_type=pb.CommandAck.Cumulative, message_id=[_MID],
                          validation_error=pb.CommandAck.ChecksumMismatch, request_id=9,
                          properties=[pb.KeyLongValue(key="k", value=1)]),
    BC.FLOW: pb.CommandFlow(consumer_id=3, messagePermits=1000),
    BC.UNSUBSCRIBE: pb.CommandUnsubscribe(consumer_id=3, request_id=4, force=True),
    BC.SUCCESS: pb.CommandSuccess(request_id=4, schema=_SCHEMA),
    BC.ERROR: pb.CommandError(request_id=4, error=pb.ServiceNotReady, message="not yet"),
    BC.CLOSE_PRODUCER: pb.CommandCloseProducer(producer_id=1, request_id=2**64 - 1),
    BC.CLOSE_CONSUMER: pb.CommandCloseConsumer(consumer_id=3, request_id=5,
                                               assignedBrokerServiceUrl="pulsar://b:6650"),
    BC.PRODUCER_SUCCESS: pb.CommandProducerSuccess(request_id=2, producer_name="standalone-0-1",
                                                   last_sequence_id=-1, producer_ready=False),
    BC.PING: pb.CommandPing(),
    BC.PONG: pb.CommandPong(),
    BC.REDELIVER_UNACKNOWLEDGED_MESSAGES: pb.CommandRedeliverUnacknowledgedMessages(
        consumer_id=3, message_ids=[_MID, pb.MessageIdData(ledgerId=1, entryId=2, batch_index=5)]),
    BC.PARTITIONED_METADATA: pb.CommandPartitionedTopicMetadata(topic="persistent://t/n/a", request_id=1),
    BC.PARTITIONED_METADATA_RESPONSE: pb.CommandPartitionedTopicMetadataResponse(
        request_id=1, partitions=0, response=pb.CommandPartitionedTopicMetadataResponse.Success),
    BC.LOOKUP: pb.CommandLookupTopic(topic="persistent://t/n/a", request_id=1, authoritative=True),
    BC.LOOKUP_RESPONSE: pb.CommandLookupTopicResponse(
        request_id=1, brokerServiceUrl="pulsar://localhost:6650",
        response=pb.CommandLookupTopicResponse.Connect, authoritative=True),
    BC.CONSUMER_STATS: pb.CommandConsumerStats(request_id=1, consumer_id=3),
    BC.CONSUMER_STATS_RESPONSE: pb.CommandConsumerStatsResponse(request_id=1, msgRateOut=1.5, msgBacklog=7),
    BC.REACHED_END_OF_TOPIC: pb.CommandReachedEndOfTopic(consumer_id=3),
    BC.SEEK: pb.CommandSeek(consumer_id=3, request_id=4, message_publish_time=1700000000000),
    BC.GET_LAST_MESSAGE_ID: pb.CommandGetLastMessageId(consumer_id=3, request_id=4),
    BC.GET_LAST_MESSAGE_ID_RESPONSE: pb.CommandGetLastMessageIdResponse(
        request_id=4, last_message_id=_MID, consumer_mark_delete_position=_MID),
    BC.ACTIVE_CONSUMER_CHANGE: pb.CommandActiveConsumerChange(consumer_id=3, is_active=True),
    BC.GET_TOPICS_OF_NAMESPACE: pb.CommandGetTopicsOfNamespace(request_id=1, namespace="t/n",
                                                               mode=pb.CommandGetTopicsOfNamespace.ALL),
    BC.GET_TOPICS_OF_NAMESPACE_RESPONSE: pb.CommandGetTopicsOfNamespaceResponse(
        request_id=1, topics=["persistent://t/n/a", "persistent://t/n/b"]),
    BC.GET_SCHEMA: pb.CommandGetSchema(request_id=1, topic="persistent://t/n/a", schema_version=b"\x00"),
    BC.GET_SCHEMA_RESPONSE: pb.CommandGetSchemaResponse(request_id=1, schema=_SCHEMA, schema_version=b"\x01"),
    BC.AUTH_CHALLENGE: pb.CommandAuthChallenge(server_version="magnetar", protocol_version=20,
                                               challenge=pb.AuthData(auth_method_name="token", auth_data=b"refresh")),
    BC.AUTH_RESPONSE: pb.CommandAuthResponse(client_version="Pulsar-CPP-v3.5", protocol_version=20,
                                             response=pb.AuthData(auth_method_name="token", auth_data=b"jwt")),
    BC.ACK_RESPONSE: pb.CommandAckResponse(consumer_id=3, request_id=9),
    BC.GET_OR_CREATE_SCHEMA: pb.CommandGetOrCreateSchema(request_id=1, topic="persistent://t/n/a",
                                                         schema=_SCHEMA),
    BC.GET_OR_CREATE_SCHEMA_RESPONSE: pb.CommandGetOrCreateSchemaResponse(request_id=1, schema_version=b"\x02"),
    BC.WATCH_TOPIC_LIST: pb.CommandWatchTopicList(request_id=1, watcher_id=3, namespace="t/n",
                                                  topics_pattern="persistent://t/n/orders-.*", topics_hash="0a1b2c3d"),
    BC.WATCH_TOPIC_LIST_SUCCESS: pb.CommandWatchTopicListSuccess(request_id=1, watcher_id=3,
                                                                 topic=["persistent://t/n/orders-a"],
                                                                 topics_hash="0a1b2c3d"),
    BC.WATCH_TOPIC_UPDATE: pb.CommandWatchTopicUpdate(watcher_id=3, new_topics=["persistent://t/n/orders-b"],
                                                      deleted_topics=["persistent://t/n/orders-a"],
                                                      topics_hash="4e5f6a7b"),
    BC.WATCH_TOPIC_LIST_CLOSE: pb.CommandWatchTopicListClose(request_id=2, watcher_id=3),
    # Transactions (PIP-31).
    BC.TC_CLIENT_CONNECT_REQUEST: pb.CommandTcClientConnectRequest(request_id=1, tc_id=2),
    BC.TC_CLIENT_CONNECT_RESPONSE: pb.CommandTcClientConnectResponse(request_id=1),
    BC.NEW_TXN: pb.CommandNewTxn(request_id=1, txn_ttl_seconds=60_000, tc_id=2),
    BC.NEW_TXN_RESPONSE: pb.CommandNewTxnResponse(request_id=1, txnid_most_bits=2, txnid_least_bits=7),
    BC.ADD_PARTITION_TO_TXN: pb.CommandAddPartitionToTxn(request_id=1, txnid_most_bits=2, txnid_least_bits=7,
                                                         partitions=["persistent://t/n/out"]),
    BC.ADD_PARTITION_TO_TXN_RESPONSE: pb.CommandAddPartitionToTxnResponse(request_id=1, txnid_most_bits=2,
                                                                          txnid_least_bits=7),
    BC.ADD_SUBSCRIPTION_TO_TXN: pb.CommandAddSubscriptionToTxn(
        request_id=1, txnid_most_bits=2, txnid_least_bits=7,
        subscription=[pb.Subscription(topic="persistent://t/n/in", subscription="work")]),
    BC.ADD_SUBSCRIPTION_TO_TXN_RESPONSE: pb.CommandAddSubscriptionToTxnResponse(
        request_id=1, txnid_most_bits=2, txnid_least_bits=7, error=pb.TransactionConflict, message="held"),
    BC.END_TXN: pb.CommandEndTxn(request_id=1, txnid_most_bits=2, txnid_least_bits=7, txn_action=pb.COMMIT),
    BC.END_TXN_RESPONSE: pb.CommandEndTxnResponse(request_id=1, txnid_most_bits=2, txnid_least_bits=7),
    BC.END_TXN_ON_PARTITION: pb.CommandEndTxnOnPartition(request_id=1, txnid_most_bits=2, txnid_least_bits=7,
                                                         topic="persistent://t/n/out", txn_action=pb.ABORT),
    BC.END_TXN_ON_PARTITION_RESPONSE: pb.CommandEndTxnOnPartitionResponse(request_id=1, txnid_most_bits=2,
                                                                          txnid_least_bits=7),
    BC.END_TXN_ON_SUBSCRIPTION: pb.CommandEndTxnOnSubscription(
        request_id=1, txnid_most_bits=2, txnid_least_bits=7,
        subscription=pb.Subscription(topic="persistent://t/n/in", subscription="work"), txn_action=pb.COMMIT),
    BC.END_TXN_ON_SUBSCRIPTION_RESPONSE: pb.CommandEndTxnOnSubscriptionResponse(request_id=1, txnid_most_bits=2,
                                                                                txnid_least_bits=7),
}

_METADATA = pb.MessageMetadata(producer_name="standalone-0-1", sequence_id=2, publish_time=1700000000000,
                               properties=[pb.KeyValue(key="a", value="b")], partition_key="key")


def encode_sample(command_type: int) -> tuple[bytes, BC]:
    command = wrap(SAMPLE_BODIES[command_type])
    assert command.type == command_type
    if command_type in (BC.SEND, BC.MESSAGE):
        return encode_payload_command(command, _METADATA, b"payload-bytes"), command
    return encode_command(command), command


def test_samples_cover_every_modelled_command():
    assert set(SAMPLE_BODIES) == set(codec.COMMAND_FIELD)


@pytest.mark.parametrize("command_type", sorted(SAMPLE_BODIES), ids=codec.command_name)
def test_every_modelled_command_round_trips(command_type):
    data, command = encode_sample(command_type)
    (frame,) = decode_all([data])
    assert frame.command == command
    assert codec.command_body(frame.command) == SAMPLE_BODIES[command_type]
    if command_type in (BC.SEND, BC.MESSAGE):
        assert frame.payload.metadata == _METADATA
        assert bytes(frame.payload.payload) == b"payload-bytes"
    else:
        assert frame.payload is None


def test_unmodelled_command_type_passes_through():
    """A known type whose body this codec does not model (TOPIC_MIGRATED) decodes; its
    body stays in unknown fields and the broker decides what to answer."""
    body = h("0801 1002")                                     # a TopicMigrated-like body
    command = h("0844 a204") + bytes([len(body)]) + body      # type=68, field 68
    frame = decode_frame(struct.pack(">II", len(command) + 4, len(command)) + command)
    assert frame.command.type == BC.TOPIC_MIGRATED
    assert codec.command_body(frame.command) is None


# --- any split of the input --------------------------------------------------------------

def corpus() -> list[tuple[str, bytes]]:
    frames = [(name, data) for name, data, _command, _payload in GOLDEN]
    for command_type in sorted(SAMPLE_BODIES):
        frames.append((codec.command_name(command_type), encode_sample(command_type)[0]))
    bem = pb.BrokerEntryMetadata(broker_timestamp=1700000000001, index=41)
    frames.append(("message+bem", encode_payload_command(wrap(SAMPLE_BODIES[BC.MESSAGE]), _METADATA,
                                                         b"xyz", broker_entry_metadata=bem)))
    frames.append(("send-empty-payload", encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), _METADATA, b"")))
    return frames


def test_every_frame_decodes_the_same_under_every_split():
    """Whole, two halves at every split point, and one byte at a time: same frame."""
    for name, data in corpus():
        (expected,) = decode_all([data])
        for how, chunks in splits(data):
            frames = decode_all(chunks)
            assert len(frames) == 1, (name, how)
            assert same_frame(frames[0], expected), (name, how)


def test_back_to_back_frames_in_random_chunks():
    """The whole corpus concatenated and cut at random places decodes in order."""
    frames = corpus()
    stream = b"".join(data for _name, data in frames)
    rng = random.Random(20261122)
    for _attempt in range(50):
        chunks, offset = [], 0
        while offset < len(stream):
            size = rng.randint(1, 300)
            chunks.append(stream[offset:offset + size])
            offset += size
        decoded = decode_all(chunks)
        assert [frame.size_bytes for frame in decoded] == [len(data) for _name, data in frames]


def test_payload_is_a_view_of_the_fed_chunk():
    """A frame inside one large chunk is not copied: its payload views the chunk itself."""
    data = encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), _METADATA, bytes(codec.CHUNK_BYTES_KEPT_MIN))
    chunk = data + data
    decoder = CommandDecoder()
    decoder.feed(chunk)
    first, second = decoder.next_command(), decoder.next_command()
    assert first.payload.payload.obj is chunk
    assert second.payload.stored.obj is chunk
    assert decoder.next_command() is NEED_DATA


@pytest.mark.parametrize("payload_size", [10, codec.CHUNK_BYTES_KEPT_MIN])
def test_mutable_chunks_are_copied_once_fed(payload_size):
    """A bytearray the caller reuses cannot change a frame already handed out, whether
    it was staged (small) or kept (large)."""
    data = encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), _METADATA, b"p" * payload_size)
    buffer = bytearray(data)
    decoder = CommandDecoder()
    decoder.feed(buffer)
    buffer[:] = bytes(len(buffer))
    frame = decoder.next_command()
    assert bytes(frame.payload.payload) == b"p" * payload_size


def test_trickled_frame_costs_about_its_own_size_in_memory():
    """A peer sending one byte per read must not cost a Python object per byte."""
    import tracemalloc

    data = encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), _METADATA, bytes(100_000))
    decoder = CommandDecoder()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(len(data) - 1):
            decoder.feed(data[index:index + 1])
            assert decoder.next_command() is NEED_DATA
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 3 * len(data), grown
    decoder.feed(data[-1:])
    assert len(decoder.next_command().payload.payload) == 100_000


def test_feeding_without_draining_is_a_programmer_error():
    data = encode_command(wrap(pb.CommandPing()))
    decoder = CommandDecoder()
    decoder.feed(data)
    with pytest.raises(AssertionError):
        decoder.feed(data)


# --- stored payloads and MESSAGE frames --------------------------------------------------

def test_stored_payload_is_reframed_as_message_without_reencoding():
    """The bytes the broker stores for a SEND become a MESSAGE's payload section as they
    are: same checksum, same metadata, and the stored buffer itself is sent."""
    send_data, _command = encode_sample(BC.SEND)
    (send,) = decode_all([send_data])
    stored = bytes(send.payload.stored)
    assert decode_stored(stored).metadata == _METADATA

    message_command = wrap(pb.CommandMessage(consumer_id=9, message_id=_MID))
    buffers = message_frame_buffers(message_command, stored)
    assert buffers[-1] is stored
    for bem in (None, pb.BrokerEntryMetadata(broker_timestamp=5, index=6)):
        (message,) = decode_all([encode_message_frame(message_command, stored, bem)])
        assert message.command == message_command
        assert message.payload.checksum == send.payload.checksum
        assert message.payload.metadata == _METADATA
        assert bytes(message.payload.payload) == b"payload-bytes"
        assert bytes(message.payload.stored) == stored
        assert message.payload.broker_entry_metadata == bem


def test_encode_stored_layout():
    stored = encode_stored(_METADATA, b"abc")
    metadata_bytes = _METADATA.SerializeToString()
    checked = struct.pack(">I", len(metadata_bytes)) + metadata_bytes + b"abc"
    assert stored == struct.pack(">HI", 0x0E01, crc32c.crc32c(checked)) + checked


def test_encoder_refuses_missing_required_fields():
    """Our own output missing a required field is a programmer error (assert), never a
    frame a client would reject."""
    with pytest.raises(AssertionError):
        encode_command(wrap(pb.CommandSuccess()))
    with pytest.raises(AssertionError):
        encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), pb.MessageMetadata(producer_name="p"), b"")
    with pytest.raises(AssertionError):
        encode_command(BC(type=BC.SUCCESS))                  # type without its body


# --- invalid input -------------------------------------------------------------------------

def frame_of(command: bytes, section: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command) + len(section), len(command)) + command + section


_SEND_COMMAND = h("0806 3204 0801 1000")


def checked_section(metadata_size: int, rest: bytes) -> bytes:
    checked = struct.pack(">I", metadata_size) + rest
    return struct.pack(">HI", 0x0E01, crc32c.crc32c(checked)) + checked


_GOOD_METADATA = h("0a0170 1000 1801")

INVALID = [
    ("total_size below 4", h("00000003 000000"), "below"),
    ("total_size zero", h("00000000"), "below"),
    ("command_size beyond total", h("00000006 00000003 0812"), "command_size"),
    ("command_size huge", h("00000006 ffffffff 0812"), "command_size"),
    ("garbage command", frame_of(h("ffffffff")), "does not parse"),
    ("truncated varint", frame_of(h("08")), "does not parse"),
    ("no type", frame_of(h("5a05 0801 10e807")), "required"),
    ("empty command", frame_of(b""), "required"),
    ("unknown type value", frame_of(h("0845")), "required"),
    ("type without body", frame_of(h("080b")), "lacks its flow body"),
    ("body missing required", frame_of(h("080b 5a02 0801")), "required"),
    ("invalid utf-8", frame_of(h("0803 1a04 0a02fffe")), "UTF-8"),
    ("nested invalid utf-8", frame_of(h("0804 2214 0a0174 120173 1800 2001 2801 5206 0a01ff 120176")), "UTF-8"),
    ("trailing bytes", frame_of(h("0812 920100"), b"\x00"), "after its command"),
    ("send without payload", frame_of(_SEND_COMMAND), "no payload section"),
    ("payload head truncated", frame_of(_SEND_COMMAND, h("0e01 0000")), "shorter"),
    ("bad magic", frame_of(_SEND_COMMAND, h("0e03 00000000 00000000")), "magic"),
    ("bad magic swapped", frame_of(_SEND_COMMAND, h("010e 00000000 00000000")), "magic"),
    ("metadata_size too large", frame_of(_SEND_COMMAND, checked_section(8, _GOOD_METADATA)), "metadata_size"),
    ("metadata_size huge", frame_of(_SEND_COMMAND, checked_section(0xFFFFFFFF, _GOOD_METADATA)), "metadata_size"),
    ("metadata garbage", frame_of(_SEND_COMMAND, checked_section(3, h("ffffff"))), "does not parse"),
    ("metadata missing required", frame_of(_SEND_COMMAND, checked_section(3, h("0a0170"))), "required"),
    ("bem head truncated", frame_of(_SEND_COMMAND, h("0e02 0000")), "truncated"),
    ("bem size too large", frame_of(_SEND_COMMAND, h("0e02 00000009 0801")), "exceeds"),
    ("bem garbage", frame_of(_SEND_COMMAND, h("0e02 00000002 ffff") + checked_section(7, _GOOD_METADATA)),
     "does not parse"),
    ("bem then nothing", frame_of(_SEND_COMMAND, h("0e02 00000000")), "shorter"),
]


@pytest.mark.parametrize("name, data, message", INVALID, ids=[case[0] for case in INVALID])
def test_invalid_frames_raise_malformed_frame(name, data, message):
    """Fed whole or byte by byte, the stream fails with MalformedFrame naming the fault,
    and the decoder keeps failing (the stream has no trustworthy boundary any more)."""
    for chunks in ([data], [data[index:index + 1] for index in range(len(data))]):
        decoder = CommandDecoder()
        with pytest.raises(MalformedFrame, match=message) as caught:
            for chunk in chunks:
                decoder.feed(chunk)
                while decoder.next_command() is not NEED_DATA:
                    pass
        assert not isinstance(caught.value, PayloadChecksumMismatch)
        with pytest.raises(MalformedFrame):
            decoder.next_command()
        with pytest.raises(MalformedFrame):
            decoder.feed(b"\x00")


def test_missing_type_is_not_mistaken_for_connect():
    """The runtime reads an absent enum as its first value (CONNECT): we refuse instead."""
    with pytest.raises(MalformedFrame):
        decode_frame(frame_of(h("1203 0a0161")))         # a valid connect body, no type


def test_truncated_frames_wait_for_more_and_decode_frame_refuses_them():
    for name, data in corpus():
        for cut in range(len(data)):
            decoder = CommandDecoder()
            decoder.feed(data[:cut])
            assert decoder.next_command() is NEED_DATA, (name, cut)
            with pytest.raises(MalformedFrame):
                decode_frame(data[:cut])


def test_oversized_frame_is_refused_before_its_body_is_buffered():
    decoder = CommandDecoder(frame_bytes_max=1024)
    with pytest.raises(FrameTooLarge) as caught:
        decoder.feed(struct.pack(">I", 1025))
    assert caught.value.size_bytes == 1025
    assert caught.value.size_bytes_max == 1024
    assert decoder.buffered_bytes == 4
    with pytest.raises(FrameTooLarge):
        decoder.feed(bytes(1025))


def test_frame_of_exactly_the_limit_is_accepted():
    payload_frame = encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), _METADATA, b"z" * 100)
    limit = len(payload_frame) - 4                             # frame_bytes_max bounds total_size
    assert len(decode_all([payload_frame], frame_bytes_max=limit)) == 1
    with pytest.raises(FrameTooLarge):
        decode_all([payload_frame], frame_bytes_max=limit - 1)


def test_default_limit_fits_a_maximum_size_message():
    """Pulsar's 5 MiB max_message_size plus its 10 KiB allowance for headers."""
    assert codec.FRAME_BYTES_MAX_DEFAULT == 5 * 1024 * 1024 + 10 * 1024
    big = encode_payload_command(wrap(SAMPLE_BODIES[BC.SEND]), _METADATA, bytes(codec.MAX_MESSAGE_SIZE_DEFAULT))
    (frame,) = decode_all([big])
    assert len(frame.payload.payload) == codec.MAX_MESSAGE_SIZE_DEFAULT


def test_checksum_mismatch_carries_the_command_and_decoding_goes_on():
    """A corrupted SEND payload raises PayloadChecksumMismatch with the SEND command (so
    the broker can answer SEND_ERROR(ChecksumError)); the next frame still decodes."""
    data, command = encode_sample(BC.SEND)
    corrupted = data[:-1] + bytes([data[-1] ^ 0x01])
    ping = encode_command(wrap(pb.CommandPing()))
    decoder = CommandDecoder()
    decoder.feed(corrupted + ping)
    with pytest.raises(PayloadChecksumMismatch) as caught:
        decoder.next_command()
    assert isinstance(caught.value, MalformedFrame)
    assert caught.value.command == command
    assert caught.value.checksum_stored != caught.value.checksum_computed
    assert decoder.next_command().command.type == BC.PING
    assert decoder.next_command() is NEED_DATA


def test_every_flipped_payload_bit_is_caught_by_the_checksum():
    data, _command = encode_sample(BC.SEND)
    section_start = 8 + struct.unpack_from(">I", data, 4)[0]
    for offset in range(section_start + 6, len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[offset] ^= 1 << bit
            with pytest.raises(PayloadChecksumMismatch):
                decode_frame(bytes(flipped))
    with pytest.raises(PayloadChecksumMismatch):
        decode_stored(bytes(data[section_start:-1]) + b"\x00")


# --- random input ----------------------------------------------------------------------------

def feed_expecting_only_our_error(decoder: CommandDecoder, chunks: list[bytes]) -> int:
    decoded = 0
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while True:
                try:
                    frame = decoder.next_command()
                except PayloadChecksumMismatch:
                    continue
                if frame is NEED_DATA:
                    break
                decoded += 1
    except MalformedFrame:
        pass
    return decoded


def random_chunks(rng: random.Random, data: bytes) -> list[bytes]:
    chunks, offset = [], 0
    while offset < len(data):
        size = rng.randint(1, 64)
        chunks.append(data[offset:offset + size])
        offset += size
    return chunks


def test_random_bytes_raise_only_malformed_frame():
    """Seeded noise, some of it given a plausible length prefix so parsing goes deeper."""
    rng = random.Random(1003)
    for _attempt in range(20_000):
        body = rng.randbytes(rng.randint(0, 120))
        if rng.random() < 0.5:
            command_size = rng.randint(0, len(body))
            body = struct.pack(">I", command_size) + body
        data = struct.pack(">I", len(body)) + body if rng.random() < 0.7 else body
        feed_expecting_only_our_error(CommandDecoder(frame_bytes_max=4096), random_chunks(rng, data))


def test_mutated_frames_raise_only_malformed_frame():
    """Valid frames with bytes flipped, dropped or inserted, the CRC and sizes repaired
    half the time so the mutation reaches the protobuf and metadata parsers."""
    rng = random.Random(6650)
    frames = [data for _name, data in corpus()]
    decoded_any = False
    for _attempt in range(20_000):
        data = bytearray(rng.choice(frames))
        for _mutation in range(rng.randint(1, 4)):
            roll = rng.random()
            index = rng.randrange(len(data))
            if roll < 0.6:
                data[index] = rng.randrange(256)
            elif roll < 0.8 and len(data) > 9:
                del data[index]
            else:
                data.insert(index, rng.randrange(256))
        if rng.random() < 0.5 and len(data) >= 8:
            struct.pack_into(">I", data, 0, len(data) - 4)
            command_size = struct.unpack_from(">I", data, 4)[0]
            section = 8 + command_size
            if section + 6 <= len(data) and data[section:section + 2] == b"\x0e\x01":
                struct.pack_into(">I", data, section + 2, crc32c.crc32c(bytes(data[section + 6:])))
        decoded_any |= feed_expecting_only_our_error(CommandDecoder(), random_chunks(rng, bytes(data))) > 0
    assert decoded_any


def test_the_utf_8_walk_skips_only_types_that_can_hold_no_string():
    """The walk enters a message only when some type reachable from it declares a
    string (so a send, a receipt or a message id is not walked at all); a type that
    holds itself (MessageIdData's first_chunk_message_id) is judged by what it can
    reach, and an invalid string deep in an ack (its properties' key) is still found."""
    from protocol.codec import _may_hold_strings, parse_proto

    holds = {name: _may_hold_strings(getattr(pb, name).DESCRIPTOR)
             for name in ("BaseCommand", "CommandSend", "CommandSendReceipt", "CommandFlow", "MessageIdData",
                          "CommandMessage", "CommandAck", "CommandProducer", "MessageMetadata")}
    assert holds == {"BaseCommand": True, "CommandSend": False, "CommandSendReceipt": False, "CommandFlow": False,
                     "MessageIdData": False, "CommandMessage": False, "CommandAck": True,
                     "CommandProducer": True, "MessageMetadata": True}
    ack = pb.BaseCommand(type=pb.BaseCommand.ACK, ack=pb.CommandAck(
        consumer_id=1, ack_type=pb.CommandAck.Individual,
        message_id=[pb.MessageIdData(ledgerId=1, entryId=2)],
        properties=[pb.KeyLongValue(key="k", value=3)]))
    good = ack.SerializeToString()
    assert parse_proto(pb.BaseCommand, good, "command") == ack
    bad = good.replace(b"\x0a\x01k", b"\x0a\x01\xff")
    assert bad != good
    with pytest.raises(MalformedFrame, match="UTF-8"):
        parse_proto(pb.BaseCommand, bad, "command")


def test_a_message_without_magic_and_checksum_is_read_unchecked():
    """Pulsar makes the payload checksum optional; pulsar-lite leaves it out of MESSAGE
    frames. A client reads such a MESSAGE (metadata_size | metadata | payload); a SEND
    without it is still refused (the broker stores those bytes as they are)."""
    metadata = _METADATA.SerializeToString()
    section = struct.pack(">I", len(metadata)) + metadata + b"no checksum here"
    message = decode_frame(frame_of(wrap(SAMPLE_BODIES[BC.MESSAGE]).SerializeToString(), section))
    assert message.payload is not None and message.payload.checksum == -1
    assert bytes(message.payload.payload) == b"no checksum here"
    assert message.payload.metadata == _METADATA
    with pytest.raises(MalformedFrame, match="magic"):
        decode_frame(frame_of(wrap(SAMPLE_BODIES[BC.SEND]).SerializeToString(), section))
    with pytest.raises(MalformedFrame, match="metadata_size"):
        decode_frame(frame_of(wrap(SAMPLE_BODIES[BC.MESSAGE]).SerializeToString(), struct.pack(">I", 999) + b"x"))
