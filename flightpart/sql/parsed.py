"""A query's syntax tree, for the gateway's planners: each asks whether it can do something cheaper than DuckDB."""

from __future__ import annotations

from typing import Any

from flightpart.errors import RequestRejected


def parsed(query: str) -> Any | None:
    """``query`` as sqlglot reads DuckDB's dialect, or None for a syntax it does not know (DuckDB, which then runs
    the query whole, answers it or says what is wrong with it); RequestRejected for nesting deeper than Python's
    recursion (some 50 nested parentheses), which neither the planners nor the names' lookup can read."""
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    try:
        return sqlglot.parse_one(query, read="duckdb")
    except (ParseError, TokenError):
        return None
    except RecursionError:
        raise RequestRejected("query: nested too deeply to be read (parentheses or subqueries some 50 deep); "
                              "write it flatter, e.g. with a WITH clause", field="query") from None
