"""The compactor's table of latest values, kept in a temporary SQLite file so that
compacting a topic with millions of keys needs a bounded amount of memory.

Phase one of a compaction notes every message in topic order: a value makes its key's
latest position (entry position and index in its batch) that message's, a tombstone
drops the key. Phase two asks, entry by entry, which messages of an entry are still
some key's latest. SQLite holds the table on disk with a page cache of
``CACHE_BYTES`` (what stays in memory, whatever the number of keys). Nothing here
needs to survive a crash: a compaction that did not finish is started again from the
start. So the file is unlinked (and its private directory removed) as soon as it is
open: it has no name from then on, and the kernel frees it when the connection closes
or the process dies, ``kill -9`` included (a named file in a temporary directory was
left behind by every broker killed mid-compaction). SQLite keeps working on the open
descriptor: with no rollback journal it never reopens the file by name.

Blocking (file IO): callers run these methods in a worker thread, one at a time (the
object is not shared between threads at once).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile

from common.position import Position

# The SQLite page cache: the table's share of the broker's memory during a compaction.
CACHE_BYTES = 8 * 1024 * 1024


class LatestKeys:
    def __init__(self, directory: str | None = None) -> None:
        with tempfile.TemporaryDirectory(prefix="magnetar-compaction-", dir=directory) as private:
            path = os.path.join(private, "latest.sqlite")
            # check_same_thread off: the compactor calls it from asyncio's worker threads,
            # never two at once.
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                self._db.execute(f"PRAGMA cache_size = -{CACHE_BYTES // 1024}")
                self._db.execute("PRAGMA journal_mode = OFF")
                self._db.execute("PRAGMA synchronous = OFF")
                self._db.execute("CREATE TABLE latest (key BLOB PRIMARY KEY, ledger_id INTEGER NOT NULL, "
                                 "entry_id INTEGER NOT NULL, batch_index INTEGER NOT NULL) WITHOUT ROWID")
            except BaseException:
                self._db.close()
                raise
        # Leaving the block removed the file and its directory; the open descriptor stays.
        self.keys_noted = 0

    def note(self, messages: list[tuple[bytes, bool, Position, int]]) -> None:
        """(key, tombstone, entry position, batch index) of messages, in topic order."""
        db = self._db
        db.execute("BEGIN")
        try:
            for key, tombstone, position, batch_index in messages:
                if tombstone:
                    db.execute("DELETE FROM latest WHERE key = ?", (key,))
                else:
                    db.execute("INSERT OR REPLACE INTO latest VALUES (?, ?, ?, ?)",
                               (key, position.ledger_id, position.entry_id, batch_index))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.keys_noted += len(messages)

    def index_positions(self) -> None:
        """Between the phases: the lookup of phase two goes by position."""
        self._db.execute("CREATE INDEX by_position ON latest (ledger_id, entry_id)")

    def survivors(self, first: Position, last: Position) -> dict[Position, set[int]]:
        """For the entries in [first, last]: the batch indexes (-1: not a batch) of
        their messages that are still their key's latest."""
        rows = self._db.execute(
            "SELECT ledger_id, entry_id, batch_index FROM latest WHERE (ledger_id, entry_id) >= (?, ?) "
            "AND (ledger_id, entry_id) <= (?, ?)", (first.ledger_id, first.entry_id, last.ledger_id, last.entry_id))
        found: dict[Position, set[int]] = {}
        for ledger_id, entry_id, batch_index in rows:
            found.setdefault(Position(ledger_id, entry_id), set()).add(batch_index)
        return found

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM latest").fetchone()[0])

    def close(self) -> None:
        self._db.close()
