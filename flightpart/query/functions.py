"""What the nodes can compute: one entry per aggregate and per scalar function, read by every place that names one.

:class:`AggregateFunction` and :class:`ScalarFunction` entries are read by the wire's validation, the partials,
the SQL planners and translator, pruning and the tables of ``docs/querying.md`` (:func:`markdown`), so a new
function is one entry here. Core: it imports nothing of flightpart, and sqlglot only where it builds SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

EXACT = pa.decimal128(38, 0)
"""What an exact sum adds integers and booleans up as: Arrow's own sum of int64 wraps around past 2**63 without a
word; 38 digits hold any sum of up to 10**19 int64 values (SQL's HUGEINT holds it too)."""


def _same(values: Sequence[Any]) -> Any:
    return values[0]


def _arrow_count(values: Sequence[pa.ChunkedArray]) -> pa.ChunkedArray:
    return pc.cast(values[0], pa.int64())


def _arrow_ratio(values: Sequence[pa.ChunkedArray]) -> pa.ChunkedArray:
    total, count = values
    quotient = pc.divide(pc.cast(total, pa.float64(), safe=False), pc.cast(count, pa.float64()))
    return pc.if_else(pc.equal(count, 0), pa.scalar(None, pa.float64()), quotient)


def _sql_count(values: Sequence[Any]) -> Any:
    from sqlglot import exp

    total = exp.Coalesce(this=values[0], expressions=[exp.Literal.number(0)])
    return exp.Cast(this=total, to=exp.DataType.build("BIGINT"))


def _sql_ratio(values: Sequence[Any]) -> Any:
    from sqlglot import exp

    return exp.Div(this=values[0], expression=values[1])


@dataclass(frozen=True)
class AggregateFunction:
    """One function ``Dataset.aggregate`` takes (and a ticket carries) by ``name``.

    ``partials``: the entries a node computes per partition; ``arrow``: Arrow's hash aggregate over rows (over
    :data:`EXACT` when ``exact``); ``rollup``: the aggregate combining this partial across partitions (None: not a
    partial); ``finish_arrow`` / ``finish_sql``: the result from rolled-up partials; ``sql``: the SQL aggregate it
    answers (sqlglot's class name; ``integers``: the entry used over integer columns); ``duckdb_type``: DuckDB's
    type where Arrow's differs; ``copies_values``: its partials are column values; ``skips_nan``: Arrow skips NaN
    where DuckDB does not; ``group_bytes``: the most bytes its partials take per group; ``statistics``: how a
    partition's statistics give it as a partial without keys (:mod:`.from_statistics`): ``"kept"`` (the rows kept),
    ``"valid"`` (the rows less the column's nulls), ``"min"``/``"max"`` (the recorded bound), None (they do not).
    """

    name: str
    partials: tuple[str, ...]
    arrow: str
    rollup: str | None
    summary: str
    sql: str | None = None
    reads_column: bool = True
    exact: bool = False
    integers: str | None = None
    duckdb_type: str | None = None
    finish_arrow: Callable[[Sequence[pa.ChunkedArray]], pa.ChunkedArray] = _same
    finish_sql: Callable[[Sequence[Any]], Any] = _same
    copies_values: bool = False
    skips_nan: bool = False
    group_bytes: int = 32
    statistics: str | None = None

    def output_name(self, column: str) -> str:
        """The result column pyarrow's ``group_by(...).aggregate`` names: ``{column}_{function}``, or the function
        alone."""
        return f"{column}_{self.name}" if self.reads_column else self.name

    def shown(self, column: str) -> str:
        """How EXPLAIN and messages write it: ``sum(fare)``, ``count(*)``."""
        return f"{self.name}({column})" if self.reads_column else "count(*)"


AGGREGATE_FUNCTIONS: tuple[AggregateFunction, ...] = (
    AggregateFunction("sum", ("sum",), "sum", "sum", "the sum (Arrow's: an int64 sum wraps past 2**63)", sql="Sum",
                      integers="exact_sum"),
    AggregateFunction("min", ("min",), "min", "min", "the smallest value", sql="Min", copies_values=True,
                      skips_nan=True, statistics="min"),
    AggregateFunction("max", ("max",), "max", "max", "the largest value", sql="Max", copies_values=True,
                      skips_nan=True, statistics="max"),
    AggregateFunction("count", ("count",), "count", "sum", "the values that are not null", sql="Count",
                      finish_arrow=_arrow_count, finish_sql=_sql_count, statistics="valid"),
    AggregateFunction("count_all", ("count_all",), "count_all", "sum", "the rows (the column is ignored)",
                      sql="Count(*)", reads_column=False, finish_arrow=_arrow_count, finish_sql=_sql_count,
                      statistics="kept"),
    AggregateFunction("mean", ("exact_sum", "count"), "mean", None, "the mean: an exact sum over a count", sql="Avg",
                      finish_arrow=_arrow_ratio, finish_sql=_sql_ratio),
    AggregateFunction("exact_sum", ("exact_sum",), "sum", "sum",
                      "the sum, of integers and booleans as a decimal128(38, 0) (SQL's HUGEINT)", exact=True,
                      duckdb_type="HUGEINT"),
)
"""Every aggregate the nodes compute, in the order messages list them."""

AGGREGATE: dict[str, AggregateFunction] = {f.name: f for f in AGGREGATE_FUNCTIONS}
AGGREGATES: tuple[str, ...] = tuple(AGGREGATE)
"""The names a ticket's aggregate may carry."""
ROW_COUNT = next(f.name for f in AGGREGATE_FUNCTIONS if not f.reads_column)
"""The aggregate that counts rows (SQL's ``count(*)``)."""
SQL_AGGREGATES: dict[str, str] = {f.sql: f.name for f in AGGREGATE_FUNCTIONS if f.sql is not None}
"""SQL aggregates partials answer (sqlglot's class name, ``Count(*)`` for a count of rows) -> the entry's name."""
SQL_CLASSES = frozenset(sql.removesuffix("(*)") for sql in SQL_AGGREGATES)
"""sqlglot's class names of the SQL aggregates partials answer."""


def sql_aggregate(class_name: str, of_rows: bool) -> AggregateFunction | None:
    """The entry answering a SQL aggregate (sqlglot's class name; ``of_rows``: its argument is ``*``), or None."""
    name = SQL_AGGREGATES.get(f"{class_name}(*)" if of_rows else class_name)
    return AGGREGATE[name] if name is not None else None


def rolled_up_sql(rollup: str, value: Any) -> Any:
    """The SQL aggregate ``rollup`` (``sum``, ``min``, ``max``) of ``value``."""
    from sqlglot import exp

    return {"sum": exp.Sum, "min": exp.Min, "max": exp.Max}[rollup](this=value)


# ---------------------------------------------------------------------- scalar functions


@dataclass(frozen=True)
class ScalarFunction:
    """One Arrow function a translated filter or computed column calls.

    ``name``: its key; ``written``: the SQL that translates to it (empty if none); ``arrow``: the Arrow function;
    ``returns``: its type; ``statistics``: a filter calling it may be decided from a partition's bounds (tests and
    comparisons only: any other value may be a NaN the bounds do not order).
    """

    name: str
    written: str
    arrow: str
    returns: str
    statistics: bool


_BOOLEAN = "BOOLEAN"
SCALAR_FUNCTIONS: tuple[ScalarFunction, ...] = (
    ScalarFunction("eq", "`=`, `==`", "equal", _BOOLEAN, True),
    ScalarFunction("ne", "`<>`, `!=`", "not_equal", _BOOLEAN, True),
    ScalarFunction("lt", "`<`", "less", _BOOLEAN, True),
    ScalarFunction("le", "`<=`", "less_equal", _BOOLEAN, True),
    ScalarFunction("gt", "`>`", "greater", _BOOLEAN, True),
    ScalarFunction("ge", "`>=`", "greater_equal", _BOOLEAN, True),
    ScalarFunction("not", "`NOT`", "invert", _BOOLEAN, True),
    ScalarFunction("and", "`AND`", "and_kleene", _BOOLEAN, True),
    ScalarFunction("or", "`OR`", "or_kleene", _BOOLEAN, True),
    ScalarFunction("and_plain", "", "and", _BOOLEAN, True),
    ScalarFunction("or_plain", "", "or", _BOOLEAN, True),
    ScalarFunction("in", "`IN (...)`", "is_in", _BOOLEAN, True),
    ScalarFunction("is_null", "`IS NULL`", "is_null", _BOOLEAN, True),
    ScalarFunction("is_valid", "", "is_valid", _BOOLEAN, True),
    ScalarFunction("is_nan", "", "is_nan", _BOOLEAN, True),
    ScalarFunction("if_else", "", "if_else", "its branches' type", True),
    ScalarFunction("cast", "`CAST(x AS t)`", "cast", "t", True),
    ScalarFunction("true_unless_null", "", "true_unless_null", _BOOLEAN, True),
    ScalarFunction("starts_with", "`LIKE 'p%'`", "starts_with", _BOOLEAN, True),
    ScalarFunction("ends_with", "`LIKE '%s'`", "ends_with", _BOOLEAN, True),
    ScalarFunction("contains", "`LIKE '%s%'`", "match_substring", _BOOLEAN, True),
    ScalarFunction("is_true", "`IS TRUE`, `IS FALSE`", "coalesce", _BOOLEAN, False),
    ScalarFunction("add", "`+`", "add_checked", "the operands' type (DuckDB's)", False),
    ScalarFunction("subtract", "`-`", "subtract_checked", "the operands' type (DuckDB's)", False),
    ScalarFunction("multiply", "`*`", "multiply_checked", "the operands' type (DuckDB's)", False),
    ScalarFunction("divide", "`/`", "divide", "DOUBLE", False),
    ScalarFunction("negate", "`-x`", "negate_checked", "x's type", False),
    ScalarFunction("date_trunc", "`date_trunc('month', x)`", "floor_temporal", "TIMESTAMP (microseconds)", False),
)
"""Every Arrow function a filter or computed column the nodes evaluate may call."""

SCALAR: dict[str, ScalarFunction] = {f.name: f for f in SCALAR_FUNCTIONS}
DECIDED_BY_STATISTICS = frozenset(f.arrow for f in SCALAR_FUNCTIONS if f.statistics)
"""The Arrow functions a filter whose row blocks statistics decide may call."""


def arrow_call(name: str, arguments: list[pc.Expression], options: pc.FunctionOptions | None = None) -> pc.Expression:
    """A call of the scalar function ``name`` (its key in :data:`SCALAR`) as an Arrow expression."""
    return pc.Expression._call(SCALAR[name].arrow, arguments, options)


# ---------------------------------------------------------------------- docs


def markdown() -> str:
    """The tables of ``docs/querying.md`` listing what the nodes compute, made from the entries above."""
    rows = ["| aggregate | what it is | SQL | partials per partition | combined by | per group |",
            "| --- | --- | --- | --- | --- | --- |"]
    for f in AGGREGATE_FUNCTIONS:
        sql = {"Count(*)": "`count(*)`", "Avg": "`avg(x)`"}.get(f.sql or "", f"`{(f.sql or '').lower()}(x)`")
        if f.sql is None:
            sql = "`sum(x)` of integers" if any(g.integers == f.name for g in AGGREGATE_FUNCTIONS) else ""
        size = ("values of its column, and " if f.copies_values else "") + f"at most {f.group_bytes} bytes"
        rows.append(f"| `{f.name}` | {f.summary} | {sql} | {', '.join(f'`{p}`' for p in f.partials)} | "
                    f"{f'`{f.rollup}`' if f.rollup else 'its partials'} | {size} |")
    rows += ["", "| written | Arrow function | gives | decided by statistics |", "| --- | --- | --- | --- |"]
    for s in SCALAR_FUNCTIONS:
        rows.append(f"| {s.written or '(within a translation, or a filter built otherwise)'} | `{s.arrow}` "
                    f"| {s.returns} | {'yes' if s.statistics else 'no'} |")
    return "\n".join(rows) + "\n"
