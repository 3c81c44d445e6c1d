"""Inputs for fuzzing the wire codecs, shared by the bounded hypothesis tests
(tests/unit/test_fuzz_codecs.py), the long run (bench/fuzz_codec.py, ``make fuzz``) and
the live fuzz of a broker (bench/fuzz_broker.py, ``make fuzz-broker``).

- ``seed_frames()``: valid frames of the commands clients send, made by our encoders
  (a real client's capture can be added: bench/fuzz_broker.py records one).
- ``mutate(rng, data)``: one to four of bit flips, byte writes, truncations, inserted
  or deleted runs, splices of two frames, and rewrites of the length fields (the most
  interesting bytes: total size, command size, metadata size).
- ``mutate_fields(rng, frame)``: structure-aware: random or edge values in one to three
  fields of a decoded frame's command (or its message metadata), encoded again with
  correct sizes and checksum, so that it reaches the broker's handlers.
- ``decode_all(data, splits)``: feeds the bytes to a ``CommandDecoder`` in the given
  chunks and decodes everything a broker decodes from a frame (command, payload
  section, message metadata, batch); returns how many frames came out. It lets only
  our error type (``MalformedFrame``, with its subclasses) out: anything else is a bug
  the fuzzers report.
"""

from __future__ import annotations

import random
import struct

from common.entry import encode_entry, verify_entry
from protocol import commands
from protocol.batch import encode_batch, parse_batch
from protocol.codec import (
    NEED_DATA,
    CommandDecoder,
    PayloadChecksumMismatch,
    command_body,
    decode_frame,
    encode_command,
    encode_payload_command,
    wrap,
)
from protocol.proto import pulsar_api_pb2 as pb

FRAME_BYTES_MAX = 64 * 1024


def seed_frames() -> list[bytes]:
    """Valid frames of every kind a client sends (and MESSAGE, which a broker sends)."""
    frames = [
        encode_command(wrap(pb.CommandConnect(client_version="fuzz", protocol_version=20,
                                              auth_method_name="token", auth_data=b"a.b.c"))),
        encode_command(commands.ping()),
        encode_command(commands.pong()),
        encode_command(wrap(pb.CommandPartitionedTopicMetadata(topic="persistent://public/default/f",
                                                               request_id=1))),
        encode_command(wrap(pb.CommandLookupTopic(topic="persistent://public/default/f", request_id=2))),
        encode_command(wrap(pb.CommandProducer(topic="persistent://public/default/f", producer_id=1,
                                               request_id=3, producer_name="p"))),
        encode_command(wrap(pb.CommandSubscribe(topic="persistent://public/default/f", subscription="s",
                                                subType=pb.CommandSubscribe.Shared, consumer_id=1,
                                                request_id=4))),
        encode_command(wrap(pb.CommandFlow(consumer_id=1, messagePermits=1000))),
        encode_command(wrap(pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual,
                                          message_id=[pb.MessageIdData(ledgerId=1, entryId=2)]))),
        encode_command(wrap(pb.CommandCloseProducer(producer_id=1, request_id=5))),
        encode_command(wrap(pb.CommandGetTopicsOfNamespace(namespace="public/default", request_id=6))),
        encode_command(wrap(pb.CommandSeek(consumer_id=1, request_id=7,
                                           message_id=pb.MessageIdData(ledgerId=1, entryId=0)))),
    ]
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    frames.append(encode_payload_command(wrap(pb.CommandSend(producer_id=1, sequence_id=0)), metadata,
                                         b"hello"))
    batch_metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=3)
    batch = encode_batch([(pb.SingleMessageMetadata(payload_size=1, partition_key="k"), b"a"),
                          (pb.SingleMessageMetadata(payload_size=2), b"bc"),
                          (pb.SingleMessageMetadata(payload_size=0), b"")])
    frames.append(encode_payload_command(wrap(pb.CommandSend(producer_id=1, sequence_id=1, num_messages=3)),
                                         batch_metadata, batch))
    frames.append(encode_payload_command(wrap(pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(
        ledgerId=3, entryId=4))), metadata, b"world"))
    return frames


def seed_entries() -> list[bytes]:
    return [encode_entry(7, 0, -1, 5, b"hello"), encode_entry(7, 1, 0, 5, b""),
            encode_entry(2**40, 9, 8, 1 << 20, bytes(range(256)) * 4)]


def _length_rewrite(rng: random.Random, data: bytearray) -> None:
    """Writes a random or off-by-a-little value over one of the frame's length fields."""
    offsets = [0, 4]
    magic = data.find(b"\x0e\x01")
    if magic >= 0 and magic + 10 <= len(data):
        offsets.append(magic + 6)   # metadata_size, after magic and checksum
    offset = rng.choice(offsets)
    if offset + 4 > len(data):
        return
    (current,) = struct.unpack_from(">I", data, offset)
    choice = rng.random()
    if choice < 0.4:
        value = max(0, current + rng.randint(-8, 8))
    elif choice < 0.7:
        value = rng.choice([0, 1, 3, 4, 0x7FFFFFFF, 0xFFFFFFFF, FRAME_BYTES_MAX, FRAME_BYTES_MAX + 1])
    else:
        value = rng.getrandbits(32)
    struct.pack_into(">I", data, offset, value & 0xFFFFFFFF)


def mutate(rng: random.Random, data: bytes, corpus: list[bytes] | None = None) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(8)
        if choice == 0 and out:
            index = rng.randrange(len(out))
            out[index] ^= 1 << rng.randrange(8)
        elif choice == 1 and out:
            out[rng.randrange(len(out))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        elif choice == 2 and out:
            del out[rng.randrange(len(out)):]
        elif choice == 3:
            index = rng.randrange(len(out) + 1)
            out[index:index] = rng.randbytes(rng.randint(1, 16))
        elif choice == 4 and len(out) > 1:
            start = rng.randrange(len(out))
            del out[start:start + rng.randint(1, 16)]
        elif choice == 5 and corpus:
            other = rng.choice(corpus)
            cut = rng.randrange(len(out) + 1)
            out = out[:cut] + other[rng.randrange(len(other) + 1):]
        elif choice == 6:
            _length_rewrite(rng, out)
        elif out:
            index = rng.randrange(len(out))
            out[index:index] = out[index:index + rng.randint(1, 32)]   # duplicate a run
    return bytes(out)


# Values string fields take in field-level mutations: a small pool, so that fuzzed
# names cannot create an unbounded number of subscriptions or producers.
INTERESTING_STRINGS = ["", "x", "persistent://public/default/fuzz-capture", "persistent://public/default/other",
                       "persistent://no-such-tenant/ns/t", "public/default", "public", "capture-sub", "s",
                       "non-persistent://public/default/t", "persistent://public/default/t-partition-7",
                       "a" * 1000, "é\u2603\U0001f600", "../../etc", "%2F%00", "persistent://public/default/",
                       "token", "a.b.c"]
_INT_EDGES = [0, 1, -1, 2, 7, 100, 1000, 2**31 - 1, -2**31, 2**32 - 1, 2**63 - 1, -2**63, 2**64 - 1]


def _random_value(rng: random.Random, field):
    kind = field.type
    if kind == field.TYPE_STRING:
        return rng.choice(INTERESTING_STRINGS)
    if kind == field.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 64))
    if kind == field.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == field.TYPE_ENUM:
        return rng.choice(field.enum_type.values).number
    if kind in (field.TYPE_DOUBLE, field.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e300, float(rng.randint(-1000, 1000))])
    signed = kind in (field.TYPE_INT32, field.TYPE_INT64, field.TYPE_SINT32, field.TYPE_SINT64,
                      field.TYPE_SFIXED32, field.TYPE_SFIXED64)
    bits = 32 if kind in (field.TYPE_INT32, field.TYPE_UINT32, field.TYPE_SINT32, field.TYPE_FIXED32,
                          field.TYPE_SFIXED32) else 64
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    value = rng.choice(_INT_EDGES) if rng.random() < 0.6 else rng.randint(low, high)
    return min(max(value, low), high)


def _mutate_message(rng: random.Random, message, depth: int = 0) -> None:
    """Sets, clears or appends to one random field of ``message`` (or of a sub-message)."""
    fields = message.DESCRIPTOR.fields
    if not fields:
        return
    field = rng.choice(fields)
    if field.type == field.TYPE_MESSAGE:
        if field.is_repeated:
            container = getattr(message, field.name)
            if container and rng.random() < 0.5:
                _mutate_message(rng, container[rng.randrange(len(container))], depth + 1)
            elif len(container) < 64:
                element = container.add()
                if depth < 3:
                    _mutate_message(rng, element, depth + 1)
        elif rng.random() < 0.15:
            message.ClearField(field.name)
        elif depth < 3:
            _mutate_message(rng, getattr(message, field.name), depth + 1)
        return
    if field.is_repeated:
        container = getattr(message, field.name)
        if len(container) < 64:
            container.append(_random_value(rng, field))
        return
    if rng.random() < 0.15 and field.name != "type":
        message.ClearField(field.name)
        return
    try:
        setattr(message, field.name, _random_value(rng, field))
    except (ValueError, TypeError):
        pass   # a value this field cannot hold (protobuf checks ranges): leave it


def mutate_fields(rng: random.Random, frame: bytes) -> bytes:
    """A structure-aware mutation: ``frame`` decoded, one to three fields of its command
    (or of a SEND's message metadata) set to random or edge values, and encoded again
    with correct sizes and checksum, so the broker's handlers (not only its decoder)
    see it. ``frame`` must decode."""
    decoded = decode_frame(frame)
    command = decoded.command
    body = command_body(command)
    metadata = None
    if decoded.payload is not None:
        metadata = pb.MessageMetadata()
        metadata.CopyFrom(decoded.payload.metadata)
    for _ in range(rng.randint(1, 3)):
        if metadata is not None and rng.random() < 0.3:
            _mutate_message(rng, metadata)
        elif body is not None:
            _mutate_message(rng, body)
    if not command.IsInitialized() or (metadata is not None and not metadata.IsInitialized()):
        return frame   # a required field left unset: our encoders refuse to write that
    if decoded.payload is None:
        return encode_command(command)
    payload = bytes(decoded.payload.payload)
    if rng.random() < 0.2:
        payload = mutate(rng, payload) if payload else rng.randbytes(8)
    return encode_payload_command(command, metadata, payload)


def _decode_frame_contents(frame) -> None:
    """What a broker reads beyond the command: the payload's metadata and its batch."""
    payload = frame.payload
    if payload is None:
        return
    if payload.metadata.HasField("num_messages_in_batch"):
        parse_batch(payload.metadata, payload.payload)


def decode_all(data: bytes, splits: list[int] | None = None) -> int:
    """Decodes every frame in ``data`` fed in chunks cut at ``splits``; the count of
    frames decoded. Raises MalformedFrame (ours) for bad input, and nothing else."""
    decoder = CommandDecoder(frame_bytes_max=FRAME_BYTES_MAX)
    cuts = sorted({s for s in (splits or []) if 0 < s < len(data)})
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    frames = 0
    for chunk in chunks:
        decoder.feed(chunk)
        while True:
            try:
                frame = decoder.next_command()
            except PayloadChecksumMismatch:
                frames += 1
                continue   # the frame is consumed; a broker answers and goes on
            if frame is NEED_DATA:
                break
            frames += 1
            _decode_frame_contents(frame)
    return frames


def check_entry(data: bytes) -> None:
    """The bookie's check of an entry it is asked to store: raises only our errors."""
    verify_entry(data)

