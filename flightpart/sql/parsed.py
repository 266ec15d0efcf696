"""A query's syntax tree, for the gateway's planners: each asks whether it can do something cheaper than DuckDB."""

from __future__ import annotations

import functools
import re
from typing import Any

from flightpart.errors import RequestRejected

KEPT = 256
"""Trees kept, the most recently parsed (a query is parsed by several planners, and clients send the same texts)."""
KEPT_TEXT = 8 << 10
"""Longer texts are parsed each time, never kept."""

UNREAD = object()
"""What :func:`_tree` keeps for a text sqlglot does not read."""


def parsed(query: str) -> Any | None:
    """``query`` as sqlglot reads DuckDB's dialect, or None for a syntax it does not know (DuckDB then runs it whole);
    RequestRejected for nesting past Python's recursion (decision 0034). Each caller gets a tree of its own (a copy
    of the one kept), which it may change."""
    tree = _tree(query) if len(query) <= KEPT_TEXT else _read(query)
    return None if tree is UNREAD else tree.copy()


def parsed_to_read(query: str) -> Any | None:
    """:func:`parsed`, the kept tree itself, for a caller that only reads it (finds, walks, writes it out) and never
    changes it: the copy :func:`parsed` makes costs more than most readings."""
    tree = _tree(query) if len(query) <= KEPT_TEXT else _read(query)
    return None if tree is UNREAD else tree


@functools.lru_cache(maxsize=KEPT)
def _tree(query: str) -> Any:
    """:func:`_read`, kept (a RecursionError is raised again each time: exceptions are not kept)."""
    return _read(query)


def _read(query: str) -> Any:
    """``query``'s tree, or :data:`UNREAD`."""
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    try:
        tree = sqlglot.parse_one(query, read="duckdb")
        return _shown_table(query, tree) or tree
    except (ParseError, TokenError):
        return UNREAD
    except RecursionError:
        raise RequestRejected("query: nested too deeply to be read (parentheses or subqueries some 50 deep); "
                              "write it flatter, e.g. with a WITH clause", field="query") from None



SHOWN = re.compile(r"^(?:\s*(?:/\*.*?\*/|--[^\n]*(?:\n|$)))*\s*SHOW\b", re.IGNORECASE | re.DOTALL)
"""``SHOW`` opening a query, after any comments."""


def _shown_table(query: str, tree: Any) -> Any | None:
    """``SHOW sales`` (DuckDB's ``DESCRIBE sales``, which sqlglot keeps as an unread command) as the DESCRIBE it is, so
    its table is found and registered; None for anything else."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    if not isinstance(tree, exp.Command) or str(tree.this).upper() != "SHOW":
        return None
    try:
        described = sqlglot.parse_one(SHOWN.sub("DESCRIBE", query, count=1), read="duckdb")
    except (ParseError, TokenError):
        return None
    return described if isinstance(described, exp.Describe) and isinstance(described.this, exp.Table) else None
