"""What partial aggregates are, and how DuckDB finishes them: shared by the plans of :mod:`.pushed` (one
dataset) and :mod:`.joined` (a join of two).

The nodes compute each aggregate's partials per partition (``Dataset.aggregate``: sums, counts, minima, maxima,
exact sums of integers); the catalog puts them in one table (:data:`PARTIALS`, one column per partial, named by
:func:`partial_name`) and DuckDB runs the query's finish over it (:func:`finish`). What no plan may answer from
partials is told apart here too (:func:`unplannable`, :func:`extra_arguments`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

PARTIALS = "partials"
"""The name DuckDB sees the combined partials under."""
GROUPING = "flightpart_grouping"
"""The column of :data:`PARTIALS` saying which grouping a row belongs to (its index in :attr:`Plan.groupings`)."""
AGGREGATES = {"Sum": "sum", "Min": "min", "Max": "max", "Count": "count", "Avg": "mean"}
"""The aggregates partials answer (sqlglot's class name -> ``Dataset.aggregate``'s function)."""


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
    group (:func:`finish`): ``avg`` as an exact sum and a count."""
    partial: list[tuple[str, str]] = []
    for name, function in found.values():
        partial += [(name, "exact_sum"), (name, "count")] if function == "mean" else [(name, function)]
    return list(dict.fromkeys(partial)) or [("", "count_all")]


def finish(function: str, of: Callable[[str], Any], *, within: Callable[[Any], Any] = lambda aggregate: aggregate,
           unmatched_count_once: bool = False) -> Any:
    """The SQL finishing one aggregate over the partial rows of a group, as DuckDB types it: sums of the partial sums
    and counts (0 over no rows), minima of minima, maxima of maxima, ``avg`` as the sum of sums over the sum of
    counts, an exact sum as a HUGEINT. ``of(partial function)``: the partial's column; ``within``: wraps each
    aggregate (a FILTER); ``unmatched_count_once``: a row without a partial (a left join's) counts once in count(*)."""
    from sqlglot import exp

    if function in ("min", "max"):
        return within((exp.Min if function == "min" else exp.Max)(this=of(function)))
    if function == "sum":
        return within(exp.Sum(this=of("sum")))
    if function == "exact_sum":
        return exp.Cast(this=within(exp.Sum(this=of("exact_sum"))), to=exp.DataType.build("HUGEINT"))
    if function == "mean":
        return exp.Div(this=within(exp.Sum(this=of("exact_sum"))), expression=within(exp.Sum(this=of("count"))))
    counted = of(function)
    if function == "count_all" and unmatched_count_once:
        counted = exp.Coalesce(this=counted, expressions=[exp.Literal.number(1)])
    total = exp.Coalesce(this=within(exp.Sum(this=counted)), expressions=[exp.Literal.number(0)])
    return exp.Cast(this=total, to=exp.DataType.build("BIGINT"))  # count, count(*)


def exact_sums(found: dict[str, tuple[str, str]], schema: pa.Schema | None) -> dict[str, tuple[str, str]]:
    """``found`` with each ``sum`` of an integer or boolean column of ``schema`` an ``exact_sum`` (DuckDB sums them
    into a HUGEINT; Arrow's int64 sum would wrap around past 2**63)."""
    if schema is None:
        return found
    exact = {f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)}
    return {sql: (c, "exact_sum" if f == "sum" and c in exact else f) for sql, (c, f) in found.items()}


def extra_arguments(aggregate: Any) -> bool:
    """Whether an aggregate has arguments besides its column (``min(x, 3)`` is DuckDB's three smallest values)."""
    from sqlglot import exp

    return any(isinstance(v, exp.Expression) or (isinstance(v, list) and v)
               for k, v in aggregate.args.items() if k != "this")


def unplannable(tree: Any) -> bool:
    """Whether ``tree`` holds what no plan here may answer from partials or first rows: a function sqlglot does not
    know (``count_star()``, ``fsum``, ``product``: it cannot tell an aggregate), ``COLUMNS(...)``, a sample
    (``USING SAMPLE``, ``TABLESAMPLE``), a table alias renaming its columns (``trips AS t(a, b)``)."""
    from sqlglot import exp

    if tree.find(exp.Anonymous, exp.Columns, exp.TableSample):
        return True
    return any(isinstance(t.args.get("alias"), exp.TableAlias) and t.args["alias"].columns for t in tree.find_all(exp.Table))
