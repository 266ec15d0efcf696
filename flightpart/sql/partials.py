"""Partial aggregates and how DuckDB finishes them, for :mod:`.pushed` and :mod:`.pushed_join`.

The nodes compute each aggregate's partials per partition; DuckDB runs the
query's finish over them (:data:`PARTIALS`, :func:`finish`), rolled up as
:mod:`flightpart.query.functions` says: sums of sums and counts, minima of
minima, maxima of maxima, ``avg`` as the sum of sums over the sum of counts.
That equals the aggregate over all rows whatever the partitioning; what would
not is refused (:func:`unplannable`; decision 0035).
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
    """A query answered from partials: the nodes compute each grouping's partials over ``table``'s rows ``where`` keeps,
    and DuckDB runs ``final`` over all of them (:data:`PARTIALS`)."""

    table: str
    where: str | None
    groupings: list[tuple[list[str], list[tuple[str, str]]]]
    """(group keys, aggregates as ``Dataset.aggregate`` takes them) per grouping, one call to the nodes each."""
    final: str
    joined: tuple[str, ...] = ()
    """Other datasets ``final`` reads (a join's other side), whole, as DuckDB scans."""
    computed: dict[str, str] = {}  # a NamedTuple's default: never changed in place
    """Columns the nodes compute before they aggregate (:mod:`.computed`), by name."""


def distinct_columns(distinct: Any, *, qualified: bool = False) -> tuple[str, ...] | None:
    """The columns counted by ``count(DISTINCT x)`` or ``count(DISTINCT (x, y))``, or None for anything else (a
    qualified column too, unless ``qualified``)."""
    from sqlglot import exp

    values = distinct.expressions
    if len(values) == 1 and isinstance(values[0], exp.Tuple):
        values = values[0].expressions
    if not values or not all(isinstance(v, exp.Column) and (qualified or not v.table) for v in values):
        return None
    return tuple(dict.fromkeys(v.name for v in values))


def clause(tree: Any, name: str) -> Any:
    """A clause of a parsed query (sqlglot names some with a trailing underscore)."""
    return tree.args.get(name) or tree.args.get(f"{name}_")


def select_aliases(tree: Any) -> set[str]:
    from sqlglot import exp

    return {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}


def partial_name(column: str, function: str) -> str:
    """The column of :data:`PARTIALS` holding ``function``'s partial of ``column``: a name no alias takes by chance."""
    return f"flightpart {function}({column})"


def partials_of(found: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """The partials the nodes compute for ``found`` (``avg`` as an exact sum and a count)."""
    partial: list[tuple[str, str]] = []
    for name, function in found.values():
        partial += [(name, p) for p in AGGREGATE[function].partials]
    return list(dict.fromkeys(partial)) or [("", ROW_COUNT)]


def finish(function: str, of: Callable[[str], Any], *, within: Callable[[Any], Any] = lambda aggregate: aggregate,
           unmatched_count_once: bool = False) -> Any:
    """The SQL finishing one aggregate over a group's partial rows, typed as DuckDB types it. ``of(partial)``: its
    column; ``within``: wraps each aggregate; ``unmatched_count_once``: a left join's unmatched row counts once in
    count(*)."""
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
    """``found`` with each aggregate of an integer or boolean column replaced by its exact form (``sum``:
    ``exact_sum``), summed as DuckDB does into a HUGEINT."""
    if schema is None:
        return found
    exact = {f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)}
    return {sql: (c, (AGGREGATE[f].integers or f) if c in exact else f) for sql, (c, f) in found.items()}


def extra_arguments(aggregate: Any) -> bool:
    """Whether an aggregate has arguments besides its column (``min(x, 3)``)."""
    from sqlglot import exp

    return any(isinstance(v, exp.Expression) or (isinstance(v, list) and v)
               for k, v in aggregate.args.items() if k != "this")


def unplannable(tree: Any) -> bool:
    """Whether ``tree`` is not one SELECT a plan may answer: a window, subquery, WITH, QUALIFY, ``GROUP BY ALL``, a
    function sqlglot does not know, ``COLUMNS(...)``, a sample, or an alias renaming columns."""
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
    return any(isinstance(t.args.get("alias"), exp.TableAlias) and t.args["alias"].columns
               for t in tree.find_all(exp.Table))


def aggregates_in(tree: Any, *, qualified: bool = False
                  ) -> tuple[dict[str, tuple[str, str]], list[tuple[str, ...]]] | None:
    """``tree``'s aggregates partials answer, as ``({SQL: (column, function)}, [columns of each count(DISTINCT ...)])``,
    or None when one is anything else."""
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
    """The FROM item reading the partials under ``table``'s alias, so qualified columns still resolve."""
    from sqlglot import exp

    alias = table.args.get("alias")
    return exp.Table(this=exp.to_identifier(PARTIALS), alias=alias.copy() if alias is not None else None)
