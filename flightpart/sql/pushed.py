"""Queries whose work runs on the nodes: GROUP BY aggregates (one row per group and partition) and
``ORDER BY ... LIMIT`` (each partition's first rows, see :func:`top_plan`).

A query over one dataset whose SELECT list is group keys and ``sum``,
``min``, ``max``, ``count``, ``count(*)`` and ``avg`` of columns, with an
optional WHERE that flightpart's filters express exactly, is answered in
two steps: ``ds.filter(where).aggregate(...)`` (partials per partition on
the nodes, combined at the catalog), then DuckDB over that small table for
what is left: HAVING, ORDER BY, LIMIT, expressions over the aggregates,
and the types DuckDB gives (``sum`` of integers is a HUGEINT).
``count(DISTINCT x)`` (alone, of one column) goes the same way: the nodes
group by the keys and ``x``, so each partition sends one row per group and
distinct value, and DuckDB counts them per group; beside other aggregates,
every partial is taken by the keys and ``x`` and DuckDB finishes them by
the keys (:func:`_mixed_plan`). Any other
query (joins, DISTINCT, windows, functions of columns inside an aggregate,
a filter flightpart cannot express) returns None here and is run whole by
DuckDB over the pushdown scans.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightpart.errors import FlightpartError

PARTIALS = "partials"
"""The name DuckDB sees the combined partials under."""
_FUNCTIONS = {"Sum": "sum", "Min": "min", "Max": "max", "Count": "count", "Avg": "mean"}


def plan(query: str, known: set[str]) -> tuple[str, str | None, list[str], list[tuple[str, str]], str] | None:
    """(table, where text, group keys, aggregates, final query over :data:`PARTIALS`) for a query this module
    answers, or None."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(query, read="duckdb")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or tree.args.get("joins") or tree.args.get("distinct") or tree.find(exp.Window) \
            or _arg(tree, "with") or tree.find(exp.Subquery) or tree.args.get("qualify") or tree.find(exp.Filter):
        return None  # (an aggregate's FILTER clause filters its input rows: the partials cannot take it)
    source = _arg(tree, "from")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.db or table.name not in known:
        return None
    group = tree.args.get("group")
    keys = [g.name for g in (group.expressions if group else [])]
    if group and not all(isinstance(g, exp.Column) and not g.table for g in group.expressions):
        return None
    found: dict[str, tuple[str, str]] = {}  # an aggregate's SQL -> (column, function)
    distinct: set[str] = set()  # columns of count(DISTINCT column)
    for agg in tree.find_all(exp.AggFunc):
        function = _FUNCTIONS.get(type(agg).__name__)
        if function == "count" and isinstance(agg.this, exp.Distinct) and len(agg.this.expressions) == 1 \
                and isinstance(agg.this.expressions[0], exp.Column) and not agg.this.expressions[0].table:
            distinct.add(agg.this.expressions[0].name)
            continue
        if function is None or agg.args.get("distinct") or isinstance(agg.this, exp.Distinct):
            return None
        if isinstance(agg.this, exp.Star) and function == "count":
            found[agg.sql()] = ("", "count_all")
        elif isinstance(agg.this, exp.Column) and not agg.this.table:
            found[agg.sql()] = (agg.this.name, function)
        else:
            return None
    if distinct:
        if len(distinct) > 1:
            return None  # count(DISTINCT) of several columns: DuckDB runs it whole
        if found:
            return _mixed_plan(tree, table.name, keys, distinct.pop(), found)
        return _distinct_plan(tree, table.name, keys, distinct.pop())
    if not found:
        return None
    if not _only_keys_outside_aggregates(tree, keys):
        return None
    where = tree.args.get("where")
    where_text = where.this.sql(dialect="duckdb") if where is not None else None
    final = tree.copy()
    final.set("where", None)
    final.set("group", None)
    final = final.from_(PARTIALS, copy=False)
    having = final.args.get("having")
    if having is not None:
        final.set("having", None)
        final.set("where", exp.Where(this=having.this))
    final = final.transform(lambda node: _partial_column(node, found))
    return table.name, where_text, keys, list(dict.fromkeys(found.values())), final.sql(dialect="duckdb")


def _distinct_plan(tree: Any, table: str, keys: list[str], column: str) -> tuple | None:
    """``count(DISTINCT column)`` per group: the nodes send one row per group and distinct value of ``column`` (a
    GROUP BY of the keys and the column), combined across partitions; DuckDB then counts the non-null values per
    group over those rows, keeping GROUP BY and HAVING."""
    from sqlglot import exp

    if not _only_keys_outside_aggregates(tree, keys, distinct=column):
        return None
    where = tree.args.get("where")
    final = tree.copy()
    final.set("where", None)
    final = final.from_(PARTIALS, copy=False)
    final = final.transform(lambda node: exp.Count(this=exp.column(column, quoted=True))
                            if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct) else node)
    return (table, where.this.sql(dialect="duckdb") if where is not None else None, list(dict.fromkeys([*keys, column])),
            [("", "count_all")], final.sql(dialect="duckdb"))


def _mixed_plan(tree: Any, table: str, keys: list[str], column: str, found: dict[str, tuple[str, str]]) -> tuple | None:
    """``count(DISTINCT column)`` beside other aggregates: the nodes take every partial aggregate by the keys *and*
    ``column`` (one row per group, distinct value and partition, as for the distinct count alone), and DuckDB
    finishes by the keys: sums of the partial sums and counts, minima of minima, maxima of maxima, ``avg`` as the
    sum of sums over the sum of counts, and the distinct count as the count of non-null values of ``column``."""
    from sqlglot import exp

    if not _only_keys_outside_aggregates(tree, keys, distinct=column):
        return None
    partial: list[tuple[str, str]] = []
    for name, function in found.values():
        partial += [(name, "sum"), (name, "count")] if function == "mean" else [(name, function)]

    def finished(node: Any) -> Any:
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
            return exp.Count(this=exp.column(column, quoted=True))
        if not isinstance(node, exp.AggFunc) or node.sql() not in found:
            return node
        name, function = found[node.sql()]
        of = lambda f: exp.column(f"{name}_{f}" if f != "count_all" else "count_all", quoted=True)  # noqa: E731
        if function in ("min", "max"):
            return (exp.Min if function == "min" else exp.Max)(this=of(function))
        if function == "sum":
            return exp.Sum(this=of("sum"))
        if function == "mean":
            return exp.Div(this=exp.Sum(this=of("sum")), expression=exp.Sum(this=of("count")))
        total = exp.Coalesce(this=exp.Sum(this=of(function)), expressions=[exp.Literal.number(0)])  # 0 over no rows
        return exp.Cast(this=total, to=exp.DataType.build("BIGINT"))  # count, count(*)

    where = tree.args.get("where")
    final = tree.copy()
    final.set("where", None)
    final = final.from_(PARTIALS, copy=False).transform(finished)
    return (table, where.this.sql(dialect="duckdb") if where is not None else None, list(dict.fromkeys([*keys, column])),
            list(dict.fromkeys(partial)), final.sql(dialect="duckdb"))


def _only_keys_outside_aggregates(tree: Any, keys: list[str], *, distinct: str | None = None) -> bool:
    """Whether every column outside the aggregates and WHERE is a group key or a select alias (what the partials
    can answer), and the ``distinct`` column, unless it is a key, appears only inside its aggregate."""
    from sqlglot import exp

    aliases = _aliases(tree)
    for column in tree.find_all(exp.Column):
        if column.find_ancestor(exp.AggFunc, exp.Where) is not None or column.name in keys:
            continue
        if column.name == distinct or column.name not in aliases:
            return False
    return True


def _arg(tree: Any, name: str) -> Any:
    """A clause of a parsed query (sqlglot names some with a trailing underscore: ``from_``, ``with_``)."""
    return tree.args.get(name) or tree.args.get(f"{name}_")


def _aliases(tree: Any) -> set[str]:
    from sqlglot import exp

    return {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}


def _partial_column(node: Any, found: dict[str, tuple[str, str]]) -> Any:
    """An aggregate replaced by its column of the combined partials (a sum of integers cast as DuckDB types it)."""
    from sqlglot import exp

    if isinstance(node, exp.AggFunc) and node.sql() in found:
        column, function = found[node.sql()]
        name = "count_all" if function == "count_all" else f"{column}_{function}"
        return exp.column(name, quoted=True)
    return node


def top_plan(query: str, known: set[str]) -> tuple[str, str | None, list[str] | None, list[tuple], int, str] | None:
    """For ``SELECT ... FROM dataset [WHERE ...] ORDER BY columns LIMIT n [OFFSET m]`` (no aggregate, DISTINCT,
    join, window or subquery): (table, where text, columns read (None: all), pyarrow sort keys, rows each partition
    keeps (n + m), the query without its WHERE), else None. Each partition sends its first n + m rows by the keys;
    DuckDB runs the query over what they sent, the same rows it would have kept from the whole table."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(query, read="duckdb")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or tree.args.get("joins") or tree.args.get("distinct") or tree.find(exp.Window) \
            or _arg(tree, "with") or tree.find(exp.Subquery) or tree.args.get("qualify") or tree.args.get("group") \
            or tree.args.get("having") or tree.find(exp.AggFunc):
        return None
    source = _arg(tree, "from")
    table = source.this if source is not None else None
    order, limit, offset = tree.args.get("order"), tree.args.get("limit"), tree.args.get("offset")
    if not isinstance(table, exp.Table) or table.db or table.name not in known or order is None or limit is None:
        return None
    counts = [_literal_count(clause) for clause in (limit, offset) if clause is not None]
    if None in counts:
        return None
    aliases = _aliases(tree)
    keys = []
    for ordered in order.expressions:
        column = ordered.this
        if not isinstance(column, exp.Column) or column.table or column.name in aliases:
            return None  # an expression, a position, a qualified column or a select alias: DuckDB orders it
        keys.append((column.name, "descending" if ordered.args.get("desc") else "ascending",
                     "at_start" if ordered.args.get("nulls_first") else "at_end"))
    used = [c for c in tree.find_all(exp.Column) if c.find_ancestor(exp.Where) is None]
    if any(c.table for c in used):
        return None
    columns = None if any(isinstance(e, exp.Star) for e in tree.expressions) else \
        list(dict.fromkeys([c.name for c in used] + [k[0] for k in keys]))
    where = tree.args.get("where")
    final = tree.copy()
    final.set("where", None)
    return (table.name, where.this.sql(dialect="duckdb") if where is not None else None, columns, keys, sum(counts),
            final.sql(dialect="duckdb"))


def _literal_count(clause: Any) -> int | None:
    """The row count of a LIMIT or OFFSET written as a plain non-negative integer, else None."""
    from sqlglot import exp

    value = clause.args.get("expression")
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    return None


def answer_top(query: str, known: set[str], open_dataset: Callable[[str], Any],
               run_over: Callable[[str, str, pa.Table], pa.Table]) -> pa.Table | None:
    """``query`` answered from each partition's first rows (:func:`top_plan`), or None when it is not such a query
    or flightpart cannot express its filter exactly; ``run_over(final, table, rows)`` runs DuckDB over the rows."""
    planned = top_plan(query, known)
    if planned is None:
        return None
    name, where, columns, keys, rows, final = planned
    ds = open_dataset(name)
    try:
        if where is not None:
            ds = ds.filter(where)
        if columns is not None:
            ds = ds.select(columns)
        candidates = ds.top_candidates(rows, keys)
    except (FlightpartError, KeyError, ValueError):
        return None  # a filter flightpart cannot express, or a name that is not a column: DuckDB runs it whole
    return run_over(final, name, candidates)


def answer(query: str, known: set[str], open_dataset: Callable[[str], Any], run_final: Callable[[str, pa.Table], pa.Table]
           ) -> pa.Table | None:
    """``query`` answered with its aggregates on the nodes, or None when it is not such a query (see the module doc)."""
    planned = plan(query, known)
    if planned is None:
        return None
    name, where, keys, aggregates, final = planned
    ds = open_dataset(name)
    if any(k in ds.schema.names and pa.types.is_floating(ds.schema.field(k).type) for k in keys):
        return None  # pyarrow groups -0.0 apart from 0.0, DuckDB does not: floating-point keys run whole
    integer_sums = [c for c, f in aggregates if f == "sum" and c in ds.schema.names
                    and pa.types.is_integer(ds.schema.field(c).type)]
    try:
        if where is not None:
            ds = ds.filter(where)
        partials = ds.aggregate(aggregates, by=keys)
    except FlightpartError:
        return None  # a filter or an aggregate flightpart cannot express exactly: DuckDB runs the query whole
    for column in integer_sums:  # DuckDB sums integers into a HUGEINT
        index = partials.schema.get_field_index(f"{column}_sum")
        partials = partials.set_column(index, f"{column}_sum", partials.column(index).cast(pa.decimal128(38, 0)))
    return run_final(final, partials)
