"""What a query DuckDB refused or failed ends with: a flightpart error with its code, one line, no traceback.

A query's own mistake (a syntax error, an unknown column or function) is
:class:`SqlError`; a table that is no dataset is ``DATASET_NOT_FOUND``
with the closest dataset's name; a query past the memory or spill space
DuckDB may use for the catalog's queries is ``LIMIT_EXCEEDED``; DuckDB
failing with its own files or inside itself is the catalog's failure
(``INTERNAL``), its details in the catalog's log. A node's failure inside
one of DuckDB's scans is raised as itself (:mod:`.remembered`), not as
DuckDB's wrapping of it.
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
    """The error a query ends with when DuckDB raised ``exc`` (any ``duckdb.Error`` but an interrupt); the first
    failure of a node inside the query's scans (``failures``) is raised instead where it may be the cause.
    ``engine``: DuckDB's limits, for a query past them; ``known()``: every dataset's name, and ``is_dataset(name,
    known)`` whether a name means one, for a table DuckDB does not know."""
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
    """DuckDB's message for a table it does not know, its guess kept only when it is a dataset (DuckDB guesses
    from its own system tables too: ``Did you mean "pg_sequences"?``), else the closest dataset's name, else
    ``flightpart ls``."""
    guess, missing = SUGGESTION.search(message), MISSING_TABLE.search(message)
    if guess is not None and (is_dataset(guess["name"], known)):
        return message
    close = difflib.get_close_matches(missing["name"], sorted(known), n=1) if missing else []
    instead = f' Did you mean "{close[0]}"?' if close else " (`flightpart ls` lists the datasets)"
    if guess is None:
        return message + instead
    return f"{message[:guess.start()].rstrip()}{instead}{message[guess.end():]}"


def out_of_memory(exc: Exception, engine: Any) -> LimitExceeded:
    """The error of a query that needed more memory, or more spill space on disk, than DuckDB may use for the
    catalog's queries (``engine``'s limits): a limit of the catalog's, not a mistake in the query; DuckDB's own
    advice (a ``SET`` the gateway refuses, fewer threads) is left out for what the client can change."""
    what = (f"more spill space on disk than the {engine.spill:,} bytes the catalog's queries may write together"
            if SPILL_LIMIT in str(exc) else
            f"more memory than the {engine.memory:,} bytes the catalog's queries may use together")
    return LimitExceeded(f"the query needed {what} (the server's limit), and was stopped: aggregate (GROUP BY) or "
                         "filter (WHERE) the rows, or select fewer rows or columns (LIMIT, only the columns "
                         "needed), or retry when fewer queries run", field="query")


def one_line(exc: BaseException) -> str:
    """DuckDB's message on one line (its caret lines, terminal codes and, for an internal error, its native stack
    trace left out)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).split("Stack Trace:", 1)[0]
    return " ".join(text.split())[:400]
