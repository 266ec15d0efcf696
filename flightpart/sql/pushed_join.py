"""Aggregates over a join of two datasets, computed on the nodes before the join (eager aggregation).

``SELECT z.borough, count(*), avg(t.fare) FROM trips t JOIN zones z ON
t.pickup_zone = z.zone GROUP BY z.borough`` reads every trip's zone and
fare if the join runs first. But every aggregate reads one dataset (here
``trips``), so the nodes can aggregate it first, by its join columns and
its own group keys: each partition sends one row per zone, and DuckDB joins
those rows with ``zones`` and finishes the aggregates by the query's keys
(sums of sums and counts, minima of minima, ``avg`` as the sum of sums over
the sum of counts). A zone that matches several rows of ``zones`` matched
each trip as often, so the sums come out the same. ``count(DISTINCT x)`` of
the aggregated dataset keeps ``x`` among the partials' keys and is counted
at the end as written.

What qualifies: one inner or left join of two datasets whose ON clause
equates columns of the two (and may filter either), aggregates ``sum``,
``min``, ``max``, ``count``, ``avg`` and ``count(DISTINCT x)`` of the
aggregated dataset's columns and ``count(*)`` (a row of the other side that
a left join keeps without a match counts once, as in the query), group keys
that are columns, and WHERE conditions each on one dataset: those on the
aggregated one run on the nodes, unless a left join keeps it whole (they
filter the joined rows, not its own) or may leave it NULL (they would drop
the unmatched rows).
Anything else returns None and DuckDB runs the query whole over the scans.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .partials import (
    PARTIALS,
    Plan,
    aggregates_in,
    clause,
    exact_sums,
    finish,
    partial_name,
    partials_of,
    select_aliases,
)

_OUTER = object()
"""Which side a column belongs to when it belongs to neither dataset (a select alias, or unknown)."""


def join_plan(tree: Any, known: set[str], open_dataset: Callable[[str], Any]) -> Plan | None:
    """The plan for an aggregate over one join (see the module doc), or None."""
    from sqlglot import exp

    joins = tree.args.get("joins") or []
    if len(joins) != 1:
        return None
    join = joins[0]
    left, right = clause(tree, "from").this if clause(tree, "from") is not None else None, join.this
    if not all(isinstance(t, exp.Table) and not t.db and t.name in known for t in (left, right)) \
            or left.name == right.name or left.alias_or_name == right.alias_or_name:
        return None
    if join.args.get("using") or join.args.get("method") or join.args.get("on") is None \
            or (join.side or "") not in ("", "LEFT") or (join.kind or "") not in ("", "INNER", "OUTER") \
            or (not join.side and join.kind == "OUTER"):
        return None
    tables = {left.alias_or_name: left.name, right.alias_or_name: right.name}
    datasets = {name: open_dataset(name) for name in tables.values()}
    aliases = select_aliases(tree)

    def side(column: Any) -> Any:
        """The reference (alias or name) of the dataset ``column`` is of, or :data:`_OUTER`."""
        if column.table:
            return column.table if column.table in tables else _OUTER
        holders = [ref for ref, name in tables.items() if column.name in datasets[name].schema.names]
        if len(holders) == 1 and column.name not in aliases:
            return holders[0]
        return _OUTER

    def sides(node: Any) -> set[Any]:
        return {side(c) for c in node.find_all(exp.Column)}

    classified = aggregates_in(tree, qualified=True)
    if classified is None:
        return None
    found, distinct_counts = classified
    distinct = list(dict.fromkeys(c for columns in distinct_counts for c in columns))
    read: set[Any] = set()
    for agg in tree.find_all(exp.AggFunc):
        read |= sides(agg)
    if not found and not distinct or _OUTER in read or len(read) > 1:
        return None
    if read:
        ref = read.pop()
    else:  # count(*) alone: the larger dataset is aggregated
        ref = max(tables, key=lambda r: datasets[tables[r]].shape[0])
    other = next(r for r in tables if r != ref)
    found = exact_sums(found, datasets[tables[ref]].schema)
    optional = join.side == "LEFT" and ref == right.alias_or_name  # the side a left join may leave NULL
    whole = join.side == "LEFT" and ref == left.alias_or_name  # the side a left join keeps every row of

    pushed: list[Any] = []  # conditions on the aggregated dataset alone: run on the nodes
    def placed(condition: Any, pushable: bool, kept: list[Any]) -> bool:
        """Put a condition on one side where it runs: on the nodes (``pushable``, of the aggregated dataset alone)
        or kept in the final query (of the other dataset alone); False for anything else."""
        touched = sides(condition)
        if touched == {ref} and pushable:
            pushed.append(condition)
        elif touched <= {other}:
            kept.append(condition)
        else:
            return False
        return True

    on_kept: list[Any] = []
    join_keys: list[str] = []
    for condition in _conjuncts(join.args["on"]):
        if isinstance(condition, exp.EQ) and all(isinstance(x, exp.Column) for x in (condition.this, condition.expression)) \
                and {side(condition.this), side(condition.expression)} == {ref, other}:
            mine = condition.this if side(condition.this) == ref else condition.expression
            join_keys.append(mine.name)
            on_kept.append(condition)
        elif not placed(condition, not whole, on_kept):  # in ON, a condition filters the side a left join may drop
            return None
    if not join_keys:
        return None
    where = tree.args.get("where")
    where_kept: list[Any] = []
    for condition in _conjuncts(where.this) if where is not None else []:
        if not placed(condition, not optional, where_kept):  # in WHERE, it drops the rows a left join kept unmatched
            return None
    group = tree.args.get("group")
    keys: list[str] = []
    for key in group.expressions if group else []:
        if not isinstance(key, exp.Column) or side(key) is _OUTER:
            return None
        if side(key) == ref:
            keys.append(key.name)
    for column in tree.find_all(exp.Column):  # what the final query reads of the aggregated dataset: the partials' keys
        if column.find_ancestor(exp.AggFunc, exp.Where, exp.Join) is None and side(column) == ref \
                and column.name not in keys:
            return None

    partial = partials_of(found)
    unqualified = [c.copy().transform(_unqualified) for c in pushed]
    pushed_text = exp.and_(*unqualified).sql(dialect="duckdb") if unqualified else None

    def finished(node: Any) -> Any:
        if not isinstance(node, exp.AggFunc) or node.sql() not in found:
            return node
        name, function = found[node.sql()]
        return finish(function, lambda f: exp.column(partial_name(name, f), table=ref, quoted=True),
                      unmatched_count_once=True)  # a row of the other side that matched nothing counts once

    final = tree.copy()
    final_join = final.args["joins"][0]
    final_join.set("on", exp.and_(*[c.copy() for c in on_kept]))
    final.set("where", exp.Where(this=exp.and_(*[c.copy() for c in where_kept])) if where_kept else None)
    final = final.transform(finished)
    # the aggregated dataset's place in the query is taken by its partials, under the same name
    for table in final.find_all(exp.Table):
        if table.alias_or_name == ref and table.name == tables[ref]:
            table.replace(exp.Table(this=exp.to_identifier(PARTIALS), alias=exp.TableAlias(this=exp.to_identifier(ref))))
            break
    groupings = [(list(dict.fromkeys([*join_keys, *keys, *distinct])), partial)]
    return Plan(tables[ref], pushed_text, groupings, final.sql(dialect="duckdb"), joined=(tables[other],))


def _conjuncts(condition: Any) -> list[Any]:
    """``a AND b AND c`` as ``[a, b, c]`` (parentheses dropped)."""
    from sqlglot import exp

    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]


def _unqualified(node: Any) -> Any:
    """A column without its table (a dataset's filter names its own columns)."""
    from sqlglot import exp

    if isinstance(node, exp.Column) and node.table:
        return exp.column(node.name, quoted=node.this.quoted)
    return node
