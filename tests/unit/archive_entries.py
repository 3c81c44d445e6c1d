"""Stored entries for the archive's unit tests: single messages, batches with keys,
properties and event times, compressed and encrypted payloads, built with the codec the
broker stores them with (protocol/codec.py, protocol/batch.py)."""

from __future__ import annotations

import zlib

import pyarrow as pa

from protocol.batch import encode_batch
from protocol.codec import encode_stored
from protocol.proto.pulsar_api_pb2 import CompressionType, EncryptionKeys, KeyValue, MessageMetadata, SingleMessageMetadata

PUBLISH_TIME_BASE_MS = 1_700_000_000_000


def single(entry_id: int, *, key: str | None = "k", payload: bytes | None = None, sequence_id: int | None = None,
           properties: dict[str, str] | None = None, event_time: int = 0) -> bytes:
    metadata = MessageMetadata(producer_name="producer-a", sequence_id=entry_id if sequence_id is None else sequence_id,
                               publish_time=PUBLISH_TIME_BASE_MS + entry_id)
    if key is not None:
        metadata.partition_key = key
    if event_time:
        metadata.event_time = event_time
    for name, value in ({"entry": str(entry_id)} if properties is None else properties).items():
        metadata.properties.append(KeyValue(key=name, value=value))
    return encode_stored(metadata, payload if payload is not None else b"single-%d" % entry_id)


def batch(entry_id: int, count: int = 5, *, compression: int = CompressionType.NONE) -> bytes:
    messages = []
    for index in range(count):
        single_metadata = SingleMessageMetadata(partition_key=f"key-{index % 3}", event_time=10**12 + index)
        single_metadata.properties.append(KeyValue(key="index", value=str(index)))
        if index == 2:
            single_metadata.ordering_key = b"\x00order"
        messages.append((single_metadata, b"m%d-%d|" % (entry_id, index) + b"x" * index))
    payload = encode_batch(messages)
    metadata = MessageMetadata(producer_name="producer-b", sequence_id=1000 + entry_id * count,
                               publish_time=PUBLISH_TIME_BASE_MS + entry_id, num_messages_in_batch=count)
    if compression != CompressionType.NONE:
        metadata.compression = compression
        metadata.uncompressed_size = len(payload)
        if compression == CompressionType.ZLIB:
            payload = zlib.compress(payload)
        else:
            name = {CompressionType.LZ4: "lz4_raw", CompressionType.ZSTD: "zstd"}[compression]
            payload = pa.Codec(name).compress(payload, asbytes=True)
    return encode_stored(metadata, payload)


def encrypted(entry_id: int) -> bytes:
    metadata = MessageMetadata(producer_name="producer-c", sequence_id=entry_id,
                               publish_time=PUBLISH_TIME_BASE_MS + entry_id, num_messages_in_batch=3)
    metadata.encryption_keys.append(EncryptionKeys(key="app-key", value=b"wrapped-key"))
    return encode_stored(metadata, b"\x8f" * 40)


def mixed(count: int) -> list[bytes]:
    """``count`` entries cycling through every kind."""
    makers = [
        lambda i: single(i),
        lambda i: batch(i),
        lambda i: single(i, key=None, properties={}),
        lambda i: batch(i, 3, compression=CompressionType.ZLIB),
        lambda i: batch(i, 4, compression=CompressionType.LZ4),
        lambda i: batch(i, 2, compression=CompressionType.ZSTD),
        lambda i: encrypted(i),
        lambda i: single(i, payload=b"", event_time=10**12 + i),
    ]
    return [makers[i % len(makers)](i) for i in range(count)]
