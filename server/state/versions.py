"""Version state: reserving numbers, SPMD publishes, commits, aborts and drops (tombstones), and the reads of
committed versions that FlightInfos are built from.
"""

from __future__ import annotations

import time
from typing import Any

from flightpart.errors import DatasetNotFound, LimitExceeded, RequestRejected, VersionConflict, VersionExpired
from flightpart.settings import count_from_env
from flightpart.wire import ALREADY_DROPPED, VERSION_LIMIT

from .core import StateCore
from .database import Database
from .records import LEARNED, NodeRecord, OnTop, PartRecord, VersionRecord, order_key
from .tables import check_on_top, learned_from_nodes, raise_floor, serving_order, stats_of, write_stats

PENDING_PER_WRITER = 10_000
"""Versions a writer (not an admin or the owner) may hold begun and neither committed nor aborted: each is a row kept
until commit, abort or the pending TTL, so a writer beginning in a loop must not outrun the TTL. A put, an append or
an SPMD job holds one (decision 0021). ``$FLIGHTPART_PENDING_PER_WRITER`` sets it."""
PENDING_PER_WRITER_ENV = "FLIGHTPART_PENDING_PER_WRITER"


def pending_per_writer_from_env() -> int:
    """The limit ``$FLIGHTPART_PENDING_PER_WRITER`` sets (at least 1), or :data:`PENDING_PER_WRITER`."""
    return count_from_env(PENDING_PER_WRITER_ENV, PENDING_PER_WRITER, "the versions a writer may hold begun")


class VersionState(StateCore):
    """Datasets and their versions: a version is published only when complete, and its number is never reused."""

    _db: Database  # the database (:class:`.core.StateCore`)
    _lock: Any  # its lock

    def begin(self, dataset: str, nranks: int | None = None, writer: str | None = None,
              most_pending: int | None = None) -> int:
        """Reserve the next version number (never reused); ``writer`` alone may commit or abort it. ``most_pending``:
        how many versions ``writer`` may hold pending (LIMIT_EXCEEDED past it; None: any)."""
        with self.tx(dataset) as db:
            if writer is not None and most_pending is not None:
                held = db.execute("SELECT count(*) FROM versions v JOIN writers w ON w.dataset=v.dataset AND "
                                  "w.version=v.version WHERE v.state='pending' AND w.writer=?", (writer,)).fetchone()[0]
                if held >= most_pending:
                    raise LimitExceeded(f"{writer.partition(':')[2] or writer} holds as many versions begun and "
                                        f"neither committed nor aborted as a writer may ({held:,}; "
                                        f"${PENDING_PER_WRITER_ENV}): commit or abort one, or wait for the pending TTL "
                                        "to abort it")
            row = db.execute("SELECT next_version FROM counters WHERE dataset=?", (dataset,)).fetchone()
            version = row[0] if row else 1
            if version > VERSION_LIMIT:  # no node would store it
                raise RequestRejected(f"dataset {dataset!r} has used every version number a dataset may have "
                                      f"({VERSION_LIMIT:,}); publish under another name", field="dataset")
            db.execute("INSERT INTO counters VALUES(?,?) ON CONFLICT(dataset) DO UPDATE SET "
                       "next_version=excluded.next_version",
                       (dataset, version + 1))
            db.execute(
                "INSERT INTO versions(dataset, version, state, nranks, created) VALUES(?,?,?,?,?)",
                (dataset, version, "pending", nranks, time.time()),
            )
            if writer is not None:
                db.execute("INSERT INTO writers VALUES(?,?,?)", (dataset, version, writer))
            return version

    def writer_of(self, dataset: str, version: int) -> str | None:
        """Who reserved ``version``; :data:`LEARNED` for one learned from nodes' files (it may have been committed,
        so no writer may abort it); None where no writer was recorded."""
        with self._lock:
            row = self._db.execute("SELECT writer FROM writers WHERE dataset=? AND version=?",
                                   (dataset, version)).fetchone()
            if row is None and learned_from_nodes(self._db, dataset, version):
                return LEARNED
        return row[0] if row else None
    def join_publish(self, dataset: str, nranks: int, rank: int, writer: str | None = None,
                     most_pending: int | None = None) -> int:
        """The open SPMD publish of ``writer`` (only its own) that ``rank`` should join, opened atomically if there
        is none. ``most_pending`` bounds opening one, as in :meth:`begin`; joining is never refused."""
        with self._lock:
            return self._pending_publish(dataset, nranks, rank, writer) or self.begin(
                dataset, nranks=nranks, writer=writer, most_pending=most_pending)

    def _pending_publish(self, dataset: str, nranks: int, rank: int, writer: str | None) -> int | None:
        """An open SPMD publish of ``dataset`` for ``nranks``, begun by ``writer``, that ``rank`` has not joined."""
        with self._lock:
            whose = "w.writer IS NULL" if writer is None else "w.writer=?"
            rows = self._db.execute(
                "SELECT v.version FROM versions v LEFT JOIN writers w ON w.dataset=v.dataset AND w.version=v.version "
                f"WHERE v.dataset=? AND v.state='pending' AND v.nranks=? AND {whose} ORDER BY v.version",
                (dataset, nranks) + (() if writer is None else (writer,)),
            ).fetchall()
            for (version,) in rows:
                joined = self._db.execute("SELECT 1 FROM partitions WHERE dataset=? AND version=? AND i=?",
                                          (dataset, version, rank)).fetchone()
                if not joined:
                    return version
        return None

    def version_state(self, dataset: str, version: int) -> tuple[str, int | None] | None:
        with self._lock:
            return self._db.execute("SELECT state, nranks FROM versions WHERE dataset=? AND version=?",
                                    (dataset, version)).fetchone()

    def add_rank_part(self, dataset: str, version: int, rank: int, rows: int, cols: int, nbytes: int, node_id: str,
                      schema: bytes) -> int:
        """Record one SPMD rank's part; returns how many ranks have joined. A rank publishes once: the same part
        again (a retry) changes nothing, another one is a VERSION_CONFLICT."""
        with self.tx(dataset) as db:
            joined = db.execute("SELECT p.rows, p.cols, r.node_id FROM partitions p JOIN replicas r USING(dataset, "
                                "version, i, j) WHERE dataset=? AND version=? AND i=?",
                                (dataset, version, rank)).fetchone()
            if joined is not None:
                if tuple(joined) != (rows, cols, node_id):
                    raise VersionConflict(f"rank {rank} of {dataset} v{version} published its part already "
                                          f"({joined[0]:,} rows on node {joined[2]}); a rank publishes once",
                                          field="publish-part.rank")
                return db.execute("SELECT COUNT(*) FROM partitions WHERE dataset=? AND version=?",
                                  (dataset, version)).fetchone()[0]
            db.execute("INSERT INTO partitions VALUES(?,?,?,?,?,?,?,?,?) ON CONFLICT(dataset, version, i, j) DO UPDATE "
                       "SET row_start=excluded.row_start, col_start=excluded.col_start, rows=excluded.rows, "
                       "cols=excluded.cols, nbytes=excluded.nbytes",
                       (dataset, version, rank, 0, None, 0, rows, cols, nbytes))
            db.execute("DELETE FROM replicas WHERE dataset=? AND version=? AND i=?", (dataset, version, rank))
            db.execute("INSERT INTO replicas VALUES(?,?,?,?,?)", (dataset, version, rank, 0, node_id))
            db.execute("UPDATE versions SET schema=COALESCE(schema, ?) WHERE dataset=? AND version=?",
                       (schema, dataset, version))
            return db.execute("SELECT COUNT(*) FROM partitions WHERE dataset=? AND version=?",
                              (dataset, version)).fetchone()[0]

    def version_schema(self, dataset: str, version: int) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT schema FROM versions WHERE dataset=? AND version=?",
                                   (dataset, version)).fetchone()
        return row[0] if row else None

    def rank_parts(self, dataset: str, version: int) -> list[tuple[int, int, int, str]]:
        """(rank, rows, cols, node_id) of a pending SPMD publish, by rank."""
        with self._lock:
            return self._db.execute(
                "SELECT p.i, p.rows, p.cols, r.node_id FROM partitions p JOIN replicas r USING(dataset, version, i, j) "
                "WHERE dataset=? AND version=? ORDER BY p.i",
                (dataset, version),
            ).fetchall()

    def commit(self, dataset: str, version: int, schema: bytes, shape: tuple[int, int], grid: tuple[int, int],
               parts: list[PartRecord], replicas: int = 1, *, on_top: OnTop | None = None) -> None:
        """Publish a complete version: all partitions and replicas at once.

        ``on_top`` (:class:`~.records.OnTop`) is checked in this
        transaction, so no acknowledged write hides or is hidden by another.
        """
        with self.tx(dataset) as db:
            state = db.execute("SELECT state FROM versions WHERE dataset=? AND version=?",
                               (dataset, version)).fetchone()
            if state is None:
                raise DatasetNotFound(f"dataset {dataset!r} has no pending version {version} (was it dropped or "
                                      "aborted?)")
            if state[0] == "committed":
                raise VersionConflict(f"dataset {dataset!r} version {version} is already committed", field="version")
            if state[0] != "pending":
                if state[0] == "aborted":
                    raise VersionExpired(f"{dataset} v{version} was aborted while it was being written (pending longer "
                                         "than --pending-ttl, or given up); nothing was published: put it again",
                                         field="version")
                raise DatasetNotFound(f"dataset {dataset!r} version {version} was {state[0]}; it cannot be committed")
            if on_top is not None:
                check_on_top(db, dataset, version, on_top.base)
            db.execute("DELETE FROM partitions WHERE dataset=? AND version=?", (dataset, version))
            db.execute("DELETE FROM replicas WHERE dataset=? AND version=?", (dataset, version))
            db.executemany(
                "INSERT INTO partitions VALUES(?,?,?,?,?,?,?,?,?)",
                [(dataset, version, p.part[0], p.part[1], p.start[0], p.start[1], p.shape[0], p.shape[1],
                  p.nbytes) for p in parts],
            )
            write_stats(db, dataset, version, [(p.part, p.stats) for p in parts])
            db.executemany(
                "INSERT INTO replicas VALUES(?,?,?,?,?)",
                [(dataset, version, p.part[0], p.part[1], n.node_id) for p in parts for n in p.nodes],
            )
            db.execute(
                "UPDATE versions SET state='committed', unsealed=1, schema=?, rows=?, cols=?, grid_p=?, grid_q=?, "
                "replicas=? WHERE dataset=? AND version=?",
                (schema, shape[0], shape[1], grid[0], grid[1], replicas, dataset, version),
            )

    def abort(self, dataset: str, version: int) -> list[NodeRecord]:
        """Forget a pending version; returns the nodes that may hold its files."""
        return self._delete(dataset, version, only_pending=True)

    def dropped_through(self, dataset: str) -> int:
        """The highest version a drop of every version of ``dataset`` covered (0: none)."""
        with self._lock:
            row = self._db.execute("SELECT dropped_through FROM floors WHERE dataset=?", (dataset,)).fetchone()
        return row[0] if row else 0

    def drop(self, dataset: str, version: int | None = None) -> list[NodeRecord]:
        """Forget a version (or all; numbers stay taken); returns every node that may hold its files."""
        with self._lock:
            states = {r[0] for r in self._db.execute(
                "SELECT DISTINCT state FROM versions WHERE dataset=?"
                + (" AND version=?" if version is not None else ""),
                (dataset,) + ((version,) if version is not None else ()))}
        if not states & {"pending", "committed"}:
            what = f"version {version} of dataset {dataset!r}" if version is not None else f"dataset {dataset!r}"
            if "dropped" in states:  # a writer whose drop's answer was lost to a catalog's death learns it was done
                raise DatasetNotFound(f"{what} was dropped already", field=ALREADY_DROPPED)
            raise DatasetNotFound(f"{what} does not exist")
        return self._delete(dataset, version, only_pending=False)

    def _delete(self, dataset: str, version: int | None, *, only_pending: bool) -> list[NodeRecord]:
        """Leave a tombstone ('aborted' or 'dropped') in place of the version; returns the nodes to tell: its
        holders, or every node for a pending one (placements are learned at commit)."""
        where = "dataset=?" + (" AND version=?" if version is not None else "")
        args = (dataset,) + ((version,) if version is not None else ())
        with self.tx(dataset) as db:
            states = {r[0] for r in db.execute(f"SELECT state FROM versions WHERE {where}", args)}
            if only_pending and states != {"pending"}:
                return []
            holders = {r[0] for r in db.execute(f"SELECT DISTINCT node_id FROM replicas WHERE {where}", args)}
            tombstone = "aborted" if only_pending else "dropped"
            db.execute(f"UPDATE versions SET state=? WHERE state IN ('pending', 'committed') AND {where}",
                       (tombstone, *args))
            if version is None and not only_pending:
                row = db.execute("SELECT next_version FROM counters WHERE dataset=?", (dataset,)).fetchone()
                raise_floor(db, dataset, (row[0] - 1) if row else 0)
            for table in ("partitions", "replicas", "stats"):
                db.execute(f"DELETE FROM {table} WHERE {where}", args)
            if "pending" in states:  # any node may hold a pending version's files (placements are learned at commit)
                holders = {r[0] for r in db.execute("SELECT node_id FROM nodes")}
            # until each acknowledges the order (:meth:`told`): a catalog dying before it went out has them register
            self.note_missed(sorted(holders), order_key(dataset, version), db)
        return [n for n in self.nodes() if n.node_id in holders]

    def expired_pending(self, ttl: float) -> list[tuple[str, int]]:
        """Pending versions older than ``ttl`` seconds, except those learned from nodes' unsealed files (they may
        have been committed: only an abort or a drop deletes them)."""
        with self._lock:
            return self._db.execute("SELECT dataset, version FROM versions WHERE state='pending' AND found=0 AND "
                                    "created < ? ORDER BY dataset, version", (time.time() - ttl,)).fetchall()

    def latest(self, dataset: str) -> int:
        row = self.remembered(("latest", dataset), lambda: self._db.execute(
            "SELECT MAX(version) FROM versions WHERE dataset=? AND state='committed'", (dataset,)).fetchone())
        if row is None or row[0] is None:
            raise DatasetNotFound(f"no dataset named {dataset!r}; `flightpart ls` lists what exists")
        return row[0]

    def version(self, dataset: str, version: int | None = None, *,
                nodes: dict[str, NodeRecord] | None = None) -> VersionRecord:
        """One committed version (``nodes``: the node table already read, for callers that read many versions)."""
        version = self.latest(dataset) if version is None else version
        head, rows, replica_rows, stats = self.remembered(("version", dataset, version),
                                                           lambda: self._version_rows(dataset, version))
        nodes = nodes if nodes is not None else {n.node_id: n for n in self.nodes()}
        holders: dict[tuple[int, int], list[NodeRecord]] = {}
        for i, j, node_id in replica_rows:
            if node_id in nodes:
                holders.setdefault((i, j), []).append(nodes[node_id])
        parts = [
            PartRecord((i, j), (rs, cs), (nr, nc), nb, serving_order(holders.get((i, j), []), k),
                       stats_of(stats.get((i, j))))
            for k, (i, j, rs, cs, nr, nc, nb) in enumerate(rows)
        ]
        return VersionRecord(dataset, version, bytes(head[0]), (head[1], head[2]), (head[3], head[4]), parts, head[5])

    def _version_rows(self, dataset: str, version: int) -> tuple:
        with self._lock:
            head = self._db.execute(
                "SELECT schema, rows, cols, grid_p, grid_q, replicas FROM versions WHERE dataset=? AND version=? AND "
                "state='committed'",
                (dataset, version),
            ).fetchone()
            if head is None:
                raise DatasetNotFound(f"dataset {dataset!r} has no version {version} (dropped, never committed, or "
                                      "mistyped)")
            rows = self._db.execute(
                "SELECT i, j, row_start, col_start, rows, cols, nbytes FROM partitions WHERE dataset=? AND version=? "
                "ORDER BY i, j",
                (dataset, version),
            ).fetchall()
            replica_rows = self._db.execute(
                "SELECT i, j, node_id FROM replicas WHERE dataset=? AND version=? ORDER BY i, j, node_id",
                (dataset, version)
            ).fetchall()
            stats = {(i, j): body for i, j, body in self._db.execute(
                "SELECT i, j, body FROM stats WHERE dataset=? AND version=?", (dataset, version))}
        return head, rows, replica_rows, stats

    def sealed_everywhere(self, dataset: str, version: int) -> None:
        """Every holder of a committed version has its seal: nothing to tell them after a restart."""
        with self.tx(dataset) as db:
            db.execute("UPDATE versions SET unsealed=0 WHERE dataset=? AND version=?", (dataset, version))

    def add_replica(self, dataset: str, version: int, part: tuple[int, int], node_id: str) -> None:
        with self.tx(dataset) as db:
            db.execute("INSERT INTO replicas VALUES(?,?,?,?,?) ON CONFLICT DO NOTHING",
                       (dataset, version, part[0], part[1], node_id))

    def remove_replica(self, dataset: str, version: int, part: tuple[int, int], node_id: str) -> bool:
        """Stop listing a node as holder of a partition (its copy is damaged or gone); True if it was listed."""
        with self.tx(dataset) as db:
            gone = db.execute("DELETE FROM replicas WHERE dataset=? AND version=? AND i=? AND j=? AND node_id=?",
                              (dataset, version, part[0], part[1], node_id))
            return gone.rowcount > 0

    def all_versions(self) -> list[VersionRecord]:
        """Every committed version of every dataset."""
        with self._lock:
            rows = self._db.execute("SELECT dataset, version FROM versions WHERE state='committed' "
                                    "ORDER BY dataset, version").fetchall()
        nodes = {n.node_id: n for n in self.nodes()}
        return [self.version(d, v, nodes=nodes) for d, v in rows]

    def latest_versions(self) -> list[tuple[str, int]]:
        """(dataset, latest committed version) of every dataset, by name."""
        return [(name, version) for name, version in self.remembered(("datasets",), lambda: self._db.execute(
            "SELECT dataset, MAX(version) FROM versions WHERE state='committed' GROUP BY dataset "
            "ORDER BY dataset").fetchall())]

    def datasets(self) -> list[VersionRecord]:
        """The latest committed version of every dataset (the node table is read once, not once per dataset)."""
        nodes = {n.node_id: n for n in self.nodes()}
        return [self.version(name, v, nodes=nodes) for name, v in self.latest_versions()]

    def versions_of(self, dataset: str) -> list[int]:
        return self.remembered(("versions_of", dataset), lambda: [r[0] for r in self._db.execute(
            "SELECT version FROM versions WHERE dataset=? AND state='committed' ORDER BY version", (dataset,))])
