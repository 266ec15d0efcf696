"""How many SQL queries the catalog runs at once, and how many wait: overload is a wait, then ``BUSY``, never an OOM.

A query past the running limit waits as long as its caller does, at most
:data:`QUEUE_SECONDS`; past the waiting limit or that long, it is refused
``BUSY`` with nothing run. One caller holds at most its share of slots and queue
(decision 0033).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from flightpart.errors import ServerBusy
from flightpart.settings import count_from_env

from .limits import share

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
    """At most ``running`` queries at once and ``running * WAITING_PER_RUNNING`` waiting; one caller at most
    ``per_caller`` of each. ``what`` names what is run, for the errors."""

    def __init__(self, running: int, *, queue_seconds: float = QUEUE_SECONDS, per_caller: int | None = None,
                 what: str = "SQL queries"):
        self.limit = running
        self.per_caller = min(running, per_caller if per_caller is not None else share(running))
        self.queue_seconds = queue_seconds
        self.what = what
        self.running = 0
        self.waiting = 0
        self.refused = 0  # refused with BUSY: too many waiting, or waited too long
        self._running_by: dict[str, int] = {}
        self._waiting_by: dict[str, int] = {}
        self._turn = threading.Condition()

    def _full_for(self, caller: str) -> bool:
        return self.running >= self.limit or self._running_by.get(caller, 0) >= self.per_caller

    @contextlib.contextmanager
    def held(self, gave_up: Callable[[], bool], caller: str = "") -> Iterator[None]:
        """One query's turn, waited for while ``gave_up()`` is false; ``BUSY`` when the wait is full or too long, or the
        caller gave up."""
        with self._turn:
            if self._full_for(caller):
                if self.waiting >= self.limit * WAITING_PER_RUNNING:
                    self.refused += 1
                    raise ServerBusy(f"the catalog runs {self.limit} {self.what} at once and {self.waiting} more are "
                                     "waiting: nothing of this one ran; retry shortly", field="query")
                mine = self._waiting_by.get(caller, 0)
                if mine >= self.per_caller * WAITING_PER_RUNNING:
                    self.refused += 1
                    raise ServerBusy(f"this caller runs {self._running_by.get(caller, 0)} {self.what} at the catalog, "
                                     f"its share of {self.limit}, and {mine} more are waiting: nothing of this one "
                                     "ran; retry shortly", field="query")
                self.waiting += 1
                self._waiting_by[caller] = mine + 1
                until = time.monotonic() + self.queue_seconds
                try:
                    while self._full_for(caller):
                        left = until - time.monotonic()
                        if left <= 0 or gave_up():
                            self.refused += 1
                            raise ServerBusy(f"the query waited {self.queue_seconds - max(left, 0):.0f} s for one of "
                                             f"the catalog's {self.limit} slots for {self.what} and did not run; "
                                             "retry shortly", field="query")
                        self._turn.wait(min(left, LOOK_SECONDS))
                finally:
                    self.waiting -= 1
                    _less(self._waiting_by, caller)
            self.running += 1
            self._running_by[caller] = self._running_by.get(caller, 0) + 1
        try:
            yield
        finally:
            with self._turn:
                self.running -= 1
                _less(self._running_by, caller)
                self._turn.notify_all()


def _less(counts: dict[str, int], caller: str) -> None:
    """One fewer for ``caller`` (its entry gone at none)."""
    left = counts.get(caller, 0) - 1
    if left > 0:
        counts[caller] = left
    else:
        counts.pop(caller, None)
