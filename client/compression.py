"""Payloads compressed for a producer (``compress``), decompressed for a consumer: the four codecs of
Pulsar's ``CompressionType`` in the forms the official clients write them — ZLIB (a
zlib stream), LZ4 (a raw LZ4 block, no frame), ZSTD (a zstd frame) and SNAPPY (raw
snappy, no framing). Pure: bytes in, bytes out.

``uncompressed_size`` in the message metadata is the producer's word, not to be trusted
blindly: it must be at most ``UNCOMPRESSED_BYTES_MAX``, and the output buffer is
exactly one byte larger than it, so a payload that inflates past it fails instead of
taking memory, and one that inflates to another size fails too. ZLIB comes from the
standard library; LZ4, ZSTD and SNAPPY from ``cramjam`` (pyproject.toml says why).
"""

from __future__ import annotations

import zlib

from common.errors import MalformedFrame
from protocol.proto import pulsar_api_pb2 as pb

# Pulsar's own 5 MiB message limit, doubled.
UNCOMPRESSED_BYTES_MAX = 10 * 1024 * 1024

CODECS: frozenset[int] = frozenset({pb.ZLIB, pb.LZ4, pb.ZSTD, pb.SNAPPY})


def decompress(codec: int, payload: bytes | memoryview, size: int) -> bytes:
    """``payload`` decompressed with ``codec`` (one of CODECS) into exactly ``size``
    bytes. Raises MalformedFrame for a size out of bounds or bytes that do not
    decompress to that size."""
    assert codec in CODECS, codec
    name = pb.CompressionType.Name(codec)
    if not 0 <= size <= UNCOMPRESSED_BYTES_MAX:
        raise MalformedFrame(f"uncompressed_size {size} is outside 0..{UNCOMPRESSED_BYTES_MAX}")
    if codec == pb.ZLIB:
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(bytes(payload), size + 1)
        except zlib.error as error:
            raise MalformedFrame(f"ZLIB payload does not inflate: {error}") from None
        if len(data) != size or inflater.unconsumed_tail:
            raise MalformedFrame(f"ZLIB payload inflates to more or less than uncompressed_size {size}")
        return data
    import cramjam       # here: the gateway's consumers rarely meet compressed payloads

    output = bytearray(size + 1)
    try:
        if codec == pb.LZ4:
            written = cramjam.lz4.decompress_block_into(bytes(payload), output)
        elif codec == pb.ZSTD:
            written = cramjam.zstd.decompress_into(bytes(payload), output)
        else:
            declared = cramjam.snappy.decompress_raw_len(bytes(payload))
            if declared != size:
                raise MalformedFrame(f"SNAPPY payload declares {declared} bytes, uncompressed_size {size}")
            written = cramjam.snappy.decompress_raw_into(bytes(payload), output)
    except cramjam.DecompressionError as error:
        raise MalformedFrame(f"{name} payload does not decompress to uncompressed_size {size}: {error}") from None
    if written != size:
        raise MalformedFrame(f"{name} payload decompresses to {written} bytes, not uncompressed_size {size}")
    return bytes(output[:size])


def compress(codec: int, payload: bytes) -> bytes:
    """``payload`` compressed with ``codec`` (one of CODECS) in the form the official
    clients write it, so their consumers (and ``decompress``) read it."""
    assert codec in CODECS, codec
    if codec == pb.ZLIB:
        return zlib.compress(payload)
    import cramjam

    if codec == pb.LZ4:
        return bytes(cramjam.lz4.compress_block(payload, store_size=False))
    if codec == pb.ZSTD:
        return bytes(cramjam.zstd.compress(payload))
    return bytes(cramjam.snappy.compress_raw(payload))
