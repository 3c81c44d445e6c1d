"""The set of individually acknowledged entries past a cursor's mark-delete position.
Pure.

One bitmap per ledger (bit ``e`` set: entry ``e`` acknowledged). A bitmap costs one bit
per entry of the span it covers whatever the pattern of acknowledgements, so a million
holes cost what a million entries do (125 KB), where a list of ranges would cost tens of
bytes per hole; setting and testing a bit are O(1), and finding the first unacknowledged
entry from a place is a C-speed scan. This is what lets the ack state stay exact however
many holes it has (Pulsar caps its range list at 10,000 and drops the rest).

Serialized as per-ledger (ledger_id, first_entry_id, bitmap bytes), zlib-compressed:
regular patterns (every other message acked) compress to almost nothing.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import Iterator

from common.errors import MalformedFrame
# A bitmap grows to cover at most this many entries per ledger (the vocabulary's bound
# on a ledger of a topic).
from common.position import ENTRIES_PER_LEDGER_MAX
# A decoded ack set is refused past this size (a record that decompresses to more is
# corrupt or hostile, not a cursor: 1,000,000 holes take under 200 KiB).
DECODED_BYTES_MAX = 256 * 1024 * 1024

_NOT_ALL_ONES = re.compile(rb"[^\xff]")
_HEAD = struct.Struct(">I")
_LEDGER = struct.Struct(">qqI")


class AckSet:
    def __init__(self) -> None:
        # ledger_id -> (first entry id the bitmap covers, bitmap)
        self._ledgers: dict[int, tuple[int, bytearray]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, ledger_id: int, entry_id: int) -> bool:
        """Marks an entry; returns False if it was already marked."""
        assert entry_id >= 0
        slot = self._ledgers.get(ledger_id)
        if slot is None:
            base = entry_id - entry_id % 8
            slot = self._ledgers[ledger_id] = (base, bytearray())
        base, bitmap = slot
        if entry_id < base:
            # Grow downwards (rare: acks arrive out of order below the first one seen).
            new_base = entry_id - entry_id % 8
            if base + len(bitmap) * 8 - new_base > ENTRIES_PER_LEDGER_MAX:
                # Checked before growing, so the set stays as it was (and stays decodable).
                raise ValueError(f"entry {entry_id} is too far below {base} for one ack bitmap")
            bitmap[0:0] = bytes((base - new_base) // 8)
            self._ledgers[ledger_id] = slot = (new_base, bitmap)
            base = new_base
        offset = entry_id - base
        if offset >= ENTRIES_PER_LEDGER_MAX:
            raise ValueError(f"entry {entry_id} is too far past {base} for one ack bitmap")
        index, bit = divmod(offset, 8)
        if index >= len(bitmap):
            bitmap.extend(bytes(index - len(bitmap) + 1))
        mask = 1 << bit
        if bitmap[index] & mask:
            return False
        bitmap[index] |= mask
        self._count += 1
        return True

    def add_range(self, ledger_id: int, first: int, last: int) -> int:
        """Marks entries ``first`` .. ``last`` (inclusive) of a ledger at once; returns how
        many were not marked before."""
        assert 0 <= first <= last, (first, last)
        if last - first >= ENTRIES_PER_LEDGER_MAX:
            raise ValueError(f"entries {first}..{last} are too many for one ack bitmap")
        base = first - first % 8
        run = ((1 << (last - first + 1)) - 1) << (first - base)
        other = AckSet()
        other._ledgers[ledger_id] = (base, bytearray(run.to_bytes((last - base + 8) // 8, "little")))
        before = self._count
        self.update(other)
        return self._count - before

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        slot = self._ledgers.get(ledger_id)
        if slot is None:
            return False
        base, bitmap = slot
        offset = entry_id - base
        if offset < 0:
            return False
        index, bit = divmod(offset, 8)
        return index < len(bitmap) and bool(bitmap[index] & (1 << bit))

    def first_unset(self, ledger_id: int, entry_id: int) -> int:
        """The first entry id >= ``entry_id`` of the ledger that is not marked."""
        slot = self._ledgers.get(ledger_id)
        if slot is None:
            return entry_id
        base, bitmap = slot
        offset = entry_id - base
        if offset < 0 or offset >= len(bitmap) * 8:
            return entry_id
        index, bit = divmod(offset, 8)
        while index < len(bitmap):
            byte = bitmap[index] >> bit
            if byte != (0xFF >> bit):
                # Some bit at or past ``bit`` in this byte is clear.
                while byte & 1:
                    byte >>= 1
                    bit += 1
                return base + index * 8 + bit
            index += 1
            bit = 0
            match = _NOT_ALL_ONES.search(bitmap, index)
            if match is None:
                return base + len(bitmap) * 8
            index = match.start()
        return base + len(bitmap) * 8

    def discard_up_to(self, ledger_id: int, entry_id: int) -> None:
        """Forgets marks at or below (ledger_id, entry_id), and whole earlier ledgers."""
        for other in [l for l in self._ledgers if l < ledger_id]:
            self._count -= _popcount(self._ledgers.pop(other)[1])
        slot = self._ledgers.get(ledger_id)
        if slot is None:
            return
        base, bitmap = slot
        cut = entry_id + 1 - base
        if cut <= 0:
            return
        whole_bytes = min(cut // 8, len(bitmap))
        self._count -= _popcount(bitmap[:whole_bytes])
        del bitmap[:whole_bytes]
        base += whole_bytes * 8
        remainder = cut - whole_bytes * 8
        if bitmap and remainder > 0:
            mask = (1 << remainder) - 1
            self._count -= bin(bitmap[0] & mask).count("1")
            bitmap[0] &= ~mask & 0xFF
        if not bitmap or not any(bitmap):
            self._count -= _popcount(bitmap)
            del self._ledgers[ledger_id]
        else:
            self._ledgers[ledger_id] = (base, bitmap)

    def update(self, other: "AckSet") -> None:
        """Adds every entry of ``other`` (a bytewise OR of the bitmaps)."""
        for ledger_id, (other_base, other_bitmap) in other._ledgers.items():
            if not other_bitmap:
                continue
            slot = self._ledgers.get(ledger_id)
            if slot is None:
                self._ledgers[ledger_id] = (other_base, bytearray(other_bitmap))
                self._count += _popcount(other_bitmap)
                continue
            base, bitmap = slot
            if other_base < base:
                bitmap[0:0] = bytes((base - other_base) // 8)
                base = other_base
            start = (other_base - base) // 8
            end = start + len(other_bitmap)
            if end > len(bitmap):
                bitmap.extend(bytes(end - len(bitmap)))
            before = _popcount(bitmap[start:end])
            merged = (int.from_bytes(bitmap[start:end], "little") | int.from_bytes(other_bitmap, "little"))
            bitmap[start:end] = merged.to_bytes(end - start, "little")
            self._count += _popcount(bitmap[start:end]) - before
            self._ledgers[ledger_id] = (base, bitmap)

    def ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    def ranges(self, ledger_id: int) -> Iterator[tuple[int, int]]:
        """Marked entries of a ledger as inclusive (first, last) runs."""
        slot = self._ledgers.get(ledger_id)
        if slot is None:
            return
        base, bitmap = slot
        run_start = -1
        for index, byte in enumerate(bitmap):
            if byte == 0 and run_start < 0:
                continue
            if byte == 0xFF and run_start >= 0:
                continue
            for bit in range(8):
                entry_id = base + index * 8 + bit
                if byte >> bit & 1:
                    if run_start < 0:
                        run_start = entry_id
                elif run_start >= 0:
                    yield run_start, entry_id - 1
                    run_start = -1
        if run_start >= 0:
            yield run_start, base + len(bitmap) * 8 - 1

    def range_count(self) -> int:
        return sum(1 for ledger_id in self._ledgers for _ in self.ranges(ledger_id))

    # --- serialization ------------------------------------------------------------------

    def encode(self) -> bytes:
        parts = [_HEAD.pack(len(self._ledgers))]
        for ledger_id in sorted(self._ledgers):
            base, bitmap = self._ledgers[ledger_id]
            parts.append(_LEDGER.pack(ledger_id, base, len(bitmap)))
            parts.append(bytes(bitmap))
        return zlib.compress(b"".join(parts), 6)

    @classmethod
    def decode(cls, data: bytes) -> "AckSet":
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(data, DECODED_BYTES_MAX)
        except zlib.error as error:
            raise MalformedFrame(f"ack set does not decompress: {error}") from None
        if inflater.unconsumed_tail:
            raise MalformedFrame(f"ack set decompresses to more than {DECODED_BYTES_MAX} bytes")
        if not inflater.eof:
            raise MalformedFrame("ack set truncated")
        if inflater.unused_data:
            raise MalformedFrame("ack set has bytes after its end")
        ack_set = cls()
        if len(raw) < _HEAD.size:
            raise MalformedFrame("ack set truncated")
        (count,) = _HEAD.unpack_from(raw, 0)
        offset = _HEAD.size
        for _ in range(count):
            if offset + _LEDGER.size > len(raw):
                raise MalformedFrame("ack set truncated")
            ledger_id, base, size = _LEDGER.unpack_from(raw, offset)
            offset += _LEDGER.size
            if ledger_id in ack_set._ledgers:
                raise MalformedFrame(f"ack set lists ledger {ledger_id} twice")
            if offset + size > len(raw) or base < 0 or base % 8 or size * 8 > ENTRIES_PER_LEDGER_MAX:
                raise MalformedFrame("ack set ledger bitmap out of bounds")
            bitmap = bytearray(raw[offset:offset + size])
            offset += size
            ack_set._ledgers[ledger_id] = (base, bitmap)
            ack_set._count += _popcount(bitmap)
        if offset != len(raw):
            raise MalformedFrame("ack set has trailing bytes")
        return ack_set


def _popcount(data: bytes | bytearray) -> int:
    return int.from_bytes(data, "little").bit_count() if data else 0
