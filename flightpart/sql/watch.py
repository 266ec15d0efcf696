"""The watch that stops a query at the catalog once it has run too long or its caller gave up.

Python work for a query (listing every dataset) looks at :attr:`Watch.fired` and
stops with :class:`Stopped`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

WATCH_SECONDS = 0.1
"""How often a running query looks whether its caller is still waiting for it."""


class Stopped(Exception):
    """Work in Python for a query (listing every dataset) stopped by its :class:`Watch`, as DuckDB's own is."""


class Watch:
    """Interrupts a DuckDB query once it ran ``timeout`` seconds or its caller gave up, and at each look after (an
    interrupt between two statements is lost). After :meth:`done`, it touches neither the connection nor the call's
    context, which gRPC frees."""

    def __init__(self, con: Any, timeout: float, cancelled: Callable[[], bool]):
        self.con, self.timeout, self.cancelled = con, timeout, cancelled
        self.gave_up = False
        self.fired = False  # the query was stopped: what runs in Python between DuckDB's calls stops too
        self._done = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="flightpart-sql-watch", daemon=True).start()

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._done.wait(WATCH_SECONDS):
            with self._lock:  # the call's context is asked only while its query runs: gRPC frees it after
                if self._done.is_set():
                    return
                gave_up = self.cancelled()
                if gave_up or time.monotonic() > deadline:
                    if not self.fired:
                        self.gave_up = gave_up
                    self.fired = True
                    self.con.interrupt()

    def done(self) -> None:
        with self._lock:
            self._done.set()
