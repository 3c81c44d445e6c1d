"""The perf payload header (magnetar/tools/perf_payload.py), pure.

Proves that: the header is 24 bytes laid out as its table says (magic, producer id,
sequence, send time; big-endian) and the filler follows it unchanged; encode then decode
gives the header back at the extremes of every field; payloads shorter than the header
or without the magic are not perf payloads.
"""

from __future__ import annotations

import pytest

from magnetar.tools.perf_payload import HEADER_BYTES, MAGIC, PerfHeader, decode, encode


def test_golden_layout():
    payload = encode(PerfHeader(producer_id=0x01020304, sequence=5, send_time_ns=0x1122334455667788), b"xyz")
    assert HEADER_BYTES == 24
    assert payload == (b"MGP1" + bytes.fromhex("01020304") + bytes.fromhex("0000000000000005")
                       + bytes.fromhex("1122334455667788") + b"xyz")


@pytest.mark.parametrize("header", [
    PerfHeader(0, 0, 0),
    PerfHeader(2**32 - 1, 2**64 - 1, 2**64 - 1),
    PerfHeader(12345, 678, 1_700_000_000_123_456_789),
])
def test_round_trip(header):
    payload = encode(header, b"\x00" * 1000)
    assert len(payload) == HEADER_BYTES + 1000
    assert decode(payload) == header


def test_header_alone_decodes():
    assert decode(encode(PerfHeader(1, 2, 3), b"")) == PerfHeader(1, 2, 3)


@pytest.mark.parametrize("payload", [
    b"",
    MAGIC,
    encode(PerfHeader(1, 2, 3), b"")[:HEADER_BYTES - 1],
    b"MGP2" + bytes(20),
    bytes(100),
])
def test_other_payloads_are_not_perf_payloads(payload):
    assert decode(payload) is None
