"""The catalog's SQL queries: those running now and the last :data:`KEPT` finished, one log line each.

Each query gets an id, its caller (a token's role and name), its text cut to
:data:`TEXT_CHARS` characters, and when it ends its duration, rows, the bytes
the nodes sent this process while it ran (shared with queries running at the
same time) and its outcome: ``ok``, the error code it was refused with, or
``endpoints`` for a plain scan whose rows the nodes send the client. What is
kept is bounded: :data:`KEPT` finished queries, and running ones as many as the
catalog's SQL slots and plain scans allow.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

log = logging.getLogger("flightpart.sql")

KEPT = 100
TEXT_CHARS = 200


@dataclass
class QueryRecord:
    """One query, as the status page and ``flightpart queries`` show it."""

    id: int
    caller: str
    text: str
    started: float  # seconds since the epoch
    seconds: float | None = None
    rows: int | None = None
    bytes_from_nodes: int | None = None
    outcome: str = "running"
    _began: float = field(default=0.0, repr=False)
    _moved: int = field(default=0, repr=False)

    def as_json(self) -> dict:
        out = asdict(self)
        del out["_began"], out["_moved"]
        if self.seconds is None:
            out["seconds"] = round(time.perf_counter() - self._began, 6)  # so far
        return out


class QueryHistory:
    """Running and recent queries; ``observe(seconds)`` is told each finished query's duration (a histogram)."""

    def __init__(self, moved: Callable[[], int], observe: Callable[[float], None] = lambda _s: None,
                 kept: int = KEPT):
        self._moved = moved
        self._observe = observe
        self._ids = itertools.count(1)
        self._running: dict[int, QueryRecord] = {}
        self._recent: deque[QueryRecord] = deque(maxlen=kept)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def running(self, caller: str, text: str) -> Iterator[QueryRecord]:
        """The record of a query while it runs: the caller sets ``rows`` (and ``outcome`` for a plain scan); an
        exception ends it with its error code as the outcome, and propagates."""
        record = self._begun(caller, text)
        with self._lock:
            self._running[record.id] = record
        try:
            yield record
        except BaseException as exc:
            record.outcome = _outcome(exc)
            raise
        finally:
            self._finish(record)

    def refused(self, caller: str, text: str, error: BaseException) -> None:
        """A query refused before it ran (its prepare failed), noted with its error code as its outcome."""
        record = self._begun(caller, text)
        record.outcome = _outcome(error)
        self._finish(record)

    def _begun(self, caller: str, text: str) -> QueryRecord:
        return QueryRecord(next(self._ids), caller, " ".join(text.split())[:TEXT_CHARS], time.time(),
                           _began=time.perf_counter(), _moved=self._moved())

    def _finish(self, record: QueryRecord) -> None:
        record.seconds = round(time.perf_counter() - record._began, 6)
        record.bytes_from_nodes = max(0, self._moved() - record._moved)
        if record.outcome == "running":
            record.outcome = "ok"
        with self._lock:
            self._running.pop(record.id, None)
            self._recent.append(record)
        self._observe(record.seconds)
        log.info("query %d by %s: %s in %.3f s, %s rows, %s bytes from nodes: %s", record.id, record.caller,
                 record.outcome, record.seconds, "?" if record.rows is None else f"{record.rows:,}",
                 f"{record.bytes_from_nodes:,}", record.text,
                 extra={"event": "sql_query", "query_id": record.id, "caller": record.caller, "query": record.text,
                        "seconds": record.seconds, "rows": record.rows, "bytes_from_nodes": record.bytes_from_nodes,
                        "outcome": record.outcome})

    def snapshot(self) -> dict:
        """``{"running": [...], "recent": [...]}``, the most recent first."""
        with self._lock:
            running = [r.as_json() for r in sorted(self._running.values(), key=lambda r: -r.id)]
            recent = [r.as_json() for r in reversed(self._recent)]
        return {"running": running, "recent": recent}


def _outcome(error: BaseException) -> str:
    """A failed query's outcome: its error's stable code, else the exception's class."""
    return str(getattr(error, "code", None) or type(error).__name__)
