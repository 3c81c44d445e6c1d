"""Byte layouts of everything a bookie writes to disk: journal files, entry log files,
the checkpoint file and the cookie. Pure: no IO here, only bytes in and out.

All integers big-endian. Every file starts with a 16-byte file header:

    offset  size  field           meaning
    0       4     magic           b"MGJL" journal, b"MGEL" entry log
    4       2     format_version  FORMAT_VERSION
    6       2     reserved        0
    8       8     file_id         u64, the journal id or entry log id (also in the name)

Journal record (after the file header, back to back):

    offset  size  field         meaning
    0       4     body_size     u32, bytes of type + body; 0 marks the end of written data
    4       4     crc32c        over the type byte and the body
    8       1     record_type   RECORD_ADD, RECORD_FENCE
    9       n-1   body          ADD: an encoded entry (common/entry.py); FENCE: u64 ledger_id

Entry log record (after the file header, back to back):

    offset  size  field        meaning
    0       4     entry_size   u32
    4       n     entry        an encoded entry, which carries its own ids and CRC32C

Checkpoint file (``checkpoint`` in the journal dir), 28 bytes:

    offset  size  field           meaning
    0       4     magic           b"MGCP"
    4       2     format_version  FORMAT_VERSION
    6       2     reserved        0
    8       8     journal_id      replay starts in this journal file...
    16      8     journal_offset  ...at this byte offset
    24      4     crc32c          over bytes [0, 24)

Versions:
    1  first version.

A journal record is only trusted when its CRC matches: the tail of the last journal
file may hold a torn record from a crash mid-write, and replay stops there (that record
was never acknowledged, since acknowledgement waits for the fsync that covers it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

import crc32c

from common.errors import MalformedFrame

FORMAT_VERSION = 1
FORMAT_VERSION_MIN = 1

JOURNAL_MAGIC = b"MGJL"
ENTRY_LOG_MAGIC = b"MGEL"
CHECKPOINT_MAGIC = b"MGCP"

_FILE_HEADER = struct.Struct(">4sHHQ")
FILE_HEADER_SIZE = _FILE_HEADER.size
assert FILE_HEADER_SIZE == 16

RECORD_ADD = 1
RECORD_FENCE = 2

_RECORD_HEAD = struct.Struct(">II")   # body size, crc
JOURNAL_RECORD_HEAD_SIZE = _RECORD_HEAD.size
_LEDGER_ID = struct.Struct(">Q")
_ENTRY_SIZE = struct.Struct(">I")
ENTRY_LOG_RECORD_HEAD_SIZE = _ENTRY_SIZE.size
_CHECKPOINT_BODY = struct.Struct(">4sHHQQ")
_CRC = struct.Struct(">I")
CHECKPOINT_SIZE = _CHECKPOINT_BODY.size + _CRC.size


# --- file headers ---------------------------------------------------------------------

def encode_file_header(magic: bytes, file_id: int) -> bytes:
    assert len(magic) == 4
    return _FILE_HEADER.pack(magic, FORMAT_VERSION, 0, file_id)


def decode_file_header(data: bytes, magic: bytes) -> int:
    """Checks magic and version; returns the file id."""
    if len(data) < FILE_HEADER_SIZE:
        raise MalformedFrame(f"file header truncated: {len(data)} bytes")
    found_magic, version, _reserved, file_id = _FILE_HEADER.unpack_from(data, 0)
    if found_magic != magic:
        raise MalformedFrame(f"file magic {found_magic!r} is not {magic!r}")
    if not FORMAT_VERSION_MIN <= version <= FORMAT_VERSION:
        raise MalformedFrame(f"file format version {version} is not supported")
    return file_id


# --- journal records -------------------------------------------------------------------

def journal_add_record_bytes(entry_size: int) -> int:
    """The size of the ADD record of an entry of ``entry_size`` bytes (head, type, entry)."""
    return JOURNAL_RECORD_HEAD_SIZE + 1 + entry_size


def journal_add_record(entry: bytes) -> list[bytes]:
    """The buffers of one ADD record, for a vectored write (no copy of the entry)."""
    type_byte = b"\x01"
    crc = crc32c.crc32c(entry, crc32c.crc32c(type_byte))
    return [_RECORD_HEAD.pack(len(entry) + 1, crc), type_byte, entry]


def journal_fence_record(ledger_id: int) -> bytes:
    body = b"\x02" + _LEDGER_ID.pack(ledger_id)
    return _RECORD_HEAD.pack(len(body), crc32c.crc32c(body)) + body


@dataclass(frozen=True, slots=True)
class JournalRecord:
    record_type: int
    offset: int            # byte offset of the record in its file
    end_offset: int        # byte offset just past it
    entry: bytes = b""     # RECORD_ADD
    ledger_id: int = -1    # RECORD_FENCE


def iter_journal_records(data: bytes, start_offset: int) -> Iterator[JournalRecord]:
    """Yields whole, checksummed records from ``start_offset``; stops at the first
    zero size, truncated record or CRC mismatch (a torn tail or unwritten space)."""
    offset = start_offset
    view = memoryview(data)
    while offset + JOURNAL_RECORD_HEAD_SIZE <= len(data):
        body_size, crc = _RECORD_HEAD.unpack_from(data, offset)
        body_start = offset + JOURNAL_RECORD_HEAD_SIZE
        body_end = body_start + body_size
        if body_size == 0 or body_end > len(data):
            return
        body = view[body_start:body_end]
        if crc32c.crc32c(body) != crc:
            return
        record_type = body[0]
        if record_type == RECORD_ADD:
            yield JournalRecord(RECORD_ADD, offset, body_end, entry=bytes(body[1:]))
        elif record_type == RECORD_FENCE and body_size == 1 + _LEDGER_ID.size:
            (ledger_id,) = _LEDGER_ID.unpack_from(body, 1)
            yield JournalRecord(RECORD_FENCE, offset, body_end, ledger_id=ledger_id)
        else:
            # A record with a valid CRC and an unknown type is from a newer bookie.
            raise MalformedFrame(f"unknown journal record type {record_type} at offset {offset}")
        offset = body_end


# --- entry log records -----------------------------------------------------------------

def entry_log_record_head(entry_size: int) -> bytes:
    return _ENTRY_SIZE.pack(entry_size)


def iter_entry_log_records(data: bytes | memoryview, start_offset: int = FILE_HEADER_SIZE) -> Iterator[tuple[int, memoryview]]:
    """Yields (offset of the entry bytes, entry bytes) for each record; stops at a
    truncated record (an entry log flushed partly when the bookie crashed)."""
    view = memoryview(data)
    offset = start_offset
    while offset + ENTRY_LOG_RECORD_HEAD_SIZE <= len(view):
        (size,) = _ENTRY_SIZE.unpack_from(view, offset)
        entry_offset = offset + ENTRY_LOG_RECORD_HEAD_SIZE
        if size == 0 or entry_offset + size > len(view):
            return
        yield entry_offset, view[entry_offset:entry_offset + size]
        offset = entry_offset + size


# --- checkpoint ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, order=True)
class JournalPosition:
    journal_id: int
    offset: int


def encode_checkpoint(position: JournalPosition) -> bytes:
    body = _CHECKPOINT_BODY.pack(CHECKPOINT_MAGIC, FORMAT_VERSION, 0, position.journal_id, position.offset)
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_checkpoint(data: bytes) -> JournalPosition:
    if len(data) != CHECKPOINT_SIZE:
        raise MalformedFrame(f"checkpoint of {len(data)} bytes, expected {CHECKPOINT_SIZE}")
    magic, version, _reserved, journal_id, offset = _CHECKPOINT_BODY.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _CHECKPOINT_BODY.size)
    if magic != CHECKPOINT_MAGIC:
        raise MalformedFrame(f"checkpoint magic {magic!r} is not {CHECKPOINT_MAGIC!r}")
    if not FORMAT_VERSION_MIN <= version <= FORMAT_VERSION:
        raise MalformedFrame(f"checkpoint format version {version} is not supported")
    if crc32c.crc32c(data[: _CHECKPOINT_BODY.size]) != crc:
        raise MalformedFrame("checkpoint checksum mismatch")
    return JournalPosition(journal_id, offset)


# --- file names ------------------------------------------------------------------------------

def journal_file_name(journal_id: int) -> str:
    return f"journal-{journal_id:016x}.log"


def entry_log_file_name(log_id: int) -> str:
    return f"entrylog-{log_id:016x}.log"


_HEX_DIGITS = frozenset("0123456789abcdef")


def parse_file_id(name: str, prefix: str) -> int | None:
    """The id in a name this module writes (exactly 16 lower-case hex digits); None
    for any other name, so stray files are never taken for journals or logs."""
    if not (name.startswith(prefix + "-") and name.endswith(".log")):
        return None
    text = name[len(prefix) + 1:-4]
    if len(text) != 16 or not set(text) <= _HEX_DIGITS:
        return None
    return int(text, 16)
