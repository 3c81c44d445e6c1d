"""Framing of Pulsar's binary protocol: bytes in, validated commands out, and back.
Sans-IO: no sockets, no asyncio, no clock, no logging. The connection handler feeds
whatever the socket returned and takes out complete frames.

All integers big-endian. A frame:

    offset  size  field          meaning
    0       4     total_size     u32, bytes after this field (FRAME_BYTES_MAX bounds it)
    4       4     command_size   u32, at most total_size - 4
    8       c     command        BaseCommand (protobuf)
    8+c     rest  payload        only for SEND and MESSAGE; exactly total_size - 4 - c bytes

Payload section (SEND from producers, MESSAGE to consumers):

    offset  size  field                 meaning
    0       2     magic                 0x0e02: broker entry metadata follows (optional,
    2       4     bem_size              MESSAGE only in practice; not checksummed)
    6       b     BrokerEntryMetadata
    --- the stored payload (what a ledger entry holds, see below) starts here ---
    0       2     magic                 0x0e01
    2       4     checksum              CRC32C over every byte after this field
    6       4     metadata_size         u32
    10      m     MessageMetadata       protobuf, written by the producer
    10+m    rest  payload               the message bytes; a batch if the metadata says so

Stored payload. The broker keeps the producer's bytes from the 0x0e01 magic to the end
of the frame, unchanged, as the body of one ledger entry (one entry per SEND, batch or
not). To dispatch an entry it writes a MESSAGE command in front of those bytes
(:func:`message_frame_buffers`): nothing is re-encoded and the producer's checksum
travels to the consumer, so corruption anywhere on the way (including at rest) is caught
by the client too. This is also the layout Pulsar keeps in BookKeeper. It has no
version field because it is Pulsar's wire format, not ours to version; the ledger entry
around it (common/entry.py) carries Magnetar's magic, version and digest.

Invariants of the decoder:
- ``next_command`` returns a :class:`Frame` only when every size matched, every protobuf
  parsed, every required field is present, every string field holds valid UTF-8, the
  command's body field matches its type, and the payload checksum matched (a MESSAGE's
  payload may come without magic and checksum, which Pulsar allows: read unchecked;
  a SEND's must have them, since the broker stores those bytes as they are).
- An oversized ``total_size`` is refused as soon as its four bytes arrive, before any
  of the body is buffered.
- Every invalid input raises :class:`MalformedFrame` (a subclass at most), nothing else.
  After one, the stream has no trustworthy frame boundary and the decoder repeats that
  error on every call; the only exception is :class:`PayloadChecksumMismatch`, raised
  after the frame was fully consumed, so the broker can answer SEND_ERROR(ChecksumError)
  (what Pulsar does) and keep decoding.
- Views, not copies: a frame that lies inside one fed chunk of CHUNK_BYTES_KEPT_MIN
  bytes or more is sliced out of it, and the payload handed out is a memoryview of that
  chunk; a frame spread over several chunks, or fed in small ones, costs one join. A
  view keeps its whole chunk alive, so copy what you keep for long.
- Memory is bounded: one partial frame (at most frame_bytes_max) plus the last chunk,
  with no per-chunk object for small chunks.

Why strict where Pulsar is lenient: Pulsar accepts a payload without the 0x0e01
checksum (clients before protocol v6). Every client adds it once CONNECTED announces
protocol_version >= 6, which Magnetar always does, and refusing unchecked payloads keeps
corrupted bytes out of the ledgers.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from dataclasses import dataclass
from typing import Literal, TypeVar

import crc32c
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from protocol.proto.pulsar_api_pb2 import BaseCommand, BrokerEntryMetadata, MessageMetadata
from common.errors import MalformedFrame

# --- layout constants ---------------------------------------------------------------------

MAGIC_CHECKSUM = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

# Pulsar's default maxMessageSize (5 MiB): the largest payload a client may send, and
# what CONNECTED.max_message_size announces unless configured otherwise.
MAX_MESSAGE_SIZE_DEFAULT = 5 * 1024 * 1024
# Room for the command and metadata around a maximum-size payload; Pulsar's broker adds
# the same 10 KiB to max_message_size for its frame limit, so a max-size message fits.
FRAME_PADDING_BYTES = 10 * 1024
FRAME_BYTES_MAX_DEFAULT = MAX_MESSAGE_SIZE_DEFAULT + FRAME_PADDING_BYTES
# total_size must at least cover the command_size field.
FRAME_BYTES_MIN = 4
_U32_MAX = 0xFFFF_FFFF

_U32 = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">II")            # total_size, command_size
_MAGIC = struct.Struct(">H")
_SECTION_HEAD = struct.Struct(">HI")          # magic, checksum (or magic, bem_size)
STORED_HEAD_SIZE = _SECTION_HEAD.size + _U32.size  # magic, checksum, metadata_size
assert STORED_HEAD_SIZE == 10
_BEM_HEAD_SIZE = _SECTION_HEAD.size
assert _BEM_HEAD_SIZE == 6

_PAYLOAD_TYPES = frozenset((BaseCommand.SEND, BaseCommand.MESSAGE))

# Fed chunks smaller than this are copied into a staging buffer rather than kept as they
# are, so a peer trickling a frame byte by byte costs about a byte of memory per byte
# instead of a Python object (some 200 bytes) per byte. At 4 KiB the per-object overhead
# of the chunks kept as they are stays under 5%.
CHUNK_BYTES_KEPT_MIN = 4096


# --- errors ------------------------------------------------------------------------------------

class FrameTooLarge(MalformedFrame):
    """A frame declares more bytes than the connection accepts."""

    def __init__(self, size_bytes: int, size_bytes_max: int) -> None:
        self.size_bytes = size_bytes
        self.size_bytes_max = size_bytes_max
        super().__init__(f"frame of {size_bytes} bytes exceeds the limit of {size_bytes_max}")


class PayloadChecksumMismatch(MalformedFrame):
    """The payload's CRC32C does not match its bytes. The frame boundary is intact, so the
    decoder stays usable; ``command`` (set when raised by the decoder) lets the broker
    answer a SEND with SEND_ERROR(ChecksumError) instead of closing the connection."""

    def __init__(self, checksum_stored: int, checksum_computed: int,
                 command: BaseCommand | None = None) -> None:
        self.checksum_stored = checksum_stored
        self.checksum_computed = checksum_computed
        self.command = command
        super().__init__(f"payload checksum mismatch: stored {checksum_stored:#010x} "
                         f"computed {checksum_computed:#010x}")


# --- decoded values -------------------------------------------------------------------------

class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA = _NeedData.NEED_DATA
"""Returned by :meth:`CommandDecoder.next_command` until a whole frame is buffered."""


@dataclass(frozen=True, slots=True)
class PayloadSection:
    metadata: MessageMetadata
    payload: memoryview                 # the message bytes (a batch, maybe compressed)
    stored: memoryview                  # magic | checksum | metadata_size | metadata | payload
    checksum: int                       # the CRC32C as sent, already verified
    broker_entry_metadata: BrokerEntryMetadata | None = None


@dataclass(frozen=True, slots=True)
class Frame:
    command: BaseCommand
    payload: PayloadSection | None      # set exactly for SEND and MESSAGE
    size_bytes: int                     # on the wire, length prefix included


# --- command type <-> body field -------------------------------------------------------

# BaseCommand keeps each command's body in the field whose number equals the type's
# value; the field names are irregular (partitionMetadata, lookupTopic...), so derive the
# table from the descriptor instead of spelling it out.
COMMAND_FIELD: dict[int, str] = {
    field.number: field.name
    for field in BaseCommand.DESCRIPTOR.fields
    if field.number != BaseCommand.DESCRIPTOR.fields_by_name["type"].number
}
assert COMMAND_FIELD[BaseCommand.SEND] == "send"
assert COMMAND_FIELD[BaseCommand.PARTITIONED_METADATA] == "partitionMetadata"
_TYPE_FOR_BODY: dict[str, int] = {
    BaseCommand.DESCRIPTOR.fields_by_name[name].message_type.full_name: number
    for number, name in COMMAND_FIELD.items()
}
# Bodies without fields: accepted without the body field, which some clients omit.
_EMPTY_BODY_TYPES = frozenset((BaseCommand.PING, BaseCommand.PONG))


def wrap(body: Message) -> BaseCommand:
    """The BaseCommand carrying ``body`` (a CommandXxx message), with the matching type."""
    command_type = _TYPE_FOR_BODY[body.DESCRIPTOR.full_name]
    command = BaseCommand(type=command_type)
    getattr(command, COMMAND_FIELD[command_type]).CopyFrom(body)
    return command


def command_body(command: BaseCommand) -> Message | None:
    """The command's body message, or None for a type this codec does not model."""
    name = COMMAND_FIELD.get(command.type)
    return None if name is None else getattr(command, name)


def command_name(command_type: int) -> str:
    return BaseCommand.Type.Name(command_type)


# --- protobuf parsing with proto2 rules enforced ---------------------------------------------

M = TypeVar("M", bound=Message)

# Field kinds for the string walk, cached per field descriptor. A message field whose
# type can hold no string at any depth (CommandSend, MessageIdData...) counts as a
# scalar: the walk does not enter it (most commands on the publish and ack paths).
_SCALAR, _STRING, _MESSAGE, _STRINGS, _MESSAGES = range(5)
_field_kinds: dict[FieldDescriptor, int] = {}
_holds_strings: dict[Descriptor, bool] = {}


def _may_hold_strings(descriptor: Descriptor) -> bool:
    """Whether a message of this type can carry a string field at any depth: some type
    reachable from it through its message fields (itself included; MessageIdData holds
    itself) declares one. Cached per type."""
    known = _holds_strings.get(descriptor)
    if known is None:
        reachable = {descriptor}
        pending = [descriptor]
        while pending:
            for field in pending.pop().fields:
                if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP) \
                        and field.message_type not in reachable:
                    reachable.add(field.message_type)
                    pending.append(field.message_type)
        known = _holds_strings[descriptor] = any(field.type == FieldDescriptor.TYPE_STRING
                                                 for message_type in reachable for field in message_type.fields)
    return known


def _field_kind(field: FieldDescriptor) -> int:
    kind = _field_kinds.get(field)
    if kind is None:
        if field.type == FieldDescriptor.TYPE_STRING:
            kind = _STRINGS if field.is_repeated else _STRING
        elif field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP) \
                and _may_hold_strings(field.message_type):
            kind = _MESSAGES if field.is_repeated else _MESSAGE
        else:
            kind = _SCALAR
        _field_kinds[field] = kind
    return kind


# A type with at most this many fields that can hold a string (SingleMessageMetadata,
# KeyValue, MessageIdData...) is checked field by field by name: cheaper than listing
# the fields set. Bigger ones (BaseCommand has dozens) list what is set.
_PLAN_FIELDS_MAX = 4
_plans: dict[Descriptor, tuple[tuple[str, int], ...] | None] = {}


def _plan(descriptor: Descriptor) -> tuple[tuple[str, int], ...] | None:
    if descriptor in _plans:
        return _plans[descriptor]
    fields = tuple((field.name, kind) for field in descriptor.fields if (kind := _field_kind(field)) != _SCALAR)
    plan = _plans[descriptor] = fields if len(fields) <= _PLAN_FIELDS_MAX else None
    return plan


def _strings_valid(message: Message) -> bool:
    """True if every string field set in ``message`` (recursively) decoded as UTF-8. The
    protobuf runtime hands back ``bytes`` instead of ``str`` for a proto2 string field
    with invalid UTF-8; a handler must never see that."""
    plan = _plan(message.DESCRIPTOR)
    if plan is not None:
        for name, kind in plan:
            if kind == _STRING:
                # An unset string reads as its default, a str.
                if type(getattr(message, name)) is not str:
                    return False
            elif kind == _MESSAGE:
                if message.HasField(name) and not _strings_valid(getattr(message, name)):
                    return False
            elif (items := getattr(message, name)) and not _items_valid(kind, items):
                return False
        return True
    for field, value in message.ListFields():
        kind = _field_kind(field)
        if kind == _SCALAR:
            continue
        if kind == _STRING:
            if type(value) is not str:
                return False
        elif kind == _MESSAGE:
            if not _strings_valid(value):
                return False
        elif not _items_valid(kind, value):
            return False
    return True


def _items_valid(kind: int, items) -> bool:
    """A repeated field's items: strings (``_STRINGS``) or messages (``_MESSAGES``)."""
    if kind == _STRINGS:
        for item in items:
            if type(item) is not str:
                return False
    else:
        for item in items:
            if not _strings_valid(item):
                return False
    return True


def parse_proto(message_class: type[M], data: bytes | memoryview, what: str) -> M:
    """Parses ``data`` as ``message_class`` and enforces what the runtime does not:
    proto2 required fields (a value of an enum newer than our .proto lands in unknown
    fields and so counts as missing) and UTF-8 strings. Raises MalformedFrame."""
    try:
        message = message_class.FromString(data)
    except (DecodeError, ValueError, TypeError, RecursionError) as error:
        raise MalformedFrame(f"{what} does not parse: {error}") from None
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise MalformedFrame(f"{what} lacks required fields: {missing}")
    if _may_hold_strings(message.DESCRIPTOR) and not _strings_valid(message):
        raise MalformedFrame(f"{what} has a string field that is not valid UTF-8")
    return message


def parse_proto_or_none(message_class: type[M], data: bytes | memoryview) -> M | None:
    """``parse_proto`` for a hot loop (a batch's messages): None instead of the error,
    so no description is formatted per message; the caller parses a None's data again
    with ``parse_proto`` for the error."""
    try:
        message = message_class.FromString(data)
    except (DecodeError, ValueError, TypeError, RecursionError):
        return None
    # (A type that holds no string has an empty plan: nothing to check.)
    if not message.IsInitialized() or not _strings_valid(message):
        return None
    return message


def _serialize(message: Message) -> bytes:
    # A missing required field on our own output is a broker bug, not peer input.
    assert message.IsInitialized(), message.FindInitializationErrors()
    return message.SerializeToString()


# --- decoding ------------------------------------------------------------------------------------

def decode_stored(stored: bytes | memoryview) -> PayloadSection:
    """Checks and parses a stored payload (magic, CRC32C, metadata_size, MessageMetadata,
    payload). Raises PayloadChecksumMismatch (without a command) or MalformedFrame."""
    view = memoryview(stored)
    if len(view) < STORED_HEAD_SIZE:
        raise MalformedFrame(f"payload section of {len(view)} bytes is shorter than its "
                             f"{STORED_HEAD_SIZE}-byte head")
    magic, checksum = _SECTION_HEAD.unpack_from(view, 0)
    if magic != MAGIC_CHECKSUM:
        raise MalformedFrame(f"payload magic {magic:#06x} is not {MAGIC_CHECKSUM:#06x}")
    # Verify before parsing: metadata from corrupted bytes is not worth reading.
    computed = crc32c.crc32c(view[_SECTION_HEAD.size:])
    if computed != checksum:
        raise PayloadChecksumMismatch(checksum, computed)
    (metadata_size,) = _U32.unpack_from(view, _SECTION_HEAD.size)
    if metadata_size > len(view) - STORED_HEAD_SIZE:
        raise MalformedFrame(f"metadata_size {metadata_size} exceeds the "
                             f"{len(view) - STORED_HEAD_SIZE} bytes that follow it")
    metadata_end = STORED_HEAD_SIZE + metadata_size
    metadata = parse_proto(MessageMetadata, view[STORED_HEAD_SIZE:metadata_end], "MessageMetadata")
    return PayloadSection(metadata, view[metadata_end:], view, checksum)


def _decode_unchecked(view: memoryview) -> PayloadSection:
    """A payload section sent without magic and checksum (metadata_size | metadata |
    payload): Pulsar makes the checksum optional, and some brokers (pulsar-lite) leave
    it out of MESSAGE frames. ``checksum`` is -1 and ``stored`` the bytes as they came."""
    if len(view) < _U32.size:
        raise MalformedFrame(f"payload section of {len(view)} bytes has no metadata_size")
    (metadata_size,) = _U32.unpack_from(view, 0)
    if metadata_size > len(view) - _U32.size:
        raise MalformedFrame(f"metadata_size {metadata_size} exceeds the "
                             f"{len(view) - _U32.size} bytes that follow it")
    metadata_end = _U32.size + metadata_size
    metadata = parse_proto(MessageMetadata, view[_U32.size:metadata_end], "MessageMetadata")
    return PayloadSection(metadata, view[metadata_end:], view, -1)


def decode_payload_section(section: bytes | memoryview, checksum_optional: bool = False) -> PayloadSection:
    """Parses what follows the command in a SEND or MESSAGE frame. With
    ``checksum_optional`` (MESSAGE frames: what a client reads), a section without the
    0x0e01 magic is read unchecked, as the official clients do."""
    view = memoryview(section)
    broker_entry_metadata = None
    offset = 0
    if len(view) >= _MAGIC.size and _MAGIC.unpack_from(view, 0)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if len(view) < _BEM_HEAD_SIZE:
            raise MalformedFrame("broker entry metadata head is truncated")
        (_magic, size) = _SECTION_HEAD.unpack_from(view, 0)
        if size > len(view) - _BEM_HEAD_SIZE:
            raise MalformedFrame(f"broker entry metadata size {size} exceeds the "
                                 f"{len(view) - _BEM_HEAD_SIZE} bytes that follow it")
        offset = _BEM_HEAD_SIZE + size
        broker_entry_metadata = parse_proto(BrokerEntryMetadata, view[_BEM_HEAD_SIZE:offset],
                                            "BrokerEntryMetadata")
    if checksum_optional and (len(view) - offset < _MAGIC.size
                              or _MAGIC.unpack_from(view, offset)[0] != MAGIC_CHECKSUM):
        stored = _decode_unchecked(view[offset:])
    else:
        stored = decode_stored(view[offset:])
    if broker_entry_metadata is None:
        return stored
    return PayloadSection(stored.metadata, stored.payload, stored.stored, stored.checksum,
                          broker_entry_metadata)


def decode_frame(frame: bytes | memoryview) -> Frame:
    """Parses one whole frame, length prefix included; raises MalformedFrame."""
    view = memoryview(frame)
    if len(view) < _FRAME_HEAD.size:
        raise MalformedFrame(f"frame of {len(view)} bytes is shorter than its {_FRAME_HEAD.size}-byte head")
    total_size, command_size = _FRAME_HEAD.unpack_from(view, 0)
    if total_size != len(view) - _U32.size:
        raise MalformedFrame(f"total_size {total_size} does not match {len(view) - _U32.size} bytes present")
    if command_size > total_size - _U32.size:
        raise MalformedFrame(f"command_size {command_size} exceeds total_size {total_size} - 4")
    command_end = _FRAME_HEAD.size + command_size
    command = parse_proto(BaseCommand, view[_FRAME_HEAD.size:command_end], "BaseCommand")
    field_name = COMMAND_FIELD.get(command.type)
    if (field_name is not None and command.type not in _EMPTY_BODY_TYPES
            and not command.HasField(field_name)):
        raise MalformedFrame(f"{command_name(command.type)} command lacks its {field_name} body")
    rest = view[command_end:]
    if command.type not in _PAYLOAD_TYPES:
        if rest:
            raise MalformedFrame(f"{command_name(command.type)} frame has {len(rest)} "
                                 "bytes after its command")
        return Frame(command, None, len(view))
    if not rest:
        raise MalformedFrame(f"{command_name(command.type)} frame has no payload section")
    try:
        section = decode_payload_section(rest, checksum_optional=command.type == BaseCommand.MESSAGE)
    except PayloadChecksumMismatch as error:
        raise PayloadChecksumMismatch(error.checksum_stored, error.checksum_computed, command) from None
    return Frame(command, section, len(view))


class CommandDecoder:
    """Turns a byte stream into frames. Call ``feed`` with each chunk read, then
    ``next_command`` until it returns NEED_DATA; so at most one partial frame plus the
    last chunk is ever buffered (``feed`` asserts the caller drained)."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        assert FRAME_BYTES_MIN <= frame_bytes_max <= _U32_MAX, frame_bytes_max
        self._frame_bytes_max = frame_bytes_max
        self._chunks: deque[memoryview] = deque()     # views of immutable bytes only
        self._staging = bytearray()                     # small chunks, after the deque
        self._buffered_bytes = 0
        self._total_size = -1           # of the frame at the head, once its prefix is in
        self._failure: MalformedFrame | None = None

    @property
    def buffered_bytes(self) -> int:
        return self._buffered_bytes

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        if self._failure is not None:
            raise self._failure
        assert self._total_size < 0 or self._buffered_bytes < _U32.size + self._total_size, \
            "call next_command() until NEED_DATA before feeding more"
        data = chunk if isinstance(chunk, bytes) else memoryview(chunk).cast("B")
        if not data:
            return
        if len(data) < CHUNK_BYTES_KEPT_MIN:
            self._staging += data
        else:
            # Frames and payloads handed out are views of this chunk, so it must never
            # change: bytes are kept as they are, anything mutable is copied once.
            self._seal_staging()
            self._chunks.append(memoryview(data if isinstance(data, bytes) else bytes(data)))
        self._buffered_bytes += len(data)
        if self._total_size < 0:
            self._read_total_size()

    def next_command(self) -> Frame | Literal[_NeedData.NEED_DATA]:
        if self._failure is not None:
            raise self._failure
        if self._total_size < 0:
            self._read_total_size()
            if self._total_size < 0:
                return NEED_DATA
        frame_size = _U32.size + self._total_size
        if self._buffered_bytes < frame_size:
            return NEED_DATA
        frame = self._take(frame_size)
        self._total_size = -1
        try:
            return decode_frame(frame)
        except PayloadChecksumMismatch:
            raise                       # the frame is consumed; decoding may go on
        except MalformedFrame as error:
            self._failure = error
            raise

    def _read_total_size(self) -> None:
        if self._buffered_bytes < _U32.size:
            return
        (total_size,) = _U32.unpack(self._peek(_U32.size))
        if total_size < FRAME_BYTES_MIN:
            self._failure = MalformedFrame(f"total_size {total_size} is below {FRAME_BYTES_MIN}")
            raise self._failure
        if total_size > self._frame_bytes_max:
            self._failure = FrameTooLarge(total_size, self._frame_bytes_max)
            raise self._failure
        self._total_size = total_size

    def _seal_staging(self) -> None:
        """Moves the staged small chunks to the deque as one immutable chunk."""
        if self._staging:
            self._chunks.append(memoryview(bytes(self._staging)))
            self._staging.clear()

    def _peek(self, size: int) -> bytes:
        assert size <= self._buffered_bytes
        self._seal_staging()
        parts = []
        needed = size
        for chunk in self._chunks:
            parts.append(chunk[:needed])
            needed -= len(parts[-1])
            if needed == 0:
                break
        return b"".join(parts)

    def _take(self, size: int) -> memoryview:
        """Removes ``size`` bytes from the buffer: a slice of the first chunk when it holds
        them all, else one join."""
        assert 0 < size <= self._buffered_bytes, (size, self._buffered_bytes)
        self._seal_staging()
        self._buffered_bytes -= size
        first = self._chunks[0]
        if len(first) >= size:
            if len(first) == size:
                self._chunks.popleft()
            else:
                self._chunks[0] = first[size:]
            return first[:size]
        parts = []
        needed = size
        while needed:
            chunk = self._chunks.popleft()
            if len(chunk) > needed:
                self._chunks.appendleft(chunk[needed:])
                chunk = chunk[:needed]
            parts.append(chunk)
            needed -= len(chunk)
        return memoryview(b"".join(parts))


# --- encoding -------------------------------------------------------------------------------------

def encode_command(command: BaseCommand) -> bytes:
    """A frame without payload section."""
    assert command.type not in _PAYLOAD_TYPES, command_name(command.type)
    _assert_body_matches(command)
    body = _serialize(command)
    return _FRAME_HEAD.pack(_U32.size + len(body), len(body)) + body


def _stored_buffers(metadata: MessageMetadata, payload: bytes | memoryview) -> list[bytes | memoryview]:
    metadata_bytes = _serialize(metadata)
    sized_metadata = _U32.pack(len(metadata_bytes)) + metadata_bytes
    # The crc32c package continues a running value, so the payload is hashed in place
    # after the metadata rather than joined to it first.
    checksum = crc32c.crc32c(payload, crc32c.crc32c(sized_metadata))
    return [_SECTION_HEAD.pack(MAGIC_CHECKSUM, checksum) + sized_metadata, payload]


def encode_stored(metadata: MessageMetadata, payload: bytes | memoryview) -> bytes:
    """The stored payload: magic | CRC32C | metadata_size | MessageMetadata | payload."""
    return b"".join(_stored_buffers(metadata, payload))


def _frame_buffers(command: BaseCommand, stored: list[bytes | memoryview],
                   broker_entry_metadata: BrokerEntryMetadata | None) -> list[bytes | memoryview]:
    assert command.type in _PAYLOAD_TYPES, command_name(command.type)
    _assert_body_matches(command)
    body = _serialize(command)
    section: list[bytes | memoryview] = []
    if broker_entry_metadata is not None:
        bem = _serialize(broker_entry_metadata)
        section.append(_SECTION_HEAD.pack(MAGIC_BROKER_ENTRY_METADATA, len(bem)) + bem)
    section.extend(stored)
    total_size = _U32.size + len(body) + sum(len(buffer) for buffer in section)
    assert total_size <= _U32_MAX, total_size
    return [_FRAME_HEAD.pack(total_size, len(body)) + body, *section]


def message_frame_buffers(command: BaseCommand, stored: bytes | memoryview,
                          broker_entry_metadata: BrokerEntryMetadata | None = None
                          ) -> list[bytes | memoryview]:
    """The buffers of a SEND or MESSAGE frame whose payload section is an already-encoded
    stored payload (an entry read back from a ledger). Hand them to ``writelines`` to
    send the payload without copying it. Nothing is re-encoded or re-hashed: the ledger
    reader has checked the entry's own digest, and the client checks this checksum."""
    assert len(stored) >= STORED_HEAD_SIZE, len(stored)
    assert _MAGIC.unpack_from(stored, 0)[0] == MAGIC_CHECKSUM
    return _frame_buffers(command, [stored], broker_entry_metadata)


def encode_message_frame(command: BaseCommand, stored: bytes | memoryview,
                         broker_entry_metadata: BrokerEntryMetadata | None = None) -> bytes:
    """:func:`message_frame_buffers` joined into one bytes object."""
    return b"".join(message_frame_buffers(command, stored, broker_entry_metadata))


def encode_payload_command(command: BaseCommand, metadata: MessageMetadata,
                           payload: bytes | memoryview,
                           broker_entry_metadata: BrokerEntryMetadata | None = None) -> bytes:
    """A SEND or MESSAGE frame built from its parts; the checksum is computed here."""
    return b"".join(_frame_buffers(command, _stored_buffers(metadata, payload), broker_entry_metadata))


def _assert_body_matches(command: BaseCommand) -> None:
    field_name = COMMAND_FIELD.get(command.type)
    if field_name is not None and command.type not in _EMPTY_BODY_TYPES:
        assert command.HasField(field_name), f"{command_name(command.type)} without {field_name}"


def stored_metadata(stored: bytes | memoryview) -> MessageMetadata:
    """The MessageMetadata of a stored payload, parsed as trusted: for the dispatch
    path, which runs this for every entry it sends. Neither the CRC32C nor what
    parse_proto enforces (required fields, UTF-8 strings) is checked again: the whole
    stored payload was checked by decode_stored when the SEND arrived, nothing
    re-encodes it since, and the ledger reader verified the entry's digest on the way
    back (the producer's checksum also travels on to the consumer, which checks it).
    Bytes that do not parse at all still raise MalformedFrame, nothing else."""
    view = memoryview(stored)
    if len(view) < STORED_HEAD_SIZE or _MAGIC.unpack_from(view, 0)[0] != MAGIC_CHECKSUM:
        raise MalformedFrame("stored payload lacks its 0x0e01 head")
    (metadata_size,) = _U32.unpack_from(view, _SECTION_HEAD.size)
    if metadata_size > len(view) - STORED_HEAD_SIZE:
        raise MalformedFrame(f"metadata_size {metadata_size} exceeds the stored payload")
    try:
        return MessageMetadata.FromString(view[STORED_HEAD_SIZE:STORED_HEAD_SIZE + metadata_size])
    except (DecodeError, ValueError, TypeError, RecursionError) as error:
        raise MalformedFrame(f"stored MessageMetadata does not parse: {error}") from None
