"""Reused Flight connections and JSON actions over them.

Opening a gRPC channel costs a round trip or more; every component (client,
``get``, node heartbeats, catalog checks) keeps one ``FlightClient`` per URI
in a pool and calls actions through :meth:`ConnectionPool.action`.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow.flight as flight

from .wire import dumps, loads

DEFAULT_TIMEOUT = 30.0


class ConnectionPool:
    """One ``FlightClient`` per URI, shared across threads."""

    def __init__(self, *, token: str | None = None, tls_root_certs: bytes | None = None,
                 cert_chain: bytes | None = None, private_key: bytes | None = None):
        self.token = token
        self._tls = {k: v for k, v in (("tls_root_certs", tls_root_certs), ("cert_chain", cert_chain), ("private_key", private_key)) if v}
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()

    def client(self, uri: str) -> flight.FlightClient:
        with self._lock:
            existing = self._clients.get(uri)
            if existing is None:
                existing = flight.FlightClient(uri, **self._tls)
                self._clients[uri] = existing
            return existing

    def options(self, timeout: float | None = DEFAULT_TIMEOUT) -> flight.FlightCallOptions:
        headers = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []
        return flight.FlightCallOptions(timeout=timeout, headers=headers)

    def action(self, uri: str, name: str, body: Any = None, *, timeout: float | None = DEFAULT_TIMEOUT) -> Any:
        """Run an action whose body and first result are JSON."""
        payload = dumps(body) if body is not None else b""
        results = list(self.client(uri).do_action(flight.Action(name, payload), options=self.options(timeout)))
        return loads(results[0].body.to_pybytes(), f"reply to {name}") if results else None

    def discard(self, uri: str) -> None:
        """Forget a connection that failed, so the next call dials again."""
        with self._lock:
            stale = self._clients.pop(uri, None)
        if stale is not None:
            try:
                stale.close()
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                c.close()
            except Exception:
                pass


_shared: dict[tuple, ConnectionPool] = {}
_shared_lock = threading.Lock()


def client_certificate() -> tuple[bytes | None, bytes | None]:
    """This process's client certificate and key for mutual TLS, from the environment."""
    import os
    from pathlib import Path

    cert, key = os.environ.get("FLIGHTPART_TLS_CERT"), os.environ.get("FLIGHTPART_TLS_KEY")
    return (Path(cert).read_bytes() if cert else None, Path(key).read_bytes() if key else None)


def shared_pool(token: str | None = None, tls_root_certs: bytes | None = None) -> ConnectionPool:
    """The process-wide pool for a token and CA, used by picklable ``get`` objects.

    The client certificate for mutual TLS is this process's own
    (``$FLIGHTPART_TLS_CERT`` / ``$FLIGHTPART_TLS_KEY``): a private key never
    travels inside a pickled ``get``.
    """
    key = (token, tls_root_certs)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None:
            cert, private = client_certificate() if tls_root_certs else (None, None)
            pool = _shared[key] = ConnectionPool(token=token, tls_root_certs=tls_root_certs, cert_chain=cert, private_key=private)
        return pool
