"""Raw Pulsar frames over a socket, for tests that speak the protocol by hand (a
client naming someone else, a forged field): send a frame, read its answer, go on."""

from __future__ import annotations

import socket
import time

from protocol.codec import NEED_DATA, CommandDecoder


def exchange(stream: socket.socket, frames: list[bytes], timeout_s: float = 10.0,
             count: int | None = None) -> list:
    """Sends ``frames`` one at a time, each after one answer frame to the one before;
    returns the frames read (stopping once ``count`` are read, when given). Ends early
    when the peer closes or nothing comes within ``timeout_s`` in all."""
    decoder = CommandDecoder()
    got: list = []
    deadline = time.monotonic() + timeout_s
    stream.settimeout(timeout_s)
    for frame in frames:
        stream.sendall(frame)
        wanted = len(got) + 1
        while len(got) < wanted and time.monotonic() < deadline:
            try:
                chunk = stream.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                return got
            decoder.feed(chunk)
            while (decoded := decoder.next_command()) is not NEED_DATA:
                got.append(decoded)
        if count is not None and len(got) >= count:
            break
    return got
