"""The payload ``magnetar perf produce`` sends: a 24-byte header, then filler.

    offset  size  field         meaning
    0       4     magic         b"MGP1" (Magnetar perf, layout 1)
    4       4     producer_id   random per producer: tells apart producers of one run
    8       8     sequence      0, 1, 2 … per producer: duplicates and gaps show
    16      8     send_time_ns  wall clock (time.time_ns) when the message was handed
                                to the client, for end-to-end latency
    24      …     filler        random bytes (incompressible), same for every message

All big-endian. The message's event time (ms, Pulsar's own field) is set too, so that a
consumer of other producers' messages still measures latency, at ms resolution; the
header gives µs resolution, which matters when the latency itself is a few ms.
Messages shorter than the header carry no header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"MGP1"
_HEADER = struct.Struct(">4sIQQ")
HEADER_BYTES = _HEADER.size
assert HEADER_BYTES == 24


@dataclass(frozen=True)
class PerfHeader:
    producer_id: int
    sequence: int
    send_time_ns: int


def encode(header: PerfHeader, filler: bytes) -> bytes:
    """The header followed by ``filler`` (whose length makes the message size)."""
    return _HEADER.pack(MAGIC, header.producer_id, header.sequence, header.send_time_ns) + filler


def decode(payload: bytes) -> PerfHeader | None:
    """The header of a perf payload, or None for any other payload."""
    if len(payload) < HEADER_BYTES or payload[:4] != MAGIC:
        return None
    _, producer_id, sequence, send_time_ns = _HEADER.unpack_from(payload)
    return PerfHeader(producer_id, sequence, send_time_ns)
