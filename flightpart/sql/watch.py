"""The watch that stops a query at the catalog once it has run too long or its caller gave up.

Each query DuckDB runs for the gateway has one :class:`Watch`, a thread
that looks every :data:`WATCH_SECONDS` whether the query's time is up or
its caller gave up (its deadline passed, it hung up) and then interrupts
DuckDB; work the gateway does in Python for a query (listing every
dataset) looks at :attr:`Watch.fired` and stops with :class:`Stopped`.
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
    """Stops a DuckDB query (``interrupt``) once it has run ``timeout`` seconds or its caller gave up, looking
    every :data:`WATCH_SECONDS`, and again at each look after (an interrupt that lands between two of DuckDB's
    statements is lost, and the next would run on); ``gave_up`` says which. :meth:`done` is called before the
    connection is closed:
    once it returns, the watch touches the connection no more (an interrupt racing the close raised in the watch's
    thread, and a native library is not asked to interrupt what it is closing), nor asks whether the caller gave up
    (its call's context is freed once the call ends, and asking it then would read freed memory)."""

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
