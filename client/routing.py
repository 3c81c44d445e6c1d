"""Which partition of a partitioned topic a keyed message goes to, as the official
Python client (pulsar-client 3.x, built on the C++ client) routes it by default: the
C++ client's ``BoostHash`` scheme, ``boost::hash<std::string>`` of the key's UTF-8
bytes (Boost 1.81+ on 64-bit: a multiply-xor hash over 8-byte words), masked to 31
bits, modulo the partition count. So rows a Spark job writes with a key land in the
partition the official client would have chosen for the same key, and a consumer of
one partition sees every message of its keys. Pure.

(Java's client hashes keys with JavaStringHash by default, Go's and the Java client's
Murmur3_32Hash option differ again: Pulsar's clients do not agree with each other.)
``tests/unit/test_client_routing.py`` pins keys to the partitions the official client
chose for them.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1
_Q = 0x9E3779B97F4A7C15                     # 2^64 / golden ratio
_K = 0xDF442D22CE4859B9                     # _Q * _Q mod 2^64


def _multiply_xor(x: int, y: int) -> int:
    """The 128-bit product of two 64-bit words folded to 64 bits (low ^ high)."""
    product = (x & _MASK64) * (y & _MASK64)
    return (product & _MASK64) ^ (product >> 64)


def key_hash(key: str) -> int:
    """boost::hash<std::string> of ``key`` on a 64-bit platform (seed 0)."""
    data = key.encode()
    remaining = len(data)
    offset = 0
    word = _multiply_xor(_Q, _K)
    state = word ^ remaining
    while remaining >= 8:
        chunk = int.from_bytes(data[offset:offset + 8], "little")
        word = (word + _Q) & _MASK64
        state ^= _multiply_xor((chunk + word) & _MASK64, _K)
        offset += 8
        remaining -= 8
    chunk = 0
    if remaining >= 4:
        low = int.from_bytes(data[offset:offset + 4], "little")
        high = int.from_bytes(data[offset + remaining - 4:offset + remaining], "little")
        chunk = (high << ((remaining - 4) * 8)) | low
    elif remaining >= 1:
        second = (remaining - 1) & 2
        middle = remaining >> 1
        chunk = (data[offset + second] << (second * 8)) | (data[offset + middle] << (middle * 8)) | data[offset]
    word = (word + _Q) & _MASK64
    state ^= _multiply_xor((chunk + word) & _MASK64, _K)
    return _multiply_xor((state + word) & _MASK64, _K)


def key_partition(key: str, partitions: int) -> int:
    """The partition (0 .. partitions-1) the official Python client picks for ``key``."""
    assert partitions > 0, partitions
    return (key_hash(key) & 0x7FFFFFFF) % partitions
