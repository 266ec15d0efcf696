"""What partial aggregates are, and how DuckDB finishes them: shared by the plans of :mod:`.pushed` (one
dataset) and :mod:`.pushed_join` (a join of two).

The nodes compute each aggregate's partials per partition (``Dataset.aggregate``: sums, counts, minima, maxima,
exact sums of integers); the catalog puts them in one table (:data:`PARTIALS`, one column per partial, named by
:func:`partial_name`) and DuckDB runs the query's finish over it (:func:`finish`). Which SQL aggregates partials
answer, what they are and how DuckDB finishes them are the entries of :mod:`flightpart.query.functions`. What no
plan may answer from partials is told apart here too (:func:`unplannable`, :func:`extra_arguments`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from flightpart.query.functions import AGGREGATE, ROW_COUNT, rolled_up_sql, sql_aggregate

PARTIALS = "partials"
"""The name DuckDB sees the combined partials under."""
GROUPING = "flightpart_grouping"
"""The column of :data:`PARTIALS` saying which grouping a row belongs to (its index in :attr:`Plan.groupings`)."""


class Plan(NamedTuple):
    """A query answered from partial aggregates: the nodes compute each grouping's partials over ``table``'s rows
    that ``where`` keeps, and DuckDB runs ``final`` over all of them together (:data:`PARTIALS`)."""

    table: str
    where: str | None
    groupings: list[tuple[list[str], list[tuple[str, str]]]]
    """(group keys, aggregates as ``Dataset.aggregate`` takes them) per grouping, each one call to the nodes."""
    final: str
    joined: tuple[str, ...] = ()
    """Other datasets ``final`` reads (a join's other side), whole, as DuckDB scans."""
    computed: dict[str, str] = {}  # a NamedTuple's default: never changed in place
    """Columns the nodes compute from SQL expressions before they aggregate (see :mod:`.computed`), by name."""


def distinct_columns(distinct: Any, *, qualified: bool = False) -> tuple[str, ...] | None:
    """The columns counted by ``count(DISTINCT x)`` or ``count(DISTINCT (x, y))``, or None for anything else (a
    column of a named table too, unless ``qualified``)."""
    from sqlglot import exp

    values = distinct.expressions
    if len(values) == 1 and isinstance(values[0], exp.Tuple):
        values = values[0].expressions
    if not values or not all(isinstance(v, exp.Column) and (qualified or not v.table) for v in values):
        return None
    return tuple(dict.fromkeys(v.name for v in values))


def clause(tree: Any, name: str) -> Any:
    """A clause of a parsed query (sqlglot names some with a trailing underscore: ``from_``, ``with_``)."""
    return tree.args.get(name) or tree.args.get(f"{name}_")


def select_aliases(tree: Any) -> set[str]:
    from sqlglot import exp

    return {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}


def partial_name(column: str, function: str) -> str:
    """The column of :data:`PARTIALS` holding ``function``'s partial of ``column``: a name no query's alias takes
    by chance (an alias named ``fare_sum`` would otherwise stand in HAVING for the partial ``fare_sum``)."""
    return f"flightpart {function}({column})"


def partials_of(found: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """The partial aggregates the nodes compute for ``found`` when DuckDB finishes them over several partial rows a
    group (:func:`finish`): each function's partials (``avg`` as an exact sum and a count)."""
    partial: list[tuple[str, str]] = []
    for name, function in found.values():
        partial += [(name, p) for p in AGGREGATE[function].partials]
    return list(dict.fromkeys(partial)) or [("", ROW_COUNT)]


def finish(function: str, of: Callable[[str], Any], *, within: Callable[[Any], Any] = lambda aggregate: aggregate,
           unmatched_count_once: bool = False) -> Any:
    """The SQL finishing one aggregate over the partial rows of a group, as DuckDB types it: each of its partials
    rolled up by its entry's ``rollup`` (sums of the partial sums and counts, minima of minima, maxima of maxima),
    then its entry's ``finish_sql`` (a count 0 over no rows, ``avg`` as the sum of sums over the sum of counts) and
    its ``duckdb_type`` (an exact sum as a HUGEINT). ``of(partial function)``: the partial's column; ``within``:
    wraps each aggregate (a FILTER); ``unmatched_count_once``: a row without a partial (a left join's) counts once
    in count(*)."""
    from sqlglot import exp

    entry = AGGREGATE[function]
    rolled = []
    for name in entry.partials:
        value = of(name)
        if unmatched_count_once and not AGGREGATE[name].reads_column:
            value = exp.Coalesce(this=value, expressions=[exp.Literal.number(1)])
        rolled.append(within(rolled_up_sql(AGGREGATE[name].rollup, value)))
    finished = entry.finish_sql(rolled)
    return finished if entry.duckdb_type is None else exp.Cast(this=finished, to=exp.DataType.build(entry.duckdb_type))


def exact_sums(found: dict[str, tuple[str, str]], schema: pa.Schema | None) -> dict[str, tuple[str, str]]:
    """``found`` with each aggregate of an integer or boolean column of ``schema`` whose entry names another for
    integers (``sum``: ``exact_sum``) that other (DuckDB sums them into a HUGEINT; Arrow's int64 sum would wrap
    around past 2**63)."""
    if schema is None:
        return found
    exact = {f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)}
    return {sql: (c, (AGGREGATE[f].integers or f) if c in exact else f) for sql, (c, f) in found.items()}


def extra_arguments(aggregate: Any) -> bool:
    """Whether an aggregate has arguments besides its column (``min(x, 3)`` is DuckDB's three smallest values)."""
    from sqlglot import exp

    return any(isinstance(v, exp.Expression) or (isinstance(v, list) and v)
               for k, v in aggregate.args.items() if k != "this")


def unplannable(tree: Any) -> bool:
    """Whether ``tree`` is not one SELECT over datasets that a plan here may answer from partials, first rows or a
    plain scan: it holds a window, a subquery of any kind (``EXISTS``, ``ARRAY(SELECT ...)``, ``IN (SELECT ...)``),
    a WITH query, QUALIFY, ``GROUP BY ALL``, a function sqlglot does not know (``count_star()``, ``fsum``:
    it cannot tell an aggregate), ``COLUMNS(...)``, a sample (``USING SAMPLE``, ``TABLESAMPLE``) or a table alias
    renaming its columns (``trips AS t(a, b)``)."""
    from sqlglot import exp

    if not isinstance(tree, exp.Select) or clause(tree, "with") or tree.args.get("qualify"):
        return True
    group = tree.args.get("group")
    if group is not None and group.args.get("all"):
        return True
    if tree.find(exp.Window, exp.Subquery, exp.Exists, exp.Anonymous, exp.Columns, exp.TableSample):
        return True
    if any(select is not tree for select in tree.find_all(exp.Select)):
        return True
    return any(isinstance(t.args.get("alias"), exp.TableAlias) and t.args["alias"].columns for t in tree.find_all(exp.Table))


def aggregates_in(tree: Any, *, qualified: bool = False) -> tuple[dict[str, tuple[str, str]], list[tuple[str, ...]]] | None:
    """The aggregates of ``tree`` partials answer, as ``({aggregate's SQL: (column, function)}, [the columns of each
    count(DISTINCT ...)])``, or None when one is anything else (another function, an expression of columns, a
    qualified column unless ``qualified``)."""
    from sqlglot import exp

    found: dict[str, tuple[str, str]] = {}
    distinct: dict[tuple[str, ...], None] = {}
    for agg in tree.find_all(exp.AggFunc):
        entry = sql_aggregate(type(agg).__name__, isinstance(agg.this, exp.Star))
        if isinstance(agg, exp.Count) and isinstance(agg.this, exp.Distinct):
            columns = distinct_columns(agg.this, qualified=qualified)
            if columns is None:
                return None
            distinct[columns] = None
        elif entry is None or agg.args.get("distinct") or isinstance(agg.this, exp.Distinct) or extra_arguments(agg):
            return None
        elif not entry.reads_column:
            found[agg.sql()] = ("", entry.name)
        elif isinstance(agg.this, exp.Column) and (qualified or not agg.this.table):
            found[agg.sql()] = (agg.this.name, entry.name)
        else:
            return None
    return found, list(distinct)


def partials_named(table: Any) -> Any:
    """The FROM item the final query reads the partials with, under the alias ``table`` had (``FROM trips t`` ->
    ``FROM partials AS t``), so the query's qualified columns still resolve."""
    from sqlglot import exp

    alias = table.args.get("alias")
    return exp.Table(this=exp.to_identifier(PARTIALS), alias=alias.copy() if alias is not None else None)
