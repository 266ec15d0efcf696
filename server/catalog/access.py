"""Users, groups and grants at the catalog: sign-in, each call's standing, the checks on datasets, the admin
actions, and the withdrawals every node enforces.

- **Sign-in.** Flight's basic-token handshake (``authorization: Basic`` on any call, the handshake's answer carrying
  ``authorization: Bearer <session token>``), as ADBC (``username``/``password``) and ``fp.connect(user=...,
  password=...)`` send it; or an identity provider's JWT (:mod:`..identity`) as the bearer, accepted on every call
  and exchanged for a session token by a handshake. A session token is signed like every token, so nodes check it
  with the verify key; a user reads partitions from nodes only with the capability their open gave.
- **Failed sign-ins** slow guessing (:mod:`..sign_ins`).
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

import dataclasses
import logging
from typing import Any

from flightpart.errors import Forbidden, RequestRejected, Unauthenticated, UserNotFound
from flightpart.grants import ANY, ANY_IDP_HOLDER, IDP_HOLDER_PREFIX, TOKEN_HOLDER_PREFIX, Grant, Revocation, allowed
from flightpart.passwords import WeakPassword, check_new_password, hash_password
from flightpart.tokens import Credential, verify_token
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
from ..identity import JwtVerifier
from ..info_cache import FlightInfoCache
from ..sign_ins import SignIns
from ..state.access import AccessRules
from .orders import NodeOrders

log = logging.getLogger("flightpart.catalog")

FOREVER = 1e12
"""``until`` of a revocation of a token that never expires."""


class AccessControl(NodeOrders):
    """The catalog's users and grants (see the module doc); a part of :class:`~.server.CatalogServer`."""

    _infos: FlightInfoCache  # set by the composed server (:class:`~.server.CatalogServer`)
    capability_ttl: float
    session_ttl: float
    sign_ins: SignIns
    caller: Any

    def start_access(self, session_ttl: float, identity: JwtVerifier | None) -> None:
        """Take users, sessions and identity provider tokens on this catalog's calls (with a secret only)."""
        self.session_ttl = session_ttl
        self.sign_ins = SignIns(self.state, self.secret, self.telemetry, session_ttl, identity)
        self._revoked_version = -1
        if self.secret is not None:
            self.guard.sessions = self
            self._sync_revoked(self.state.access_rules())

    # ------------------------------------------------------------------ sign-in and standing (auth.Sessions)

    def sign_in(self, basic: str) -> tuple[Credential, str]:
        return self.sign_ins.sign_in(basic)

    def federated(self, token: str) -> tuple[Credential, str] | None:
        return self.sign_ins.federated(token)

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
        if not own:
            if credential.role not in ("admin", "owner"):
                raise Forbidden(f"{credential.name} may change only their own password; an admin changes others' "
                                "and roles", field="name")
        elif b.role is not None and credential.role != "admin":
            raise Forbidden("a user may not change their own role: an admin does", field="role")
        elif b.password is not None and (b.current is None or not self.sign_ins.password_is(b.name, b.current)):
            self.sign_ins.refused(b.name, "password change without the current password")
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
        return AccessChanged(True, f"user {b.name} changed; their sessions ended (sign in again)")

    def _remove_user(self, b: RemoveUser) -> AccessChanged:
        now = wall_clock()
        self.state.remove_user(b.name, Revocation(b.name, ANY, now, self._until()))
        self.sign_ins.forget(b.name)
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
            lost += folded(ANY_IDP_HOLDER, [record.dataset for record in self.state.datasets()
                                            if grant.covers("read", record.dataset)], now, until)
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
            lost = [name for name in names
                    if allowed(before.grants, principals, "read", name) and not allowed(kept, principals, "read", name)]
            out += folded(user, lost, now, until)
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
        self._infos.clear()  # capabilities handed out before are void where revoked: the next opens get new ones
        order = Revocations(entries, self.epoch())
        live = [n for n in self.state.nodes() if n.alive]
        self.state.must_register_all([n.node_id for n in self.state.nodes() if not n.alive])
        self.fan_out(live, lambda node: self.pool.action(node.uri, order, timeout=self.fan_out_timeout),
                     f"revocations ({len(entries)})")


FOLD_DATASETS = 32
"""Past this many datasets lost by one holder in one withdrawal, one revocation voids all it was issued before."""


def folded(holder: str, datasets: list[str], now: float, until: float) -> list[Revocation]:
    """The revocations voiding what ``holder`` was issued before ``now`` for ``datasets``: one each, or one for
    everything past :data:`FOLD_DATASETS` (more than was withdrawn; what is still allowed is opened again)."""
    if len(datasets) > FOLD_DATASETS:
        return [Revocation(holder, ANY, now, until)]
    return [Revocation(holder, name, now, until) for name in datasets]


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
