"""What a query at the catalog may name besides datasets: DuckDB's descriptions of itself are not answered.

A query runs in a DuckDB of the catalog's, without access to files, but
DuckDB still describes itself: ``duckdb_settings()`` (and its view
``pg_settings``) lists the catalog's working directory (DuckDB allows an
in-memory database's WAL paths beside it), ``duckdb_extensions()`` and
``duckdb_secrets()`` fail naming the catalog's home directory,
``current_setting`` reads any setting, and the ``duckdb_*`` / ``pragma_*``
views and table functions describe the process (its memory, temporary files,
databases); ``query()`` and ``json_execute_serialized_sql`` would run any of
them from a string. None of it is a dataset, and it tells a remote client
about the machine the catalog runs on. So a query is read with DuckDB's own
parser (``json_serialize_sql``, so no syntax hides a name) and refused before
it runs when it calls a table function but those that make rows from their
arguments (:data:`ROW_MAKERS`), calls ``current_setting``, or names one of
DuckDB's own views (but ``information_schema``'s) that is not a dataset.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

ROW_MAKERS = frozenset({"range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree"})
"""The table functions a query may call: each makes rows from its arguments alone."""
SETTING_READERS = frozenset({"current_setting"})
"""Scalar functions that read DuckDB's settings."""
STANDARD_SCHEMAS = frozenset({"information_schema"})
"""Schemas of DuckDB's views a query may name: the SQL standard's description of the query's own tables."""


def self_described(con: Any, query: str, is_dataset: Callable[[str], bool]) -> str | None:
    """The first thing ``query`` names that is DuckDB describing itself (see the module doc), or None. ``is_dataset``
    is asked only of a table named as one of DuckDB's views. A query DuckDB cannot parse is left to DuckDB to refuse."""
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])  # all: none left unread
    if tree.get("error"):
        return None
    named: list[tuple[str, str, str, str]] = list(_names(tree))
    ctes = {name.lower() for kind, name, _schema, _catalog in named if kind == "cte"}
    for kind, name, schema, catalog in named:
        lowered = name.lower()
        if kind == "table function" and lowered not in ROW_MAKERS:
            return f"the table function {name}"
        if kind == "function" and lowered in SETTING_READERS:
            return name
        if kind != "table" or (not schema and not catalog and lowered in ctes):
            continue
        if schema.lower() in STANDARD_SCHEMAS or (lowered, schema.lower()) not in _duckdb_views():
            continue  # a dataset, or a name DuckDB will say it does not know
        if schema in ("", "main") and not catalog and is_dataset(name):
            continue  # a dataset of the name of one of DuckDB's views: the dataset is meant
        return name
    return None


@functools.cache
def _duckdb_views() -> frozenset[tuple[str, str]]:
    """DuckDB's own views as (name, schema), lowered, each also with an empty schema (named unqualified); read
    from a DuckDB of their own once per process."""
    import duckdb

    with duckdb.connect(config={"enable_external_access": False}) as con:
        rows = con.execute("SELECT lower(view_name), lower(schema_name) FROM duckdb_views() WHERE internal").fetchall()
    return frozenset((view, schema) for view, schema in rows) | frozenset((view, "") for view, _schema in rows)


def _names(node: Any) -> Iterator[tuple[str, str, str, str]]:
    """Everything a parsed query names: (kind, name, schema, catalog), kind "table function", "function", "table"
    or "cte" (a WITH query's name)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind = item.get("type")
            if kind == "TABLE_FUNCTION" and isinstance(item.get("function"), dict):
                function = item["function"]
                yield "table function", str(function.get("function_name", "")), "", ""
                stack.extend(function.get("children") or [])
                stack.extend(v for k, v in item.items() if k != "function")
                continue
            if isinstance(item.get("function_name"), str):
                yield "function", item["function_name"], "", ""
            if kind == "BASE_TABLE" and isinstance(item.get("table_name"), str):
                yield "table", item["table_name"], str(item.get("schema_name") or ""), str(item.get("catalog_name") or "")
            if isinstance(item.get("cte_map"), dict):
                for entry in item["cte_map"].get("map") or []:
                    if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                        yield "cte", entry["key"], "", ""
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
