"""Expressions of columns a query groups by or aggregates, computed by the nodes before they aggregate.

Each expression the nodes compute exactly as DuckDB does
(:func:`flightpart.query.predicates.parse_sql_value`) becomes a computed column,
and the query is rewritten to read it outside its WHERE; a query with any other
expression is left whole.
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa

from flightpart.errors import InvalidExpression
from flightpart.query.functions import SQL_CLASSES
from flightpart.query.predicates import date_trunc_unit_not_quoted, parse_sql_value

COMPUTED = "flightpart computed"
"""The prefix of computed columns' names, which no column or alias takes by chance."""


def computed_on_nodes(tree: Any, schema: pa.Schema, query: str) -> tuple[dict[str, str], pa.Schema] | None:
    """Rewrite ``tree`` in place to read a computed column for each grouping and aggregated expression; returns the
    columns (name -> SQL) and ``schema`` with them, or None when one cannot be computed exactly."""
    from sqlglot import exp

    if date_trunc_unit_not_quoted(query):
        return None  # date_trunc(unit_column, ts): sqlglot reads a column named like a unit as that unit
    aliases = {e.alias.lower(): e.this for e in tree.expressions if isinstance(e, exp.Alias)}
    columns = {name.lower() for name in schema.names}
    wanted = _wanted(tree, aliases, columns)
    if not wanted:
        return {}, schema
    if set(aliases) & columns:
        return None  # an alias named like a column: DuckDB's HAVING binds the alias, a computed column the column
    dates = {f.name.lower() for f in schema if pa.types.is_date(f.type)}
    if not _date_trunc_of_a_date_is_a_timestamp() and any(
            isinstance(t.this, exp.Column) and t.this.name.lower() in dates
            for expression in wanted for t in expression.find_all(exp.TimestampTrunc, exp.DateTrunc)):
        return None  # this DuckDB truncates a DATE to a DATE: the nodes' TIMESTAMP would print otherwise
    named = _named(wanted, schema)
    if named is None:
        return None
    computed, by_text, fields = named
    _read_computed(tree, by_text)
    return computed, pa.schema(fields)


def _wanted(tree: Any, aliases: dict[str, Any], columns: set[str]) -> list[Any]:
    """The non-column expressions ``tree`` groups by (a key naming an alias replaced in place by its expression), then
    those its aggregates take, outside WHERE."""
    from sqlglot import exp

    group = tree.args.get("group")
    wanted: list[Any] = []
    for key in list(group.expressions) if group else []:
        named = key.name.lower() if isinstance(key, exp.Column) and not key.table else None
        if named is not None and named not in columns and named in aliases:
            key = key.replace(aliases[named].copy())  # GROUP BY an alias of an expression (a column wins, as in DuckDB,
            # whatever the letters' case)
        if not isinstance(key, exp.Column):
            wanted.append(key)
    for aggregate in tree.find_all(exp.AggFunc):
        value = aggregate.this
        if type(aggregate).__name__ in SQL_CLASSES and isinstance(value, exp.Expression) \
                and not isinstance(value, (exp.Column, exp.Star, exp.Distinct)) \
                and value.find_ancestor(exp.Where) is None:
            wanted.append(value)
    return wanted


def _named(wanted: list[Any], schema: pa.Schema) -> tuple[dict[str, str], dict[str, str], list[pa.Field]] | None:
    """Each distinct expression as a computed column: (name -> SQL, SQL -> name, the fields), or None when one is not
    computed exactly."""
    from sqlglot import exp

    computed: dict[str, str] = {}
    by_text: dict[str, str] = {}
    fields = list(schema)
    for expression in wanted:
        text = expression.sql(dialect="duckdb")
        if text in by_text:
            continue
        if expression.find(exp.AggFunc, exp.Window) is not None:
            return None
        try:
            _expression, type_, _reads = parse_sql_value(text, schema)
        except InvalidExpression:
            return None
        name = f"{COMPUTED} {len(computed)}"
        computed[name] = text
        by_text[text] = name
        fields.append(pa.field(name, type_))
    return computed, by_text, fields


def _read_computed(tree: Any, by_text: dict[str, str]) -> None:
    """Rewrite ``tree`` in place to read each computed column outside its WHERE (the nodes filter before they
    compute)."""
    from sqlglot import exp

    where = tree.args.get("where")
    tree.set("where", None)

    def as_column(node: Any) -> Any:
        if isinstance(node, exp.Expression) and not isinstance(node, (exp.Column, exp.Literal, exp.Alias)):
            name = by_text.get(node.sql(dialect="duckdb"))
            if name is not None:
                return exp.column(name, quoted=True)
        return node

    rewritten = tree.transform(as_column, copy=False)
    assert rewritten is tree  # the root is a SELECT, never an expression computed
    if where is not None:
        tree.set("where", where)


@functools.lru_cache(maxsize=1)
def _date_trunc_of_a_date_is_a_timestamp() -> bool:
    """Whether this DuckDB returns a TIMESTAMP for ``date_trunc`` of a DATE, as the nodes compute it."""
    import duckdb

    return duckdb.connect().sql("SELECT typeof(date_trunc('month', DATE '2024-05-17'))").fetchall()[0][0] == "TIMESTAMP"
