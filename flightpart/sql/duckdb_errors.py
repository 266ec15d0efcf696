"""What a query DuckDB refused or failed ends with: a flightpart error with its code, one line, no traceback.

The query's mistake is :class:`SqlError`; an unknown table,
``DATASET_NOT_FOUND``; past DuckDB's memory or spill, ``LIMIT_EXCEEDED``; DuckDB
failing itself, ``INTERNAL``. A node's failure inside a scan is raised as itself
(:mod:`.remembered`).
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable
from typing import Any

from flightpart.errors import DatasetNotFound, FlightpartError, LimitExceeded, RequestRejected, ServerError

from .remembered import ScanFailures

log = logging.getLogger("flightpart.sql")

MISSING_TABLE = re.compile(r"Table with name (?P<name>.+?) does not exist")
SUGGESTION = re.compile(r'\s*Did you mean "(?P<name>[^"]*)"\?')
"""DuckDB's guess at a mistyped name, in a CatalogException's message."""
SPILL_LIMIT = "max_temp_directory_size"
"""What DuckDB's out-of-memory error names when its spill files, not its memory, reached their limit."""


class SqlError(RequestRejected):
    """A query DuckDB refused: a syntax error, an unknown column, a type error."""


def failed(exc: Exception, failures: ScanFailures, engine: Any, known: Callable[[], set[str]],
           is_dataset: Callable[[str, set[str]], bool]) -> FlightpartError:
    """The error a query ends with when DuckDB raised ``exc``, or the first node failure in its scans where that may be
    the cause. ``engine``: DuckDB's limits; ``known()``, ``is_dataset``: the datasets."""
    import duckdb

    if isinstance(exc, duckdb.CatalogException):
        message = one_line(exc)
        if MISSING_TABLE.search(message) is None:  # a function or type DuckDB does not know: the query's mistake
            return SqlError(message, field="query")
        return DatasetNotFound(suggesting_datasets(message, known(), is_dataset), field="query")
    failures.raise_first()  # a node refused or failed a read inside DuckDB's scan: that error, as it was
    if isinstance(exc, duckdb.OutOfMemoryException):
        return out_of_memory(exc, engine)
    if isinstance(exc, duckdb.IOException):
        # external access is off: an I/O error is DuckDB's own files (its spill files), the catalog's failure
        log.warning("DuckDB failed to read or write its own files in a query: %s", exc)
        return ServerError(f"DuckDB failed with its files at the catalog ({one_line(exc)}); the catalog's log has "
                           "the details", field="query")
    if isinstance(exc, (duckdb.InternalException, duckdb.FatalException)):
        # DuckDB failing inside itself is not the query's mistake; its native stack trace stays in the log
        log.warning("DuckDB failed inside a query: %s", exc)
        return ServerError(f"DuckDB failed inside the query at the catalog ({one_line(exc)}); the catalog's log has "
                           "the details", field="query")
    return SqlError(one_line(exc), field="query")


def suggesting_datasets(message: str, known: set[str], is_dataset: Callable[[str, set[str]], bool]) -> str:
    """DuckDB's message for an unknown table, its guess kept only when it is a dataset (DuckDB also guesses its system
    tables), else the closest dataset's name, else ``flightpart ls``."""
    guess, missing = SUGGESTION.search(message), MISSING_TABLE.search(message)
    if guess is not None and (is_dataset(guess["name"], known)):
        return message
    close = difflib.get_close_matches(missing["name"], sorted(known), n=1) if missing else []
    instead = f' Did you mean "{close[0]}"?' if close else " (`flightpart ls` lists the datasets)"
    if guess is None:
        return message + instead
    return f"{message[:guess.start()].rstrip()}{instead}{message[guess.end():]}"


def out_of_memory(exc: Exception, engine: Any) -> LimitExceeded:
    """The error of a query past DuckDB's memory or spill limits (``engine``): a limit of the catalog's, with advice the
    client can follow in place of DuckDB's."""
    what = (f"more spill space on disk than the {engine.spill:,} bytes the catalog's queries may write together"
            if SPILL_LIMIT in str(exc) else
            f"more memory than the {engine.memory:,} bytes the catalog's queries may use together")
    return LimitExceeded(f"the query needed {what} (the server's limit), and was stopped: aggregate (GROUP BY) or "
                         "filter (WHERE) the rows, or select fewer rows or columns (LIMIT, only the columns "
                         "needed), or retry when fewer queries run", field="query")


def one_line(exc: BaseException) -> str:
    """DuckDB's message on one line, without caret lines, terminal codes or native stack trace."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split("Stack Trace:", 1)[0]
    return " ".join(text.split())[:400]
