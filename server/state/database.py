"""Where the catalog's state lives: SQLite (one catalog, the default) or PostgreSQL (several catalogs, one leader).

The state's SQL is written once, in what both engines speak: ``?`` placeholders, ``INSERT ... ON CONFLICT``,
``GREATEST`` (registered in SQLite); PostgreSQL gets ``%s``, 64-bit integers, double precision and bytea.

A PostgreSQL database fences its writes: every transaction reads the lease row first (to refuse early) and again
last, ``FOR SHARE`` (held until the commit, so a takeover comes before the check or after the commit), and rolls
back when the epoch there is not the one this catalog leads with. A catalog that lost its lease while frozen
cannot write, whatever its own clock says.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flightpart.errors import NotLeader, StateUnavailable

NEW_INDEX = re.compile(r"\s*CREATE INDEX IF NOT EXISTS (?P<name>\w+)", re.IGNORECASE)
"""An index the schema makes, which PostgreSQL's CREATE INDEX locks its table for (a SHARE lock, taken before it
looks whether the index exists): a catalog starting beside a leader that is writing waited for every write in
flight, and the writes after queued behind it (for up to the lock timeout, when the start then failed as busy). It
is made only where it does not exist yet."""


class Database:
    """A connection both SQLite and PostgreSQL satisfy: execute, executemany, transactions under one lock."""

    lock: threading.RLock
    kind = "?"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    def transaction(self) -> Any:
        """A context manager: the statements inside commit together or not at all (the lock held throughout)."""
        raise NotImplementedError

    @property
    def rows_written(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SqliteDatabase(Database):
    """One SQLite file in WAL mode, synchronous=FULL: every commit on disk before it is acknowledged."""

    kind = "sqlite"

    def __init__(self, path: str):
        self.lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.create_function("GREATEST", 2, _greatest, deterministic=True)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")

    def script(self, sql: str) -> None:
        self._db.executescript(sql)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._db.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._db.executemany(sql, rows)

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        with self.lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}

    @property
    def rows_written(self) -> int:
        return self._db.total_changes

    def close(self) -> None:
        with self.lock:
            self._db.close()


def _greatest(a: Any, b: Any) -> Any:
    return a if b is None else b if a is None else max(a, b)


_TYPES = ((re.compile(r"\bREAL\b"), "DOUBLE PRECISION"), (re.compile(r"\bINTEGER\b"), "BIGINT"),
          (re.compile(r"\bBLOB\b"), "BYTEA"))

LEASE_TABLE = """
CREATE TABLE IF NOT EXISTS flightpart_lease(
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, uri TEXT NOT NULL, epoch BIGINT NOT NULL,
    expires TIMESTAMPTZ NOT NULL, since TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS flightpart_catalogs(holder TEXT PRIMARY KEY, uri TEXT NOT NULL, seen TIMESTAMPTZ NOT NULL);
"""


class PostgresDatabase(Database):
    """The catalog's state in PostgreSQL, shared by every catalog of the cluster; only the leader writes.

    ``fence()`` gives the epoch this catalog leads with (None: it does not lead). Connection trouble is
    :class:`~flightpart.errors.StateUnavailable` (reconnected at the next call). A silent link never holds a
    call for long: the kernel gives up after ``link_timeout`` seconds unacknowledged, and a watchdog cuts a
    call still running after ``call_deadline`` seconds, or after ``link_timeout`` once this catalog leads no more.
    """

    kind = "postgresql"

    def __init__(self, url: str, *, fence: Callable[[], int | None] = lambda: None, connect_timeout: float = 3.0,
                 link_timeout: float = 10.0, call_deadline: float = 30.0, settings: dict[str, str] | None = None):
        import psycopg  # the ha extra: only a catalog given --lease needs it

        self._psycopg = psycopg
        self.url = url
        self.fence = fence
        self.connect_timeout = connect_timeout
        seconds = max(1, round(link_timeout / 3))
        self._link = {"keepalives": 1, "keepalives_idle": seconds, "keepalives_interval": seconds,
                      "keepalives_count": 2, "tcp_user_timeout": max(1000, int(link_timeout * 1000))}
        # a catalog frozen inside a transaction (SIGSTOP, a pause) must not hold the lease row's lock for ever:
        # the database ends such a session, so a takeover waits seconds, not until the frozen process wakes
        # text comes back as str even from a database made without a locale (SQL_ASCII, where psycopg gives bytes)
        self.settings = {"client_encoding": "UTF8", "idle_in_transaction_session_timeout": "3s", "lock_timeout": "10s",
                         **(settings or {})}
        self.lock = threading.RLock()
        self._conn: Any = None
        self._written = 0
        self.link_timeout, self.call_deadline = link_timeout, max(call_deadline, link_timeout)
        self._since: float | None = None  # monotonic start of the call in progress (under the lock), None: none
        self._closed = threading.Event()
        self._connect()
        threading.Thread(target=self._watch_calls, name="flightpart-db-watch", daemon=True).start()

    def _watch_calls(self) -> None:
        """Cut the connection under a call that runs too long (see the class): the call fails as StateUnavailable."""
        while not self._closed.wait(min(0.25, self.link_timeout / 4)):
            since, conn = self._since, self._conn
            if since is None or conn is None:
                continue
            running = time.monotonic() - since
            if running > self.call_deadline or (running > self.link_timeout and self.fence() is None):
                try:
                    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as cut:
                        cut.shutdown(socket.SHUT_RDWR)
                except (OSError, ValueError, AttributeError):
                    continue  # closed meanwhile

    def _connect(self) -> Any:
        if self._conn is None or self._conn.closed:
            options = " ".join(f"-c {name}={value}" for name, value in self.settings.items())
            try:
                self._conn = self._psycopg.connect(self.url, autocommit=True,
                                                   connect_timeout=max(1, int(self.connect_timeout)),
                                                   options=options, **self._link)
            except self._psycopg.Error as exc:
                self._conn = None
                raise StateUnavailable(f"the state database does not answer: {_one_line(exc)}") from None
        return self._conn

    def script(self, sql: str) -> None:
        with self.lock, self._guard():
            conn = self._connect()
            with conn.transaction():
                # catalogs starting together create tables one at a time
                conn.execute("SELECT pg_advisory_xact_lock(7213)")
                for statement in filter(str.strip, sql.split(";")):
                    index = NEW_INDEX.match(statement)
                    if index and conn.execute("SELECT to_regclass(%s)", (index["name"],)).fetchone()[0] is not None:
                        continue  # see NEW_INDEX: a catalog starting must not stop the others' writes
                    conn.execute(_pg(statement))

    @contextmanager
    def _guard(self) -> Iterator[None]:
        outermost = self._since is None
        if outermost:
            self._since = time.monotonic()
        try:
            yield
        except self._psycopg.errors.LockNotAvailable as exc:  # waited longer than lock_timeout: busy, not down
            raise StateUnavailable(f"the state database is busy: {_one_line(exc)}", field="lock") from None
        except self._psycopg.Error as exc:
            broken = self._conn is not None and (self._conn.closed or self._conn.broken)
            if broken:
                self._conn = None
            # a connection cut (by a restart, a cut link) fails as OperationalError or, when psycopg found it closed
            # first, InterfaceError; any other error of a broken connection is the connection's, not the statement's
            if not (broken or isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError))):
                raise
            raise StateUnavailable(f"the state database does not answer: {_one_line(exc)}") from None
        finally:
            if outermost:
                self._since = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        with self.lock, self._guard():
            cursor = self._connect().execute(_pg(sql), tuple(params))
            if cursor.rowcount > 0 and not sql.lstrip().upper().startswith("SELECT"):
                self._written += cursor.rowcount
            return cursor

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        with self.lock, self._guard():
            with self._connect().cursor() as cursor:
                cursor.executemany(_pg(sql), rows)
            self._written += len(rows)

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        with self.lock, self._guard():
            conn = self._connect()
            with conn.transaction():
                self._check_fence(conn)  # early: no work done that is bound to be refused
                yield self
                # last: the row stays locked from here to the commit, so a takeover either came before this check
                # (refused: rolled back) or waits these milliseconds and comes after the commit, never in between
                self._check_fence(conn, lock=True)

    def _check_fence(self, conn: Any, *, lock: bool = False) -> None:
        """NotLeader unless the lease row still names the epoch this catalog leads with (``lock``: held until the
        transaction ends)."""
        epoch = self.fence()
        row = conn.execute("SELECT epoch, uri FROM flightpart_lease WHERE id = 1"
                           + (" FOR SHARE" if lock else "")).fetchone()
        if epoch is None or row is None or row[0] != epoch:
            raise NotLeader("this catalog does not lead the cluster (its lease passed to another); nothing was changed",
                            field=row[1] if row is not None and row[0] != epoch else None)

    @property
    def rows_written(self) -> int:
        return self._written

    def reset(self) -> None:
        """Close the connection; the next call makes a new one."""
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def close(self) -> None:
        self._closed.set()
        self.reset()


def _pg(sql: str) -> str:
    """SQLite's spelling as PostgreSQL's: ``%s`` placeholders, 64-bit integers, double precision, bytea."""
    for pattern, replacement in _TYPES:
        sql = pattern.sub(replacement, sql)
    return sql.replace("%", "%%").replace("?", "%s")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
