"""The watch that stops a query at the catalog once it has run too long or its caller gave up.

Python work for a query (listing every dataset) looks at :attr:`Watch.fired` and
stops with :class:`Stopped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("flightpart.sql")

WATCH_SECONDS = 0.1
"""How often a running query looks whether its caller is still waiting for it."""


class Stopped(Exception):
    """Work in Python for a query (listing every dataset) stopped by its :class:`Watch`, as DuckDB's own is."""


class Watch:
    """Interrupts a DuckDB query once it ran ``timeout`` seconds or its caller gave up, and at each look after (an
    interrupt between two statements is lost). After :meth:`done`, it touches neither the connection nor the call's
    context, which gRPC frees. Every running query's watch is looked at by one thread (:class:`_Watcher`)."""

    def __init__(self, con: Any, timeout: float, cancelled: Callable[[], bool]):
        self.con, self.timeout, self.cancelled = con, timeout, cancelled
        self.gave_up = False
        self.fired = False  # the query was stopped: what runs in Python between DuckDB's calls stops too
        self._done = False
        self._deadline = time.monotonic() + timeout
        self._lock = threading.Lock()
        _WATCHER.add(self)

    def look(self) -> None:
        """Stop the query if its time is up or its caller gave up (nothing once :meth:`done`)."""
        with self._lock:  # the call's context is asked only while its query runs: gRPC frees it after
            if self._done:
                return
            gave_up = self.cancelled()
            if gave_up or time.monotonic() > self._deadline:
                if not self.fired:
                    self.gave_up = gave_up
                self.fired = True
                self.con.interrupt()

    def done(self) -> None:
        with self._lock:
            self._done = True
        _WATCHER.remove(self)


class _Watcher:
    """The one thread that looks at every running query's :class:`Watch` each :data:`WATCH_SECONDS`; it runs while
    some query does."""

    def __init__(self) -> None:
        self._watches: set[Watch] = set()
        self._lock = threading.Lock()
        self._running = False

    def add(self, watch: Watch) -> None:
        with self._lock:
            self._watches.add(watch)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="flightpart-sql-watch", daemon=True).start()

    def remove(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_SECONDS)
            with self._lock:
                watches = list(self._watches)
                if not watches:
                    self._running = False
                    return
            for watch in watches:
                try:
                    watch.look()
                except Exception:  # one watch's failure must not end every query's: that one is no longer looked at
                    log.exception("a running query's watch failed; it is no longer looked at")
                    self.remove(watch)


_WATCHER = _Watcher()
