"""Which datasets a query's table names mean.

A dataset is a table under its name (its latest version) or as ``name@version``.
DuckDB matches names whatever their case, so two datasets differing only in case
cannot both be read by one query.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from .duckdb_errors import SqlError
from .parsed import KEPT, KEPT_TEXT, parsed_to_read

VERSIONED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,127})@(?P<version>[0-9]{1,18})$")


def named_datasets(query: str, known: Callable[[], set[str]]) -> list[str]:
    """The datasets ``query`` names as tables that exist (``known()``: every dataset's name); others are left for DuckDB
    to refuse."""
    wanted = _tables_named(query) if len(query) <= KEPT_TEXT else _tables_in(query)
    if not wanted:
        return []  # none, or DuckDB, which parses it, names the tables it cannot find
    names = known()
    named = sorted(n for n in wanted if names_dataset(n, names))
    folded: dict[str, str] = {}
    for name in named:  # DuckDB's names are one table whatever their case: two datasets would be read as one
        other = folded.setdefault(name.casefold(), name)
        if other != name and dataset_named(other, names) != dataset_named(name, names):
            raise SqlError(f"{other!r} and {name!r} are two datasets whose names differ only in case, which SQL "
                           "does not tell apart (DuckDB reads both as one table): query them separately",
                           field="query")
    return named


def _tables_in(query: str) -> frozenset[str]:
    """The plain table names ``query`` reads (a WITH query named as a dataset hides it from the rest of the query, not
    from its own body: it is named too); none when sqlglot does not read it."""
    from sqlglot import exp

    tree = parsed_to_read(query)
    if tree is None:
        return frozenset()
    return frozenset(t.name for t in tree.find_all(exp.Table) if t.name and t.db in ("", "main") and not t.catalog)


@functools.lru_cache(maxsize=KEPT)
def _tables_named(query: str) -> frozenset[str]:
    """:func:`_tables_in`, kept per text (a query's names are looked up several times as it is planned)."""
    return _tables_in(query)


def names_dataset(table: str, known: set[str]) -> bool:
    """Whether a table name means one of the ``known`` datasets (``name@version``: a version of one)."""
    return dataset_named(table, known) is not None


def dataset_named(table: str, known: set[str]) -> str | None:
    """The dataset (and ``@version``) a table name means: the one of that very name, else the only one whose name
    differs in case; None when none or several do."""
    match = VERSIONED.match(table)
    name, suffix = (match["name"], table[len(match["name"]):]) if match else (table, "")
    if name in known:
        return name + suffix
    folded = [k for k in known if k.casefold() == name.casefold()]
    return folded[0] + suffix if len(folded) == 1 else None


def lists_tables(query: str, named: list[str]) -> bool:
    """Whether ``query`` lists tables (``SHOW TABLES``, ``information_schema``) and reads no table but those and the
    datasets ``named``; a query naming another table runs without the listing, and that name is refused."""
    from sqlglot import exp

    tree = parsed_to_read(query)
    if tree is None:
        return False
    if isinstance(tree, exp.Show):
        return True
    tables = list(tree.find_all(exp.Table))
    listing = [t for t in tables if t.db.lower() == "information_schema" and not t.catalog]
    withs = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    others = [t for t in tables if not any(t is seen for seen in listing) and t.name and t.name not in withs]
    return bool(listing) and all(t.name in named and t.db in ("", "main") and not t.catalog for t in others)
