"""Queries whose work runs on the nodes: GROUP BY aggregates, and ``ORDER BY ... LIMIT`` (:func:`top_plan`).

A query over one dataset of group keys and aggregates partials answer
(:mod:`.partials`), with a WHERE flightpart expresses exactly, runs as
``ds.filter(where).aggregate(...)`` on the nodes, then DuckDB over the partials
for the rest. Each ``count(DISTINCT ...)`` is a grouping of its own. Anything
else returns None and runs whole; so do floating-point keys and NaN-skipping
aggregates of columns that may hold NaN (decision 0035).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightpart.errors import FlightpartError, ServerError
from flightpart.kept import Kept
from flightpart.query.aggregates import evaluated
from flightpart.query.functions import AGGREGATE, ROW_COUNT

from .computed import computed_on_nodes
from .parsed import KEPT_TEXT, parsed
from .partials import (
    GROUPING,
    Plan,
    aggregates_in,
    clause,
    distinct_columns,
    exact_sums,
    finish,
    partial_name,
    partials_named,
    partials_of,
    select_aliases,
    unplannable,
)

PARTIAL_BYTES = 256 << 20
"""Bytes of partials the catalog takes in for one query; past it the query runs whole, within DuckDB's memory limit."""
log = logging.getLogger("flightpart.sql")

UNEXPRESSED = (FlightpartError, KeyError, ValueError, TypeError, OverflowError, pa.ArrowException)
"""What a filter or aggregate flightpart cannot express raises: the query then runs whole, and DuckDB says what it
says."""



_PLANS: Kept[tuple[Plan | None]] = Kept(256)
"""The plans of the 256 (text, versions of the datasets it names) last planned: a plan reads the text and the
named datasets' schemas, which a version never changes."""


def kept_plan(query: str, known: set[str], open_dataset: Callable[[str], Any]) -> Plan | None:
    """:func:`plan`, kept per text (of at most :data:`~.parsed.KEPT_TEXT` characters) and versions of the ``known``
    datasets."""
    if len(query) > KEPT_TEXT:
        return plan(query, known, open_dataset)
    key = (query, tuple(sorted((name, open_dataset(name).version) for name in known)))
    found = _PLANS.get(key)
    if found is None:
        found = (plan(query, known, open_dataset),)
        _PLANS.put(key, found)
    return found[0]


def plan(query: str, known: set[str], open_dataset: Callable[[str], Any] | None = None) -> Plan | None:
    """How the nodes and DuckDB share ``query``'s work, or None. ``open_dataset``: the datasets by name; without it
    joins are not planned."""
    from sqlglot import exp

    tree = parsed(query)
    if tree is None:
        return None
    if unplannable(tree) or tree.args.get("distinct") or tree.find(exp.Filter):
        return None  # (an aggregate's FILTER clause filters its input rows: the partials cannot take it)
    if not _ordinals_named(tree):
        return None
    if tree.args.get("joins"):
        from .pushed_join import join_plan

        return join_plan(tree, known, open_dataset) if open_dataset is not None else None
    source = clause(tree, "from")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or table.db or table.name not in known:
        return None
    schema = open_dataset(table.name).schema if open_dataset is not None else None
    computed: dict[str, str] = {}
    if schema is not None:
        rewritten = computed_on_nodes(tree, schema, query)
        if rewritten is None:
            return None
        computed, schema = rewritten
    group = tree.args.get("group")
    keys = [g.name for g in (group.expressions if group else [])]
    if group and not all(isinstance(g, exp.Column) and not g.table for g in group.expressions):
        return None
    classified = aggregates_in(tree)
    if classified is None:
        return None
    found, distinct = classified
    found = exact_sums(found, schema)
    where = tree.args.get("where")
    where_text = where.this.sql(dialect="duckdb") if where is not None else None
    if distinct:
        planned = _distinct_plan(tree, table, where_text, keys, distinct, found)
        return planned._replace(computed=computed) if planned is not None else None
    if not found:
        return None
    if not _only_keys_outside_aggregates(tree, keys):
        return None
    final = tree.copy()
    final.set("where", None)
    final.set("group", None)
    final = final.from_(partials_named(table), copy=False)
    having = final.args.get("having")
    if having is not None:
        final.set("having", None)
        final.set("where", exp.Where(this=having.this))
    final = final.transform(lambda node: _partial_column(node, found))
    return Plan(table.name, where_text, [(keys, list(dict.fromkeys(found.values())))], final.sql(dialect="duckdb"),
                computed=computed)


def _ordinals_named(tree: Any) -> bool:
    """Replace each ``GROUP BY 2`` by the SELECT list's second item (in place); False when an ordinal is out of range or
    names an aggregate, a window or a star."""
    from sqlglot import exp

    group = tree.args.get("group")
    for key in list(group.expressions) if group else []:
        if isinstance(key, exp.Literal) and not key.is_string:
            position = int(key.this) if key.this.isdigit() else 0
            if not 0 < position <= len(tree.expressions):
                return False
            named = tree.expressions[position - 1]
            named = named.this if isinstance(named, exp.Alias) else named
            if named.find(exp.AggFunc, exp.Window, exp.Star) is not None:
                return False
            key.replace(named.copy())  # an expression: computed on the nodes when it can be (see .computed)
    return True


def _distinct_plan(tree: Any, table: Any, where: str | None, keys: list[str], distinct: list[tuple[str, ...]],
                   found: dict[str, tuple[str, str]]) -> Plan | None:
    """``count(DISTINCT ...)`` beside other aggregates: one grouping by the keys for the others, one per distinct count
    by the keys and its columns. DuckDB finishes each aggregate over its own grouping's rows; ``count(DISTINCT (x, y))``
    counts rows (a tuple of NULLs is a value)."""
    from sqlglot import exp

    if not _only_keys_outside_aggregates(tree, keys, distinct={c for columns in distinct for c in columns}):
        return None
    groupings: list[tuple[list[str], list[tuple[str, str]]]] = []
    if found:
        groupings.append((keys, partials_of(found)))
    grouping_of = {}
    for columns in distinct:
        grouping_of[columns] = len(groupings)
        groupings.append((list(dict.fromkeys([*keys, *columns])), [("", ROW_COUNT)]))

    def only(aggregate: Any, grouping: int) -> Any:
        condition = exp.EQ(this=exp.column(GROUPING, quoted=True), expression=exp.Literal.number(grouping))
        return exp.Filter(this=aggregate, expression=exp.Where(this=condition))

    def finished(node: Any) -> Any:
        if isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct):
            values = node.this.expressions
            columns = distinct_columns(node.this)
            counted = exp.column(columns[0], quoted=True) if not isinstance(values[0], exp.Tuple) else exp.Star()
            return only(exp.Count(this=counted), grouping_of[columns])
        if not isinstance(node, exp.AggFunc) or node.sql() not in found:
            return node
        name, function = found[node.sql()]
        return finish(function, lambda f: exp.column(partial_name(name, f), quoted=True),
                      within=lambda aggregate: only(aggregate, 0))

    final = tree.copy()
    final.set("where", None)
    final = final.from_(partials_named(table), copy=False).transform(finished)
    return Plan(table.name, where, groupings, final.sql(dialect="duckdb"))


def _only_keys_outside_aggregates(tree: Any, keys: list[str], *, distinct: set[str] = frozenset()) -> bool:
    """Whether every column outside aggregates and WHERE is a group key or select alias, and the ``distinct`` columns,
    unless keys, appear only inside aggregates."""
    from sqlglot import exp

    aliases = select_aliases(tree)
    for column in tree.find_all(exp.Column):
        if column.find_ancestor(exp.AggFunc, exp.Where) is not None or column.name in keys:
            continue
        if column.name in distinct or column.name not in aliases:
            return False
    return True


def _partial_column(node: Any, found: dict[str, tuple[str, str]]) -> Any:
    """An aggregate replaced by its partials' column, cast to DuckDB's type where Arrow's differs."""
    from sqlglot import exp

    if isinstance(node, exp.AggFunc) and node.sql() in found:
        column, function = found[node.sql()]
        named = exp.column(partial_name(column, function), quoted=True)
        kind = AGGREGATE[function].duckdb_type
        return named if kind is None else exp.Cast(this=named, to=exp.DataType.build(kind))
    return node


def _computed_floating(schema: pa.Schema, text: str | None) -> bool:
    """Whether a computed column (its SQL text; None: not computed) is floating-point over ``schema``."""
    if text is None:
        return False
    try:
        return pa.types.is_floating(evaluated(text, schema)[1])  # parsed once: the nodes' partials parse it too
    except FlightpartError:
        return True  # not computable here: run whole


def _without_nan(ds: Any, column: str) -> bool:
    """Whether every partition holding ``column`` has statistics bounding it: nodes record a float column's minimum and
    maximum only when it has no NaN there."""
    seen = False
    for part in ds.plan.version.parts:
        if part.stats is None:
            return False  # nothing recorded: no bound
        entry = part.stats.get(column)
        if entry is None:
            continue  # a column group without the column
        if "min" not in entry:
            return False
        seen = True
    return seen


def top_plan(query: str, known: set[str]) -> tuple[str, str | None, list[str] | None, list[tuple], int, str] | None:
    """For ``SELECT ... FROM dataset [WHERE ...] ORDER BY columns LIMIT n [OFFSET m]`` and nothing more: (table, WHERE,
    columns or None, sort keys, n + m, the query without WHERE), else None. The first n + m rows by the keys are among
    each partition's first n + m, so DuckDB over those keeps the same rows."""
    from sqlglot import exp

    tree = parsed(query)
    if tree is None:
        return None
    if unplannable(tree) or tree.args.get("joins") or tree.args.get("distinct") or tree.args.get("group") \
            or tree.args.get("having") or tree.find(exp.AggFunc):
        return None
    source = clause(tree, "from")
    table = source.this if source is not None else None
    order, limit, offset = tree.args.get("order"), tree.args.get("limit"), tree.args.get("offset")
    if not isinstance(table, exp.Table) or table.db or table.name not in known or order is None or limit is None:
        return None
    counts = [_literal_count(clause) for clause in (limit, offset) if clause is not None]
    if None in counts:
        return None
    aliases = select_aliases(tree)
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
    """The count of a LIMIT or OFFSET written as a plain non-negative integer, else None."""
    from sqlglot import exp

    value = clause.args.get("expression")
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    return None


def answer_top(query: str, known: set[str], open_dataset: Callable[[str], Any],
               run_over: Callable[[str, str, pa.Table], pa.Table]) -> pa.Table | None:
    """``query`` answered from each partition's first rows, or None; ``run_over(final, table, rows)`` runs DuckDB over
    the rows."""
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
    except UNEXPRESSED:
        return None  # a filter flightpart cannot express, or a name that is not a column: DuckDB runs it whole
    return run_over(final, name, candidates)


def answer(query: str, known: set[str], open_dataset: Callable[[str], Any],
           run_final: Callable[[str, pa.Table, tuple[str, ...]], pa.Table]) -> pa.Table | None:
    """``query`` answered with its aggregates on the nodes, or None (see the module doc). ``run_final(final, partials,
    joined)`` runs DuckDB over the partials and the ``joined`` datasets."""
    planned = kept_plan(query, known, open_dataset)
    if planned is None:
        return None
    ds = open_dataset(planned.table)
    if GROUPING in ds.schema.names:
        return None
    floating = {f.name for f in ds.schema if pa.types.is_floating(f.type)}
    if any(k in floating or _computed_floating(ds.schema, planned.computed.get(k))
           for keys, _ in planned.groupings for k in keys):
        return None  # pyarrow groups -0.0 apart from 0.0, DuckDB does not: floating-point keys run whole
    if any(c in floating and AGGREGATE[f].skips_nan and not _without_nan(ds, c)
           for _, aggregates in planned.groupings for c, f in aggregates):
        return None  # Arrow's min and max skip NaN; DuckDB ranks NaN above every number (a computed value is
        # computed only when finite: see flightpart.query.aggregates.with_computed)
    tables, taken = [], 0
    try:
        if planned.where is not None:
            ds = ds.filter(planned.where)
        for grouping, (keys, aggregates) in enumerate(planned.groupings):
            partials = ds.aggregate(aggregates, by=keys, computed=planned.computed or None,
                                    max_bytes=max(PARTIAL_BYTES - taken, 0))
            taken += partials.nbytes
            partials = partials.rename_columns([*keys, *(partial_name(c, f) for c, f in aggregates)])
            tables.append(partials.append_column(GROUPING, pa.array([grouping] * partials.num_rows, pa.int32())))
    except UNEXPRESSED as exc:
        if isinstance(exc, ServerError):  # not the query's doing: a node failed, or answered what no node would
            log.warning("the nodes' partial aggregates could not be used (%s); the query runs whole", exc)
        return None  # a filter or an aggregate flightpart cannot express exactly, or partials past PARTIAL_BYTES:
        # DuckDB runs the query whole
    try:
        partials = pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # a key of two groupings in two types: DuckDB runs the query whole
    return run_final(planned.final, partials, planned.joined)
