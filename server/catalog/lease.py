"""Which catalog leads: a lease held as one row in PostgreSQL, with an epoch that grows at every takeover.

Every catalog of a cluster runs a :class:`Lease` on the same database. The
leader renews the row every ``renew_every`` seconds; the others take it
only once it has expired. The row's times are the database's clock
(``clock_timestamp()``), so the catalogs' clocks never need to agree.

The arithmetic that keeps two leaders from acting at once: a renewal sent at
this catalog's monotonic time ``t`` and accepted sets the row's expiry to at
least ``t + duration`` in real time (the database read its clock after the
request left). This catalog leads until ``t + duration - margin`` on its own
monotonic clock; ``margin`` covers the two clocks' rates differing (parts
per million) and the time between checking the lease and acting. No
standby can take the row before its expiry, so the old leader has stopped
before the new one starts. Two more fences stand behind this one, for a
leader frozen between its check and its act: its database writes check the
epoch in the same transaction (:class:`~server.state.database.PostgresDatabase`),
and nodes refuse orders whose epoch is lower than the highest they have seen.

The loop never ends: a failed round is logged and the next starts on a fresh
connection, and a takeover whose first steps fail gives the lease up again,
so some catalog takes it once the database answers. A leader whose lease ran
out unrenewed leads no more: it serves reads from memory only while no other
catalog it heard of says it leads (``find_leader``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flightpart.errors import StateUnavailable

from ..state.database import LEASE_TABLE, PostgresDatabase

log = logging.getLogger("flightpart.catalog")

LEASE_SECONDS = 3.0
RENEW_SECONDS = 0.5
MARGIN_SECONDS = 0.5


@dataclass(frozen=True)
class LeaseRow:
    """What the lease row says: who holds it (address, epoch, since when, Unix seconds) and whether it is current."""

    uri: str
    epoch: int
    since: float
    current: bool


class Lease:
    """This catalog's part in the election; ``leads()`` is the check before every write."""

    def __init__(self, url: str, uri: str, *, duration: float = LEASE_SECONDS, renew_every: float | None = None,
                 margin: float | None = None, on_lead: Callable[[int], None] = lambda epoch: None,
                 on_lose: Callable[[], None] = lambda: None,
                 find_leader: Callable[[Sequence[str]], LeaseRow | None] = lambda uris: None):
        renew_every = min(RENEW_SECONDS, duration / 6) if renew_every is None else renew_every
        margin = min(MARGIN_SECONDS, duration / 6) if margin is None else margin
        if not 0 < margin < duration or not 0 < renew_every < duration - margin:
            raise ValueError(f"lease {duration} s: the renewal interval ({renew_every} s) and the margin ({margin} s) "
                             "must fit inside it")
        self.uri = uri
        self.holder = uuid.uuid4().hex  # this process: a catalog restarted at the same address is a new holder
        self.duration, self.renew_every, self.margin = duration, renew_every, margin
        self.on_lead, self.on_lose, self.find_leader = on_lead, on_lose, find_leader
        # its own connection, whose statements give up in a second: a long state transaction (or a frozen leader's)
        # never delays a renewal or a takeover past the lease
        self.db = PostgresDatabase(url, link_timeout=duration,
                                   settings={"lock_timeout": "1s", "statement_timeout": "2s"})
        self.db.script(LEASE_TABLE)
        self.epoch: int | None = None  # the epoch this catalog holds the lease with (None: it does not)
        self._valid_until = 0.0  # monotonic: this catalog leads until then, unless renewed
        self.row: LeaseRow | None = None  # the row as last read
        self._others: tuple[str, ...] = ()  # other catalogs heard from lately (their last rounds reached the database)
        self.reachable = True  # whether the last round reached the database
        self._lapsed = False  # it led, and its lease ran out unrenewed: it keeps what it read, leading no more
        self._elsewhere: LeaseRow | None = None  # the leader another catalog named while the database was out of reach
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="flightpart-lease", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop taking part; a leader gives the lease up at once (``release``) so a standby need not wait."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if release and self.epoch is not None:
            self._release(self.epoch)
        self.epoch = None
        self.db.close()

    def _release(self, epoch: int) -> None:
        """Let the row expire now, if it still names this holder and ``epoch`` (a standby may take it at once)."""
        try:
            self.db.execute("UPDATE flightpart_lease SET expires = clock_timestamp() - interval '1 second' "
                            "WHERE id = 1 AND holder = ? AND epoch = ?", (self.holder, epoch))
        except StateUnavailable:
            pass

    def leads(self) -> bool:
        """Whether this catalog holds the lease now (with the margin taken off its end)."""
        return self.epoch is not None and time.monotonic() < self._valid_until

    def fence(self) -> int | None:
        """The epoch to write with, None when this catalog does not lead (checked again in each transaction)."""
        return self.epoch if self.leads() else None

    def _loop(self) -> None:
        while not self._stopping.wait(self.renew_every if self.epoch is not None else self.renew_every / 2):
            try:
                self.tick()
            except Exception:  # whatever failed, the next round starts afresh: the election must outlive it
                log.exception("lease: a round failed; the next one starts on a fresh connection")
                self.db.reset()

    def tick(self) -> None:
        """One round: renew (leader) or try to take the lease (standby); read the row and the standbys."""
        sent = time.monotonic()
        try:
            epoch = self._renew() if self.epoch is not None else self._take()
            self._read()
        except StateUnavailable as exc:
            if exc.field == "lock":  # the leader is inside a long write (its lock on the row): try next round
                log.debug("lease: the row is locked by a write in progress; next round")
                return
            self._unreachable(exc)
            return
        if not self.reachable:
            log.info("lease: the database answers again")
        self.reachable, self._elsewhere = True, None
        if epoch is None and self.epoch is not None:
            lost = self.epoch
            self.epoch = None
            log.warning("lease: lost (epoch %d); another catalog leads: %s", lost, self.row.uri if self.row else "?")
            self.on_lose()
        elif epoch is not None:
            self._valid_until = sent + self.duration - self.margin
            if self.epoch is None:
                self._lead(epoch)
        elif self._lapsed:  # another catalog holds the row (or nobody yet): what this one kept from leading is void
            self._lapsed = False
            self.on_lose()

    def _lead(self, epoch: int) -> None:
        """Take up ``epoch``: ``on_lead`` reads the state afresh; if that fails, the lease is given up again (held
        but not acted on, it would keep every catalog from leading)."""
        self.epoch, self._lapsed = epoch, False
        try:
            self.on_lead(epoch)
        except Exception as exc:
            log.warning("lease: taking over at epoch %d failed (%s); the lease is given up and taken again later",
                        epoch, " ".join(str(exc).split())[:300])
            self.epoch = None
            self._release(epoch)
            self.on_lose()
            return
        log.warning("lease: this catalog (%s) leads the cluster from epoch %d", self.uri, epoch)

    def _unreachable(self, exc: StateUnavailable) -> None:
        """The database did not answer this round: a leader past its lease steps down, and a catalog that does not
        lead asks the others which of them does."""
        if self.reachable:
            log.warning("lease: the database does not answer (%s); %s", exc,
                        "serving reads from memory, writes refused" if self.epoch is not None else "standing by")
        self.reachable = False
        if self.epoch is not None and not self.leads():
            log.warning("lease: epoch %d ran out unrenewed; this catalog leads no more (reads from memory while no "
                        "other catalog leads)", self.epoch)
            self.epoch, self._lapsed = None, True
        if self.epoch is None:
            self._elsewhere = self.find_leader(self._others)
            if self._elsewhere is not None and self._lapsed:
                log.warning("lease: %s leads (epoch %d); callers are sent there", self._elsewhere.uri,
                            self._elsewhere.epoch)
                self._lapsed = False
                self.on_lose()

    def _renew(self) -> int | None:
        row = self.db.execute(
            "UPDATE flightpart_lease SET expires = clock_timestamp() + ? * interval '1 second' "
            "WHERE id = 1 AND holder = ? AND epoch = ? RETURNING epoch",
            (self.duration, self.holder, self.epoch)).fetchone()
        return row[0] if row else None

    def _take(self) -> int | None:
        row = self.db.execute(
            "INSERT INTO flightpart_lease(id, holder, uri, epoch, expires, since) "
            "VALUES(1, ?, ?, 1, clock_timestamp() + ? * interval '1 second', clock_timestamp()) "
            "ON CONFLICT(id) DO UPDATE SET holder = excluded.holder, uri = excluded.uri, "
            "epoch = flightpart_lease.epoch + 1, expires = excluded.expires, since = excluded.since "
            "WHERE flightpart_lease.expires < clock_timestamp() RETURNING epoch",
            (self.holder, self.uri, self.duration)).fetchone()
        return row[0] if row else None

    def _read(self) -> None:
        self.db.execute("INSERT INTO flightpart_catalogs VALUES(?, ?, clock_timestamp()) ON CONFLICT(holder) DO UPDATE "
                        "SET uri = excluded.uri, seen = excluded.seen", (self.holder, self.uri))
        row = self.db.execute("SELECT uri, epoch, extract(epoch from since), expires > clock_timestamp() "
                              "FROM flightpart_lease WHERE id = 1").fetchone()
        self.row = LeaseRow(row[0], int(row[1]), float(row[2]), bool(row[3])) if row else None
        seen = self.db.execute("SELECT uri FROM flightpart_catalogs WHERE seen > clock_timestamp() - ? * interval "
                               "'1 second' AND holder <> ? ORDER BY uri", (3 * self.duration, self.holder)).fetchall()
        self._others = tuple(uri for (uri,) in seen)
        self.db.execute("DELETE FROM flightpart_catalogs WHERE seen < clock_timestamp() - interval '1 day'")

    def serves_from_memory(self) -> bool:
        """Whether this catalog, its lease run out unrenewed, still answers reads from memory (no other leads)."""
        return (self._lapsed or (self.epoch is not None and not self.leads())) and self._elsewhere is None

    def leader(self) -> str | None:
        """The leader's address as last known (None: vacant or unknown); without the row, only what another
        catalog said of itself."""
        if self.leads():
            return self.uri
        if not self.reachable or self.epoch is not None:
            return self._elsewhere.uri if self._elsewhere is not None else None
        return self.row.uri if self.row is not None and self.row.current else None

    @property
    def standbys(self) -> tuple[str, ...]:
        """Catalogs heard from lately that do not lead (this one included when it does not)."""
        leader = self.leader()
        return tuple(sorted({uri for uri in self._others if uri != leader}
                            | ({self.uri} if self.epoch is None else set())))

    def describe(self) -> dict[str, Any]:
        row = self._elsewhere if self._elsewhere is not None and not self.reachable else self.row
        role = "leader" if self.leads() else "read-only" if self.serves_from_memory() else "standby"
        return {"role": role, "uri": self.uri, "leader": self.leader(), "epoch": row.epoch if row else None,
                "since": row.since if row else None, "standbys": self.standbys}
