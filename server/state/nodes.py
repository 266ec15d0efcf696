"""Node state: registrations, heartbeats (kept in memory, flushed in batches), liveness, and the nodes that must
register again because they may have missed an order (the ``missed`` table).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from ..auth import CLOCK_MARGIN
from ..liveness import SentTimes
from .core import StateCore
from .database import Database
from .records import MUST_REGISTER, NodeRecord, Registration
from .tables import below_floor, bury, learned_from_nodes, set_state, state_of, take_claims, write_committed

log = logging.getLogger("flightpart.catalog")


class NodeState(StateCore):
    """The nodes a catalog knows, alive or not, and what each told it."""

    _db: Database  # the database (:class:`.core.StateCore`)
    _lock: Any  # its lock
    _memo: dict[tuple, Any] | None  # the reads remembered (:meth:`.core.StateCore.remembered`)

    FLUSH_EVERY = 30.0
    """Seconds between writes of the in-memory heartbeats to the database (what a restart starts from)."""

    def __init__(self, path: str | Path = ":memory:", *, dead_after: float = 10.0, database: Database | None = None):
        super().__init__(path, database=database)
        self.dead_after = dead_after
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

    def register_node(self, page: Registration) -> tuple[list[tuple[str, int]], list[tuple[str, int]],
                                                          list[tuple[str, int]]]:
        """Record a node and what it holds; returns (orphans, versions to seal, versions it says are gone).

        The node's ``tombstones`` are recorded first, so a catalog that lost
        its state gets them and its counters back; a version they drop is
        returned third (every node must delete it). Orphans are versions
        dropped or aborted here. Unknown sealed versions are rebuilt from
        their manifests, unknown unsealed ones recorded as pending (see the
        package docstring). A claim to a committed partition counts only
        where the catalog placed it, or a signed manifest ``granted`` it.
        Versions to seal: committed ones the node holds without a manifest.
        A paged registration calls this once per page, each naming every
        version and sealed version the node has.
        """
        node_id, uri, ip, pid, data_dir = page.node_id, page.uri, page.ip, page.pid, page.data_dir
        held, manifests, versions, granted = page.held, page.manifests, page.versions, page.granted
        sealed_versions, tombstones = page.sealed_versions, page.tombstones
        orphans: set[tuple[str, int]] = set()
        now = time.time()
        with self._lock:
            self._known.add(node_id)
            self._beats[node_id] = now
        tx = self.tx()
        with tx as db:
            before = db.execute("SELECT uri, ip, pid, data_dir FROM nodes WHERE node_id=?", (node_id,)).fetchone()
            changed = {t.dataset for t in tombstones}  # what this registration changes: its reads are forgotten
            gone = bury(db, tombstones, now)
            db.execute(
                "INSERT INTO nodes VALUES(?,?,?,?,?,?) ON CONFLICT(node_id) DO UPDATE SET "
                "uri=excluded.uri, ip=excluded.ip, pid=excluded.pid, data_dir=excluded.data_dir, "
                "last_heartbeat=excluded.last_heartbeat",
                (node_id, uri, ip, pid, data_dir, now),
            )
            seen = ({(d, v) for d, v in versions} | {(p["dataset"], p["version"]) for p in held}
                    | {(m.dataset, m.version) for m in manifests})
            for dataset, version in seen:
                db.execute("INSERT INTO counters VALUES(?, ?) ON CONFLICT(dataset) DO UPDATE SET "
                           "next_version=GREATEST(counters.next_version, excluded.next_version)",
                           (dataset, version + 1))
            states = {key: state_of(db, *key) for key in seen}
            for key in [k for k, state in states.items()
                        if state in (None, "pending", "committed") and below_floor(db, *k)]:
                if states[key] is not None and not learned_from_nodes(db, *key):
                    log.warning("%s v%d: below a drop of every version a node reported, but this catalog wrote it "
                                "and never dropped it: kept", *key)
                    continue
                if states[key] is not None:
                    gone.add(key)  # resurrected by an earlier node's manifest, dropped by a drop of every version
                set_state(db, *key, "dropped", now)
                states[key] = "dropped"
                changed.add(key[0])
            for m in manifests:
                if states[(m.dataset, m.version)] in (None, "pending"):
                    write_committed(db, m, now)
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
                taken, recorded = take_claims(db, node_id, key, parts, granted)
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
        """Whether a datagram's beat could be taken (:meth:`heartbeat`), read without the lock; checked again there."""
        newest = self._newest.get(node_id)
        return newest is not None and clock_ms is not None and clock_ms > newest

    def forget_datagram_clocks(self) -> None:
        """No datagram is taken until each node's next beat over Flight (this catalog stopped leading)."""
        with self._lock:
            self._newest.clear()

    def heartbeat(self, node_id: str, free_bytes: int | None = None, low_space: bool = False,
                  clock_skew: float | None = None, clock_ms: int | None = None, *, datagram: bool = False) -> bool:
        """Note a node's heartbeat (in memory); False if it must register first, or if a ``datagram`` beat could
        be a replay: datagrams are taken only after a beat over Flight since this catalog started or took over,
        and only with a clock past every beat taken from that node."""
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
        # the datagrams' thread writes nothing: the catalog's housekeeping flushes every 30 s as well
        if not datagram and time.monotonic() - self._flushed > self.FLUSH_EVERY:
            self.flush_heartbeats()
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
            with self.tx(touches=None) as db:
                db.executemany("UPDATE nodes SET last_heartbeat=GREATEST(last_heartbeat, ?) WHERE node_id=?",
                               [(t, n) for n, t in beats.items()])
                # when: the next catalog to start (or take over) knows a node silent since long before was dead
                db.execute("INSERT INTO meta VALUES('beats_flushed', ?) ON CONFLICT(key) DO UPDATE SET "
                           "value=excluded.value",
                           (repr(time.time()),))

    def _dead_before(self) -> float:
        """A node whose recorded heartbeat is older than this was dead when heartbeats were last written (0: never)."""
        with self._lock:  # called from the announcing thread too: the connection is used under the lock only
            row = self._db.execute("SELECT value FROM meta WHERE key='beats_flushed'").fetchone()
        return float(row[0]) - self.dead_after if row else 0.0

    def _nodes_told_everything(self) -> set[str]:
        """Recorded nodes that hold no unsealed committed version and missed no order: their heartbeats are taken;
        the others must register again to learn what they missed."""
        return {r[0] for r in self._db.execute("SELECT node_id FROM nodes")} - {r[0] for r in self._db.execute(
            "SELECT DISTINCT r.node_id FROM replicas r JOIN versions v USING(dataset, version) WHERE v.unsealed=1")} - {
            r[0] for r in self._db.execute("SELECT DISTINCT node_id FROM missed")}

    def take_over(self) -> None:
        """This catalog leads now: forget what was remembered, know every recorded node, count silence from now."""
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
        """A new leader's announcement went to every recorded node: one dead at the last flush is not waited for."""
        dead_before = self._dead_before()
        with self._lock:
            self._dead_since_flush = dead_before

    def heard(self, node_id: str) -> None:
        """A node answered this catalog (not a heartbeat: at a takeover): alive from now."""
        with self._lock:
            self._beats[node_id] = time.time()

    def unsettled_for(self) -> float:
        """Seconds until this catalog's view of which nodes are alive can be trusted: 0 once every recorded node
        was heard from since it started or took over, else what is left of ``dead_after`` from then."""
        return 0.0 if not self.unheard() else max(0.0, self._started + self.dead_after - time.time())

    def unheard(self) -> set[str]:
        """Recorded nodes not heard from since this catalog started or took over, while that is under ``dead_after``
        ago, and not already dead when the heartbeats were last written: neither known alive nor known dead."""
        with self._lock:
            since, dead_before = self._started, self._dead_since_flush
            beats = dict(self._beats)
        if time.time() >= since + self.dead_after:
            return set()
        return {n.node_id for n in self.nodes()
                if beats.get(n.node_id, 0.0) < since and n.last_heartbeat >= dead_before}

    def must_register(self, node_id: str) -> None:
        """The node's next heartbeat is refused, so it registers again and learns what it missed (drops, seals)."""
        self.must_register_all([node_id])

    def must_register_all(self, node_ids: Collection[str], what: str = MUST_REGISTER) -> None:
        """These nodes' next heartbeats are refused; kept in ``missed`` too, so a successor has them register."""
        node_ids = sorted(set(node_ids))
        if not node_ids:
            return
        with self._lock:
            self._known.difference_update(node_ids)
        self.note_missed(node_ids, what)

    def expect_acknowledgements(self, node_ids: Collection[str], what: str) -> None:
        """An order (``what``: :func:`order_key`) goes to these nodes: each is ``missed`` until it acknowledges it
        (:meth:`told`); their heartbeats are taken meanwhile."""
        self.note_missed(sorted(set(node_ids)), what)

    def note_missed(self, node_ids: Sequence[str], what: str, db: Database | None = None) -> None:
        if not node_ids:
            return
        rows = [(n, what, time.time()) for n in node_ids]
        statement = "INSERT INTO missed VALUES(?, ?, ?) ON CONFLICT(node_id, what) DO UPDATE SET at=excluded.at"
        if db is not None:
            db.executemany(statement, rows)
            return
        try:
            with self.tx(None) as tx:
                tx.executemany(statement, rows)
        except Exception as exc:  # the next leader tells them at registration, or this one, in memory (may register)
            log.warning("nodes %s must register again; not kept in the database (%s)", ", ".join(node_ids), exc)

    def told(self, node_ids: Collection[str], what: str) -> None:
        """These nodes acknowledged the order ``what``: not ``missed`` for it any more (rows of other orders stay)."""
        if not node_ids:
            return
        try:
            with self.tx(None) as db:
                db.executemany("DELETE FROM missed WHERE node_id=? AND what=?", [(n, what) for n in sorted(node_ids)])
        except Exception as exc:  # a row left costs one registration more, no more
            log.info("%s: acknowledgements not written (%s); those nodes register again", what, exc)

    def registered(self, node_id: str, since: float) -> None:
        """The node's registration, begun at ``since``, is complete: what it missed before then is cleared."""
        try:
            with self._lock:
                if self._db.execute("SELECT 1 FROM missed WHERE node_id=? AND at<?",
                                    (node_id, since)).fetchone() is None:
                    return  # nothing to clear: no write for the usual registration
            with self.tx(None) as db:
                db.execute("DELETE FROM missed WHERE node_id=? AND at<?", (node_id, since))
        except Exception as exc:
            log.info("node %s registered; what it missed is not cleared in the database (%s)", node_id, exc)

    def retire_dead(self, after: float) -> list[str]:
        """Forget nodes not heard from for ``after`` seconds; their replicas count as lost (``repair`` copies them)."""
        cutoff = time.time() - after
        # silence counts from when this catalog could hear a node: a catalog back from an outage retires no one at once
        dead = [n.node_id for n in self.nodes() if max(n.last_heartbeat, self._started) < cutoff]
        if dead:
            with self.tx() as db:
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
            rows = self.remembered(("nodes",), lambda: self._db.execute(
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
