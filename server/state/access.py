"""Users, groups, grants and revocations in the catalog's database, so a standby that takes over knows them.

Every change bumps ``access_version`` in ``meta`` in the same transaction. The catalog reads the whole of it as
one :class:`AccessRules` (small: people, not rows) and keeps it until its version changes or
:data:`FRESH_SECONDS` pass, so a change written by another catalog (a former leader's) is seen within that.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flightpart.errors import RequestRejected, UserNotFound
from flightpart.grants import ANY, Grant, Revocation

from .core import StateCore
from .database import Database

ACCESS_SCHEMA = """
CREATE TABLE IF NOT EXISTS users(
    name TEXT PRIMARY KEY, hash TEXT NOT NULL, role TEXT NOT NULL, created REAL NOT NULL, changed REAL NOT NULL);
CREATE TABLE IF NOT EXISTS members(grp TEXT NOT NULL, member TEXT NOT NULL, PRIMARY KEY(grp, member));
CREATE TABLE IF NOT EXISTS grants(
    access TEXT NOT NULL, pattern TEXT NOT NULL, grantee TEXT NOT NULL, PRIMARY KEY(access, pattern, grantee));
CREATE TABLE IF NOT EXISTS revocations(
    holder TEXT NOT NULL, pattern TEXT NOT NULL, at REAL NOT NULL, until REAL NOT NULL,
    PRIMARY KEY(holder, pattern, at));
"""
FRESH_SECONDS = 1.0
"""How long one reading of the access rules answers before the version is looked at again."""
MAX_USERS, MAX_GRANTS, MAX_MEMBERS, MAX_REVOCATIONS = 10_000, 10_000, 100_000, 20_000
"""The most of each the catalog keeps: they are all held in memory and sent to every node."""


@dataclass(frozen=True)
class UserRecord:
    name: str
    hash: str
    role: str
    created: float
    changed: float


@dataclass(frozen=True)
class AccessRules:
    """One reading of the access tables: users by name, each user's groups, grants and live revocations."""

    version: int = 0
    users: dict[str, UserRecord] = field(default_factory=dict)
    groups: dict[str, frozenset[str]] = field(default_factory=dict)  # member -> its groups
    grants: tuple[Grant, ...] = ()
    revocations: tuple[Revocation, ...] = ()
    group_names: frozenset[str] = frozenset()

    def principals(self, user: str, groups: tuple[str, ...] | None = None) -> frozenset[str]:
        """``user`` and their groups. ``groups``: an identity provider's user's, instead of the catalog's; such a
        user has no grant while their name is a local user's or group's, and a group named like a local user is
        none of theirs."""
        if groups is None:
            return frozenset((user, *self.groups.get(user, ())))
        if user in self.users or user in self.group_names:
            return frozenset()
        return frozenset((user, *(g for g in groups if g not in self.users)))


class AccessState(StateCore):
    """The access tables (see the module doc), over the state's database."""

    _db: Database  # the database (:class:`.core.StateCore`)
    _lock: Any  # its lock

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._db.script(ACCESS_SCHEMA)
        self._access: tuple[float, AccessRules, int] | None = None
        self._access_changes = 0  # bumped by every change this catalog makes: a reading made before it is not used

    # ------------------------------------------------------------------ reading

    def access_rules(self) -> AccessRules:
        """The access tables as last read, read again when :data:`FRESH_SECONDS` passed and their version moved, or
        this catalog changed them. No lock of its own is held while the database is read (a change holds the
        database's lock and bumps a counter): two threads may read at once, never wait on each other."""
        changes, kept = self._access_changes, self._access
        if kept is not None and kept[2] == changes and time.monotonic() - kept[0] < FRESH_SECONDS:
            return kept[1]
        try:
            version = self._access_version()
        except Exception:
            if kept is not None:
                return kept[1]  # the database is away: the last reading answers, as other reads do
            raise
        rules = kept[1] if kept is not None and kept[1].version == version else self._read_access(version)
        self._access = (time.monotonic(), rules, changes)
        return rules

    def _access_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='access_version'").fetchone()
        return int(row[0]) if row else 0

    def _read_access(self, version: int) -> AccessRules:
        with self._lock:
            users = {r[0]: UserRecord(r[0], r[1], r[2], r[3], r[4])
                     for r in self._db.execute("SELECT name, hash, role, created, changed FROM users")}
            groups: dict[str, set[str]] = {}
            for grp, member in self._db.execute("SELECT grp, member FROM members"):
                groups.setdefault(member, set()).add(grp)
            grants = tuple(Grant(*r) for r in self._db.execute(
                "SELECT access, pattern, grantee FROM grants ORDER BY grantee, pattern, access"))
            revocations = tuple(Revocation(*r) for r in self._db.execute(
                "SELECT holder, pattern, at, until FROM revocations WHERE until > ?", (time.time(),)))
        return AccessRules(version, users, {m: frozenset(g) for m, g in groups.items()}, grants, revocations,
                           frozenset(g for gs in groups.values() for g in gs))

    # ------------------------------------------------------------------ writing

    def _changed(self, db: Database) -> None:
        """Bump the access version inside the caller's transaction, and forget the reading kept."""
        db.execute("INSERT INTO meta VALUES('access_version', '1') ON CONFLICT(key) DO UPDATE SET "
                   "value=CAST(CAST(meta.value AS INTEGER) + 1 AS TEXT)")
        self._access_changes += 1  # under the database's lock: one writer at a time

    def _count(self, db: Database, sql: str, params: Sequence[Any], most: int, what: str) -> None:
        (count,) = db.execute(sql, params).fetchone()
        if count >= most:
            raise RequestRejected(f"the catalog keeps at most {most:,} {what}: remove some first", field=what)

    def add_user(self, name: str, password_hash: str, role: str) -> None:
        """A new user; RequestRejected if the name is taken by a user or a group."""
        now = time.time()
        tx = self.tx(None)
        with tx as db:
            if db.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone():
                raise RequestRejected(f"user {name} exists already (`flightpart user passwd` or `role` changes one)",
                                      field="name")
            if db.execute("SELECT 1 FROM members WHERE grp=?", (name,)).fetchone():
                raise RequestRejected(f"{name} is a group: users and groups share one set of names", field="name")
            self._count(db, "SELECT count(*) FROM users", (), MAX_USERS, "users")
            db.execute("INSERT INTO users VALUES(?,?,?,?,?)", (name, password_hash, role, now, now))
            self._changed(db)

    def change_user(self, name: str, *, password_hash: str | None = None, role: str | None = None,
                    revoke: Revocation | None = None) -> None:
        """A user's new password or role; ``revoke``: their sessions issued before are void (written alike)."""
        tx = self.tx(None)
        with tx as db:
            if not db.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone():
                raise UserNotFound(f"no user {name}", field="name")
            if password_hash is not None:
                db.execute("UPDATE users SET hash=?, changed=? WHERE name=?", (password_hash, time.time(), name))
            if role is not None:
                db.execute("UPDATE users SET role=?, changed=? WHERE name=?", (role, time.time(), name))
            if revoke is not None:
                self._revoke(db, [revoke])
            self._changed(db)

    def remove_user(self, name: str, revoke: Revocation) -> None:
        """The user gone, with their memberships; everything issued to them before is void (``revoke``)."""
        tx = self.tx(None)
        with tx as db:
            if not db.execute("SELECT 1 FROM users WHERE name=?", (name,)).fetchone():
                raise UserNotFound(f"no user {name}", field="name")
            db.execute("DELETE FROM users WHERE name=?", (name,))
            db.execute("DELETE FROM members WHERE member=?", (name,))
            db.execute("DELETE FROM grants WHERE grantee=?", (name,))
            self._revoke(db, [revoke])
            self._changed(db)

    def set_member(self, group: str, user: str, member: bool, revoke: list[Revocation]) -> bool:
        """Add ``user`` to ``group`` (or take them out, voiding with ``revoke``); whether anything changed."""
        tx = self.tx(None)
        with tx as db:
            if member:
                if db.execute("SELECT 1 FROM users WHERE name=?", (group,)).fetchone():
                    raise RequestRejected(f"{group} is a user: users and groups share one set of names",
                                          field="group")
                if not db.execute("SELECT 1 FROM users WHERE name=?", (user,)).fetchone():
                    raise UserNotFound(f"no user {user}: add the user first", field="user")
                if db.execute("SELECT 1 FROM members WHERE grp=? AND member=?", (group, user)).fetchone():
                    return False
                self._count(db, "SELECT count(*) FROM members", (), MAX_MEMBERS, "memberships")
                db.execute("INSERT INTO members VALUES(?,?)", (group, user))
            else:
                if not db.execute("SELECT 1 FROM members WHERE grp=? AND member=?", (group, user)).fetchone():
                    return False
                db.execute("DELETE FROM members WHERE grp=? AND member=?", (group, user))
                self._revoke(db, revoke)
            self._changed(db)
            return True

    def set_grant(self, grant: Grant, granted: bool, revoke: list[Revocation]) -> bool:
        """Give ``grant`` (or withdraw it, voiding with ``revoke``); whether anything changed."""
        tx = self.tx(None)
        with tx as db:
            key = (grant.access, grant.pattern, grant.grantee)
            exists = db.execute("SELECT 1 FROM grants WHERE access=? AND pattern=? AND grantee=?", key).fetchone()
            if granted == bool(exists):
                return False
            if granted:
                self._count(db, "SELECT count(*) FROM grants", (), MAX_GRANTS, "grants")
                db.execute("INSERT INTO grants VALUES(?,?,?)", key)
            else:
                db.execute("DELETE FROM grants WHERE access=? AND pattern=? AND grantee=?", key)
                self._revoke(db, revoke)
            self._changed(db)
            return True

    def add_revocations(self, entries: list[Revocation]) -> None:
        """Void what ``entries`` name (a token revoked, a user's sessions ended)."""
        tx = self.tx(None)
        with tx as db:
            self._revoke(db, entries)
            self._changed(db)

    def _revoke(self, db: Database, entries: list[Revocation]) -> None:
        """Write ``entries`` (never refused: a withdrawal must not fail for a full table). Past
        :data:`MAX_REVOCATIONS` entries, each holder's are folded into one voiding all it was issued before its
        latest: more than was withdrawn (those still allowed open again), never less."""
        now = time.time()
        db.execute("DELETE FROM revocations WHERE until <= ?", (now,))
        db.executemany("INSERT INTO revocations VALUES(?,?,?,?) ON CONFLICT(holder, pattern, at) DO NOTHING",
                       [(e.holder, e.pattern or ANY, e.at, e.until) for e in entries])
        (count,) = db.execute("SELECT count(*) FROM revocations").fetchone()
        if count <= MAX_REVOCATIONS:
            return
        folded = db.execute("SELECT holder, MAX(at), MAX(until) FROM revocations GROUP BY holder").fetchall()
        db.execute("DELETE FROM revocations")
        db.executemany("INSERT INTO revocations VALUES(?,?,?,?)", [(h, ANY, at, until) for h, at, until in folded])
