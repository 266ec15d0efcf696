"""A catalog's users, groups and grants, as an admin (or a user changing their own password) manages them:
``client.users`` (:class:`Users`).
"""

from __future__ import annotations

import builtins
from typing import Any

from flightpart.wire import (
    AccessChanged,
    AddUser,
    ChangeUser,
    GrantRow,
    ListGrants,
    ListUsers,
    RemoveUser,
    RevokeSessions,
    SetGrant,
    SetMember,
    UserRow,
)


class Users:
    """The catalog's users and grants (see docs/operations/users.md). Each method is one call to the
    catalog; changes answer what they did (:class:`~flightpart.wire.AccessChanged`)."""

    def __init__(self, client: Any):
        self._client = client

    def list(self) -> list[UserRow]:
        """Every user: name, role, groups, when added."""
        return list(self._client.call(ListUsers()).users)

    def add(self, name: str, password: str, role: str = "reader") -> AccessChanged:
        """A user who signs in with ``password`` (8 to 1024 characters), as ``role`` (reader, writer or admin)."""
        return self._client.call(AddUser(name, password, role))

    def change(self, name: str, *, password: str | None = None, role: str | None = None,
               current: str | None = None) -> AccessChanged:
        """A user's new password or role; their sessions end. A user may change their own password, giving their
        ``current`` one."""
        return self._client.call(ChangeUser(name, password, role, current))

    def remove(self, name: str) -> AccessChanged:
        """The user gone; their sessions, and the handles they opened, stop working on every node."""
        return self._client.call(RemoveUser(name))

    def join(self, group: str, user: str) -> AccessChanged:
        """``user`` joins ``group`` (made by its first member)."""
        return self._client.call(SetMember(group, user, True))

    def leave(self, group: str, user: str) -> AccessChanged:
        """``user`` leaves ``group``: what only the group's grants allowed them is withdrawn."""
        return self._client.call(SetMember(group, user, False))

    def grant(self, access: str, pattern: str, grantee: str) -> AccessChanged:
        """``access`` (read or write) on the datasets ``pattern`` matches (``*`` and ``?`` as in file names) to a user
        or a group."""
        return self._client.call(SetGrant(access, pattern, grantee, True))

    def revoke(self, access: str, pattern: str, grantee: str) -> AccessChanged:
        """Withdraw a grant; what it alone allowed stops working on every node within a round trip."""
        return self._client.call(SetGrant(access, pattern, grantee, False))

    def grants(self) -> builtins.list[GrantRow]:
        """Every grant."""
        return list(self._client.call(ListGrants()).grants)

    def revoke_sessions(self, *, user: str | None = None, token: str | None = None) -> AccessChanged:
        """Void every session and handle of ``user`` issued until now, or one ``token`` (a role token, a session)."""
        return self._client.call(RevokeSessions(user, token))
