"""The entry format: one ledger entry as written by the ledger client, stored by the
bookie (journal and entry log keep these bytes unchanged) and verified by readers.

Layout (big-endian), ENTRY_HEADER_SIZE = 44 bytes, then the payload:

    offset  size  field               meaning
    0       2     magic               0x4D45 ("ME", Magnetar Entry)
    2       1     format_version      FORMAT_VERSION
    3       1     flags               reserved, 0
    4       8     ledger_id           u64
    12      8     entry_id            u64
    20      8     last_add_confirmed  i64; the writer's LAC when it sent the entry, -1 none
    28      8     length_bytes        u64; payload bytes of the ledger up to and including
                                      this entry (recovery closes a ledger with it)
    36      4     payload_size        u32, bytes after the header
    40      4     digest              CRC32C over bytes [0, 40) then the payload

Versions:
    1  first version.

The digest is computed once by the writer. The bookie checks it on add (a bad writer
or a corrupted network buffer never reaches the journal) and when it reads the entry
back from disk; the reader checks it again. Nothing else re-encodes an entry: the
bookie journals, stores and returns the writer's bytes, and recovery re-replicates them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from common.errors import DigestMismatch, MalformedFrame

ENTRY_MAGIC = 0x4D45
FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1

_HEADER = struct.Struct(">HBBQQqQI")  # magic, version, flags, ledger, entry, last add confirmed, length, payload size
_DIGEST = struct.Struct(">I")
ENTRY_HEADER_SIZE = _HEADER.size + _DIGEST.size
assert ENTRY_HEADER_SIZE == 44

NO_ENTRY = -1

_KIB = 1024
_MIB = 1024 * _KIB
# The largest encoded entry (header included) a bookie accepts, by default. Pulsar's
# default maximum message is 5 MiB and a producer batch is one entry; the margin covers
# the entry header and the broker's metadata. Bookies and the ledger client use the same
# default: a client must not submit what its bookies refuse.
ENTRY_BYTES_MAX_DEFAULT = 5 * _MIB + 64 * _KIB


@dataclass(frozen=True, slots=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    length_bytes: int
    payload_size: int


def encode_entry(ledger_id: int, entry_id: int, last_add_confirmed: int, length_bytes: int,
                 payload: bytes | memoryview) -> bytes:
    """Returns header + payload as one bytes object (the unit sent and stored)."""
    assert ledger_id >= 0, ledger_id
    assert entry_id >= 0, entry_id
    assert last_add_confirmed >= NO_ENTRY and last_add_confirmed < entry_id, (last_add_confirmed, entry_id)
    assert length_bytes >= len(payload), (length_bytes, len(payload))
    head = _HEADER.pack(ENTRY_MAGIC, FORMAT_VERSION, 0, ledger_id, entry_id, last_add_confirmed, length_bytes,
                        len(payload))
    digest = crc32c.crc32c(payload, crc32c.crc32c(head))
    return b"".join((head, _DIGEST.pack(digest), payload))


def decode_header(data: bytes | memoryview) -> EntryHeader:
    """Parses and checks the header only (magic, version, size); not the digest."""
    if len(data) < ENTRY_HEADER_SIZE:
        raise MalformedFrame(f"entry of {len(data)} bytes is shorter than its {ENTRY_HEADER_SIZE}-byte header")
    magic, version, _flags, ledger_id, entry_id, last_add_confirmed, length_bytes, payload_size = \
        _HEADER.unpack_from(data, 0)
    if magic != ENTRY_MAGIC:
        raise MalformedFrame(f"entry magic {magic:#06x} is not {ENTRY_MAGIC:#06x}")
    if not FORMAT_VERSION_MIN <= version <= FORMAT_VERSION:
        raise MalformedFrame(f"entry format version {version} is not supported")
    if payload_size != len(data) - ENTRY_HEADER_SIZE:
        raise MalformedFrame(
            f"entry payload_size {payload_size} does not match {len(data) - ENTRY_HEADER_SIZE} bytes present"
        )
    if last_add_confirmed < NO_ENTRY or last_add_confirmed >= entry_id:
        raise MalformedFrame(f"entry last_add_confirmed {last_add_confirmed} is not below entry_id {entry_id}")
    if length_bytes < payload_size:
        raise MalformedFrame(f"entry length_bytes {length_bytes} is below its payload size {payload_size}")
    return EntryHeader(ledger_id, entry_id, last_add_confirmed, length_bytes, payload_size)


def verify_entry(data: bytes | memoryview) -> EntryHeader:
    """Checks header and digest; raises MalformedFrame or DigestMismatch."""
    header = decode_header(data)
    (stored,) = _DIGEST.unpack_from(data, _HEADER.size)
    view = memoryview(data)
    computed = crc32c.crc32c(view[ENTRY_HEADER_SIZE:], crc32c.crc32c(view[: _HEADER.size]))
    if computed != stored:
        raise DigestMismatch(header.ledger_id, header.entry_id,
                             f"stored {stored:#010x} computed {computed:#010x}")
    return header


def entry_payload(data: bytes | memoryview) -> memoryview:
    """The payload part of an encoded entry, without copying."""
    return memoryview(data)[ENTRY_HEADER_SIZE:]


def entry_ids(data: bytes | memoryview) -> tuple[int, int]:
    """(ledger_id, entry_id) of an encoded entry whose header was checked before."""
    _magic, _version, _flags, ledger_id, entry_id, _lac, _length, _size = _HEADER.unpack_from(data, 0)
    return ledger_id, entry_id
