"""The state's database and what every part of it shares: opening it, the cluster's identity, write transactions,
and the memory of reads that answers while a PostgreSQL database is away.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

from flightpart.errors import StateUnavailable

from .database import Database, SqliteDatabase
from .tables import SCHEMA


class StateCore:
    """One database (SQLite, or the PostgreSQL one given) with its schema made; what node and version state build on."""

    def __init__(self, path: str | Path = ":memory:", *, database: Database | None = None):
        if database is None and str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # owner only, whatever the umask; SQLite gives the -wal and -shm files the database file's mode
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(path, 0o600)
        self._db = database if database is not None else SqliteDatabase(str(path))
        self._db.script(SCHEMA)
        # PostgreSQL state outlives this catalog's view of it: what was read last answers opens while it is away
        self._memo: dict[tuple, Any] | None = {} if self._db.kind == "postgresql" else None
        # SQLite files from before these columns existed get them; a PostgreSQL database is always made whole above
        if isinstance(self._db, SqliteDatabase) and "found" not in self._db.columns("versions"):
            # 1: a pending version first learned from a node's unsealed files (this catalog lost its state): it may
            # have been committed before the loss, so no pending TTL deletes it
            self._db.execute("ALTER TABLE versions ADD COLUMN found INTEGER NOT NULL DEFAULT 0")
        if isinstance(self._db, SqliteDatabase) and "unsealed" not in self._db.columns("versions"):
            # 1 from a commit until every holder has its seal: a catalog that died in between tells them at restart
            self._db.execute("ALTER TABLE versions ADD COLUMN unsealed INTEGER NOT NULL DEFAULT 0")
        self._lock = self._db.lock

    @property
    def database(self) -> Database:
        """Where the state lives (SQLite or PostgreSQL)."""
        return self._db

    @property
    def rows_written(self) -> int:
        """Rows the database has written since it was opened."""
        return self._db.rows_written

    def cluster(self) -> str | None:
        """This cluster's identity, once known."""
        row = self.remembered(("cluster",),
                              lambda: self._db.execute("SELECT value FROM meta WHERE key='cluster'").fetchone())
        return row[0] if row else None

    def adopt_cluster(self, offered: str | None) -> str | None:
        """The cluster id kept, else ``offered`` by a node (a catalog rebuilt from its nodes), else None; never a
        fresh one, so whoever reaches an empty catalog first does not decide the identity."""
        tx = self.tx()
        with tx as db:
            row = db.execute("SELECT value FROM meta WHERE key='cluster'").fetchone()
            if row or offered is None:
                tx.narrow((), shared=False)  # nothing written: every registration asks, none should wipe the memory
                return row[0] if row else None
            db.execute("INSERT INTO meta VALUES('cluster', ?)", (offered,))
            tx.narrow((), shared=True)  # the identity alone: no dataset's reads change
            return offered

    def mint_cluster(self, given: str | None = None) -> str:
        """The cluster id, made now (``given``, or fresh) when none is known: a new cluster's first write."""
        tx = self.tx()
        with tx as db:
            row = db.execute("SELECT value FROM meta WHERE key='cluster'").fetchone()
            tx.narrow((), shared=not row)  # the identity alone: no dataset's reads change
            if row:
                return row[0]
            cluster = given or uuid.uuid4().hex
            db.execute("INSERT INTO meta VALUES('cluster', ?)", (cluster,))
            return cluster

    def tx(self, touches: str | None = "*") -> Any:
        """A write transaction; on commit it forgets the remembered reads of the dataset it ``touches`` (``"*"``:
        any; None: none), so the memory never answers for state this catalog changed."""
        return _Forgetting(self._db.transaction(), self._memo, touches)

    MEMO_ENTRIES = 4096
    """Reads remembered at once (a PostgreSQL catalog's answers while its database is away); past it, started afresh."""

    def remembered(self, key: tuple, read: Any) -> Any:
        """``read()``; on PostgreSQL also kept, and answered from memory when the database does not answer."""
        if self._memo is None:
            with self._lock:
                return read()
        try:
            with self._lock:
                value = read()
        except StateUnavailable:
            if key in self._memo:
                return self._memo[key]
            raise
        if len(self._memo) >= self.MEMO_ENTRIES:
            self._memo.clear()
        self._memo[key] = value
        return value

    def ping(self) -> bool:
        """True while the database answers."""
        try:
            with self._lock:
                return tuple(self._db.execute("SELECT 1").fetchone()) == (1,)
        except StateUnavailable:
            return False


class _Forgetting:
    """A transaction that forgets remembered reads when it commits (:meth:`StateCore.tx`), narrowed by its body
    (:meth:`narrow`) to what it changed."""

    def __init__(self, tx: Any, memo: dict | None, touches: str | None):
        self.tx, self.memo, self.touches = tx, memo, touches
        self.datasets: set[str] | None = None  # set by narrow(): the datasets changed
        self.shared = True  # with narrow(): whether the cluster-wide reads (nodes, datasets, cluster) changed

    def narrow(self, datasets: Collection[str], shared: bool) -> None:
        """Forget only the reads of ``datasets``, and the cluster-wide ones if ``shared``."""
        self.datasets, self.shared = set(datasets), shared or bool(datasets)

    def __enter__(self) -> Database:
        return self.tx.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.tx.__exit__(*exc)
        finally:
            if self.memo is not None and exc[0] is None and self.touches is not None:
                for key in [k for k in self.memo if self._forgets(k)]:
                    self.memo.pop(key, None)

    def _forgets(self, key: tuple) -> bool:
        if self.datasets is not None:
            return self.shared if len(key) == 1 else key[1] in self.datasets
        return self.touches == "*" or len(key) == 1 or key[1] == self.touches
