"""The catalog's tables, and the statements over them that node and version state share.

The schema is written in the SQL both engines speak (:mod:`.database`). The functions run inside the caller's
write transaction (``db``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Sequence
from typing import Any

from flightpart.errors import DatasetNotFound, VersionConflict
from flightpart.wire import EncodedJson

from .database import Database
from .records import NodeRecord, VersionRecord

log = logging.getLogger("flightpart.catalog")

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
"""  # noqa: E501
"""``missed``: nodes that must register again before their heartbeats are taken, because they may not have had an
order: a drop's or abort's (``what``: :func:`order_key`), from the moment it is written until the node acknowledges
that order, or any order a node did not answer (``what``: ``register``); ``at``: when, so a registration clears only
what was written before it began. Kept in the database, not only in memory, so a catalog that dies before the order
went out, or before a node that missed it registered, still has it register at the next start or takeover, which
tells it what it missed."""


def serving_order(holders: list[NodeRecord], k: int) -> list[NodeRecord]:
    """Replicas in the order readers try them: live first, rotated by the partition's index so every holder
    serves first for some partitions."""
    if len(holders) > 1:
        shift = k % len(holders)
        holders = holders[shift:] + holders[:shift]
        if not all(n.alive for n in holders):
            holders = sorted(holders, key=lambda n: not n.alive)
    return holders


def write_stats(db: Database, dataset: str, version: int, entries: list, *, replace: bool = True) -> None:
    clash = "DO UPDATE SET body=excluded.body" if replace else "DO NOTHING"
    db.executemany(f"INSERT INTO stats VALUES(?,?,?,?,?) ON CONFLICT(dataset, version, i, j) {clash}",
                   [(dataset, version, part[0], part[1], json.dumps(body)) for part, body in entries if body])


def stats_of(body: str | None) -> EncodedJson | None:
    """A stored statistics body as its JSON text."""
    return EncodedJson(body) if body and body != "null" else None


def state_of(db: Database, dataset: str, version: int) -> str | None:
    row = db.execute("SELECT state FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()
    return row[0] if row else None


def learned_from_nodes(db: Database, dataset: str, version: int) -> bool:
    """Whether this catalog learned ``version`` from a node's files (a manifest, or unsealed files) rather than from a
    writer: only such a version may a node's tombstone drop."""
    row = db.execute("SELECT found FROM versions WHERE dataset=? AND version=?", (dataset, version)).fetchone()
    return bool(row and row[0])


def write_committed(db: Database, m: VersionRecord, now: float) -> None:
    """A committed version from a node's manifest (a catalog rebuilding what it lost), marked as learned from a node."""
    db.execute("INSERT INTO versions(dataset, version, state, created, found) VALUES(?,?,?,?,1) "
               "ON CONFLICT(dataset, version) DO NOTHING", (m.dataset, m.version, "pending", now))
    db.execute("DELETE FROM partitions WHERE dataset=? AND version=?", (m.dataset, m.version))
    db.executemany("INSERT INTO partitions VALUES(?,?,?,?,?,?,?,?,?)",
                   [(m.dataset, m.version, p.part[0], p.part[1], p.start[0], p.start[1], p.shape[0], p.shape[1],
                     p.nbytes)
                    for p in m.parts])
    db.execute("UPDATE versions SET state='committed', schema=?, rows=?, cols=?, grid_p=?, grid_q=?, replicas=? "
               "WHERE dataset=? AND version=?", (m.schema, m.shape[0], m.shape[1], m.grid[0], m.grid[1], m.replicas,
                                                 m.dataset, m.version))


def check_on_top(db: Any, dataset: str, version: int, base: int | None) -> None:
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


def raise_floor(db: Database, dataset: str, through: int) -> None:
    """Every version of ``dataset`` up to ``through`` is dropped, and no number up to it is handed out again."""
    if through <= 0:
        return
    db.execute("INSERT INTO floors VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
               "dropped_through=GREATEST(floors.dropped_through, excluded.dropped_through)", (dataset, through))
    db.execute("INSERT INTO counters VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
               "next_version=GREATEST(counters.next_version, excluded.next_version)", (dataset, through + 1))


def below_floor(db: Database, dataset: str, version: int) -> bool:
    row = db.execute("SELECT dropped_through FROM floors WHERE dataset=?", (dataset,)).fetchone()
    return bool(row) and version <= row[0]


def set_state(db: Database, dataset: str, version: int, state: str, now: float) -> None:
    """``version`` becomes a tombstone (``dropped`` or ``aborted``): its partitions are forgotten, its number kept."""
    db.execute("INSERT INTO versions(dataset, version, state, created) VALUES(?,?,?,?) "
               "ON CONFLICT(dataset, version) DO UPDATE SET state=excluded.state", (dataset, version, state, now))
    for table in ("partitions", "replicas", "stats"):
        db.execute(f"DELETE FROM {table} WHERE dataset=? AND version=?", (dataset, version))
    db.execute("INSERT INTO counters VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
               "next_version=GREATEST(counters.next_version, excluded.next_version)", (dataset, version + 1))


def bury(db: Database, tombstones: Sequence[Any], now: float) -> set[tuple[str, int]]:
    """Record what a node says is gone; returns the versions this catalog still had (pending or committed) and now
    drops or aborts, whose files every node must delete."""
    gone: set[tuple[str, int]] = set()
    for t in tombstones:
        raise_floor(db, t.dataset, t.dropped_through)
        for versions, kind in ((t.dropped, "dropped"), (t.aborted, "aborted")):
            for version in versions:
                state = state_of(db, t.dataset, version)
                if state == kind or state == "dropped" or (kind == "aborted" and state == "committed"):
                    continue  # known; an abort never undoes a commit
                if state in ("pending", "committed") and not learned_from_nodes(db, t.dataset, version):
                    # a node's word drops only what a node's files brought back (a catalog rebuilding lost state); a
                    # version this catalog wrote is dropped by a drop it was asked for, never by a node's tombstone
                    log.warning("%s v%d: a node says it was %s, but this catalog wrote it and never did: kept",
                                t.dataset, version, kind)
                    continue
                if state in ("pending", "committed"):
                    gone.add((t.dataset, version))
                set_state(db, t.dataset, version, kind, now)
    return gone


def take_claims(db: Database, node_id: str, key: tuple[str, int], parts: list[dict],
                 granted: Collection[tuple[str, int, tuple[int, int]]]) -> tuple[bool, bool]:
    """A node's claims to partitions of a committed version: counted where the catalog placed them (a recorded
    replica, or one a signed manifest grants), logged and ignored elsewhere. Returns whether any was taken and
    whether the record changed; only changes are written."""
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
    write_stats(db, *key, described, replace=False)
    return True, bool(new or larger or described)
