"""Stored entries rebuilt, byte for byte, from the rows of an archive record batch.
Pure: a record batch in, (entry_id, stored payload) pairs out.

The stored payload of an entry (protocol/codec.py) is

    0x0e01 | CRC32C | metadata_size | MessageMetadata | payload

and the archive keeps, on the entry's first row, the MessageMetadata bytes exactly as
the producer sent them (``entry_metadata``) and the producer's CRC32C
(``entry_checksum``). The payload is, in order of precedence:

- ``entry_payload`` when set (a compressed entry: the rows hold the messages
  decompressed, this column the bytes as stored);
- for a batch (``single_metadata`` set on its rows): each message as
  ``u32 size | SingleMessageMetadata bytes | payload``, in batch-index order;
- otherwise the single row's ``payload`` (a message not in a batch, or an entry kept
  opaque because it is encrypted).

The CRC32C is computed over the rebuilt bytes and must equal the kept one: a rebuild
that differs from what the producer sent is reported as ArchiveCorrupt, never served.
So consumers get the very bytes the bookies held: same message ids, same batches,
same properties, and the producer's checksum still checks end to end.
"""

from __future__ import annotations

import struct

import crc32c
import pyarrow as pa

from archive.format import COLUMN_INDEX
from common.errors import ArchiveCorrupt
from protocol.codec import MAGIC_CHECKSUM

_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">HI")   # magic, checksum


def entries_of_batch(batch: pa.RecordBatch, url: str, batch_index: int) -> list[tuple[int, bytes]]:
    """Every entry of a record batch as (entry_id, stored payload), in entry order.
    ``url`` and ``batch_index`` name the batch in errors."""
    rows = batch.num_rows
    column = batch.column
    entry_ids = column(COLUMN_INDEX["entry_id"]).to_pylist()
    entry_metadatas = column(COLUMN_INDEX["entry_metadata"]).to_pylist()
    checksums = column(COLUMN_INDEX["entry_checksum"]).to_pylist()
    singles = column(COLUMN_INDEX["single_metadata"]).to_pylist()
    payloads = column(COLUMN_INDEX["payload"]).to_pylist()
    entry_payloads = column(COLUMN_INDEX["entry_payload"]).to_pylist()
    entries: list[tuple[int, bytes]] = []
    row = 0
    while row < rows:
        entry_id = entry_ids[row]
        metadata_bytes = entry_metadatas[row]
        checksum = checksums[row]
        if metadata_bytes is None or checksum is None:
            raise ArchiveCorrupt(url, f"row {row} starts entry {entry_id} but has no entry metadata", batch_index)
        end = row + 1
        while end < rows and entry_ids[end] == entry_id:
            if entry_metadatas[end] is not None:
                raise ArchiveCorrupt(url, f"row {end} of entry {entry_id} repeats the entry metadata", batch_index)
            end += 1
        if entries and entry_id != entries[-1][0] + 1:
            raise ArchiveCorrupt(url, f"entry {entry_id} follows entry {entries[-1][0]}", batch_index)
        parts = [_U32.pack(len(metadata_bytes)), metadata_bytes]
        if entry_payloads[row] is not None:
            parts.append(entry_payloads[row])
        elif singles[row] is not None:
            for index in range(row, end):
                single = singles[index]
                if single is None:
                    raise ArchiveCorrupt(url, f"row {index} of batched entry {entry_id} has no message metadata",
                                         batch_index)
                parts.append(_U32.pack(len(single)))
                parts.append(single)
                parts.append(payloads[index])
        else:
            if end != row + 1:
                raise ArchiveCorrupt(url, f"entry {entry_id} has {end - row} rows but is not a batch", batch_index)
            parts.append(payloads[row])
        # One join and one CRC32C over it: cheaper than a CRC32C call per part for a
        # batch of many small messages.
        body = b"".join(parts)
        computed = crc32c.crc32c(body)
        if computed != checksum:
            raise ArchiveCorrupt(url, f"entry {entry_id} rebuilds with CRC32C {computed:#010x}, "
                                      f"not the producer's {checksum:#010x}", batch_index)
        entries.append((entry_id, _HEAD.pack(MAGIC_CHECKSUM, checksum) + body))
        row = end
    return entries
