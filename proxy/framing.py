"""Whole frames out of a byte buffer, leaving what follows untouched: the proxy reads
frames only until it starts piping, and the bytes after the last frame it read must
reach the broker exactly as the client sent them."""

from __future__ import annotations

import struct

from common.errors import MalformedFrame
from protocol.codec import FRAME_BYTES_MIN, Frame, FrameTooLarge, decode_frame

_SIZE = struct.Struct(">I")


def take_frame(buffer: bytearray, frame_bytes_max: int) -> Frame | None:
    """The first whole frame of ``buffer`` (removed from it), None if it is not whole
    yet. MalformedFrame (FrameTooLarge) for a frame that cannot be valid."""
    if len(buffer) < _SIZE.size:
        return None
    (total,) = _SIZE.unpack_from(buffer)
    if total > frame_bytes_max:
        raise FrameTooLarge(total, frame_bytes_max)
    if total < FRAME_BYTES_MIN:
        raise MalformedFrame(f"frame of {total} bytes is too short")
    if len(buffer) < _SIZE.size + total:
        return None
    frame = bytes(buffer[:_SIZE.size + total])
    del buffer[:_SIZE.size + total]
    return decode_frame(frame)
