"""The entry index of one ledger directory: (ledger_id, entry_id) → location in an
entry log, plus each ledger's durable state and each entry log's live bytes.

It lives in SQLite (stdlib, crash-safe, B-tree keyed on (ledger_id, entry_id)), in WAL
mode so that reader threads never wait for the flush thread. Every write happens on
the directory's flush thread through ``IndexWriter``; reads go through per-thread
``IndexReader`` connections. A flush commits its rows in one transaction with
``synchronous=FULL``: once ``commit`` returns, the rows survive a crash, which is what
a checkpoint needs before the journal may be trimmed.

Tables:
    entries(ledger_id, entry_id, log_id, offset, size)      the index proper
    ledgers(ledger_id, fenced, last_add_confirmed, last_entry_id)
    log_usage(log_id, ledger_id, live_bytes)                 for compaction decisions
    entry_logs(log_id, size_bytes)                           sizes of sealed logs
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from typing import Iterable

from bookie.entry_log import EntryLocation

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL,
    entry_id INTEGER NOT NULL,
    log_id INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (ledger_id, entry_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id INTEGER PRIMARY KEY,
    fenced INTEGER NOT NULL,
    last_add_confirmed INTEGER NOT NULL,
    last_entry_id INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS log_usage (
    log_id INTEGER NOT NULL,
    ledger_id INTEGER NOT NULL,
    live_bytes INTEGER NOT NULL,
    PRIMARY KEY (log_id, ledger_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS log_usage_by_ledger ON log_usage (ledger_id);
CREATE TABLE IF NOT EXISTS entry_logs (
    log_id INTEGER PRIMARY KEY,
    size_bytes INTEGER NOT NULL
);
"""

# SQLite allows at most 32766 bound parameters per statement (since 3.32).
_PARAMS_PER_STATEMENT_MAX = 30_000


@dataclass(frozen=True, slots=True)
class LedgerRow:
    ledger_id: int
    fenced: bool
    last_add_confirmed: int
    last_entry_id: int


def _connect(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    return connection


class IndexWriter:
    """The single writing connection (flush thread only)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = _connect(path)
        self._db.executescript(_SCHEMA)

    def commit_flush(
        self,
        rows: list[tuple[int, int, EntryLocation]],
        ledgers: Iterable[LedgerRow],
        sealed_logs: Iterable[tuple[int, int]],
    ) -> None:
        """One transaction: new index rows, ledger states, live bytes, sealed log sizes."""
        usage: dict[tuple[int, int], int] = {}
        for ledger_id, _entry_id, location in rows:
            key = (location.log_id, ledger_id)
            usage[key] = usage.get(key, 0) + location.size
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany(
                "INSERT OR REPLACE INTO entries (ledger_id, entry_id, log_id, offset, size) VALUES (?, ?, ?, ?, ?)",
                [(ledger_id, entry_id, loc.log_id, loc.offset, loc.size) for ledger_id, entry_id, loc in rows],
            )
            db.executemany(
                "INSERT INTO log_usage (log_id, ledger_id, live_bytes) VALUES (?, ?, ?) "
                "ON CONFLICT (log_id, ledger_id) DO UPDATE SET live_bytes = live_bytes + excluded.live_bytes",
                [(log_id, ledger_id, size) for (log_id, ledger_id), size in usage.items()],
            )
            db.executemany(
                "INSERT OR REPLACE INTO ledgers (ledger_id, fenced, last_add_confirmed, last_entry_id) VALUES (?, ?, ?, ?)",
                [(row.ledger_id, int(row.fenced), row.last_add_confirmed, row.last_entry_id) for row in ledgers],
            )
            db.executemany(
                "INSERT OR REPLACE INTO entry_logs (log_id, size_bytes) VALUES (?, ?)",
                list(sealed_logs),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def delete_ledgers(self, ledger_ids: list[int]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            for ledger_id in ledger_ids:
                db.execute("DELETE FROM entries WHERE ledger_id = ?", (ledger_id,))
                db.execute("DELETE FROM ledgers WHERE ledger_id = ?", (ledger_id,))
                db.execute("DELETE FROM log_usage WHERE ledger_id = ?", (ledger_id,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def relocate(self, moves: list[tuple[int, int, int, EntryLocation]], old_log_id: int) -> None:
        """After compaction copied entries of ``old_log_id``: points their rows at the
        new locations, moves the live bytes, and forgets the old log. One transaction."""
        usage: dict[tuple[int, int], int] = {}
        for ledger_id, _entry_id, _old_offset, location in moves:
            key = (location.log_id, ledger_id)
            usage[key] = usage.get(key, 0) + location.size
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany(
                "UPDATE entries SET log_id = ?, offset = ? WHERE ledger_id = ? AND entry_id = ? "
                "AND log_id = ? AND offset = ?",
                [(loc.log_id, loc.offset, ledger_id, entry_id, old_log_id, old_offset)
                 for ledger_id, entry_id, old_offset, loc in moves],
            )
            db.executemany(
                "INSERT INTO log_usage (log_id, ledger_id, live_bytes) VALUES (?, ?, ?) "
                "ON CONFLICT (log_id, ledger_id) DO UPDATE SET live_bytes = live_bytes + excluded.live_bytes",
                [(log_id, ledger_id, size) for (log_id, ledger_id), size in usage.items()],
            )
            db.execute("DELETE FROM log_usage WHERE log_id = ?", (old_log_id,))
            db.execute("DELETE FROM entry_logs WHERE log_id = ?", (old_log_id,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def forget_log(self, log_id: int) -> None:
        self._db.execute("DELETE FROM log_usage WHERE log_id = ?", (log_id,))
        self._db.execute("DELETE FROM entry_logs WHERE log_id = ?", (log_id,))

    # Reads the flush thread itself needs (compaction decisions, start-up).

    def ledger_rows(self) -> list[LedgerRow]:
        return [
            LedgerRow(ledger_id, bool(fenced), lac, last)
            for ledger_id, fenced, lac, last in self._db.execute(
                "SELECT ledger_id, fenced, last_add_confirmed, last_entry_id FROM ledgers")
        ]

    def log_live_bytes(self) -> dict[int, int]:
        return dict(self._db.execute("SELECT log_id, SUM(live_bytes) FROM log_usage GROUP BY log_id"))

    def log_sizes(self) -> dict[int, int]:
        return dict(self._db.execute("SELECT log_id, size_bytes FROM entry_logs"))

    def location_of(self, ledger_id: int, entry_id: int) -> EntryLocation | None:
        row = self._db.execute(
            "SELECT log_id, offset, size FROM entries WHERE ledger_id = ? AND entry_id = ?",
            (ledger_id, entry_id)).fetchone()
        return EntryLocation(*row) if row else None

    def close(self) -> None:
        self._db.close()


class IndexReader:
    """Lookups from any thread: each thread gets its own connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            db.execute("PRAGMA query_only=1")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def locations(self, ledger_id: int, entry_ids: list[int]) -> dict[int, EntryLocation]:
        """Locations of the given entries that are indexed (absent ids are left out)."""
        if not entry_ids:
            return {}
        db = self._db()
        found: dict[int, EntryLocation] = {}
        low, high = min(entry_ids), max(entry_ids)
        if high - low + 1 <= 4 * len(entry_ids):
            # A dense set (the common range read): one range scan.
            wanted = set(entry_ids)
            for entry_id, log_id, offset, size in db.execute(
                    "SELECT entry_id, log_id, offset, size FROM entries "
                    "WHERE ledger_id = ? AND entry_id BETWEEN ? AND ?", (ledger_id, low, high)):
                if entry_id in wanted:
                    found[entry_id] = EntryLocation(log_id, offset, size)
            return found
        for start in range(0, len(entry_ids), _PARAMS_PER_STATEMENT_MAX):
            chunk = entry_ids[start:start + _PARAMS_PER_STATEMENT_MAX]
            marks = ",".join("?" * len(chunk))
            for entry_id, log_id, offset, size in db.execute(
                    f"SELECT entry_id, log_id, offset, size FROM entries "
                    f"WHERE ledger_id = ? AND entry_id IN ({marks})", (ledger_id, *chunk)):
                found[entry_id] = EntryLocation(log_id, offset, size)
        return found

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
