"""DuckDB's descriptions of itself, which the catalog's SQL does not answer.

A query runs in a DuckDB of the catalog's, without access to files, but
DuckDB still describes itself: ``duckdb_settings()`` lists the catalog's
working directory (DuckDB allows an in-memory database's WAL paths beside
it), ``duckdb_extensions()`` and ``duckdb_secrets()`` fail naming the
catalog's home directory, ``current_setting`` reads any setting, and the
``duckdb_*`` / ``pragma_*`` views and table functions describe the process
(its memory, temporary files, databases). None of it is a dataset, and it
tells a remote client about the machine the catalog runs on. So a query that
names one is refused before it runs. The names are read from DuckDB's own
parse of the query (``json_serialize_sql``), so no syntax hides them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

SELF_DESCRIBING_PREFIXES = ("duckdb_", "pragma_")
"""DuckDB's views and table functions about itself (``duckdb_settings()``, ``pragma_database_list``, ...)."""
SELF_DESCRIBING_FUNCTIONS = frozenset({"current_setting", "which_secret"})
"""Functions that read DuckDB's settings or secrets."""


def self_described(con: Any, query: str, datasets: Callable[[], set[str]]) -> str | None:
    """The first name in ``query`` of DuckDB describing itself, or None. A table of such a name that is one of
    ``datasets`` (asked for only then) is the dataset. A query DuckDB cannot parse is left to DuckDB to refuse."""
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])  # all: none left unread
    if tree.get("error"):
        return None
    known: set[str] | None = None
    for kind, name in _names(tree):
        lowered = name.lower()
        if kind == "function" and (lowered in SELF_DESCRIBING_FUNCTIONS or lowered.startswith(SELF_DESCRIBING_PREFIXES)):
            return name
        if kind == "table" and lowered.startswith(SELF_DESCRIBING_PREFIXES):
            known = datasets() if known is None else known
            if name not in known:
                return name
    return None


def _names(node: Any) -> Iterator[tuple[str, str]]:
    """Every function and table a parsed query names, as ("function" | "table", name)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("function_name"), str):
                yield "function", item["function_name"]
            if item.get("type") == "BASE_TABLE" and isinstance(item.get("table_name"), str):
                yield "table", item["table_name"]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
