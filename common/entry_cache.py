"""A byte-bounded LRU of ledger entries keyed by (ledger_id, entry_id). Pure.

Two users: the bookie's read cache (entries recently read from disk, so readers that
read them again do not hit the disk) and the broker's entry cache
(entries just appended, so tailing consumers and every subscription of a topic are
served from memory). Ledger ids are unique cluster-wide, so one cache serves all
ledgers of a process."""

from __future__ import annotations

from collections import OrderedDict


class EntryCache:
    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes >= 0
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        key = (ledger_id, entry_id)
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.size_bytes -= len(previous)
        if len(entry) > self.capacity_bytes:
            return  # too big to cache; the older version (dropped above) must not linger
        self._entries[key] = entry
        self.size_bytes += len(entry)
        while self.size_bytes > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size_bytes -= len(evicted)

    def contains(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the entry is cached, without counting a hit or a miss or refreshing it."""
        return (ledger_id, entry_id) in self._entries

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        key = (ledger_id, entry_id)
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def delete_ledger(self, ledger_id: int) -> None:
        self.delete_ledgers({ledger_id})

    def delete_ledgers(self, ledger_ids: set[int] | frozenset[int]) -> None:
        """Drops every entry of the given ledgers in one pass over the cache (a pass
        per ledger would cost ledgers x cached entries when many go at once)."""
        if not ledger_ids or not self._entries:
            return
        doomed = [key for key in self._entries if key[0] in ledger_ids]
        for key in doomed:
            self.size_bytes -= len(self._entries.pop(key))
        assert self.size_bytes >= 0, self.size_bytes

    def __len__(self) -> int:
        return len(self._entries)
