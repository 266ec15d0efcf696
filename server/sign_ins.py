"""Sign-in at the catalog: a user's name and password, or an identity provider's token, checked into a session
(:class:`SignIns`), and failed sign-ins slowed (:class:`SignInThrottle`).

- **Failed sign-ins** are counted per user: past :data:`FREE_FAILURES` in a row, that user's sign-ins are refused
  unchecked for a time that doubles with each failure (at most :data:`MOST_LOCKOUT` seconds), and checks in flight
  count against what is left, so guesses sent at once do not outrun the count. At most :data:`CHECKS_AT_ONCE`
  users' passwords are hashed at once, and names that are no user's get a dummy hash as long in one slot of their
  own, so a flood of made-up names neither holds users' sign-ins up nor fills memory.
- **A provider's users** have names of their own: a token naming a local user is refused, and groups named like
  local users are left out of its groups.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from flightpart.errors import ServerBusy, Unauthenticated
from flightpart.grants import IDP_HOLDER_PREFIX
from flightpart.passwords import password_matches, unknown_user_hash
from flightpart.tokens import Credential, session_token

from .audit import audit
from .auth import CLOCK_MARGIN, wall_clock
from .identity import JwtVerifier, looks_like_jwt
from .state import CatalogState
from .telemetry import Telemetry

FREE_FAILURES = 5
"""Failed sign-ins in a row a user name may have before its sign-ins are refused for a while."""
MOST_LOCKOUT = 300.0
"""The longest a user name's sign-ins are refused after failures (seconds)."""
IN_FLIGHT = -1.0
""":meth:`SignInThrottle.admit`'s answer while as many of a user's checks as their failures leave are in flight."""
CHECKS_AT_ONCE = 2
"""Passwords hashed at once; a sign-in waits at most :data:`CHECK_WAIT` seconds for its turn, then is ``BUSY``."""
CHECK_WAIT = 10.0
NAMES_WATCHED = 10_000
"""Sign-ins remembered (:data:`SIGNED_IN_SECONDS`) and identity provider tokens seen, the oldest forgotten first."""
SIGNED_IN_SECONDS = 60.0
"""How long a name and password that signed in are remembered, so a client sending them on every call is not
hashed every time (forgotten at once when the user's password, role or existence changes)."""


class SignInThrottle:
    """Failed sign-ins per user, checks in flight per user, and the lockout they earn (see the module doc). Only the
    names of users are kept (at most :data:`~.state.access.MAX_USERS`), so a flood of made-up names fills nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}  # user -> (failures in a row, when the last)
        self._flying: dict[str, int] = {}  # user -> passwords of theirs being checked now

    def admit(self, name: str, now: float) -> float:
        """0 and one more check of ``name`` in flight; the seconds before ``name`` may try again, locked after
        :data:`FREE_FAILURES` failures; or :data:`IN_FLIGHT` while checks in flight take what is left of them, so
        guesses sent at once cannot outrun the count."""
        with self._lock:
            failures, last = self._failures.get(name, (0, 0.0))
            if failures >= FREE_FAILURES:
                wait = last + min(MOST_LOCKOUT, 2.0 ** (failures - FREE_FAILURES)) - now
                if wait > 0:
                    return wait
            flying = self._flying.get(name, 0)
            if flying >= max(1, FREE_FAILURES - failures):
                return IN_FLIGHT
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


class SignIns:
    """The catalog's sign-ins (see the module doc): ``Basic`` credentials and provider tokens into sessions."""

    def __init__(self, state: CatalogState, secret: bytes | None, telemetry: Telemetry, session_ttl: float,
                 identity: JwtVerifier | None):
        self.state, self.secret, self.telemetry = state, secret, telemetry
        self.session_ttl, self.identity = session_ttl, identity
        self.throttle = SignInThrottle()
        self._checking = threading.BoundedSemaphore(CHECKS_AT_ONCE)
        self._checking_unknown = threading.BoundedSemaphore(1)  # names that are no user's, hashed apart
        self._signed_in: OrderedDict[bytes, tuple[Credential, str, float, int]] = OrderedDict()
        self._signed_in_lock = threading.Lock()
        self._signed_in_key = secrets.token_bytes(32)
        self._seen_federated: OrderedDict[bytes, None] = OrderedDict()  # digests of provider tokens seen

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
            self.refused(user[:64], "wrong user name or password")
            raise Unauthenticated("sign-in refused: wrong user name or password", field="authorization")
        key = hmac.new(self._signed_in_key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._signed_in_lock:
            kept = self._signed_in.get(key)
        if kept is not None and kept[2] > time.monotonic() and kept[3] == rules.version:
            return kept[0], kept[1]  # this very name and password signed in a moment ago
        matched, failures = self._checked(user, record.hash, password, now)
        if not matched:
            self.refused(user, "wrong user name or password", failures=failures)
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

    def _admitted(self, user: str, now: float) -> None:
        """Wait for a check of ``user``'s password to be let through (:meth:`SignInThrottle.admit`): locked, refused;
        others of theirs in flight, waited for (``BUSY`` after :data:`CHECK_WAIT` seconds)."""
        deadline = time.monotonic() + CHECK_WAIT
        while True:
            wait = self.throttle.admit(user, now)
            if wait == 0:
                return
            if wait != IN_FLIGHT:
                self.refused(user, f"locked for {wait:.0f} s more after failed sign-ins")
                raise Unauthenticated(f"sign-in refused: too many failed sign-ins for {user}; try again in "
                                      f"{max(1, round(wait))} s", field="authorization")
            if time.monotonic() > deadline:
                raise ServerBusy(f"busy: other sign-ins of {user} are being checked; retry shortly")
            time.sleep(0.05)
            now = wall_clock()

    def refused(self, user: str, why: str, **extra: Any) -> None:
        """Count and write down a sign-in refused."""
        self.telemetry.refused("sign_in")
        audit(self.telemetry, "sign-in", False, None, user=user[:64], why=why, **extra)

    def federated(self, token: str) -> tuple[Credential, str] | None:
        if self.identity is None or not looks_like_jwt(token):
            return None
        now = wall_clock()
        try:
            identity = self.identity.verify(token, now, CLOCK_MARGIN)
        except Unauthenticated as refused:
            self.refused("", f"identity provider token: {refused.message}")
            raise
        rules = self.state.access_rules()
        if identity.user in rules.users or identity.user in rules.group_names:
            self.refused(identity.user, "identity provider token names a local user or group")
            raise Unauthenticated(f"JWT refused: {identity.user} is a user or group of this catalog; an identity "
                                  "provider's users have names of their own", field="authorization")
        groups = tuple(g for g in identity.groups if g not in rules.users)  # a local user's name is no group
        credential = Credential(identity.role, identity.user, identity.expiry, holder=IDP_HOLDER_PREFIX + identity.user,
                                issued=identity.issued, user=True, groups=groups)
        digest = hashlib.sha256(token.encode()).digest()
        with self._signed_in_lock:
            first = digest not in self._seen_federated
            self._seen_federated[digest] = None
            while len(self._seen_federated) > NAMES_WATCHED:
                self._seen_federated.popitem(last=False)
        if first:
            audit(self.telemetry, "sign-in", True, credential, via="identity provider", groups=list(identity.groups))
        expiry = int(min(identity.expiry, now + self.session_ttl))
        return credential, session_token(self.secret, identity.user, identity.role, now, expiry, groups)

    def password_is(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s, checked as a sign-in is (counted, locked out after failures)."""
        record = self.state.access_rules().users.get(name)
        if record is None:
            return False
        return self._checked(name, record.hash, password, wall_clock())[0]  # counted as a sign-in's check is

    def _checked(self, user: str, stored: str, password: str, now: float) -> tuple[bool, int]:
        """Whether ``password`` matches ``stored``, once the throttle lets a check of ``user`` through
        (:meth:`_admitted`) and a hashing slot is free; and ``user``'s failures in a row after it."""
        self._admitted(user, now)
        matched: bool | None = None  # None: not checked (busy), which is no failure
        try:
            if not self._checking.acquire(timeout=CHECK_WAIT):
                raise ServerBusy("busy: too many sign-ins are being checked at once; retry shortly")
            try:
                matched = password_matches(stored, password)
            finally:
                self._checking.release()
        finally:
            failures = self.throttle.done(user, now, matched)
        return bool(matched), failures

    def forget(self, name: str) -> None:
        """A removed user's failures."""
        self.throttle.forget(name)
