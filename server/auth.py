"""Who may call what, and how many streams at once: a middleware on every RPC.

With a cluster secret (or its verify key, on a node), every call carries ``authorization: Bearer <token>``: the
secret (the owner), a role token signed with it, or a read capability for one version (:mod:`flightpart.tokens`).
Tokens are verified here; a call without a valid one fails ``UNAUTHENTICATED`` before any handler runs.
Handlers ask :func:`authorize` (``FORBIDDEN`` otherwise). ``do_get`` and ``do_put`` count as open streams;
past the maximum a new one is ``BUSY`` (retryable).

One caller (credential name and peer IP) holds at most half of the streams, and a stream idle for the idle
timeout loses its slot, so idle streams cannot lock others out.

Expiry is judged by the catalog's clock: a node's own clock less the skew measured from each heartbeat's answer
(:meth:`GuardFactory.now`), with :data:`CLOCK_MARGIN` seconds of grace.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.flight as flight

from flightpart.errors import FlightpartError, Forbidden, NodeUnavailable, ServerBusy, Unauthenticated
from flightpart.grants import ANY_IDP_HOLDER, IDP_HOLDER_PREFIX, Revocation, voided
from flightpart.tokens import (
    CAPABILITY,
    CATALOG_NODE,
    GRANT_HEADER,
    Credential,
    Keys,
    outdated_format,
    verify_key,
    verify_token,
)
from flightpart.wire import encode_error

from .audit import audit
from .telemetry import Call, Telemetry

log = logging.getLogger("flightpart.auth")

CLOCK_MARGIN_ENV = "FLIGHTPART_CLOCK_MARGIN"
"""Overrides :data:`CLOCK_MARGIN` (seconds, 0 or more) for every daemon started with it."""

CLOCK_OFFSET_ENV = "FLIGHTPART_TEST_CLOCK_OFFSET"
"""A test hook: seconds added to this daemon's wall clock (a node whose clock is wrong, without root)."""


def _seconds_from_env(name: str, default: float, minimum: float | None = None) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"${name}: expected seconds as a number, got {raw!r}") from None
    if minimum is not None and not value >= minimum:
        raise ValueError(f"${name}: expected at least {minimum:g} seconds, got {raw!r}")
    return value


CLOCK_MARGIN = _seconds_from_env(CLOCK_MARGIN_ENV, 30.0, minimum=0.0)
"""Seconds a token or capability is still honoured after its expiry by the catalog's time as this daemon knows it
(default 30). It leans towards serving: it covers what that knowledge lacks (a node before its first heartbeat's
answer, a clock that stepped since the last), and the price is that an expired one may be served at most this late.
Clocks further apart than this are logged by the catalog (it compares every heartbeat's clock with its own) and
shown on the status page."""

_CLOCK_OFFSET = _seconds_from_env(CLOCK_OFFSET_ENV, 0.0)

CLOCK_SAMPLES = 8
"""Heartbeat answers a node keeps the catalog's clock from; the one with the shortest round trip sets its skew."""


def wall_clock() -> float:
    """This daemon's idea of the Unix time: what expiry is checked against and what heartbeats report."""
    return time.time() + _CLOCK_OFFSET

WHOLE_STREAM_RATE = 4 << 20
"""Bytes per second a reader of a stream sent whole is assumed to take at least: nothing marks such a stream's
progress, so its slot is kept that long before the idle timeout starts (:meth:`GuardFactory.sent_whole`)."""
WHOLE_STREAM_MOST_SECONDS = 60.0
"""The most time a stream sent whole is given that way, however large: a partition with dictionary columns is sent
whole at any size, and 1 GiB at 4 MB/s would otherwise hold its slot some four minutes before the idle timeout."""
STREAM_METHODS = (flight.FlightMethod.DO_GET, flight.FlightMethod.DO_PUT, flight.FlightMethod.DO_EXCHANGE)
OWNER = Credential("owner", "owner")

GRANTS = {
    "read": {"reader", "writer", "admin", "node", "owner"},
    "locate": {"reader", "writer", "admin", "node", "owner"},
    "write": {"writer", "admin", "owner"},
    "admin": {"admin", "owner"},
    "node": {"node", "owner"},
    "catalog": {"owner"},
}
"""Which roles hold each permission. A capability holds "read" for its one version, and "locate"
(a node's identity and data directory, which a reader on the node's host needs to map files).
"catalog" (a node ordered to drop, seal or copy) is held by the owner and by the catalog's own node
token (named ``catalog``): another node's token may not order a node around."""


def _header(headers: dict, name: str) -> list[str]:
    values = headers.get(name) or headers.get(name.encode()) or []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


class Sessions(Protocol):
    """What a catalog adds to its guard: users' sign-in and their credentials' current standing
    (:class:`~flightpart.server.catalog.access.AccessControl`)."""

    def sign_in(self, basic: str) -> tuple[Credential, str]:
        """The credential and a session token for ``Basic`` credentials (base64 ``user:password``), or
        :class:`Unauthenticated`."""
        ...

    def federated(self, token: str) -> tuple[Credential, str] | None:
        """An identity provider's token's credential and a session token for it; None when ``token`` is no such
        token; :class:`Unauthenticated` when it is one that fails."""
        ...

    def current(self, credential: Credential) -> Credential:
        """``credential`` as it stands now (a user's present role), or :class:`Unauthenticated` once withdrawn."""
        ...


class Revoked:
    """The revocations a daemon enforces (:mod:`flightpart.grants`), by holder; a node's are set by its catalog."""

    def __init__(self) -> None:
        self._by_holder: dict[str, tuple[Revocation, ...]] = {}

    def set(self, entries: tuple[Revocation, ...]) -> None:
        by_holder: dict[str, list[Revocation]] = {}
        for entry in entries:
            by_holder.setdefault(entry.holder, []).append(entry)
        self._by_holder = {holder: tuple(found) for holder, found in by_holder.items()}

    def voids(self, credential: Credential) -> bool:
        """Whether a revocation voids ``credential`` (a capability for its dataset; anything else as a session)."""
        if not credential.holder:
            return False
        found = self._by_holder.get(credential.holder, ())
        if credential.holder.startswith(IDP_HOLDER_PREFIX):
            found += self._by_holder.get(ANY_IDP_HOLDER, ())
        if not found:
            return False
        scope = credential.scope
        return voided(found, credential.holder, scope[0] if scope else None, credential.issued)


class GuardFactory(flight.ServerMiddlewareFactory):
    """Authentication and stream accounting for one server."""

    def __init__(self, secret: Keys | None = None, max_streams: int | None = None, telemetry: Telemetry | None = None,
                 stream_idle_timeout: float | None = None):
        super().__init__()
        self.telemetry = telemetry or Telemetry()
        self.secret = secret
        if isinstance(secret, bytes):
            verify_key(secret)  # the key's one slow derivation, at start and not in a caller's first call
        self.max_streams = max_streams
        self.stream_idle_timeout = stream_idle_timeout
        self.open_streams = 0
        self._lock = threading.Lock()
        self._by_caller: dict[str, int] = {}
        self._watched: set[CallGuard] = set()
        self.sessions: Sessions | None = None  # a catalog's users (set by it)
        self.revoked = Revoked()
        self.clock_skew = 0.0
        self._clock_samples: deque[tuple[float, float]] = deque(maxlen=CLOCK_SAMPLES)  # (round trip, skew)
        """Seconds this daemon's clock runs ahead of its catalog's, as last heard (:meth:`heard_catalog_clock`); 0
        until then, and on a catalog, whose clock is the cluster's."""
        if stream_idle_timeout is not None:
            threading.Thread(target=_watch_idle_streams, args=(weakref.ref(self), stream_idle_timeout),
                             name="flightpart-idle-streams", daemon=True).start()

    def now(self) -> float:
        """The catalog's time as this daemon knows it (its clock less the skew last heard); expiry is judged on it."""
        return wall_clock() - self.clock_skew

    def heard_catalog_clock(self, sent: float, received: float, catalog: float) -> None:
        """Note the catalog's clock (``catalog``) from the answer to a heartbeat sent at ``sent`` and answered at
        ``received`` (:func:`wall_clock`). The catalog read it in between, so the midpoint less it is off by at most
        half the round trip; the skew kept is the shortest round trip's among the last :data:`CLOCK_SAMPLES`.
        One thread calls it."""
        if received < sent:
            return
        self._clock_samples.append((received - sent, (sent + received) / 2 - catalog))
        self.clock_skew = round(min(self._clock_samples)[1], 3)

    def authenticate(self, headers: dict) -> tuple[Credential, str | None]:
        """The caller's credential, and a session token to send back when it signed in with this call (a user's
        name and password, or an identity provider's token); ``UNAUTHENTICATED`` otherwise."""
        if self.secret is None:
            return OWNER, None
        outdated = None
        try:
            for value in _header(headers, "authorization"):
                if value.startswith("Basic ") and self.sessions is not None:
                    return self.sessions.sign_in(value[len("Basic "):])
                if value.startswith("Bearer "):
                    token = value[len("Bearer "):]
                    credential = verify_token(self.secret, token, self.now(), CLOCK_MARGIN)
                    if credential is not None:
                        return self.standing(credential), None
                    federated = self.sessions.federated(token) if self.sessions is not None else None
                    if federated is not None:
                        return self.standing(federated[0]), federated[1]
                    outdated = outdated or outdated_format(token)
        except Unauthenticated as refused:
            self.telemetry.refused("unauthenticated")
            raise flight.FlightUnauthenticatedError(refused.message, extra_info=encode_error(refused)) from None
        except NodeUnavailable as busy:  # a sign-in that waited too long for its turn, the state out of reach
            self.telemetry.refused("busy")
            raise flight.FlightUnavailableError(busy.message, extra_info=encode_error(busy)) from None
        except FlightpartError as failed:  # no traceback, whatever the state said
            raise flight.FlightServerError(failed.message, extra_info=encode_error(failed)) from None
        self.telemetry.refused("unauthenticated")
        refusal = Unauthenticated("a valid flightpart token is required (it may have expired)" + (
            f"; this one is an {outdated} token, signed with an earlier release's key: mint it again with "
            "`flightpart token`" if outdated else ""))
        raise flight.FlightUnauthenticatedError(refusal.message, extra_info=encode_error(refusal))

    def standing(self, credential: Credential) -> Credential:
        """``credential`` as it stands now: :class:`Unauthenticated` once a revocation voids it (or, on a catalog,
        its user is gone); a user's present role on a catalog."""
        if self.sessions is not None:
            return self.sessions.current(credential)
        if self.revoked.voids(credential):
            audit(self.telemetry, "call", False, credential, why="revoked")
            raise Unauthenticated("this credential was revoked (its user removed, a grant or the token withdrawn): "
                                  "sign in again, or ask an admin", field="authorization")
        return credential

    def start_call(self, info: Any, headers: dict) -> CallGuard:
        credential, session = (OWNER, None) if self.secret is None else self.authenticate(headers)
        if info.method not in STREAM_METHODS:
            guard = CallGuard(self, credential, stream=False, grant=self._grant(credential, headers))
            guard.session = session
            return guard
        with self._lock:
            if self.max_streams is not None and self.open_streams >= self.max_streams:
                self.telemetry.refused("busy")
                busy = ServerBusy(f"busy: {self.open_streams} streams open, the limit; retry shortly")
                raise flight.FlightUnavailableError(busy.message, extra_info=encode_error(busy))
            self.open_streams += 1
        writes = info.method == flight.FlightMethod.DO_PUT
        guard = CallGuard(self, credential, stream=True, writes=writes,
                          grant=self._grant(credential, headers) if writes else None)
        guard.session = session
        return guard

    @staticmethod
    def _grant(credential: Credential, headers: dict) -> str | None:
        """A writer's version grant (:data:`~flightpart.tokens.GRANT_HEADER`), checked when a handler needs it."""
        if credential.role not in ("writer", "admin") or (credential.role == "admin" and not credential.user):
            return None
        values = _header(headers, GRANT_HEADER)
        return values[0] if values else None

    @property
    def refused(self) -> int:
        """Calls this guard refused before any handler ran (a bad token, the stream limit)."""
        counts = self.telemetry.refusals()
        return counts.get("unauthenticated", 0) + counts.get("busy", 0)

    def caller_share(self) -> int | None:
        """How many streams one caller may hold: half of the limit (at least one), so others always find room."""
        return None if self.max_streams is None else max(1, self.max_streams // 2)

    def admit(self, guard: CallGuard | None, peer: str) -> None:
        """Count this stream against its caller (credential name + peer IP); ``BUSY`` past the caller's share."""
        if guard is None or not guard.stream:
            return
        caller = f"{guard.credential.role}:{guard.credential.name}@{peer_ip(peer)}"
        share = self.caller_share()
        with self._lock:
            held = self._by_caller.get(caller, 0)
            if share is not None and held >= share:  # counted as refused by the handler's boundary
                raise ServerBusy(f"busy: this caller already holds {held} streams, its share of {self.max_streams}; "
                                 "retry shortly")
            self._by_caller[caller] = held + 1
            guard.caller = caller
            guard.last_progress = time.monotonic()
            if self.stream_idle_timeout is not None:
                self._watched.add(guard)

    def watch(self, guard: CallGuard | None, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, noting each time the reader takes one; once the stream lost its slot for idling, an error."""
        for batch in batches:
            if guard is not None:
                if guard.credential.holder and self.revoked.voids(guard.credential):
                    refused = Unauthenticated("stream cut: its credential was revoked while it was sent",
                                              field="authorization")
                    raise flight.FlightUnauthenticatedError(refused.message, extra_info=encode_error(refused))
                if guard.timed_out:
                    cancelled = NodeUnavailable("stream cancelled: its reader took nothing for "
                                                f"{self.stream_idle_timeout:g} s")
                    raise flight.FlightUnavailableError(cancelled.message, extra_info=encode_error(cancelled))
                guard.last_progress = time.monotonic()
            yield batch

    def received(self, guard: CallGuard | None, messages: Iterator[Any]) -> Iterator[Any]:
        """A put's ``messages``, each noted as progress: an idle writer loses its slot but its call goes on."""
        for message in messages:
            if guard is not None:
                guard.last_progress = time.monotonic()
            yield message

    def sent_whole(self, guard: CallGuard | None, nbytes: int) -> None:
        """``guard``'s stream goes to Arrow whole (``nbytes``): its reader gets the time :data:`WHOLE_STREAM_RATE`
        needs (at most :data:`WHOLE_STREAM_MOST_SECONDS`) before the idle timeout runs."""
        if guard is not None:
            guard.last_progress = time.monotonic() + min(nbytes / WHOLE_STREAM_RATE, WHOLE_STREAM_MOST_SECONDS)
            guard.whole = True

    def free_idle_streams(self) -> None:
        """Free the slots of streams idle for the idle timeout."""
        timeout = self.stream_idle_timeout
        assert timeout is not None
        now = time.monotonic()
        with self._lock:
            idle = [g for g in self._watched if now - g.last_progress > timeout]
            freed = [g for g in idle if self._free_slot(g, timed_out=True)]
        for guard in freed:
            if guard.whole:
                log.warning("freed the stream slot of %s: its stream, sent whole, was not done %g s after a reader "
                            "taking %d MB/s would have been (a large one is given at most %g s)", guard.caller, timeout,
                            WHOLE_STREAM_RATE // 1_000_000, WHOLE_STREAM_MOST_SECONDS)
            elif guard.writes:
                log.warning("freed the stream slot of %s: its put sent nothing for %g s", guard.caller, timeout)
            else:
                log.warning("freed the stream slot of %s: its reader took nothing for %g s", guard.caller, timeout)

    def _free_slot(self, guard: CallGuard, *, timed_out: bool = False) -> bool:
        """Give back ``guard``'s slot of :attr:`max_streams` (once); called with the lock held."""
        if not guard.holds_slot:
            return False
        guard.holds_slot = False
        guard.timed_out = timed_out
        self.open_streams -= 1
        self._watched.discard(guard)
        return True

    def release(self, guard: CallGuard) -> None:
        """The call ended: its slot (unless the idle watchdog freed it already) and its place in its caller's share.

        A stream freed for idling counts against its caller's share until the call ends, so a reader cannot pile
        up unread calls by waiting out the idle timeout."""
        with self._lock:
            self._free_slot(guard)
            if guard.caller is not None:
                left = self._by_caller.get(guard.caller, 0) - 1
                if left > 0:
                    self._by_caller[guard.caller] = left
                else:
                    self._by_caller.pop(guard.caller, None)
                guard.caller = None


def _watch_idle_streams(factory: weakref.ReferenceType[GuardFactory], timeout: float) -> None:
    """The idle watchdog's loop; it ends with its guard (a weak reference, so a stopped server is not kept)."""
    while True:
        time.sleep(min(1.0, timeout / 4))
        guard = factory()
        if guard is None:
            return
        guard.free_idle_streams()
        del guard


@functools.lru_cache(maxsize=1024)
def peer_ip(peer: str | bytes) -> str:
    """The IP of a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    text = peer.decode() if isinstance(peer, bytes) else str(peer)
    _, _, address = text.partition(":")
    host = (address or text).rsplit(":", 1)[0]
    return host.strip("[]")


class CallGuard(flight.ServerMiddleware):
    """One call's credential (and its stream slot, released when the call ends)."""

    __slots__ = ("factory", "credential", "grant", "stream", "writes", "caller", "holds_slot", "last_progress", "whole",
                 "timed_out", "session", "_finish")

    def __init__(self, factory: GuardFactory, credential: Credential, *, stream: bool, writes: bool = False,
                 grant: str | None = None):
        super().__init__()
        self.factory = factory
        self.credential = credential
        self.grant = grant                    # a writer's version grant, as sent (see require_version_grant)
        self.stream = stream
        self.writes = writes                  # a put: its progress is what its writer sends (GuardFactory.received)
        self.caller: str | None = None       # set when the handler admits the stream (see GuardFactory.admit)
        self.holds_slot = stream              # until the call ends, or the idle watchdog frees it
        self.last_progress = time.monotonic()
        self.whole = False                    # sent whole: progress is not seen (GuardFactory.sent_whole)
        self.timed_out = False
        self.session: str | None = None      # a session token this call signed in for, sent back in its headers
        self._finish: tuple[Telemetry, Call] | None = None

    def sending_headers(self) -> dict[str, str]:
        """A sign-in's answer: the session token (``authorization: Bearer``), as Flight's basic-token handshake
        expects."""
        return {"authorization": f"Bearer {self.session}"} if self.session is not None else {}

    def finish_with(self, telemetry: Telemetry, call: Call) -> None:
        """Record ``call`` when the stream completes (its handler returned before the data was sent)."""
        self._finish = (telemetry, call)

    def call_completed(self, exception: Any) -> None:
        if self.stream:
            self.factory.release(self)
        if self._finish is not None:
            telemetry, call = self._finish
            self._finish = None
            telemetry.finish(call, exception)


class Handshake(flight.ServerAuthHandler):
    """Flight's handshake, answered: a catalog's sign-in happens in its guard (``authorization: Basic``, or an
    identity provider's bearer token), whose answer carries the session token in its headers; this handler only lets
    the handshake through and leaves every call's check to the guard."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        pass

    def is_valid(self, token: bytes) -> str:
        return ""


def guard_of(context: Any) -> CallGuard | None:
    """The current call's guard (None for an in-process call, which has no context)."""
    return context.get_middleware("guard") if context is not None else None


def credential_of(context: Any) -> Credential:
    """The credential the current call was made with (the owner when the server has no secret)."""
    guard = guard_of(context)
    return guard.credential if guard is not None else OWNER


def require_version_grant(guard: CallGuard | None, dataset: str, version: int, what: str,
                          grant: str | None = None) -> None:
    """``FORBIDDEN`` unless a writer's (or any user's) call carries the catalog's grant for ``dataset`` v``version``,
    made out to it (decision 0015): its header's, or ``grant`` for a second version it reads. Other callers need
    none."""
    if (guard is None or (guard.credential.role != "writer" and not guard.credential.user)
            or guard.factory.secret is None):
        return
    shown = grant if grant is not None else guard.grant
    granted = None if shown is None else verify_token(guard.factory.secret, shown, guard.factory.now(), CLOCK_MARGIN)
    if granted is None or granted.begun_scope != (dataset, version, guard.credential.name):
        said = "carries no grant" if shown is None else "carries a grant that is not for it (or expired)"
        raise Forbidden(f"writer {guard.credential.name}'s {what} of {dataset} v{version} {said}: a writer writes "
                        "only versions it began, with the grant the catalog gave it (fp.connect(...).put begins one)",
                        field="authorization")


def admit_stream(context: Any, peer: str | None = None) -> CallGuard | None:
    """This ``do_get``'s or ``do_put``'s guard, once its caller's share allows one more stream (``BUSY``
    otherwise); ``peer``: the caller's gRPC peer when the handler has it already."""
    guard = guard_of(context)
    if guard is not None:
        guard.factory.admit(guard, context.peer() if peer is None else peer)
    return guard


def authorize(context: Any, permission: str, scope: tuple[str, int] | None = None) -> Credential:
    """The caller's credential if it allows ``permission`` (on ``scope`` for a capability), else ``FORBIDDEN``. A
    user's session reads no rows at a node (a read with a ``scope``): only the capability their open gave does."""
    credential = credential_of(context)
    if credential.user and permission == "read" and scope is not None:
        raise Forbidden(f"user {credential.name} reads {scope[0]} v{scope[1]} from a node with the capability their "
                        "open of it gave (the dataset's handles carry it), not with their session: a user's grants "
                        "are the catalog's to check", field="authorization")
    if credential.role in GRANTS[permission]:
        return credential
    if permission == "catalog" and credential.role == "node" and credential.name == CATALOG_NODE:
        return credential
    if credential.role == CAPABILITY and ((permission == "read" and scope is not None and scope == credential.scope)
                                          or permission == "locate"):
        return credential
    what = (f"{credential.role} {credential.name}" if credential.role != CAPABILITY
            else f"a capability for {credential.name}")
    raise Forbidden(f"{what} may not {permission}" + (f" {scope[0]} v{scope[1]}" if scope else ""),
                    field="authorization")


def tls_server_options(cert: str | None, key: str | None, client_ca: str | None) -> dict:
    """FlightServerBase keyword arguments for TLS (and mutual TLS with a client CA)."""
    if not cert and not key and not client_ca:
        return {}
    if not (cert and key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    options: dict = {"tls_certificates": [(Path(cert).read_bytes(), Path(key).read_bytes())]}
    if client_ca:
        options.update(verify_client=True, root_certificates=Path(client_ca).read_bytes())
    return options
