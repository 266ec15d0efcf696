"""How many SQL queries the catalog runs at once, and how many wait: overload is a wait, then ``BUSY``, never an OOM.

Each query may hold up to DuckDB's memory limit and its partials at the
catalog; without a bound, twenty clients at once would ask twenty times that
of one process. Queries past the running limit wait their turn (as long as
their caller waits, at most :data:`QUEUE_SECONDS`); past the waiting limit,
or that long, they are refused with the retryable code ``BUSY`` at once,
and nothing of them ran.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from flightpart.errors import ServerBusy
from flightpart.settings import count_from_env

RUNNING = 4
"""Queries the catalog runs at once by default ($FLIGHTPART_SQL_QUERIES sets it)."""
WAITING_PER_RUNNING = 4
"""Queries that may wait for each one running; more are refused with ``BUSY`` at once."""
QUEUE_SECONDS = 60.0
"""The longest a query waits for its turn (less when its caller's deadline is nearer)."""
LOOK_SECONDS = 0.1
"""How often a waiting query looks whether its caller is still there."""
ENV = "FLIGHTPART_SQL_QUERIES"


def running_from_env() -> int:
    """The running limit ``$FLIGHTPART_SQL_QUERIES`` sets (a whole number, at least 1), or :data:`RUNNING`."""
    return count_from_env(ENV, RUNNING, "the number of SQL queries the catalog runs at once")


class QuerySlots:
    """At most ``running`` queries at once, at most ``running * WAITING_PER_RUNNING`` waiting (see the module doc)."""

    def __init__(self, running: int, *, queue_seconds: float = QUEUE_SECONDS):
        self.limit = running
        self.queue_seconds = queue_seconds
        self.running = 0
        self.waiting = 0
        self.refused = 0  # refused with BUSY: too many waiting, or waited too long
        self._turn = threading.Condition()

    @contextlib.contextmanager
    def held(self, gave_up: Callable[[], bool]) -> Iterator[None]:
        """One query's turn, waited for while ``gave_up()`` is false; ``BUSY`` when the wait is full or too long.
        A caller that gave up while waiting leaves with ``BUSY`` too (it is no longer there to read it)."""
        with self._turn:
            if self.running >= self.limit:
                if self.waiting >= self.limit * WAITING_PER_RUNNING:
                    self.refused += 1
                    raise ServerBusy(f"the catalog runs {self.limit} SQL queries at once and {self.waiting} more are "
                                     "waiting: nothing of this one ran; retry shortly", field="query")
                self.waiting += 1
                until = time.monotonic() + self.queue_seconds
                try:
                    while self.running >= self.limit:
                        left = until - time.monotonic()
                        if left <= 0 or gave_up():
                            self.refused += 1
                            raise ServerBusy(f"the query waited {self.queue_seconds - max(left, 0):.0f} s for one of "
                                             f"the catalog's {self.limit} SQL query slots and did not run; retry shortly",
                                             field="query")
                        self._turn.wait(min(left, LOOK_SECONDS))
                finally:
                    self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._turn:
                self.running -= 1
                self._turn.notify()
