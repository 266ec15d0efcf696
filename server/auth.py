"""Who may call, and how many streams at once: a middleware on every RPC.

Every call must carry ``authorization: Bearer <token>`` when the daemon has
a token (compared in constant time); a call without it fails with
``UNAUTHENTICATED`` before any handler runs, so it learns nothing of the
datasets. ``do_get`` and ``do_put`` count as open streams; past the
configured maximum a new one is refused as ``BUSY`` (retryable) instead of
exhausting memory.
"""

from __future__ import annotations

import hmac
import threading
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from flightpart.errors import ServerBusy, Unauthenticated
from flightpart.wire import encode_error

STREAM_METHODS = (flight.FlightMethod.DO_GET, flight.FlightMethod.DO_PUT, flight.FlightMethod.DO_EXCHANGE)


def _header(headers: dict, name: str) -> list[str]:
    values = headers.get(name) or headers.get(name.encode()) or []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


class GuardFactory(flight.ServerMiddlewareFactory):
    """Token check and stream accounting for one server."""

    def __init__(self, token: str | None = None, max_streams: int | None = None):
        super().__init__()
        self._expected = f"Bearer {token}".encode() if token else None
        self.max_streams = max_streams
        self.open_streams = 0
        self.refused = 0
        self._lock = threading.Lock()

    def start_call(self, info: Any, headers: dict) -> "StreamGuard | None":
        if self._expected is not None:
            given = _header(headers, "authorization")
            if not any(hmac.compare_digest(v.encode(), self._expected) for v in given):
                with self._lock:
                    self.refused += 1
                refusal = Unauthenticated("a valid flightpart token is required")
                raise flight.FlightUnauthenticatedError(refusal.message, extra_info=encode_error(refusal))
        if info.method not in STREAM_METHODS:
            return None
        with self._lock:
            if self.max_streams is not None and self.open_streams >= self.max_streams:
                self.refused += 1
                busy = ServerBusy(f"busy: {self.open_streams} streams open, the limit; retry shortly")
                raise flight.FlightUnavailableError(busy.message, extra_info=encode_error(busy))
            self.open_streams += 1
        return StreamGuard(self)

    def release(self) -> None:
        with self._lock:
            self.open_streams -= 1


class StreamGuard(flight.ServerMiddleware):
    def __init__(self, factory: GuardFactory):
        super().__init__()
        self.factory = factory

    def call_completed(self, exception: Any) -> None:
        self.factory.release()


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


def read_token(token_file: str | None, token: str | None) -> str | None:
    """The shared token from a file (first line) or the environment's value."""
    if token_file:
        lines = Path(token_file).read_text().strip().splitlines()
        value = lines[0].strip() if lines else ""
        if not value:
            raise ValueError(f"{token_file}: the token file is empty")
        return value
    return token or None
