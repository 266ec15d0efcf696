"""What a query at the catalog may name besides datasets: nothing of DuckDB describing itself, and no file.

A query is read with DuckDB's own parser (``json_serialize_sql``), every value
of every node at any depth, and refused before it runs when it calls a table
function but :data:`ROW_MAKERS`, a function reading DuckDB's state
(:data:`SETTING_READERS`, :data:`SELF_PREFIXES`), or names one of DuckDB's views
or settings (but ``information_schema``) or a file path that is not a dataset. A
DuckDB whose parse the walk no longer reads is found at the first query
(:func:`walk_understood`) and nothing runs. sqlglot's parse is checked too, so
one parser's blind spot is not enough (decision 0031).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from flightpart.errors import ServerError
from flightpart.kept import Kept

from .parsed import parsed_to_read

ROW_MAKERS = frozenset({"range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree"})
"""The table functions a query may call: each makes rows from its arguments alone."""
SETTING_READERS = frozenset({"current_setting", "getvariable", "getenv"})
"""Scalar functions that read DuckDB's settings, variables or the environment."""
SELF_PREFIXES = ("duckdb_", "pragma_")
"""Prefixes of DuckDB's functions that describe the process."""
STANDARD_SCHEMAS = frozenset({"information_schema"})
"""Schemas of DuckDB's views a query may name: the SQL standard's description of the query's own tables."""
PATH_LIKE = re.compile(r"[./\\:*?\[\]{}~]")
"""A character that makes DuckDB read a table name as a file; no dataset name has one but the dot, and a dataset is
looked up first."""
SELF = ("is DuckDB describing or running itself at the catalog (its settings, files, memory), not a dataset, and is "
        "not answered here: nothing was run; Flight SQL's GetTables (or `flightpart ls`) lists the datasets; the table "
        "functions a query may call are " + ", ".join(sorted(ROW_MAKERS)))

Named = tuple[str, str, str, str]
"""(kind, name, schema, catalog): kind "table function", "function", "table", "shown" (``SHOW name``) or "cte"."""


def refusal(con: Any, query: str, is_dataset: Callable[[str], bool]) -> str | None:
    """Why ``query`` (one SELECT) is not run here, or None; ``is_dataset`` is asked only of names otherwise refused. A
    query DuckDB cannot describe is refused; ServerError when the walk cannot read this DuckDB's parse."""
    if not walk_understood():
        raise ServerError("the catalog cannot check SQL with this DuckDB (its parse of a query is not what flightpart "
                          "reads), so no query is run; the catalog's DuckDB needs the version flightpart supports",
                          field="query")
    read = _READ.get(query) if len(query) <= MAX_KEPT_TEXT else None
    if read is None:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])  # all: none unread
        named = None if tree.get("error") else tuple(_named(tree))
        read = Read(named, tuple({name.lower() for kind, name, _s, _c in named or () if kind == "cte"}),
                    None if named is None else sqlglot_refusal(query))
        if len(query) <= MAX_KEPT_TEXT:
            _READ.put(query, read)
    if read.named is None:
        return ("the query could not be checked for what it may read (DuckDB's parser gives no description of it), "
                "so it was not run: write it as one SELECT")
    for kind, name, schema, catalog in read.named:
        why = _refused(kind, name, schema, catalog, set(read.ctes), is_dataset)
        if why is not None:
            return why
    return read.sqlglot


class Read(NamedTuple):
    """What a query's text names (None: DuckDB could not describe it), the common table expressions among them, and
    sqlglot's refusal of it: the same for the same text, so kept per text (:data:`_READ`); only whether a name is a
    dataset is asked again at each run."""

    named: tuple[Named, ...] | None
    ctes: tuple[str, ...]
    sqlglot: str | None


MAX_KEPT_TEXT = 8 << 10
_READ: Kept[Read] = Kept(256)
"""Each of the 256 texts (of at most :data:`MAX_KEPT_TEXT` characters) last checked, as read."""


def _refused(kind: str, name: str, schema: str, catalog: str, ctes: set[str],
             is_dataset: Callable[[str], bool]) -> str | None:
    """Why one thing a query names is not answered here, or None."""
    lowered = name.lower()
    if kind == "table function" and lowered not in ROW_MAKERS:
        return f"the table function {_shown(name)} {SELF}"
    if kind == "function" and (lowered in SETTING_READERS or lowered.startswith(SELF_PREFIXES)):
        return f"{_shown(name)} {SELF}"
    if kind not in ("table", "shown") or (not schema and not catalog and lowered in ctes):
        return None
    if PATH_LIKE.search(name) and not is_dataset(name):
        return ("a table named by a file path is no dataset, and the catalog opens no file for a query: nothing was "
                "run; Flight SQL's GetTables (or `flightpart ls`) lists the datasets")
    if kind == "shown" and lowered in _duckdb_settings() and not is_dataset(name):
        return f"SHOW {_shown(name)} reads one of DuckDB's settings, which {SELF}"
    if schema.lower() in STANDARD_SCHEMAS or (lowered, schema.lower()) not in _duckdb_views():
        return None  # a dataset, or a name DuckDB will say it does not know
    if schema in ("", "main") and not catalog and is_dataset(name):
        return None  # a dataset of the name of one of DuckDB's views: the dataset is meant
    return f"{_shown(name)} {SELF}"


def _shown(name: str) -> str:
    """A name the client wrote, as an error quotes it: at most 64 characters."""
    return name if len(name) <= 64 else name[:64] + "…"


def sqlglot_refusal(query: str) -> str | None:
    """sqlglot's reading of ``query``: a call it names as a refused table function or a setting reader is refused
    too."""
    from sqlglot import exp

    if _refused_names().search(query.lower()) is None:
        return None  # sqlglot names a function as the query spells it: none of them is named (a long IN list)
    tree = parsed_to_read(query)
    if tree is None:
        return None
    for node in tree.walk():
        if not isinstance(node, exp.Func):
            continue
        anonymous = isinstance(node, exp.Anonymous)
        name = node.name if anonymous else node.sql_name()  # a function sqlglot knows, by its own name (READ_CSV)
        lowered = name.lower()
        if not anonymous and not isinstance(node.parent, exp.Table):
            continue  # a scalar function sqlglot knows is none of DuckDB's descriptions of itself
        if lowered in SETTING_READERS or lowered.startswith(SELF_PREFIXES) \
                or (lowered in _duckdb_table_functions() and lowered not in ROW_MAKERS):
            return f"{_shown(name)} {SELF}"
    return None


def _named(node: Any) -> Iterator[Named]:
    """Everything a parsed query names (:data:`Named`), from every value of every node at any depth, whatever key holds
    a function's arguments."""
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        item, called_as_table = stack.pop()
        if isinstance(item, list):
            stack.extend((value, False) for value in item)
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if isinstance(item.get("function_name"), str):
            yield ("table function" if called_as_table else "function", item["function_name"],
                   str(item.get("schema") or ""), str(item.get("catalog") or ""))
        if kind == "TABLE_FUNCTION":
            function = item.get("function")
            if isinstance(function, dict) and isinstance(function.get("function_name"), str):
                stack.append((function, True))
            else:  # a table function the parse does not name: not one of the row makers
                yield "table function", "(unnamed)", "", ""
            stack.extend((value, False) for key, value in item.items() if key != "function")
            continue
        if kind == "BASE_TABLE" and isinstance(item.get("table_name"), str):
            yield "table", item["table_name"], str(item.get("schema_name") or ""), str(item.get("catalog_name") or "")
        if kind == "SHOW_REF" and item.get("show_type") == "SHOW" and item.get("table_name"):
            yield ("shown", str(item["table_name"]), str(item.get("schema_name") or ""),
                   str(item.get("catalog_name") or ""))
        if isinstance(item.get("cte_map"), dict):
            for entry in item["cte_map"].get("map") or []:
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    yield "cte", entry["key"], "", ""
        stack.extend((value, False) for value in item.values())


CANARY = ("WITH w AS (SELECT 1) SELECT * FROM unnest([coalesce(current_setting('a'))]) AS u, t, (SHOW s), w "
          "WHERE 1 IN (SELECT 1 FROM range(1))")
"""A query naming one of each thing the walk looks for, at depth."""
CANARY_NAMES = {("table function", "unnest"), ("function", "current_setting"), ("table", "t"), ("shown", "s"),
                ("cte", "w"), ("table function", "range")}


@functools.cache
def walk_understood() -> bool:
    """Whether this DuckDB's parse names what :func:`_named` looks for: every name of the :data:`CANARY` query is
    found."""
    import duckdb

    with duckdb.connect(config={"enable_external_access": False}) as con:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [CANARY]).fetchall()[0][0])
    return CANARY_NAMES <= {(kind, name) for kind, name, _schema, _catalog in _named(tree)}


@functools.cache
def _refused_names() -> re.Pattern[str]:
    """Any name :func:`sqlglot_refusal` refuses, as it would appear in a query's text, lowered."""
    names = (_duckdb_table_functions() - ROW_MAKERS) | SETTING_READERS | set(SELF_PREFIXES)
    return re.compile("|".join(re.escape(name) for name in sorted(names, key=len, reverse=True)))


@functools.cache
def _duckdb_views() -> frozenset[tuple[str, str]]:
    """DuckDB's own views as (name, schema), lowered, each also with an empty schema; read once per process."""
    import duckdb

    with duckdb.connect(config={"enable_external_access": False}) as con:
        rows = con.execute("SELECT lower(view_name), lower(schema_name) FROM duckdb_views() WHERE internal").fetchall()
    return frozenset((view, schema) for view, schema in rows) | frozenset((view, "") for view, _schema in rows)


@functools.cache
def _duckdb_settings() -> frozenset[str]:
    """The names (and aliases) of DuckDB's settings, lowered, which ``SHOW name`` reads."""
    import duckdb

    with duckdb.connect(config={"enable_external_access": False}) as con:
        rows = con.sql("SELECT * FROM duckdb_settings()").to_arrow_table().to_pylist()
    return frozenset(n.lower() for row in rows for n in [row["name"], *(row.get("aliases") or [])]
                     if isinstance(n, str))


@functools.cache
def _duckdb_table_functions() -> frozenset[str]:
    """The names of DuckDB's table functions, table macros and pragmas, lowered."""
    import duckdb

    with duckdb.connect(config={"enable_external_access": False}) as con:
        rows = con.execute("SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
                           "WHERE function_type IN ('table', 'table_macro', 'pragma')").fetchall()
    return frozenset(name for (name,) in rows)
