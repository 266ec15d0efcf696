"""Users, groups and grants at the catalog: sign-in, each call's standing, the checks on datasets, the admin
actions, and the withdrawals every node enforces.

- **Sign-in.** Flight's basic-token handshake (``authorization: Basic`` on any call, the handshake's answer carrying
  ``authorization: Bearer <session token>``), as ADBC (``username``/``password``) and ``fp.connect(user=...,
  password=...)`` send it; or an identity provider's JWT (:mod:`..identity`) as the bearer, accepted on every call
  and exchanged for a session token by a handshake. A session token is signed like every token, so nodes check it
  with the verify key; a user reads partitions from nodes only with the capability their open gave.
- **Failed sign-ins** are counted per user: past :data:`FREE_FAILURES` in a row, that user's sign-ins are refused
  unchecked for a time that doubles with each failure (at most :data:`MOST_LOCKOUT` seconds), and checks in flight
  count against what is left, so guesses sent at once do not outrun the count. At most :data:`CHECKS_AT_ONCE` users'
  passwords are hashed at once, and names that are no user's get a dummy hash as long in one slot of their own, so
  a flood of made-up names neither holds users' sign-ins up nor fills memory.
- **Standing.** Each call's credential is checked against the rules as they are now (:meth:`current`): a removed
  user or a revoked session is ``UNAUTHENTICATED`` at once; a user's role is the one kept, not the token's.
- **Datasets.** :meth:`require` is the one check: a user may do what a grant to them or their groups allows
  (:func:`flightpart.grants.allowed`); operators' role tokens are not narrowed.
- **Withdrawal.** Removing a user, a grant or a membership, or revoking sessions or a token, writes revocations
  (:class:`flightpart.grants.Revocation`): the catalog sends the whole list to every live node at once; a node that
  misses it registers again and learns it from the registration's answer. So a handle pickled into a task stops
  reading within a round trip on every node that answered.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from flightpart.errors import Forbidden, RequestRejected, ServerBusy, Unauthenticated, UserNotFound
from flightpart.grants import ANY, ANY_IDP_HOLDER, IDP_HOLDER_PREFIX, TOKEN_HOLDER_PREFIX, Grant, Revocation, allowed
from flightpart.passwords import WeakPassword, check_new_password, hash_password, password_matches, unknown_user_hash
from flightpart.tokens import Credential, session_token, verify_token
from flightpart.wire import (
    AccessChanged,
    AddUser,
    ChangeUser,
    GrantList,
    GrantRow,
    ListGrants,
    ListUsers,
    RemoveUser,
    RevocationEntry,
    Revocations,
    RevokeSessions,
    SetGrant,
    SetMember,
    UserList,
    UserRow,
)

from ..audit import audit
from ..auth import CLOCK_MARGIN, wall_clock
from ..base import Action
from ..identity import JwtVerifier, looks_like_jwt
from ..info_cache import FlightInfoCache
from ..state.access import AccessRules
from .orders import NodeOrders

log = logging.getLogger("flightpart.catalog")

FREE_FAILURES = 5
"""Failed sign-ins in a row a user name may have before its sign-ins are refused for a while."""
MOST_LOCKOUT = 300.0
"""The longest a user name's sign-ins are refused after failures (seconds)."""
CHECKS_AT_ONCE = 2
"""Passwords hashed at once; a sign-in waits at most :data:`CHECK_WAIT` seconds for its turn, then is ``BUSY``."""
CHECK_WAIT = 10.0
NAMES_WATCHED = 10_000
"""Sign-ins remembered (:data:`SIGNED_IN_SECONDS`) and identity provider tokens seen, the oldest forgotten first."""
SIGNED_IN_SECONDS = 60.0
"""How long a name and password that signed in are remembered, so a client sending them on every call is not
hashed every time (forgotten at once when the user's password, role or existence changes)."""
FOREVER = 1e12
"""``until`` of a revocation of a token that never expires."""


class SignInThrottle:
    """Failed sign-ins per user, checks in flight per user, and the lockout they earn (see the module doc). Only the
    names of users are kept (at most :data:`~..state.access.MAX_USERS`), so a flood of made-up names fills nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}  # user -> (failures in a row, when the last)
        self._flying: dict[str, int] = {}  # user -> passwords of theirs being checked now

    def admit(self, name: str, now: float) -> float:
        """0 and one more check of ``name`` in flight, or the seconds before ``name`` may try again: locked after
        :data:`FREE_FAILURES` failures, and checks in flight count against what is left of them, so guesses sent
        at once cannot outrun the count."""
        with self._lock:
            failures, last = self._failures.get(name, (0, 0.0))
            if failures >= FREE_FAILURES:
                wait = last + min(MOST_LOCKOUT, 2.0 ** (failures - FREE_FAILURES)) - now
                if wait > 0:
                    return wait
            flying = self._flying.get(name, 0)
            if flying >= max(1, FREE_FAILURES - failures):
                return 1.0
            self._flying[name] = flying + 1
            return 0.0

    def done(self, name: str, now: float, matched: bool | None) -> int:
        """A check of ``name`` admitted is over (``matched`` None: it was not made); the failures in a row now."""
        with self._lock:
            left = self._flying.get(name, 1) - 1
            if left > 0:
                self._flying[name] = left
            else:
                self._flying.pop(name, None)
            if matched is None:
                return self._failures.get(name, (0, 0.0))[0]
            if matched:
                self._failures.pop(name, None)
                return 0
            failures = self._failures.get(name, (0, 0.0))[0] + 1
            self._failures[name] = (failures, now)
            return failures

    def forget(self, name: str) -> None:
        """A removed user's failures."""
        with self._lock:
            self._failures.pop(name, None)


class AccessControl(NodeOrders):
    """The catalog's users and grants (see the module doc); a part of :class:`~.server.CatalogServer`."""

    _infos: FlightInfoCache  # set by the composed server (:class:`~.server.CatalogServer`)
    capability_ttl: float
    session_ttl: float
    identity: JwtVerifier | None
    caller: Any

    def start_access(self, session_ttl: float, identity: JwtVerifier | None) -> None:
        """Take users, sessions and identity provider tokens on this catalog's calls (with a secret only)."""
        self.session_ttl = session_ttl
        self.identity = identity
        self._throttle = SignInThrottle()
        self._checking = threading.BoundedSemaphore(CHECKS_AT_ONCE)
        self._checking_unknown = threading.BoundedSemaphore(1)  # names that are no user's, hashed apart
        self._signed_in: OrderedDict[bytes, tuple[Credential, str, float, int]] = OrderedDict()
        self._signed_in_lock = threading.Lock()
        self._signed_in_key = secrets.token_bytes(32)
        self._seen_federated: OrderedDict[str, None] = OrderedDict()
        self._revoked_version = -1
        if self.secret is not None:
            self.guard.sessions = self
            self._sync_revoked(self.state.access_rules())

    # ------------------------------------------------------------------ sign-in and standing (auth.Sessions)

    def sign_in(self, basic: str) -> tuple[Credential, str]:
        try:
            text = basic.strip()  # Go's clients (ADBC) leave the padding out
            user, sep, password = base64.b64decode(text + "=" * (-len(text) % 4), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            user, sep, password = "", "", ""
        if not sep or not user:
            raise Unauthenticated("sign-in: expected Basic credentials, base64 of user:password", field="authorization")
        now = wall_clock()
        rules = self.state.access_rules()
        record = rules.users.get(user)
        if record is None:  # no account to guess: the same refusal, after a hash as long, in a slot of its own
            if not self._checking_unknown.acquire(timeout=CHECK_WAIT):
                raise ServerBusy("busy: too many sign-ins are being checked at once; retry shortly")
            try:
                password_matches(unknown_user_hash(), password)
            finally:
                self._checking_unknown.release()
            self._refuse_sign_in(user[:64], "wrong user name or password")
            raise Unauthenticated("sign-in refused: wrong user name or password", field="authorization")
        wait = self._throttle.admit(user, now)
        if wait > 0:
            self._refuse_sign_in(user, f"locked for {wait:.0f} s more after failed sign-ins")
            raise Unauthenticated(f"sign-in refused: too many failed sign-ins for {user}; try again in "
                                  f"{max(1, round(wait))} s", field="authorization")
        matched: bool | None = None  # None: not checked (busy), which is no failure
        try:
            key = hmac.new(self._signed_in_key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
            with self._signed_in_lock:
                kept = self._signed_in.get(key)
            if kept is not None and kept[2] > time.monotonic() and kept[3] == rules.version:
                matched = True
                return kept[0], kept[1]
            if not self._checking.acquire(timeout=CHECK_WAIT):
                raise ServerBusy("busy: too many sign-ins are being checked at once; retry shortly")
            try:
                matched = password_matches(record.hash, password)
            finally:
                self._checking.release()
        finally:
            failures = self._throttle.done(user, now, matched)
        if not matched:
            self._refuse_sign_in(user, "wrong user name or password", failures=failures)
            raise Unauthenticated("sign-in refused: wrong user name or password", field="authorization")
        expiry = int(now + self.session_ttl)
        credential = Credential(record.role, user, expiry, holder=user, issued=now, user=True)
        token = session_token(self.secret, user, record.role, now, expiry)
        audit(self.telemetry, "sign-in", True, credential, role=record.role)
        with self._signed_in_lock:
            self._signed_in[key] = (credential, token, time.monotonic() + SIGNED_IN_SECONDS, rules.version)
            while len(self._signed_in) > NAMES_WATCHED:
                self._signed_in.popitem(last=False)
        return credential, token

    def _refuse_sign_in(self, user: str, why: str, **extra: Any) -> None:
        self.telemetry.refused("sign_in")
        audit(self.telemetry, "sign-in", False, None, user=user[:64], why=why, **extra)

    def federated(self, token: str) -> tuple[Credential, str] | None:
        if self.identity is None or not looks_like_jwt(token):
            return None
        now = wall_clock()
        try:
            identity = self.identity.verify(token, now, CLOCK_MARGIN)
        except Unauthenticated as refused:
            self._refuse_sign_in("", f"identity provider token: {refused.message}")
            raise
        local = self.state.access_rules().users
        if identity.user in local:
            self._refuse_sign_in(identity.user, "identity provider token names a local user")
            raise Unauthenticated(f"JWT refused: {identity.user} is a user of this catalog, who signs in with their "
                                  "password; an identity provider's users have names of their own",
                                  field="authorization")
        groups = tuple(g for g in identity.groups if g not in local)  # a local user's name is no provider's group
        credential = Credential(identity.role, identity.user, identity.expiry,
                                holder=IDP_HOLDER_PREFIX + identity.user, issued=0.0, user=True, groups=groups)
        with self._signed_in_lock:
            first = token not in self._seen_federated
            self._seen_federated[token] = None
            while len(self._seen_federated) > NAMES_WATCHED:
                self._seen_federated.popitem(last=False)
        if first:
            audit(self.telemetry, "sign-in", True, credential, via="identity provider", groups=list(identity.groups))
        expiry = int(min(identity.expiry, now + self.session_ttl))
        return credential, session_token(self.secret, identity.user, identity.role, now, expiry, groups)

    def current(self, credential: Credential) -> Credential:
        if not credential.holder:
            return credential
        rules = self.state.access_rules()
        self._sync_revoked(rules)
        if self.guard.revoked.voids(credential):
            audit(self.telemetry, "call", False, credential, why="revoked")
            raise Unauthenticated("this session or token was revoked (its user removed, a grant or the token "
                                  "withdrawn): sign in again, or ask an admin", field="authorization")
        if credential.user and credential.groups is None:
            record = rules.users.get(credential.name)
            if record is None:
                raise Unauthenticated(f"user {credential.name} no longer exists", field="authorization")
            if record.role != credential.role:
                return dataclasses.replace(credential, role=record.role)
        return credential

    def _sync_revoked(self, rules: AccessRules) -> None:
        """The guard enforces the revocations of ``rules`` (read again when their version moved)."""
        if rules.version != self._revoked_version:
            self.guard.revoked.set(rules.revocations)
            self._revoked_version = rules.version

    # ------------------------------------------------------------------ datasets

    def may(self, credential: Credential, access: str, dataset: str) -> bool:
        """Whether ``credential`` may ``access`` (read or write) ``dataset``: any non-user may; a user as their
        grants allow."""
        if not credential.user:
            return True
        rules = self.state.access_rules()
        return allowed(rules.grants, rules.principals(credential.name, credential.groups), access, dataset)

    def require(self, credential: Credential, access: str, dataset: str, what: str, *, version: int | None = None,
                client: str = "") -> None:
        """``FORBIDDEN`` (written to the audit trail) unless ``credential`` may ``access`` ``dataset``; a user's
        allowed ``what`` is written too."""
        if self.may(credential, access, dataset):
            if credential.user:
                audit(self.telemetry, what, True, credential, dataset=dataset, version=version, client=client)
            return
        audit(self.telemetry, what, False, credential, dataset=dataset, version=version, client=client,
              why=f"no {access} grant")
        raise Forbidden(f"user {credential.name} may not {access} {dataset}: no grant to them or their groups allows "
                        f"it (an admin gives one with `flightpart grant {access} {dataset} TO {credential.name}`)",
                        field="dataset")

    def visible(self, credential: Credential) -> Any:
        """A predicate: which dataset names ``credential`` may read (listings show only those)."""
        if not credential.user:
            return lambda name: True
        rules = self.state.access_rules()
        principals = rules.principals(credential.name, credential.groups)
        grants = [g for g in rules.grants if g.grantee in principals]
        return lambda name: allowed(grants, principals, "read", name)

    # ------------------------------------------------------------------ the admin's actions

    def _admin(self, what: str, **fields: Any) -> Credential:
        credential = self.caller.credential
        audit(self.telemetry, what, True, credential, **fields)
        return credential

    def _until(self) -> float:
        return wall_clock() + max(self.session_ttl, self.capability_ttl) + 2 * CLOCK_MARGIN

    def _add_user(self, b: AddUser) -> AccessChanged:
        _check_password(b.password)
        self.state.add_user(b.name, hash_password(b.password), b.role)
        self._admin("user-add", user_added=b.name, role=b.role)
        return AccessChanged(True, f"user {b.name} added as {b.role}")

    def _change_user(self, b: ChangeUser) -> AccessChanged:
        credential = self.caller.credential
        own = credential.user and credential.groups is None and credential.name == b.name
        if not own or credential.role == "admin":
            if credential.role not in ("admin", "owner"):
                raise Forbidden(f"{credential.name} may change only their own password; an admin changes others' "
                                "and roles", field="name")
        elif b.role is not None:
            raise Forbidden("a user may not change their own role: an admin does", field="role")
        elif b.current is None or not self._password_is(b.name, b.current):
            self._refuse_sign_in(b.name, "password change without the current password")
            raise Forbidden("changing your own password takes your current one (`flightpart user passwd` asks for "
                            "it)", field="current")
        if b.password is None and b.role is None:
            return AccessChanged(False, "nothing to change: give a password or a role")
        if b.password is not None:
            _check_password(b.password)
        now = wall_clock()
        self.state.change_user(b.name, password_hash=None if b.password is None else hash_password(b.password),
                               role=b.role, revoke=Revocation(b.name, ANY, now, self._until()))
        self._admin("user-change", changed=b.name, password=b.password is not None, role=b.role)
        self._tell_nodes()
        return AccessChanged(True, f"user {b.name} changed; their other sessions ended")

    def _password_is(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s (hashed in one of the sign-in slots)."""
        record = self.state.access_rules().users.get(name)
        if record is None or not self._checking.acquire(timeout=CHECK_WAIT):
            return False
        try:
            return password_matches(record.hash, password)
        finally:
            self._checking.release()

    def _remove_user(self, b: RemoveUser) -> AccessChanged:
        now = wall_clock()
        self.state.remove_user(b.name, Revocation(b.name, ANY, now, self._until()))
        self._throttle.forget(b.name)
        self._admin("user-remove", removed=b.name)
        self._tell_nodes()
        return AccessChanged(True, f"user {b.name} removed; their sessions and handles are void")

    def _users(self, _: ListUsers) -> UserList:
        rules = self.state.access_rules()
        return UserList(tuple(UserRow(u.name, u.role, tuple(sorted(rules.groups.get(u.name, ()))), u.created)
                              for u in sorted(rules.users.values(), key=lambda u: u.name)))

    def _set_member(self, b: SetMember) -> AccessChanged:
        before = self.state.access_rules()
        if b.user not in before.users:
            raise UserNotFound(f"no user {b.user}: add the user first (`flightpart user add {b.user}`)", field="user")
        lost = [] if b.member else self._lost(before, {b.user}, lambda g: g.grantee == b.group)
        changed = self.state.set_member(b.group, b.user, b.member, lost)
        self._admin("group-member", group=b.group, member=b.user, joined=b.member, changed=changed)
        if lost:
            self._tell_nodes()
        verb = "joined" if b.member else "left"
        return AccessChanged(changed, f"{b.user} {verb} {b.group}" if changed else "nothing changed")

    def _grant(self, b: SetGrant) -> AccessChanged:
        grant = Grant(b.access, b.pattern, b.grantee)
        before = self.state.access_rules()
        affected = {b.grantee} if b.grantee in before.users else {
            member for member, groups in before.groups.items() if b.grantee in groups}
        lost = [] if b.granted else self._lost(before, affected, lambda g: g == grant)
        if not b.granted and b.grantee not in before.users:  # a group, or a provider's user: its members unknown here
            now, until = wall_clock(), self._until()
            lost += [Revocation(ANY_IDP_HOLDER, record.dataset, now, until) for record in self.state.datasets()
                     if grant.covers("read", record.dataset)]
        changed = self.state.set_grant(grant, b.granted, lost)
        self._admin("grant" if b.granted else "revoke", access=b.access, pattern=b.pattern, grantee=b.grantee,
                    changed=changed)
        if lost:
            self._tell_nodes()
        said = (f"{b.access} on {b.pattern} {'granted to' if b.granted else 'revoked from'} {b.grantee}"
                if changed else "nothing changed: " + ("granted already" if b.granted else "no such grant"))
        return AccessChanged(changed, said)

    def _grants(self, _: ListGrants) -> GrantList:
        return GrantList(tuple(GrantRow(g.access, g.pattern, g.grantee) for g in self.state.access_rules().grants))

    def _revoke_sessions(self, b: RevokeSessions) -> AccessChanged:
        if (b.user is None) == (b.token is None):
            raise RequestRejected("revoke-sessions: name a user or a token (one of them)", field="revoke-sessions")
        now = wall_clock()
        if b.user is not None:
            entry = Revocation(b.user, ANY, now, self._until())
            entries = [entry, Revocation(IDP_HOLDER_PREFIX + b.user, ANY, now, self._until())]
            said = f"every session and handle of {b.user} issued until now is void"
        else:
            assert self.secret is not None and b.token is not None
            credential = verify_token(self.secret, b.token, now, CLOCK_MARGIN)
            if credential is None or not credential.holder:
                raise Forbidden("revoke-sessions: not a token of this cluster that can be revoked (expired, the "
                                "secret itself, or not signed here)", field="token")
            until = FOREVER if not credential.expiry else credential.expiry + 2 * CLOCK_MARGIN
            entry = Revocation(credential.holder, ANY, now, max(until, self._until()))
            entries = [entry]
            said = (f"the token ({credential.role} {credential.name}) is void, with the handles opened with it"
                    if credential.holder.startswith(TOKEN_HOLDER_PREFIX) else
                    f"every session and handle of {credential.holder} issued until now is void")
        self.state.add_revocations(entries)
        self._admin("revoke-sessions", holder=entry.holder)
        self._tell_nodes()
        return AccessChanged(True, said)

    def _lost(self, before: AccessRules, users: set[str], withdrawn: Any) -> list[Revocation]:
        """Revocations for what ``users`` can no longer read once the grants ``withdrawn`` matches stop applying to
        them: one per existing dataset they could read before and cannot after."""
        if not users:
            return []
        now, until = wall_clock(), self._until()
        kept = [g for g in before.grants if not withdrawn(g)]
        names = [record.dataset for record in self.state.datasets()]
        out = []
        for user in users:
            principals = before.principals(user)
            for name in names:
                if allowed(before.grants, principals, "read", name) and not allowed(kept, principals, "read", name):
                    out.append(Revocation(user, name, now, until))
        return out

    def revocation_entries(self) -> tuple[RevocationEntry, ...] | None:
        """Every revocation in force, as a node is told it (None without a secret: nothing is revoked)."""
        if self.secret is None:
            return None
        rules = self.state.access_rules()
        self._sync_revoked(rules)
        return tuple(RevocationEntry(r.holder, r.pattern, r.at, r.until) for r in rules.revocations)

    def _tell_nodes(self) -> None:
        """Send every live node the revocations in force; one that misses them registers again (and learns them)."""
        entries = self.revocation_entries()
        if entries is None:
            return
        order = Revocations(entries, self.epoch())
        live = [n for n in self.state.nodes() if n.alive]
        self.state.must_register_all([n.node_id for n in self.state.nodes() if not n.alive])
        self.fan_out(live, lambda node: self.pool.action(node.uri, order, timeout=self.fan_out_timeout),
                     f"revocations ({len(entries)})")
        self._infos.clear()  # capabilities handed out before are void where revoked: the next opens get new ones


def _check_password(password: str) -> None:
    try:
        check_new_password(password)
    except WeakPassword as exc:
        raise RequestRejected(f"password refused: {exc}", field="password") from None


ACTIONS = (
    Action(AddUser, AccessControl._add_user, "add a user who signs in with a password", "admin"),
    Action(ChangeUser, AccessControl._change_user, "a user's new password (theirs or an admin's) or role (an admin's)",
           "read"),
    Action(RemoveUser, AccessControl._remove_user, "remove a user: their sessions and handles are void", "admin"),
    Action(ListUsers, AccessControl._users, "every user, their role and groups", "admin", changes_state=False),
    Action(SetMember, AccessControl._set_member, "a user joins or leaves a group", "admin"),
    Action(SetGrant, AccessControl._grant, "give or withdraw read or write on the datasets a pattern matches",
           "admin"),
    Action(ListGrants, AccessControl._grants, "every grant", "admin", changes_state=False),
    Action(RevokeSessions, AccessControl._revoke_sessions, "void a user's sessions and handles, or one token",
           "admin"),
)
"""The actions this part serves, added to the catalog's table (:attr:`~.server.CatalogServer.actions`)."""
