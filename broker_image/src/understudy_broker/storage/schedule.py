"""The schedule index: which scheduled messages are due when, on disk.

Why this module exists: a group's scheduled messages live in its commit log (the
internal topic ``scheduling.SCHEDULE_TOPIC``, queue 0), durable and replicated like any
record. To find the ones due now without a timer (or an object) per message, every broker
of the group (master and slaves alike) keeps this index of the log: one SQLite row per
pending entry, ``(origin, due)`` with ``origin`` the entry's offset in the schedule queue,
ordered by ``(due, origin)``. Memory is SQLite's page cache, whatever the count.

The index is *derived* data. The log is the truth: ``indexed`` says up to which schedule
offset the log has been applied; a DONE record in the log removes the entries it names
(a master delivered them); a log cut shorter by recovery cuts the index with it; an
unreadable file is set aside and rebuilt from the log. One thing is not in the log: the
entries an acting slave *escaped* to another group (it never writes its own log). Those
are kept here (``escaped``) until back-sync has handed them to the master, and an entry
escaped here is never indexed again (docs/delayed.md).

Durability: WAL with ``synchronous=NORMAL`` — a committed transaction survives the
process being killed (kill -9), which is the failure the escape record must survive; a
machine crash can lose the last transactions of the *index*, which re-applying the log
restores, and of ``escaped``, which at worst delivers an escaped message once more (the
at-least-once window the checker counts as an escape duplicate).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from understudy_broker.storage.durability import set_aside

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entry (origin INTEGER PRIMARY KEY, due INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS entry_due ON entry (due, origin);
CREATE TABLE IF NOT EXISTS escaped (origin INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
"""


class ScheduleIndex:
    """See the module docstring. One per broker; used from the event loop's thread."""

    def __init__(self, path: Path, db: sqlite3.Connection, *, rebuilt: str | None) -> None:
        self.path = path
        self._db = db
        #: Why the file was set aside and rebuilt at open (None: it was usable).
        self.rebuilt = rebuilt
        self._pending = int(db.execute("SELECT COUNT(*) FROM entry").fetchone()[0])

    @classmethod
    def open(cls, path: Path) -> ScheduleIndex:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return cls(path, cls._connect(path), rebuilt=None)
        except sqlite3.DatabaseError as exc:
            aside = set_aside(path, companions=("-wal", "-shm"))
            log.error("schedule index %s is unreadable (%s): set aside as %s, rebuilt from "
                      "the commit log", path, exc, aside.name)
            return cls(path, cls._connect(path), rebuilt=str(exc))

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA cache_size=-8192")  # 8 MiB at most, whatever the count
            db.executescript(_SCHEMA)
            db.execute("PRAGMA quick_check").fetchone()
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        self._db.close()

    # ---- what the log says ----------------------------------------------------------

    @property
    def indexed(self) -> int:
        """The next schedule-queue offset to apply (everything before it is applied)."""
        row = self._db.execute("SELECT v FROM meta WHERE k='indexed'").fetchone()
        return int(row[0]) if row else 0

    def apply(self, entries: Sequence[tuple[int, int]], done: Iterable[int], upto: int) -> None:
        """In one transaction: add ``(origin, due)`` entries (not those escaped here),
        remove the ``done`` origins, and record that the log is applied up to ``upto``."""
        with self._tx() as db:
            added = db.executemany(
                "INSERT OR IGNORE INTO entry (origin, due) SELECT ?, ? "
                "WHERE NOT EXISTS (SELECT 1 FROM escaped WHERE origin = ?)",
                [(o, d, o) for o, d in entries]).rowcount
            gone = self._delete(db, done)
            self._set_indexed(db, upto)
        self._pending += max(0, added) - gone

    def cut(self, end: int, start: int) -> int:
        """The schedule queue now spans ``[start, end)`` (recovery cut its tail, or
        retention its head): forget what lies outside, and apply the log from inside it
        (``indexed`` is moved into ``[start, end]``). Returns entries dropped."""
        indexed = min(max(self.indexed, start), end)
        with self._tx() as db:
            n = int(db.execute("DELETE FROM entry WHERE origin >= ? OR origin < ?",
                               (end, start)).rowcount)
            db.execute("DELETE FROM escaped WHERE origin >= ?", (end,))
            self._set_indexed(db, indexed)
        self._pending -= n
        return n

    # ---- what is due ----------------------------------------------------------------

    def due(self, now_ms: int, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` pending ``(origin, due)``, due at or before ``now_ms``, earliest
        first."""
        return [(int(o), int(d)) for o, d in self._db.execute(
            "SELECT origin, due FROM entry WHERE due <= ? ORDER BY due, origin LIMIT ?",
            (now_ms, limit))]

    def next_due(self) -> int | None:
        row = self._db.execute("SELECT MIN(due) FROM entry").fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def pending(self) -> int:
        return self._pending

    def overdue(self, now_ms: int) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM entry WHERE due <= ?",
                                    (now_ms,)).fetchone()[0])

    def first_origin(self) -> int | None:
        """The oldest pending entry (log retention must keep it)."""
        row = self._db.execute("SELECT MIN(origin) FROM entry").fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # ---- escape (an acting slave) ---------------------------------------------------

    def escaped_add(self, origins: Sequence[int]) -> None:
        """Entries this acting slave delivered to another group: gone from the schedule,
        remembered for back-sync. Committed before it returns (survives kill -9)."""
        with self._tx() as db:
            gone = self._delete(db, origins)
            db.executemany("INSERT OR IGNORE INTO escaped (origin) VALUES (?)",
                           [(o,) for o in origins])
        self._pending -= gone

    def escaped(self) -> list[int]:
        return [int(o) for (o,) in self._db.execute("SELECT origin FROM escaped ORDER BY origin")]

    def escaped_synced(self, origins: Sequence[int]) -> None:
        """The master acknowledged these in a back-sync: it writes DONE for them, which
        this broker will read from the log like any other."""
        with self._tx() as db:
            db.executemany("DELETE FROM escaped WHERE origin = ?", [(o,) for o in origins])

    def forget(self, origins: Sequence[int]) -> None:
        """Remove entries (the master took them from a back-sync; its DONE follows)."""
        with self._tx() as db:
            gone = self._delete(db, origins)
        self._pending -= gone

    # ---- the one copy of each write ---------------------------------------------------

    @staticmethod
    def _delete(db: sqlite3.Connection, origins: Iterable[int]) -> int:
        """Remove pending entries; returns how many were there."""
        return max(0, db.executemany("DELETE FROM entry WHERE origin = ?",
                                     [(o,) for o in origins]).rowcount)

    @staticmethod
    def _set_indexed(db: sqlite3.Connection, upto: int) -> None:
        db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('indexed', ?)", (upto,))

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        db = self._db
        db.execute("BEGIN")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
