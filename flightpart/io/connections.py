"""Reused Flight connections, and JSON actions over them: one ``FlightClient`` per URI in a pool per
:class:`~flightpart.io.access.Access`, since opening a channel costs a round trip or more."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow.flight as flight

from flightpart.errors import ClientClosed, ServerError, ServerStarting
from flightpart.tokens import GRANT_HEADER
from flightpart.wire import Message, decode_error

from .access import Access

DEFAULT_TIMEOUT = 30.0
STARTING_PATIENCE = 10.0
"""Seconds an action keeps retrying a daemon that answers ``STARTING`` (its port open, its state not built yet)."""


def starting(exc: flight.FlightError) -> bool:
    """True when ``exc`` says the daemon is still starting (code ``STARTING``)."""
    decoded = decode_error(getattr(exc, "extra_info", None))
    return decoded is not None and decoded[0] == ServerStarting.code


class ConnectionPool:
    """One ``FlightClient`` per URI, shared across threads; refuses work once closed."""

    def __init__(self, access: Access | None = None):
        self.access = access or Access()
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def client(self, uri: str) -> flight.FlightClient:
        with self._lock:
            if self._closed:
                raise ClientClosed("this client is closed; open a new one with fp.connect(...)")
            existing = self._clients.get(uri)
            if existing is None:
                existing = flight.FlightClient(uri, **self.access.client_kwargs())
                self._clients[uri] = existing
            return existing

    def options(self, timeout: float | None = DEFAULT_TIMEOUT, grant: str | None = None) -> flight.FlightCallOptions:
        """Call options: ``timeout``, this pool's credential and, for a writer's put or order, the catalog's ``grant``
        (:func:`~flightpart.tokens.version_grant`)."""
        headers = self.access.headers()
        if grant is not None:
            headers = [*headers, (GRANT_HEADER.encode(), grant.encode())]
        return flight.FlightCallOptions(timeout=timeout, headers=headers)

    def action(self, uri: str, body: Message, *, timeout: float | None = DEFAULT_TIMEOUT,
               grant: str | None = None) -> Any:
        """Send ``body`` as the action its class names; returns the reply its class names, decoded and checked."""
        name, reply = body.ACTION, body.REPLY
        if not name or reply is None:
            raise TypeError(f"{type(body).__name__} is not an action's request (it names no action or no reply)")
        payload = body.encode()
        give_up, delay = time.monotonic() + STARTING_PATIENCE, 0.02
        while True:
            try:
                results = list(self.client(uri).do_action(flight.Action(name, payload),
                                                          options=self.options(timeout, grant)))
                break
            except flight.FlightUnavailableError as exc:  # a daemon still starting ran nothing: asking again is safe
                if not starting(exc) or time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        if not results:
            raise ServerError(f"{uri} answered {name} with nothing")
        return reply.decode(results[0].body.to_pybytes(), f"reply to {name}")

    def connected(self) -> set[str]:
        """The URIs this pool holds an open connection to."""
        with self._lock:
            return set(self._clients)

    def discard(self, uri: str) -> None:
        """Forget a connection that failed, so the next call dials again."""
        with self._lock:
            stale = self._clients.pop(uri, None)
        _close_quietly(stale)

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection; later calls raise :class:`~flightpart.errors.ClientClosed`."""
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            _close_quietly(c)


def _close_quietly(client: flight.FlightClient | None) -> None:
    if client is None:
        return
    try:
        client.close()
    except Exception:  # already broken: nothing left to release
        pass


_shared: dict[Access, ConnectionPool] = {}
_shared_lock = threading.Lock()


def shared_pool(access: Access) -> ConnectionPool:
    """The process-wide pool for one access, used by picklable ``get`` objects (never closed)."""
    with _shared_lock:
        pool = _shared.get(access)
        if pool is None:
            pool = _shared[access] = ConnectionPool(access)
        return pool
