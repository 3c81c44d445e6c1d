"""The add socket's framing: the add stream without gRPC (issue 16).

Every message on the connection is a 4-byte big-endian length and then that many bytes
of one protobuf message of ``proto/bookie.proto``: the writer sends an
``AddSocketHello`` and then ``AddRequest``s, the bookie an ``AddSocketWelcome`` and
then ``AddResponse``s, with the same meaning as gRPC's ``AddEntries`` stream (replies in
order, one per request or one for several when the requests let them merge). Pure:
bytes in, messages out; a length past the bound or a message that does not parse is
``MalformedFrame``, and the connection that sent it is closed by its owner.
"""

from __future__ import annotations

import struct
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from common.errors import MalformedFrame

_LENGTH = struct.Struct(">I")
LENGTH_BYTES = _LENGTH.size

M = TypeVar("M", bound=Message)


def encode_message(message: Message) -> bytes:
    body = message.SerializeToString()
    return _LENGTH.pack(len(body)) + body


def decode_length(header: bytes, message_bytes_max: int) -> int:
    """The length a message's 4-byte header announces; MalformedFrame past the bound
    (checked before anything that long is read)."""
    assert len(header) == LENGTH_BYTES, len(header)
    (length,) = _LENGTH.unpack(header)
    if length > message_bytes_max:
        raise MalformedFrame(f"add socket message of {length} bytes exceeds {message_bytes_max}")
    return length


def parse(cls: type[M], body: bytes) -> M:
    """``cls`` from a message's bytes; MalformedFrame when they are not one."""
    try:
        return cls.FromString(body)
    except (DecodeError, ValueError, RecursionError) as error:
        raise MalformedFrame(f"add socket message is not a {cls.__name__}: {error}") from None


class MessageDecoder:
    """Cuts the bytes of a connection, fed as they arrive, into message bodies. A length
    past the bound is MalformedFrame as soon as its header is in (before the body is
    waited for); at most one message plus one read's bytes are held."""

    def __init__(self, message_bytes_max: int) -> None:
        self._message_bytes_max = message_bytes_max
        self._buffer = bytearray()
        self._offset = 0          # where the next message starts in _buffer
        self._length = -1         # the current message's length, once its header is in

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_body(self) -> bytes | None:
        """The next whole message's bytes, or None until more are fed."""
        available = len(self._buffer) - self._offset
        if self._length < 0:
            if available < LENGTH_BYTES:
                self._compact()
                return None
            self._length = decode_length(bytes(self._buffer[self._offset:self._offset + LENGTH_BYTES]),
                                         self._message_bytes_max)
            self._offset += LENGTH_BYTES
            available -= LENGTH_BYTES
        if available < self._length:
            self._compact()
            return None
        body = bytes(self._buffer[self._offset:self._offset + self._length])
        self._offset += self._length
        self._length = -1
        return body

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._offset

    def _compact(self) -> None:
        if self._offset:
            del self._buffer[:self._offset]
            self._offset = 0
