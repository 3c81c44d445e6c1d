"""The add socket's framing (protocol/add_socket.py): a message is its 4-byte
big-endian length and its bytes; a length past the bound is refused before anything
that long is read; bytes that are not the message expected are MalformedFrame; a stream
cut anywhere is put together again by the incremental decoder, which says how many bytes
of an unfinished message it holds (so an end inside a message can be told from a clean
one)."""

from __future__ import annotations

import struct

import pytest

from common.errors import MalformedFrame
from protocol.add_socket import LENGTH_BYTES, MessageDecoder, decode_length, encode_message, parse
from protocol.proto import bookie_pb2


def _request() -> bookie_pb2.AddRequest:
    return bookie_pb2.AddRequest(entries=[bookie_pb2.AddEntry(ledger_id=3, entry_id=7, entry=b"e" * 100)],
                                 replies_may_merge=True)


def test_a_message_round_trips_and_lengths_are_bounded():
    frame = encode_message(_request())
    length = decode_length(frame[:LENGTH_BYTES], 1024)
    assert length == len(frame) - LENGTH_BYTES
    assert parse(bookie_pb2.AddRequest, frame[LENGTH_BYTES:]) == _request()
    with pytest.raises(MalformedFrame, match="exceeds"):
        decode_length(struct.pack(">I", 1025), 1024)
    with pytest.raises(MalformedFrame):
        parse(bookie_pb2.AddRequest, b"\xff\xff\xff")


def test_the_incremental_decoder_cuts_messages_however_the_bytes_arrive():
    frames = [encode_message(_request()), encode_message(bookie_pb2.AddSocketHello(token="t")),
              encode_message(_request())]
    stream = b"".join(frames)
    bodies = [frame[LENGTH_BYTES:] for frame in frames]
    for chunk_bytes in (1, 3, 7, len(stream)):
        decoder = MessageDecoder(1024)
        got = []
        for start in range(0, len(stream), chunk_bytes):
            decoder.feed(stream[start:start + chunk_bytes])
            while (body := decoder.next_body()) is not None:
                got.append(body)
        assert got == bodies, chunk_bytes
        assert decoder.buffered_bytes == 0


def test_the_incremental_decoder_refuses_a_long_length_before_its_body():
    decoder = MessageDecoder(1024)
    decoder.feed(struct.pack(">I", 1025))     # the header alone: nothing of the body yet
    with pytest.raises(MalformedFrame, match="exceeds"):
        decoder.next_body()
    partial = MessageDecoder(1024)
    partial.feed(encode_message(_request())[:-1])
    assert partial.next_body() is None and partial.buffered_bytes > 0
