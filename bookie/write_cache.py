"""The write cache: entries that are durable in the journal but not yet in an entry log.

Pure data structure (no IO, no clock). Entries are grouped per ledger so a flush writes
each ledger's entries contiguously and in entry order into the entry log, which keeps
later range reads sequential on disk. Size accounting is in entry bytes.
"""

from __future__ import annotations


class WriteCache:
    def __init__(self) -> None:
        self._ledgers: dict[int, dict[int, bytes]] = {}
        self.size_bytes = 0
        self.entry_count = 0

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        entries = self._ledgers.get(ledger_id)
        if entries is None:
            entries = self._ledgers[ledger_id] = {}
        previous = entries.get(entry_id)
        if previous is not None:
            # The same entry written twice (a recovery re-add, a resend): keep the last.
            self.size_bytes -= len(previous)
            self.entry_count -= 1
        entries[entry_id] = entry
        self.size_bytes += len(entry)
        self.entry_count += 1

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        entries = self._ledgers.get(ledger_id)
        return entries.get(entry_id) if entries is not None else None

    def last_entry_id(self, ledger_id: int) -> int:
        entries = self._ledgers.get(ledger_id)
        return max(entries) if entries else -1

    def delete_ledger(self, ledger_id: int) -> None:
        entries = self._ledgers.pop(ledger_id, None)
        if entries:
            self.size_bytes -= sum(len(e) for e in entries.values())
            self.entry_count -= len(entries)

    def ledger_ids(self) -> set[int]:
        return set(self._ledgers)

    def sorted_items(self) -> list[tuple[int, int, bytes]]:
        """(ledger_id, entry_id, entry) in ledger order, then entry order."""
        items: list[tuple[int, int, bytes]] = []
        for ledger_id in sorted(self._ledgers):
            entries = self._ledgers[ledger_id]
            for entry_id in sorted(entries):
                items.append((ledger_id, entry_id, entries[entry_id]))
        return items

    def __len__(self) -> int:
        return self.entry_count
