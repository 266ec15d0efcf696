"""Following the leading catalog: one address for a cluster whose catalogs share a lease.

Calls go to the catalog believed to lead. Only a standby's NOT_LEADER (go to the leader it names) and no answer
(go to the next address) are retried; an unanswered call may have been done, so writes check
(:func:`unanswered`). Any other answer, errors included, is the leader's and is returned as it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import pyarrow.flight as flight

from flightpart.errors import NotLeader, ServerStarting
from flightpart.wire import decode_error

from .errors import translate

T = TypeVar("T")

FAILOVER_WAIT = 15.0
"""Seconds a call waits for a leader when every address fails or none leads yet (a takeover takes about the
lease, 3 s by default)."""

_NO_ANSWER = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightCancelledError, ConnectionError)


def split_addresses(text: str) -> list[str]:
    """``grpc://a:8815,grpc://b:8815`` as a list (blanks dropped); one address is a list of one."""
    return [part.strip() for part in text.split(",") if part.strip()]


class CatalogAddresses:
    """The catalogs of one cluster; :meth:`call` runs a call at the leader, following it when it moves."""

    def __init__(self, uris: Sequence[str], *, wait: float = FAILOVER_WAIT):
        if not uris:
            raise ValueError("no catalog address")
        self.uris = list(dict.fromkeys(uris))
        self.wait = wait
        self._current = self.uris[0]
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        """The address calls go to now: the leader as last heard of."""
        return self._current

    def follow(self, uri: str) -> None:
        """Send calls to ``uri`` from now on."""
        with self._lock:
            self._current = uri

    def _next(self, failed: str) -> None:
        with self._lock:
            if self._current == failed:
                known = self.uris if failed in self.uris else [failed, *self.uris]
                self._current = known[(known.index(failed) + 1) % len(known)]

    def __str__(self) -> str:
        return ",".join(self.uris)

    def call(self, fn: Callable[[str], T]) -> T:
        """``fn(address)`` at the leader, following NOT_LEADER and passing unanswering addresses until one leads or
        :attr:`wait` seconds pass; errors are raised as flightpart's own."""
        deadline = time.monotonic() + self.wait
        pause = 0.05
        while True:
            uri = self._current
            try:
                return fn(uri)
            except BaseException as exc:
                error = translate(exc) if isinstance(exc, (flight.FlightError, ConnectionError, OSError)) else exc
                if isinstance(error, NotLeader) or (isinstance(error, ServerStarting) and len(self.uris) > 1):
                    if error.field and error.field != uri:
                        self.follow(error.field)
                        continue  # the leader is named: go at once
                    self._next(uri)
                elif len(self.uris) > 1 and unanswered(exc):
                    self._next(uri)
                else:
                    _raise(error, exc)
                if time.monotonic() + pause > deadline:
                    _raise(error, exc)
            time.sleep(pause)
            pause = min(pause * 2, 0.4)


def _raise(error: BaseException, original: BaseException) -> None:
    if error is original:
        raise original
    raise error from original


def unanswered(exc: BaseException) -> bool:
    """Whether a call's error says its catalog did not answer (no flightpart code); the call may still have been
    done."""
    return isinstance(exc, _NO_ANSWER) and decode_error(getattr(exc, "extra_info", None)) is None
