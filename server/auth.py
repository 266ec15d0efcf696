"""Who may call what, and how many streams at once: a middleware on every RPC.

With a cluster secret (or only its verify key, on a node), every call must carry
``authorization: Bearer <token>``: the secret itself (the owner: every right,
where the daemon holds the secret), a role token signed with it (reader,
writer, admin, node) or a read capability for one dataset version (see
:mod:`flightpart.tokens`). Tokens are verified here, without asking
anyone; a call without a valid one fails with ``UNAUTHENTICATED`` before any
handler runs, so it learns nothing of the datasets. Handlers then ask
:func:`authorize` whether the caller's credential allows what it asks
(``FORBIDDEN`` otherwise). ``do_get`` and ``do_put`` count as open streams;
past the configured maximum a new one is refused as ``BUSY`` (retryable).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from flightpart.errors import Forbidden, ServerBusy, Unauthenticated
from flightpart.tokens import CAPABILITY, CATALOG_NODE, Credential, Keys, verify_token
from flightpart.wire import encode_error

from .telemetry import Call, Telemetry

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


class GuardFactory(flight.ServerMiddlewareFactory):
    """Authentication and stream accounting for one server."""

    def __init__(self, secret: Keys | None = None, max_streams: int | None = None, telemetry: Telemetry | None = None):
        super().__init__()
        self.telemetry = telemetry or Telemetry()
        self.secret = secret
        self.max_streams = max_streams
        self.open_streams = 0
        self._lock = threading.Lock()

    def authenticate(self, headers: dict) -> Credential:
        if self.secret is None:
            return OWNER
        for value in _header(headers, "authorization"):
            if value.startswith("Bearer "):
                credential = verify_token(self.secret, value[len("Bearer "):], time.time())
                if credential is not None:
                    return credential
        self.telemetry.refused("unauthenticated")
        refusal = Unauthenticated("a valid flightpart token is required (it may have expired)")
        raise flight.FlightUnauthenticatedError(refusal.message, extra_info=encode_error(refusal))

    def start_call(self, info: Any, headers: dict) -> CallGuard:
        credential = self.authenticate(headers)
        if info.method not in STREAM_METHODS:
            return CallGuard(self, credential, stream=False)
        with self._lock:
            if self.max_streams is not None and self.open_streams >= self.max_streams:
                self.telemetry.refused("busy")
                busy = ServerBusy(f"busy: {self.open_streams} streams open, the limit; retry shortly")
                raise flight.FlightUnavailableError(busy.message, extra_info=encode_error(busy))
            self.open_streams += 1
        return CallGuard(self, credential, stream=True)

    @property
    def refused(self) -> int:
        """Calls this guard refused before any handler ran (a bad token, the stream limit)."""
        counts = self.telemetry.refusals()
        return counts.get("unauthenticated", 0) + counts.get("busy", 0)

    def release(self) -> None:
        with self._lock:
            self.open_streams -= 1


class CallGuard(flight.ServerMiddleware):
    """One call's credential (and its stream slot, released when the call ends)."""

    def __init__(self, factory: GuardFactory, credential: Credential, *, stream: bool):
        super().__init__()
        self.factory = factory
        self.credential = credential
        self.stream = stream
        self._finish: tuple[Telemetry, Call] | None = None

    def finish_with(self, telemetry: Telemetry, call: Call) -> None:
        """Record ``call`` when the stream completes (its handler returned before the data was sent)."""
        self._finish = (telemetry, call)

    def call_completed(self, exception: Any) -> None:
        if self.stream:
            self.factory.release()
        if self._finish is not None:
            telemetry, call = self._finish
            self._finish = None
            telemetry.finish(call, exception)


def credential_of(context: Any) -> Credential:
    """The credential the current call was made with (the owner when the server has no secret)."""
    guard = context.get_middleware("guard") if context is not None else None
    return guard.credential if guard is not None else OWNER


def authorize(context: Any, permission: str, scope: tuple[str, int] | None = None) -> Credential:
    """The caller's credential if it allows ``permission`` (on ``scope`` for a capability), else ``FORBIDDEN``."""
    credential = credential_of(context)
    if credential.role in GRANTS[permission]:
        return credential
    if permission == "catalog" and credential.role == "node" and credential.name == CATALOG_NODE:
        return credential
    if credential.role == CAPABILITY and ((permission == "read" and scope is not None and scope == credential.scope)
                                          or permission == "locate"):
        return credential
    what = f"{credential.role} {credential.name}" if credential.role != CAPABILITY else f"a capability for {credential.name}"
    raise Forbidden(f"{what} may not {permission}" + (f" {scope[0]} v{scope[1]}" if scope else ""), field="authorization")


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
