"""The entry index of one ledger directory: (ledger_id, entry_id) → location in an
entry log, plus each ledger's durable state and each entry log's live bytes.

It lives in SQLite (stdlib, crash-safe, B-tree keyed on (ledger_id, entry_id)), in WAL
mode so that reader threads never wait for the flush thread. Every write happens on
the directory's flush thread through ``IndexWriter``; reads go through per-thread
``IndexReader`` connections. A flush commits its rows in one transaction with
``synchronous=FULL``: once ``commit`` returns, the rows survive a crash, which is what
a checkpoint needs before the journal may be trimmed.

Tables:
    entries(ledger_id, entry_id, log_id, offset, size)      the index proper, with a
                                                             second index by (log_id, offset)
    ledgers(ledger_id, fenced, last_add_confirmed, last_entry_id)
    entry_logs(log_id, size_bytes)                           sizes of the entry logs

Live bytes of an entry log are what the index still points into it, read through the
(log_id, offset) index: exact whatever was overwritten or deleted, and compaction takes
the list of live entries from the same place (never from scanning the log, which a
damaged record head could cut short). Measured: the second index lowers raw insert
speed from ~570k to ~410k rows/s, about eight times what a bookie needs.

``PRAGMA user_version`` holds SCHEMA_VERSION; an index of another version is refused.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

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
CREATE INDEX IF NOT EXISTS entries_by_log ON entries (log_id, offset, size);
CREATE TABLE IF NOT EXISTS entry_logs (
    log_id INTEGER PRIMARY KEY,
    size_bytes INTEGER NOT NULL
);
"""

SCHEMA_VERSION = 1

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


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN ... COMMIT, rolled back if the body or the COMMIT raises. SQLite rolls
    some failed transactions back by itself (a full disk, an I/O error), so ROLLBACK
    runs only if a transaction is still open: otherwise it would raise "no transaction
    is active" in place of the error that matters."""
    db.execute("BEGIN")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    assert not db.in_transaction


class IndexWriter:
    """The single writing connection (flush thread only)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = _connect(path)
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version not in (0, SCHEMA_VERSION):
            from common.errors import ConfigError

            raise ConfigError(f"index {path} has schema version {version}, this bookie knows {SCHEMA_VERSION}")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def commit_flush(
        self,
        rows: list[tuple[int, int, EntryLocation]],
        ledgers: Iterable[LedgerRow],
        sealed_logs: Iterable[tuple[int, int]],
    ) -> None:
        """One transaction: new index rows, ledger states, entry log sizes."""
        db = self._db
        with _transaction(db):
            db.executemany(
                "INSERT OR REPLACE INTO entries (ledger_id, entry_id, log_id, offset, size) VALUES (?, ?, ?, ?, ?)",
                [(ledger_id, entry_id, loc.log_id, loc.offset, loc.size) for ledger_id, entry_id, loc in rows],
            )
            db.executemany(
                "INSERT OR REPLACE INTO ledgers (ledger_id, fenced, last_add_confirmed, last_entry_id) VALUES (?, ?, ?, ?)",
                [(row.ledger_id, int(row.fenced), row.last_add_confirmed, row.last_entry_id) for row in ledgers],
            )
            db.executemany(
                "INSERT OR REPLACE INTO entry_logs (log_id, size_bytes) VALUES (?, ?)",
                list(sealed_logs),
            )

    def delete_ledgers(self, ledger_ids: list[int]) -> None:
        db = self._db
        with _transaction(db):
            for ledger_id in ledger_ids:
                db.execute("DELETE FROM entries WHERE ledger_id = ?", (ledger_id,))
                db.execute("DELETE FROM ledgers WHERE ledger_id = ?", (ledger_id,))

    def relocate(self, moves: list[tuple[int, int, int, EntryLocation]], old_log_id: int) -> None:
        """After compaction copied entries out of ``old_log_id``: points their rows at
        the new locations (only rows still pointing at the old place). One transaction."""
        db = self._db
        with _transaction(db):
            db.executemany(
                "UPDATE entries SET log_id = ?, offset = ? WHERE ledger_id = ? AND entry_id = ? "
                "AND log_id = ? AND offset = ?",
                [(loc.log_id, loc.offset, ledger_id, entry_id, old_log_id, old_offset)
                 for ledger_id, entry_id, old_offset, loc in moves],
            )

    def forget_log(self, log_id: int) -> None:
        """Drops an entry log's size row; the caller checked nothing points into it."""
        assert not self.log_has_entries(log_id), log_id
        self._db.execute("DELETE FROM entry_logs WHERE log_id = ?", (log_id,))

    # Reads the flush thread itself needs (compaction decisions, start-up).

    def ledger_rows(self) -> list[LedgerRow]:
        return [
            LedgerRow(ledger_id, bool(fenced), last_add_confirmed, last)
            for ledger_id, fenced, last_add_confirmed, last in self._db.execute(
                "SELECT ledger_id, fenced, last_add_confirmed, last_entry_id FROM ledgers")
        ]

    def log_live_bytes(self, log_id: int) -> int:
        (total,) = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM entries WHERE log_id = ?",
                                    (log_id,)).fetchone()
        return int(total)

    def log_has_entries(self, log_id: int) -> bool:
        return self._db.execute("SELECT 1 FROM entries WHERE log_id = ? LIMIT 1", (log_id,)).fetchone() is not None

    def live_entries(self, log_id: int, after_offset: int, limit: int) -> list[tuple[int, int, int, int]]:
        """(ledger_id, entry_id, offset, size) of entries the index has in ``log_id``
        past ``after_offset``, in offset order, at most ``limit`` of them."""
        return list(self._db.execute(
            "SELECT ledger_id, entry_id, offset, size FROM entries WHERE log_id = ? AND offset > ? "
            "ORDER BY offset LIMIT ?", (log_id, after_offset, limit)))

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
