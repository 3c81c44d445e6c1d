"""Batch entries split once for every subscription of a topic read through one
connection (fan-out: several subscriptions of one topic in one client).

Each subscription's consumer receives its own MESSAGE for the same entry: same topic,
same (ledger_id, entry_id), same stored bytes. Splitting a batch (decompressing, then
parsing a SingleMessageMetadata per message) was 59-72 % of a fan-out's client CPU,
done once per subscription. The connection keeps the last few splits here, and a
consumer receiving an entry another one split takes that split instead of making its
own (client/messages.py ``decode_entry``).

What is shared and what is not:
- Shared: a ``SplitBatch``, immutable (tuples, ints, str, bytes): every message of the
  batch with its id, payload, keys, properties as pairs, event time, sequence id.
- Each consumer's own: the MESSAGE's ack set (which messages it still gets), the
  redelivery count, and every object handed out (ReceivedEntry, ReceivedMessage, the
  property dicts), built from the split for that consumer alone.

A split is taken only when the stored bytes received (payload section: checksum,
metadata, payload) are the very bytes it was made from, compared in full (a memcmp,
about 10 µs for a 260 KB entry: 0.01 µs per message of a 1,000-message batch). Frames
whose CRC32C does not match never get here: the codec refuses them and the connection
closes (protocol/codec.py). Frames without a checksum (pulsar-lite sends them) are
compared like any other, so a copy damaged in flight is split on its own and does not
take, nor replace, the good one's split. Entries handed over whole (unknown codec,
encrypted, unreadable) are never kept.

Bounded three ways, oldest first out: ``entries_max`` splits, ``bytes_max`` bytes
(stored bytes plus the payload copies plus ``RECORD_OVERHEAD_BYTES`` per message; a
split larger than that alone is not kept), and ``age_max_s`` seconds (checked at each
``put`` and by the connection's keep-alive tick, so an idle client lets go of its
splits).
"""

from __future__ import annotations

import time
from typing import Callable

from client.messages import SplitBatch

# Python objects per kept message beyond its payload bytes: the record tuple, its
# MessageId, the payload's bytes header, a key string: about 300 bytes (sys.getsizeof).
RECORD_OVERHEAD_BYTES = 300

Key = tuple[str, int, int, int]          # (topic, partition, ledger_id, entry_id)


class SplitCache:
    def __init__(self, entries_max: int, bytes_max: int, age_max_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert entries_max > 0 and bytes_max > 0 and age_max_s > 0, (entries_max, bytes_max, age_max_s)
        self.entries_max = entries_max
        self.bytes_max = bytes_max
        self.age_max_s = age_max_s
        self._clock = clock
        # key -> (stored bytes, split, size in bytes, when kept); insertion order is age order.
        self._splits: dict[Key, tuple[bytes, SplitBatch, int, float]] = {}
        self.bytes = 0
        # Observability (and what the tests read): splits taken, asked for and not there,
        # there but from other bytes, and dropped by a bound.
        self.hits = 0
        self.misses = 0
        self.mismatches = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._splits)

    def get(self, key: Key, stored: bytes | memoryview) -> SplitBatch | None:
        kept = self._splits.get(key)
        if kept is None:
            self.misses += 1
            return None
        kept_stored = kept[0]
        # bytes == bytes is a memcmp; a memoryview compared with bytes goes item by item.
        if len(kept_stored) != len(stored) or kept_stored != (stored if isinstance(stored, bytes) else bytes(stored)):
            self.mismatches += 1
            return None
        self.hits += 1
        return kept[1]

    def put(self, key: Key, stored: bytes | memoryview, split: SplitBatch) -> None:
        """Keeps ``split`` of the entry whose stored bytes are ``stored``. A key kept
        already (from other bytes) keeps what it has: the first split stays."""
        if key in self._splits:
            return
        size = len(stored) + split.payload_bytes + RECORD_OVERHEAD_BYTES * split.batch_size
        if size > self.bytes_max:
            return
        now = self._clock()
        self.expire(now)
        while self._splits and (len(self._splits) >= self.entries_max or self.bytes + size > self.bytes_max):
            self._drop_oldest()
        self._splits[key] = (bytes(stored), split, size, now)
        self.bytes += size

    def expire(self, now_s: float) -> None:
        """Drops the splits kept more than ``age_max_s`` ago."""
        while self._splits and now_s - next(iter(self._splits.values()))[3] > self.age_max_s:
            self._drop_oldest()

    def drop_topic(self, topic: str) -> None:
        """Drops every split of ``topic`` (no two subscriptions of it read here any more)."""
        for key in [key for key in self._splits if key[0] == topic]:
            self.bytes -= self._splits.pop(key)[2]

    def clear(self) -> None:
        self._splits.clear()
        self.bytes = 0

    def _drop_oldest(self) -> None:
        key = next(iter(self._splits))
        self.bytes -= self._splits.pop(key)[2]
        self.evictions += 1
