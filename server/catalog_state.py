"""The catalog's durable state in SQLite (WAL): nodes, datasets, versions, partitions.

Kept apart from the Flight server so the rules are plain functions over a
database that a test can drive directly:

- a version is published only when complete, and versions are never reused
  (the counter also moves past every version number a node reports);
- a dropped or aborted version keeps a tombstone, so a node that was away is
  told to delete it; a version the catalog does not know is never a reason
  to delete anything: a sealed one is rebuilt from its manifest, an unsealed
  one is recorded as pending and expires by the pending TTL;
- the cluster's identity is kept here, so nodes obey only their own catalog.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightpart.errors import (
    DatasetNotFound,
    LimitExceeded,
    NotLeader,
    RequestRejected,
    StateUnavailable,
    VersionConflict,
    VersionExpired,
)
from flightpart.settings import count_from_env
from flightpart.wire import ALREADY_DROPPED, VERSION_LIMIT, EncodedJson

from .auth import CLOCK_MARGIN
from .catalog_db import Database, SqliteDatabase
from .liveness import SentTimes

log = logging.getLogger("flightpart.catalog")

PENDING_PER_WRITER = 10_000
"""Versions a writer (a writer token's name; not an admin or the owner) may hold begun and neither committed nor
aborted: each is a row of state kept until its commit, its abort or the pending TTL, and a writer that began versions
in a loop (some 130 a second) outran the TTL's cleanup without end. Far above what puts in flight need: a put, an
append or a whole SPMD job holds one. ``$FLIGHTPART_PENDING_PER_WRITER`` sets it."""
PENDING_PER_WRITER_ENV = "FLIGHTPART_PENDING_PER_WRITER"


def pending_per_writer_from_env() -> int:
    """The limit ``$FLIGHTPART_PENDING_PER_WRITER`` sets (a whole number, at least 1), or :data:`PENDING_PER_WRITER`."""
    return count_from_env(PENDING_PER_WRITER_ENV, PENDING_PER_WRITER, "the versions a writer may hold begun")

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes(
    node_id TEXT PRIMARY KEY, uri TEXT NOT NULL, ip TEXT NOT NULL, pid INTEGER NOT NULL,
    data_dir TEXT, last_heartbeat REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters(dataset TEXT PRIMARY KEY, next_version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS versions(
    dataset TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL, schema BLOB,
    rows INTEGER, cols INTEGER, grid_p INTEGER, grid_q INTEGER, nranks INTEGER, created REAL NOT NULL,
    replicas INTEGER NOT NULL DEFAULT 1, found INTEGER NOT NULL DEFAULT 0, unsealed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(dataset, version));
CREATE TABLE IF NOT EXISTS partitions(
    dataset TEXT NOT NULL, version INTEGER NOT NULL, i INTEGER NOT NULL, j INTEGER NOT NULL,
    row_start INTEGER, col_start INTEGER, rows INTEGER NOT NULL, cols INTEGER NOT NULL, nbytes INTEGER NOT NULL,
    PRIMARY KEY(dataset, version, i, j));
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stats(
    dataset TEXT NOT NULL, version INTEGER NOT NULL, i INTEGER NOT NULL, j INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY(dataset, version, i, j));
CREATE TABLE IF NOT EXISTS floors(dataset TEXT PRIMARY KEY, dropped_through INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS writers(
    dataset TEXT NOT NULL, version INTEGER NOT NULL, writer TEXT NOT NULL, PRIMARY KEY(dataset, version));
CREATE TABLE IF NOT EXISTS replicas(
    dataset TEXT NOT NULL, version INTEGER NOT NULL, i INTEGER NOT NULL, j INTEGER NOT NULL, node_id TEXT NOT NULL,
    PRIMARY KEY(dataset, version, i, j, node_id));
CREATE TABLE IF NOT EXISTS missed(node_id TEXT NOT NULL, what TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY(node_id, what));
CREATE INDEX IF NOT EXISTS versions_pending ON versions(dataset, version) WHERE state='pending';
"""
"""``missed``: nodes that must register again before their heartbeats are taken, because they may not have had an
order: a drop's or abort's (``what``: :func:`order_key`), from the moment it is written until the node acknowledges
that order, or any order a node did not answer (``what``: ``register``); ``at``: when, so a registration clears only
what was written before it began. Kept in the database, not only in memory, so a catalog that dies before the order
went out, or before a node that missed it registered, still has it register at the next start or takeover, which
tells it what it missed."""

MUST_REGISTER = "register"
"""The ``missed`` row of a node that did not answer an order (see :meth:`CatalogState.must_register`)."""


def order_key(dataset: str, version: int | None) -> str:
    """The ``missed`` rows of one drop or abort: a node acknowledging it clears only these."""
    return f"drop {dataset} {'*' if version is None else version}"


@dataclass
class NodeRecord:
    node_id: str
    uri: str
    ip: str
    pid: int
    data_dir: str | None
    last_heartbeat: float
    alive: bool

    free_bytes: int | None = None
    low_space: bool = False
    clock_skew: float | None = None  # seconds the node's clock runs ahead of the catalog's (from its last heartbeat)

    def as_json(self) -> dict:
        return {**self.__dict__}


@dataclass
class PartRecord:
    part: tuple[int, int]
    start: tuple[int, int]
    shape: tuple[int, int]
    nbytes: int
    nodes: list[NodeRecord] = field(default_factory=list)
    stats: EncodedJson | dict | None = None  # column statistics from the node that stored it


@dataclass
class VersionRecord:
    dataset: str
    version: int
    schema: bytes
    shape: tuple[int, int]
    grid: tuple[int, int]
    parts: list[PartRecord]
    replicas: int = 1

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


LEARNED = "learned:from nodes' files"
"""The writer of a version learned from nodes' files (:meth:`CatalogState.writer_of`): none, so only an admin may
finish it."""


class CatalogState:
    """Thread-safe access to one SQLite database."""

    FLUSH_EVERY = 30.0
    """Seconds between writes of the in-memory heartbeats to the database (what a restart starts from)."""

    def __init__(self, path: str | Path = ":memory:", *, dead_after: float = 10.0, database: Database | None = None):
        if database is None and str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # owner only, whatever the umask; SQLite gives the -wal and -shm files the database file's mode
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(path, 0o600)
        self.dead_after = dead_after
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
        self._space: dict[str, tuple[int | None, bool]] = {}  # node id -> (free bytes, low space), from heartbeats
        self._skew: dict[str, float | None] = {}  # node id -> its clock minus ours, seconds, from heartbeats
        # liveness lives in memory: a heartbeat is a dict write, flushed to the database in one batch now and then
        self._beats: dict[str, float] = {}
        self._sent = SentTimes()
        self._newest: dict[str, int] = {}  # node id -> the latest clock of its beats taken (datagrams must be later)
        # holders of a version committed without all its seals (this catalog died in between) register again
        # at their next heartbeat, which tells them the seal they missed
        self._known = self._nodes_told_everything()
        self._flushed = time.monotonic()
        self._started = time.time()
        self._dead_since_flush = self._dead_before()  # see :meth:`unheard`

    # ------------------------------------------------------------------ identity

    @property
    def database(self) -> Database:
        """Where the state lives (SQLite or PostgreSQL)."""
        return self._db

    @property
    def rows_written(self) -> int:
        """Rows the database has written since it was opened (what shows heartbeats are kept in memory, then batched)."""
        return self._db.rows_written

    def cluster(self) -> str | None:
        """This cluster's identity, once known."""
        row = self._remembered(("cluster",), lambda: self._db.execute("SELECT value FROM meta WHERE key='cluster'").fetchone())
        return row[0] if row else None

    def adopt_cluster(self, offered: str | None) -> str | None:
        """The cluster id: the one kept, else ``offered`` (a node that holds it: a catalog rebuilt from its nodes).

        Never a fresh one: which node or client reaches a catalog on empty
        state first must not decide the cluster's identity (see
        :meth:`mint_cluster`). None while no identity is known.
        """
        tx = self._tx()
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
        tx = self._tx()
        with tx as db:
            row = db.execute("SELECT value FROM meta WHERE key='cluster'").fetchone()
            tx.narrow((), shared=not row)  # the identity alone: no dataset's reads change
            if row:
                return row[0]
            cluster = given or uuid.uuid4().hex
            db.execute("INSERT INTO meta VALUES('cluster', ?)", (cluster,))
            return cluster

    def close(self) -> None:
        try:
            self.flush_heartbeats()
        except (NotLeader, StateUnavailable):
            pass  # another catalog leads, or the database is away: the heartbeats were its to keep
        self._db.close()

    def _tx(self, touches: str | None = "*") -> Any:
        """A write transaction. On PostgreSQL, what was remembered for reads of the dataset it ``touches`` (``"*"``:
        any; None: no dataset, as a flush of heartbeats) is forgotten once it commits, so the memory never answers
        for state this catalog changed."""
        return _Forgetting(self._db.transaction(), self._memo, touches)

    MEMO_ENTRIES = 4096
    """Reads remembered at once (a PostgreSQL catalog's answers while its database is away); past it, started afresh."""

    def _remembered(self, key: tuple, read: Any) -> Any:
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

    # ------------------------------------------------------------------ nodes

    def register_node(self, node_id: str, uri: str, ip: str, pid: int, data_dir: str | None, held: list[dict],
                      manifests: Sequence[VersionRecord] = (), versions: Sequence[tuple[str, int]] = (),
                      sealed_versions: Sequence[tuple[str, int]] = (),
                      granted: Collection[tuple[str, int, tuple[int, int]]] = (),
                      tombstones: Sequence[Any] = ()) -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
        """Record a node and what it holds; returns (orphans, versions to seal, versions it says are gone).

        ``tombstones`` (:class:`flightpart.wire.Tombstones`) are the versions
        the node knows were dropped or aborted: they are recorded first, so a
        catalog that lost its state gets its tombstones and version counters
        back, and a version a node's tombstone says was dropped is dropped
        here too (returned third: every node must be told to delete it).

        Orphans are versions this catalog dropped or aborted (tombstones):
        the node deletes them. Sealed versions the catalog does not know (it
        lost its state) are rebuilt from their manifests; unsealed unknown
        ones are recorded as pending, kept until their writer aborts them or
        an operator drops them (they may have been committed). A claim to a
        partition of a committed version counts only where the catalog
        placed it: a replica it recorded, or one a signed manifest ``granted``. Every
        version number the node has moves the counter past it. Versions to
        seal are committed versions the node holds parts of without a
        manifest (a commit whose seal did not reach it). A registration in
        pages calls this once per page, each page naming every version and
        every sealed version the node has.
        """
        orphans: set[tuple[str, int]] = set()
        now = time.time()
        with self._lock:
            self._known.add(node_id)
            self._beats[node_id] = now
        tx = self._tx()
        with tx as db:
            before = db.execute("SELECT uri, ip, pid, data_dir FROM nodes WHERE node_id=?", (node_id,)).fetchone()
            changed = {t.dataset for t in tombstones}  # what this registration changes: its reads are forgotten
            gone = _bury(db, tombstones, now)
            db.execute(
                "INSERT INTO nodes VALUES(?,?,?,?,?,?) ON CONFLICT(node_id) DO UPDATE SET "
                "uri=excluded.uri, ip=excluded.ip, pid=excluded.pid, data_dir=excluded.data_dir, last_heartbeat=excluded.last_heartbeat",
                (node_id, uri, ip, pid, data_dir, now),
            )
            seen = {(d, v) for d, v in versions} | {(p["dataset"], p["version"]) for p in held} | {(m.dataset, m.version) for m in manifests}
            for dataset, version in seen:
                db.execute("INSERT INTO counters VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
                           "next_version=GREATEST(counters.next_version, excluded.next_version)", (dataset, version + 1))
            states = {key: _state(db, *key) for key in seen}
            for key in [k for k, state in states.items() if state in (None, "pending", "committed") and _below_floor(db, *k)]:
                if states[key] is not None and not _learned_from_nodes(db, *key):
                    log.warning("%s v%d: below a drop of every version a node reported, but this catalog wrote it "
                                "and never dropped it: kept", *key)
                    continue
                if states[key] is not None:
                    gone.add(key)  # resurrected by an earlier node's manifest, dropped by a drop of every version
                _set_state(db, *key, "dropped", now)
                states[key] = "dropped"
                changed.add(key[0])
            for m in manifests:
                if states[(m.dataset, m.version)] in (None, "pending"):
                    _write_committed(db, m, now)
                    states[(m.dataset, m.version)] = "committed"
                    changed.add(m.dataset)
            sealed = {(m.dataset, m.version) for m in manifests} | set(sealed_versions)
            unsealed_committed: set[tuple[str, int]] = set()
            claims: dict[tuple[str, int], list[dict]] = {}
            for p in held:
                key = (p["dataset"], p["version"])
                state = states[key]
                if state == "committed":
                    claims.setdefault(key, []).append(p)
                elif state in ("dropped", "aborted"):
                    orphans.add(key)
                elif state is None:
                    db.execute("INSERT INTO versions(dataset, version, state, created, found) VALUES(?,?,?,?,1)",
                               (*key, "pending", now))
                    states[key] = "pending"
                    changed.add(key[0])
            for key, parts in claims.items():  # a few statements per version, not per partition
                taken, recorded = _take_claims(db, node_id, key, parts, granted)
                if taken and key not in sealed:
                    unsealed_committed.add(key)
                if recorded:
                    changed.add(key[0])
            for key in seen - {(p["dataset"], p["version"]) for p in held}:
                if states[key] in ("dropped", "aborted"):
                    orphans.add(key)  # an empty directory of a version that is gone
            tx.narrow(changed, shared=tuple(before or ()) != (uri, ip, pid, data_dir))
        return sorted(orphans), sorted(unsealed_committed), sorted(gone)

    def knows(self, node_id: str) -> bool:
        """Whether a heartbeat from this node is taken (it need not register again first)."""
        return node_id in self._known

    def datagram_fresh(self, node_id: str, clock_ms: int | None) -> bool:
        """Whether a datagram's beat could be taken (see :meth:`heartbeat`), read without the lock: a replay is
        dropped before anything else is done for it. :meth:`heartbeat` checks again under the lock."""
        newest = self._newest.get(node_id)
        return newest is not None and clock_ms is not None and clock_ms > newest

    def forget_datagram_clocks(self) -> None:
        """No datagram is taken until each node's next beat over Flight (this catalog stopped leading)."""
        with self._lock:
            self._newest.clear()

    def heartbeat(self, node_id: str, free_bytes: int | None = None, low_space: bool = False,
                  clock_skew: float | None = None, clock_ms: int | None = None, *, datagram: bool = False) -> bool:
        """Note a node's heartbeat (in memory); False if the node must register (again) first, or, for a beat that
        came in a datagram (``datagram``), if it could be a replay: this catalog takes a node's datagrams only
        after a beat of it over Flight since it started or took over, and only with a clock past every beat
        taken from it. A withheld or recorded datagram (the node sent that beat over Flight since, or this
        catalog restarted) is then declined, and the node asks over Flight."""
        with self._lock:
            if node_id not in self._known:
                return False
            newest = self._newest.get(node_id)
            if datagram and (newest is None or clock_ms is None or clock_ms <= newest):
                return False
            if clock_ms is not None:  # a clock far ahead (CLOCK_MARGIN) does not bar the node's datagrams for long
                clock_ms = min(clock_ms, int((time.time() + CLOCK_MARGIN) * 1000))
                self._newest[node_id] = clock_ms if newest is None else max(clock_ms, newest)
            sent = self._sent.sent_at(node_id, time.time(), clock_skew)  # a beat that waited counts from then
            self._beats[node_id] = max(sent, self._beats.get(node_id, 0.0))
            self._space[node_id] = (free_bytes, low_space)
            self._skew[node_id] = clock_skew
        if not datagram and time.monotonic() - self._flushed > self.FLUSH_EVERY:  # the datagrams' thread writes nothing:
            self.flush_heartbeats()  # the catalog's housekeeping flushes every 30 s as well
        return True

    @property
    def late_heartbeats(self) -> int:
        """Heartbeats that waited before they were handled, counted from when they were sent."""
        return self._sent.late

    def flush_heartbeats(self) -> None:
        """Write the heartbeats heard since the last flush, in one transaction."""
        with self._lock:
            beats = dict(self._beats)
            self._flushed = time.monotonic()
        if beats:
            with self._tx(touches=None) as db:
                db.executemany("UPDATE nodes SET last_heartbeat=GREATEST(last_heartbeat, ?) WHERE node_id=?",
                               [(t, n) for n, t in beats.items()])
                # when: the next catalog to start (or take over) knows a node silent since long before was dead
                db.execute("INSERT INTO meta VALUES('beats_flushed', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                           (repr(time.time()),))

    def _dead_before(self) -> float:
        """A node whose recorded heartbeat is older than this was dead when the heartbeats were last written (by
        this catalog before a restart, or by the leader before a takeover): 0 when they never were."""
        with self._lock:  # called from the announcing thread too: the connection is used under the lock only
            row = self._db.execute("SELECT value FROM meta WHERE key='beats_flushed'").fetchone()
        return float(row[0]) - self.dead_after if row else 0.0

    def _nodes_told_everything(self) -> set[str]:
        """Recorded nodes that hold no version committed without its seal and missed no order (``missed``): their
        heartbeats are taken as they come; the others must register again (their next heartbeat is refused) and are
        told the seal or the drop they missed."""
        return {r[0] for r in self._db.execute("SELECT node_id FROM nodes")} - {r[0] for r in self._db.execute(
            "SELECT DISTINCT r.node_id FROM replicas r JOIN versions v USING(dataset, version) WHERE v.unsealed=1")} - {
            r[0] for r in self._db.execute("SELECT DISTINCT node_id FROM missed")}

    def take_over(self) -> None:
        """This catalog leads now (another led before, writing the shared database): forget what was remembered,
        know every recorded node (none must register again), and count silence from now, as after a restart."""
        with self._lock:
            if self._memo is not None:
                self._memo.clear()
            self._known = self._nodes_told_everything()
            self._started = time.time()
            # until the new leader's announcement reached every node it could (:meth:`announced`), no node is taken
            # for dead by the old leader's last flush: one cut off from it, or back since, may be alive
            self._dead_since_flush = 0.0
            self._newest.clear()  # datagrams sent to the leader in between may be replayed here: Flight first

    def announced(self) -> None:
        """A new leader's announcement went to every recorded node: those that answered were :meth:`heard`; from now
        on one already dead at the last flush of the heartbeats is not waited for (see :meth:`unheard`)."""
        dead_before = self._dead_before()
        with self._lock:
            self._dead_since_flush = dead_before

    def heard(self, node_id: str) -> None:
        """A node answered this catalog (not a heartbeat: at a takeover): alive from now."""
        with self._lock:
            self._beats[node_id] = time.time()

    def unsettled_for(self) -> float:
        """Seconds until this catalog's view of which nodes are alive can be trusted: 0 once every recorded node was
        heard from since it started or took over, else what is left of ``dead_after`` from then (a node silent that
        long is dead; before, it may only not have reached this catalog yet, its last beat flushed by another)."""
        return 0.0 if not self.unheard() else max(0.0, self._started + self.dead_after - time.time())

    def unheard(self) -> set[str]:
        """The recorded nodes not heard from since this catalog started or took over, while that is under
        ``dead_after`` ago: neither known alive nor known dead yet (see :meth:`unsettled_for`). Not those already
        dead when the heartbeats were last written (silent ``dead_after`` by then): a node decommissioned but not
        yet retired held every node list after a start for the whole ``dead_after``."""
        with self._lock:
            since, dead_before = self._started, self._dead_since_flush
            beats = dict(self._beats)
        if time.time() >= since + self.dead_after:
            return set()
        return {n.node_id for n in self.nodes() if beats.get(n.node_id, 0.0) < since and n.last_heartbeat >= dead_before}

    def must_register(self, node_id: str) -> None:
        """The node's next heartbeat is refused, so it registers again and learns what it missed (drops, seals)."""
        self.must_register_all([node_id])

    def must_register_all(self, node_ids: Collection[str], what: str = MUST_REGISTER) -> None:
        """These nodes' next heartbeats are refused (see :meth:`must_register`); kept in the database too, in one
        transaction (``missed``), so a catalog that dies first still has them register."""
        node_ids = sorted(set(node_ids))
        if not node_ids:
            return
        with self._lock:
            self._known.difference_update(node_ids)
        self._note_missed(node_ids, what)

    def expect_acknowledgements(self, node_ids: Collection[str], what: str) -> None:
        """An order (``what``: :func:`order_key`) is about to go to these nodes: each is ``missed`` until it
        acknowledges it (:meth:`told`), so a catalog that dies first has them register; their heartbeats are taken
        meanwhile."""
        self._note_missed(sorted(set(node_ids)), what)

    def _note_missed(self, node_ids: Sequence[str], what: str, db: Database | None = None) -> None:
        if not node_ids:
            return
        rows = [(n, what, time.time()) for n in node_ids]
        statement = "INSERT INTO missed VALUES(?, ?, ?) ON CONFLICT(node_id, what) DO UPDATE SET at=excluded.at"
        if db is not None:
            db.executemany(statement, rows)
            return
        try:
            with self._tx(None) as tx:
                tx.executemany(statement, rows)
        except Exception as exc:  # the next leader tells them at registration, or this one, in memory (may register)
            log.warning("nodes %s must register again; not kept in the database (%s)", ", ".join(node_ids), exc)

    def told(self, node_ids: Collection[str], what: str) -> None:
        """These nodes acknowledged the order ``what``: not ``missed`` for it any more (rows of other orders stay)."""
        if not node_ids:
            return
        try:
            with self._tx(None) as db:
                db.executemany("DELETE FROM missed WHERE node_id=? AND what=?", [(n, what) for n in sorted(node_ids)])
        except Exception as exc:  # a row left costs one registration more, no more
            log.info("%s: acknowledgements not written (%s); those nodes register again", what, exc)

    def registered(self, node_id: str, since: float) -> None:
        """The node's registration, begun at ``since`` (``time.time()``), is complete: it was told every tombstone and
        seal written before that, so what it missed before then is cleared."""
        try:
            with self._lock:
                if self._db.execute("SELECT 1 FROM missed WHERE node_id=? AND at<?", (node_id, since)).fetchone() is None:
                    return  # nothing to clear: no write for the usual registration
            with self._tx(None) as db:
                db.execute("DELETE FROM missed WHERE node_id=? AND at<?", (node_id, since))
        except Exception as exc:
            log.info("node %s registered; what it missed is not cleared in the database (%s)", node_id, exc)

    def retire_dead(self, after: float) -> list[str]:
        """Forget nodes not heard from for ``after`` seconds; their replicas count as lost (``repair`` copies them)."""
        cutoff = time.time() - after
        # silence counts from when this catalog could hear a node: a catalog back from an outage retires no one at once
        dead = [n.node_id for n in self.nodes() if max(n.last_heartbeat, self._started) < cutoff]
        if dead:
            with self._tx() as db:
                for table in ("nodes", "replicas", "missed"):
                    db.executemany(f"DELETE FROM {table} WHERE node_id=?", [(n,) for n in dead])
            with self._lock:
                for n in dead:
                    self._known.discard(n)
                    self._beats.pop(n, None)
                    self._space.pop(n, None)
                    self._skew.pop(n, None)
                    self._newest.pop(n, None)
                    self._sent.forget(n)
        return dead

    def nodes(self) -> list[NodeRecord]:
        now = time.time()
        with self._lock:
            rows = self._remembered(("nodes",), lambda: self._db.execute(
                "SELECT node_id, uri, ip, pid, data_dir, last_heartbeat FROM nodes ORDER BY ip, uri").fetchall())
            beats = dict(self._beats)
            space = dict(self._space)
            skews = dict(self._skew)
        out = []
        for node_id, uri, ip, pid, data_dir, last in rows:
            last = max(last, beats.get(node_id, 0.0))
            free, low = space.get(node_id, (None, False))
            out.append(NodeRecord(node_id, uri, ip, pid, data_dir, last, alive=now - last <= self.dead_after,
                                  free_bytes=free, low_space=low, clock_skew=skews.get(node_id)))
        return out

    def node(self, node_id: str) -> NodeRecord | None:
        return next((n for n in self.nodes() if n.node_id == node_id), None)

    # ------------------------------------------------------------------ versions

    def begin(self, dataset: str, nranks: int | None = None, writer: str | None = None,
              most_pending: int | None = None) -> int:
        """Reserve the next version number (never reused, even after a drop); ``writer``: who reserved it (a role and
        a name), the one writer that may commit or abort it (:meth:`writer_of`). ``most_pending``: how many versions
        ``writer`` may hold begun and neither committed nor aborted (LIMIT_EXCEEDED past it; None: any)."""
        with self._tx(dataset) as db:
            if writer is not None and most_pending is not None:
                held = db.execute("SELECT count(*) FROM versions v JOIN writers w ON w.dataset=v.dataset AND "
                                  "w.version=v.version WHERE v.state='pending' AND w.writer=?", (writer,)).fetchone()[0]
                if held >= most_pending:
                    raise LimitExceeded(f"{writer.partition(':')[2] or writer} holds as many versions begun and neither "
                                        f"committed nor aborted as a writer may ({held:,}; ${PENDING_PER_WRITER_ENV}): "
                                        "commit or abort one, or wait for the pending TTL to abort it")
            row = db.execute("SELECT next_version FROM counters WHERE dataset=?", (dataset,)).fetchone()
            version = row[0] if row else 1
            if version > VERSION_LIMIT:  # no node would store it
                raise RequestRejected(f"dataset {dataset!r} has used every version number a dataset may have "
                                      f"({VERSION_LIMIT:,}); publish under another name", field="dataset")
            db.execute("INSERT INTO counters VALUES(?,?) ON CONFLICT(dataset) DO UPDATE SET next_version=excluded.next_version",
                       (dataset, version + 1))
            db.execute(
                "INSERT INTO versions(dataset, version, state, nranks, created) VALUES(?,?,?,?,?)",
                (dataset, version, "pending", nranks, time.time()),
            )
            if writer is not None:
                db.execute("INSERT INTO writers VALUES(?,?,?)", (dataset, version, writer))
            return version

    def writer_of(self, dataset: str, version: int) -> str | None:
        """Who reserved ``version``: :data:`LEARNED` for a version learned from nodes' files (a catalog that lost its
        state: it may have been committed, so no writer may abort it), None where no writer was recorded."""
        with self._lock:
            row = self._db.execute("SELECT writer FROM writers WHERE dataset=? AND version=?", (dataset, version)).fetchone()
            if row is None and _learned_from_nodes(self._db, dataset, version):
                return LEARNED
        return row[0] if row else None

    def ping(self) -> bool:
        """True while the database answers."""
        try:
            with self._lock:
                return tuple(self._db.execute("SELECT 1").fetchone()) == (1,)
        except StateUnavailable:
            return False

    def join_publish(self, dataset: str, nranks: int, rank: int, writer: str | None = None,
                     most_pending: int | None = None) -> int:
        """The open SPMD publish of ``writer`` that ``rank`` should join, opened for it if there is none
        (atomically). Only ``writer``'s own: another writer's open publish of the name had taken every rank of a
        job, which then could not publish. ``most_pending`` holds the opening of one to the writer's share, as
        :meth:`begin` does; joining an open one is never refused (a job's later ranks)."""
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
                joined = self._db.execute("SELECT 1 FROM partitions WHERE dataset=? AND version=? AND i=?", (dataset, version, rank)).fetchone()
                if not joined:
                    return version
        return None

    def version_state(self, dataset: str, version: int) -> tuple[str, int | None] | None:
        with self._lock:
            return self._db.execute("SELECT state, nranks FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()

    def add_rank_part(self, dataset: str, version: int, rank: int, rows: int, cols: int, nbytes: int, node_id: str, schema: bytes) -> int:
        """Record one SPMD rank's part; returns how many ranks have joined. A rank publishes once: the same part sent
        again (a retry) changes nothing, another one for that rank is a VERSION_CONFLICT (it had replaced the
        first, so any writer could swap a rank's rows for its own)."""
        with self._tx(dataset) as db:
            joined = db.execute("SELECT p.rows, p.cols, r.node_id FROM partitions p JOIN replicas r USING(dataset, version, i, j) "
                                "WHERE dataset=? AND version=? AND i=?", (dataset, version, rank)).fetchone()
            if joined is not None:
                if tuple(joined) != (rows, cols, node_id):
                    raise VersionConflict(f"rank {rank} of {dataset} v{version} published its part already ({joined[0]:,} "
                                          f"rows on node {joined[2]}); a rank publishes once", field="publish-part.rank")
                return db.execute("SELECT COUNT(*) FROM partitions WHERE dataset=? AND version=?", (dataset, version)).fetchone()[0]
            db.execute("INSERT INTO partitions VALUES(?,?,?,?,?,?,?,?,?) ON CONFLICT(dataset, version, i, j) DO UPDATE SET "
                       "row_start=excluded.row_start, col_start=excluded.col_start, rows=excluded.rows, cols=excluded.cols, "
                       "nbytes=excluded.nbytes", (dataset, version, rank, 0, None, 0, rows, cols, nbytes))
            db.execute("DELETE FROM replicas WHERE dataset=? AND version=? AND i=?", (dataset, version, rank))
            db.execute("INSERT INTO replicas VALUES(?,?,?,?,?)", (dataset, version, rank, 0, node_id))
            db.execute("UPDATE versions SET schema=COALESCE(schema, ?) WHERE dataset=? AND version=?", (schema, dataset, version))
            return db.execute("SELECT COUNT(*) FROM partitions WHERE dataset=? AND version=?", (dataset, version)).fetchone()[0]

    def version_schema(self, dataset: str, version: int) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT schema FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()
        return row[0] if row else None

    def rank_parts(self, dataset: str, version: int) -> list[tuple[int, int, int, str]]:
        """(rank, rows, cols, node_id) of a pending SPMD publish, by rank."""
        with self._lock:
            return self._db.execute(
                "SELECT p.i, p.rows, p.cols, r.node_id FROM partitions p JOIN replicas r USING(dataset, version, i, j) "
                "WHERE dataset=? AND version=? ORDER BY p.i",
                (dataset, version),
            ).fetchall()

    def commit(self, dataset: str, version: int, schema: bytes, shape: tuple[int, int], grid: tuple[int, int], parts: list[PartRecord],
               replicas: int = 1, *, ordered: bool = False, base: int | None = None) -> None:
        """Publish a complete version: all partitions and replicas at once.

        ``ordered`` (a client's commit): the version must land on top of the
        latest, checked in this transaction so no other commit slips in
        between: ``base`` (the version the write was computed from, None for
        a replace) must still be the latest, and no newer version may be
        committed already. Otherwise an acknowledged write would be hidden
        by, or would hide, another one.
        """
        with self._tx(dataset) as db:
            state = db.execute("SELECT state FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()
            if state is None:
                raise DatasetNotFound(f"dataset {dataset!r} has no pending version {version} (was it dropped or aborted?)")
            if state[0] == "committed":
                raise VersionConflict(f"dataset {dataset!r} version {version} is already committed", field="version")
            if state[0] != "pending":
                if state[0] == "aborted":
                    raise VersionExpired(f"{dataset} v{version} was aborted while it was being written (pending longer than "
                                         "--pending-ttl, or given up); nothing was published: put it again", field="version")
                raise DatasetNotFound(f"dataset {dataset!r} version {version} was {state[0]}; it cannot be committed")
            if ordered:
                _check_on_top(db, dataset, version, base)
            db.execute("DELETE FROM partitions WHERE dataset=? AND version=?", (dataset, version))
            db.execute("DELETE FROM replicas WHERE dataset=? AND version=?", (dataset, version))
            db.executemany(
                "INSERT INTO partitions VALUES(?,?,?,?,?,?,?,?,?)",
                [(dataset, version, p.part[0], p.part[1], p.start[0], p.start[1], p.shape[0], p.shape[1], p.nbytes) for p in parts],
            )
            _write_stats(db, dataset, version, [(p.part, p.stats) for p in parts])
            db.executemany(
                "INSERT INTO replicas VALUES(?,?,?,?,?)",
                [(dataset, version, p.part[0], p.part[1], n.node_id) for p in parts for n in p.nodes],
            )
            db.execute(
                "UPDATE versions SET state='committed', unsealed=1, schema=?, rows=?, cols=?, grid_p=?, grid_q=?, replicas=? "
                "WHERE dataset=? AND version=?",
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
        """Forget a version (or all: every number handed out so far stays taken); returns every node that may hold
        its files."""
        with self._lock:
            states = {r[0] for r in self._db.execute(
                "SELECT DISTINCT state FROM versions WHERE dataset=?" + (" AND version=?" if version is not None else ""),
                (dataset,) + ((version,) if version is not None else ()))}
        if not states & {"pending", "committed"}:
            what = f"version {version} of dataset {dataset!r}" if version is not None else f"dataset {dataset!r}"
            if "dropped" in states:  # a writer whose drop's answer was lost to a catalog's death learns it was done
                raise DatasetNotFound(f"{what} was dropped already", field=ALREADY_DROPPED)
            raise DatasetNotFound(f"{what} does not exist")
        return self._delete(dataset, version, only_pending=False)

    def _delete(self, dataset: str, version: int | None, *, only_pending: bool) -> list[NodeRecord]:
        """Leave a tombstone ('aborted' or 'dropped') in place of the version: a node away now learns of it later.

        Returns the nodes to tell: the holders of a committed version, every
        node for a pending one (the catalog learns placements at commit).
        """
        where = "dataset=?" + (" AND version=?" if version is not None else "")
        args = (dataset,) + ((version,) if version is not None else ())
        with self._tx(dataset) as db:
            states = {r[0] for r in db.execute(f"SELECT state FROM versions WHERE {where}", args)}
            if only_pending and states != {"pending"}:
                return []
            holders = {r[0] for r in db.execute(f"SELECT DISTINCT node_id FROM replicas WHERE {where}", args)}
            tombstone = "aborted" if only_pending else "dropped"
            db.execute(f"UPDATE versions SET state=? WHERE state IN ('pending', 'committed') AND {where}", (tombstone, *args))
            if version is None and not only_pending:
                row = db.execute("SELECT next_version FROM counters WHERE dataset=?", (dataset,)).fetchone()
                _raise_floor(db, dataset, (row[0] - 1) if row else 0)
            for table in ("partitions", "replicas", "stats"):
                db.execute(f"DELETE FROM {table} WHERE {where}", args)
            if "pending" in states:  # any node may hold a pending version's files (placements are learned at commit)
                holders = {r[0] for r in db.execute("SELECT node_id FROM nodes")}
            # until each acknowledges the order (:meth:`told`): a catalog dying before it went out has them register
            self._note_missed(sorted(holders), order_key(dataset, version), db)
        return [n for n in self.nodes() if n.node_id in holders]

    def expired_pending(self, ttl: float) -> list[tuple[str, int]]:
        """Pending versions older than ``ttl`` seconds: puts that never finished. Not those first learned from a
        node's unsealed files after a loss of state: such a version may have been committed (the catalog died between
        its commit and the seal), so only its writer's abort or an operator's drop deletes it."""
        with self._lock:
            return self._db.execute("SELECT dataset, version FROM versions WHERE state='pending' AND found=0 AND created < ? "
                                    "ORDER BY dataset, version", (time.time() - ttl,)).fetchall()

    def latest(self, dataset: str) -> int:
        row = self._remembered(("latest", dataset), lambda: self._db.execute(
            "SELECT MAX(version) FROM versions WHERE dataset=? AND state='committed'", (dataset,)).fetchone())
        if row is None or row[0] is None:
            raise DatasetNotFound(f"no dataset named {dataset!r}; `flightpart ls` lists what exists")
        return row[0]

    def version(self, dataset: str, version: int | None = None, *, nodes: dict[str, NodeRecord] | None = None) -> VersionRecord:
        """One committed version (``nodes``: the node table already read, for callers that read many versions)."""
        version = self.latest(dataset) if version is None else version
        head, rows, replica_rows, stats = self._remembered(("version", dataset, version),
                                                           lambda: self._version_rows(dataset, version))
        nodes = nodes if nodes is not None else {n.node_id: n for n in self.nodes()}
        holders: dict[tuple[int, int], list[NodeRecord]] = {}
        for i, j, node_id in replica_rows:
            if node_id in nodes:
                holders.setdefault((i, j), []).append(nodes[node_id])
        parts = [
            PartRecord((i, j), (rs, cs), (nr, nc), nb, _serving_order(holders.get((i, j), []), k), _stats_of(stats.get((i, j))))
            for k, (i, j, rs, cs, nr, nc, nb) in enumerate(rows)
        ]
        return VersionRecord(dataset, version, bytes(head[0]), (head[1], head[2]), (head[3], head[4]), parts, head[5])

    def _version_rows(self, dataset: str, version: int) -> tuple:
        with self._lock:
            head = self._db.execute(
                "SELECT schema, rows, cols, grid_p, grid_q, replicas FROM versions WHERE dataset=? AND version=? AND state='committed'",
                (dataset, version),
            ).fetchone()
            if head is None:
                raise DatasetNotFound(f"dataset {dataset!r} has no version {version} (dropped, never committed, or mistyped)")
            rows = self._db.execute(
                "SELECT i, j, row_start, col_start, rows, cols, nbytes FROM partitions WHERE dataset=? AND version=? ORDER BY i, j",
                (dataset, version),
            ).fetchall()
            replica_rows = self._db.execute(
                "SELECT i, j, node_id FROM replicas WHERE dataset=? AND version=? ORDER BY i, j, node_id", (dataset, version)
            ).fetchall()
            stats = {(i, j): body for i, j, body in self._db.execute(
                "SELECT i, j, body FROM stats WHERE dataset=? AND version=?", (dataset, version))}
        return head, rows, replica_rows, stats

    def sealed_everywhere(self, dataset: str, version: int) -> None:
        """Every holder of a committed version has its seal: nothing to tell them after a restart."""
        with self._tx(dataset) as db:
            db.execute("UPDATE versions SET unsealed=0 WHERE dataset=? AND version=?", (dataset, version))

    def add_replica(self, dataset: str, version: int, part: tuple[int, int], node_id: str) -> None:
        with self._tx(dataset) as db:
            db.execute("INSERT INTO replicas VALUES(?,?,?,?,?) ON CONFLICT DO NOTHING", (dataset, version, part[0], part[1], node_id))

    def remove_replica(self, dataset: str, version: int, part: tuple[int, int], node_id: str) -> bool:
        """Stop listing a node as holder of a partition (its copy is damaged or gone); True if it was listed."""
        with self._tx(dataset) as db:
            gone = db.execute("DELETE FROM replicas WHERE dataset=? AND version=? AND i=? AND j=? AND node_id=?",
                              (dataset, version, part[0], part[1], node_id))
            return gone.rowcount > 0

    def all_versions(self) -> list[VersionRecord]:
        """Every committed version of every dataset."""
        with self._lock:
            rows = self._db.execute("SELECT dataset, version FROM versions WHERE state='committed' ORDER BY dataset, version").fetchall()
        nodes = {n.node_id: n for n in self.nodes()}
        return [self.version(d, v, nodes=nodes) for d, v in rows]

    def latest_versions(self) -> list[tuple[str, int]]:
        """(dataset, latest committed version) of every dataset, by name."""
        return [(name, version) for name, version in self._remembered(("datasets",), lambda: self._db.execute(
            "SELECT dataset, MAX(version) FROM versions WHERE state='committed' GROUP BY dataset ORDER BY dataset").fetchall())]

    def datasets(self) -> list[VersionRecord]:
        """The latest committed version of every dataset (the node table is read once, not once per dataset)."""
        nodes = {n.node_id: n for n in self.nodes()}
        return [self.version(name, v, nodes=nodes) for name, v in self.latest_versions()]

    def versions_of(self, dataset: str) -> list[int]:
        return self._remembered(("versions_of", dataset), lambda: [r[0] for r in self._db.execute(
            "SELECT version FROM versions WHERE dataset=? AND state='committed' ORDER BY version", (dataset,))])


def _serving_order(holders: list[NodeRecord], k: int) -> list[NodeRecord]:
    """Replicas in the order readers try them: live first, and rotated by the partition's index,
    so that every holder serves first for some partitions instead of the lowest node id for all."""
    if len(holders) > 1:
        shift = k % len(holders)
        holders = holders[shift:] + holders[:shift]
        if not all(n.alive for n in holders):
            holders = sorted(holders, key=lambda n: not n.alive)
    return holders


def _write_stats(db: Database, dataset: str, version: int, entries: list, *, replace: bool = True) -> None:
    clash = "DO UPDATE SET body=excluded.body" if replace else "DO NOTHING"
    db.executemany(f"INSERT INTO stats VALUES(?,?,?,?,?) ON CONFLICT(dataset, version, i, j) {clash}",
                   [(dataset, version, part[0], part[1], json.dumps(body)) for part, body in entries if body])


def _stats_of(body: str | None) -> EncodedJson | None:
    """A stored statistics body as the JSON text it is (only a FlightInfo reads it, and writes it out as it is)."""
    return EncodedJson(body) if body and body != "null" else None


def _state(db: Database, dataset: str, version: int) -> str | None:
    row = db.execute("SELECT state FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()
    return row[0] if row else None


def _learned_from_nodes(db: Database, dataset: str, version: int) -> bool:
    """Whether this catalog learned ``version`` from a node's files (a manifest, or unsealed files) rather than from a
    writer: only such a version may a node's tombstone drop."""
    row = db.execute("SELECT found FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()
    return bool(row and row[0])


def _write_committed(db: Database, m: VersionRecord, now: float) -> None:
    """A committed version from a node's manifest (a catalog rebuilding what it lost), marked as learned from a node."""
    db.execute("INSERT INTO versions(dataset, version, state, created, found) VALUES(?,?,?,?,1) "
               "ON CONFLICT(dataset, version) DO NOTHING", (m.dataset, m.version, "pending", now))
    db.execute("DELETE FROM partitions WHERE dataset=? AND version=?", (m.dataset, m.version))
    db.executemany("INSERT INTO partitions VALUES(?,?,?,?,?,?,?,?,?)",
                   [(m.dataset, m.version, p.part[0], p.part[1], p.start[0], p.start[1], p.shape[0], p.shape[1], p.nbytes)
                    for p in m.parts])
    db.execute("UPDATE versions SET state='committed', schema=?, rows=?, cols=?, grid_p=?, grid_q=?, replicas=? "
               "WHERE dataset=? AND version=?", (m.schema, m.shape[0], m.shape[1], m.grid[0], m.grid[1], m.replicas, m.dataset, m.version))


class _Forgetting:
    """A transaction that empties the read memo when it commits (see :meth:`CatalogState._tx`).

    What it forgets is what it ``touches`` (``"*"``, a dataset, None), unless
    its body narrows that (:meth:`narrow`) once it knows what it changed: a node that
    registers again and brings nothing new must not wipe what answers opens
    while the database is away.
    """

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


def _check_on_top(db: Any, dataset: str, version: int, base: int | None) -> None:
    """VersionConflict (field ``commit.base``) unless ``version`` would become the latest on top of ``base``."""
    row = db.execute("SELECT MAX(version) FROM versions WHERE dataset=? AND state='committed'", (dataset,)).fetchone()
    latest = row[0] if row else None
    if base is not None and latest is None:
        raise DatasetNotFound(f"dataset {dataset!r} was dropped while v{version} was being written from v{base}; "
                              "nothing was published", field="commit.base")
    if base is not None and latest != base:
        raise VersionConflict(f"{dataset} v{version} was computed from v{base}, but v{latest} was committed meanwhile; "
                              "compute it again from the latest version", field="commit.base")
    if latest is not None and latest > version:
        raise VersionConflict(f"{dataset} v{latest} was committed after v{version} was reserved; write it again as a "
                              "new version so it lands on top", field="commit.base")


def _raise_floor(db: Database, dataset: str, through: int) -> None:
    """Every version of ``dataset`` up to ``through`` is dropped, and no number up to it is handed out again."""
    if through <= 0:
        return
    db.execute("INSERT INTO floors VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
               "dropped_through=GREATEST(floors.dropped_through, excluded.dropped_through)", (dataset, through))
    db.execute("INSERT INTO counters VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
               "next_version=GREATEST(counters.next_version, excluded.next_version)", (dataset, through + 1))


def _below_floor(db: Database, dataset: str, version: int) -> bool:
    row = db.execute("SELECT dropped_through FROM floors WHERE dataset=?", (dataset,)).fetchone()
    return bool(row) and version <= row[0]


def _set_state(db: Database, dataset: str, version: int, state: str, now: float) -> None:
    """``version`` becomes a tombstone (``dropped`` or ``aborted``): its partitions are forgotten, its number kept."""
    db.execute("INSERT INTO versions(dataset, version, state, created) VALUES(?,?,?,?) "
               "ON CONFLICT(dataset, version) DO UPDATE SET state=excluded.state", (dataset, version, state, now))
    for table in ("partitions", "replicas", "stats"):
        db.execute(f"DELETE FROM {table} WHERE dataset=? AND version=?", (dataset, version))
    db.execute("INSERT INTO counters VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
               "next_version=GREATEST(counters.next_version, excluded.next_version)", (dataset, version + 1))


def _bury(db: Database, tombstones: Sequence[Any], now: float) -> set[tuple[str, int]]:
    """Record what a node says is gone; returns the versions this catalog still had (pending or committed) and now
    drops or aborts, whose files every node must delete."""
    gone: set[tuple[str, int]] = set()
    for t in tombstones:
        _raise_floor(db, t.dataset, t.dropped_through)
        for versions, kind in ((t.dropped, "dropped"), (t.aborted, "aborted")):
            for version in versions:
                state = _state(db, t.dataset, version)
                if state == kind or state == "dropped" or (kind == "aborted" and state == "committed"):
                    continue  # known; an abort never undoes a commit
                if state in ("pending", "committed") and not _learned_from_nodes(db, t.dataset, version):
                    # a node's word drops only what a node's files brought back (a catalog rebuilding lost state); a
                    # version this catalog wrote is dropped by a drop it was asked for, never by a node's tombstone
                    log.warning("%s v%d: a node says it was %s, but this catalog wrote it and never did: kept",
                                t.dataset, version, kind)
                    continue
                if state in ("pending", "committed"):
                    gone.add((t.dataset, version))
                _set_state(db, t.dataset, version, kind, now)
    return gone


def _take_claims(db: Database, node_id: str, key: tuple[str, int], parts: list[dict],
                 granted: Collection[tuple[str, int, tuple[int, int]]]) -> tuple[bool, bool]:
    """A node's claims to partitions of a committed version: counted where the catalog put them there (a replica it
    recorded, or one a signed manifest grants), logged and ignored elsewhere. Returns whether any was taken, and
    whether the version's record changed: a replica not recorded yet, a larger size, statistics it had none of. Only
    changes are written, so a node registering again with what the catalog knows writes nothing."""
    known = {(i, j): nbytes for i, j, nbytes in db.execute(
        "SELECT i, j, nbytes FROM partitions WHERE dataset=? AND version=?", key)}
    placed = {(i, j) for i, j in db.execute("SELECT i, j FROM replicas WHERE dataset=? AND version=? AND node_id=?",
                                            (*key, node_id))}
    taken = []
    for p in parts:
        part = tuple(p["part"])
        if part not in known:
            continue
        if part not in placed and (key[0], key[1], part) not in granted:
            log.warning("node %s claims partition %s of %s v%d, which this catalog never placed there: ignored",
                        node_id, part, *key)
            continue
        taken.append(p)
    if not taken:
        return False, False
    with_stats = {(i, j) for i, j in db.execute("SELECT i, j FROM stats WHERE dataset=? AND version=?", key)}
    new = [p for p in taken if tuple(p["part"]) not in placed]
    larger = [p for p in taken if (p.get("nbytes") or 0) > (known[tuple(p["part"])] or 0)]
    described = [(p["part"], p["stats"]) for p in taken if p.get("stats") and tuple(p["part"]) not in with_stats]
    db.executemany("INSERT INTO replicas VALUES(?,?,?,?,?) ON CONFLICT DO NOTHING",
                   [(*key, p["part"][0], p["part"][1], node_id) for p in new])
    db.executemany("UPDATE partitions SET nbytes=GREATEST(nbytes, ?) WHERE dataset=? AND version=? AND i=? AND j=?",
                   [(p["nbytes"], *key, p["part"][0], p["part"][1]) for p in larger])
    _write_stats(db, *key, described, replace=False)
    return True, bool(new or larger or described)
