"""Aggregates over a join of two datasets, computed on the nodes before the join (eager aggregation).

When every aggregate reads one dataset, the nodes aggregate it by its join
columns and group keys, and DuckDB joins those partial rows with the other
dataset and finishes the aggregates by the query's keys. A join value matching k
rows of the other side matched each of its rows k times, so the finished
aggregates equal those over the joined rows.

What qualifies: one inner or left join of two datasets whose ON equates their
columns (and may filter either); aggregates of the aggregated side that partials
answer, and ``count(*)``; column group keys; WHERE conditions each on one
dataset. The aggregated side's conditions run on the nodes unless a left join
keeps that side whole or may leave it NULL. Anything else returns None.
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
"""The side of a column of neither dataset (a select alias, or unknown)."""


class _Join:
    """The one join of two datasets a query reads, and which of them each column is of."""

    def __init__(self, tree: Any, join: Any, left: Any, right: Any, open_dataset: Callable[[str], Any]):
        self.tree, self.join, self.left, self.right = tree, join, left, right
        self.tables = {left.alias_or_name: left.name, right.alias_or_name: right.name}
        self.datasets = {name: open_dataset(name) for name in self.tables.values()}
        self.aliases = select_aliases(tree)

    def side(self, column: Any) -> Any:
        """The reference of the dataset ``column`` is of, or :data:`_OUTER`."""
        if column.table:
            return column.table if column.table in self.tables else _OUTER
        holders = [ref for ref, name in self.tables.items() if column.name in self.datasets[name].schema.names]
        if len(holders) == 1 and column.name not in self.aliases:
            return holders[0]
        return _OUTER

    def sides(self, node: Any) -> set[Any]:
        from sqlglot import exp

        return {self.side(c) for c in node.find_all(exp.Column)}


class _Placed:
    """Where each ON and WHERE condition runs, for the aggregated side ``ref``: on the nodes (``pushed``) or in the
    final query (``on_kept``, ``where_kept``); ``join_keys``: ``ref``'s columns ON equates with the other's."""

    def __init__(self, join: _Join, ref: Any):
        self.join, self.ref = join, ref
        self.other = next(r for r in join.tables if r != ref)
        self.pushed: list[Any] = []
        self.on_kept: list[Any] = []
        self.where_kept: list[Any] = []
        self.join_keys: list[str] = []

    def place(self, condition: Any, pushable: bool, kept: list[Any]) -> bool:
        """Put a condition where it runs: on the nodes (``pushable`` and of the aggregated side alone) or kept (of the
        other side alone); False otherwise."""
        touched = self.join.sides(condition)
        if touched == {self.ref} and pushable:
            self.pushed.append(condition)
        elif touched <= {self.other}:
            kept.append(condition)
        else:
            return False
        return True

    def all_placed(self) -> bool:
        """Place every ON and WHERE condition; False when one cannot be, or ON equates no columns of the two."""
        from sqlglot import exp

        join, side = self.join, self.join.side
        optional = join.join.side == "LEFT" and self.ref == join.right.alias_or_name  # a left join may leave it NULL
        whole = join.join.side == "LEFT" and self.ref == join.left.alias_or_name  # a left join keeps its every row
        for condition in _conjuncts(join.join.args["on"]):
            if isinstance(condition, exp.EQ) \
                    and all(isinstance(x, exp.Column) for x in (condition.this, condition.expression)) \
                    and {side(condition.this), side(condition.expression)} == {self.ref, self.other}:
                mine = condition.this if side(condition.this) == self.ref else condition.expression
                self.join_keys.append(mine.name)
                self.on_kept.append(condition)
            elif not self.place(condition, not whole, self.on_kept):  # in ON, it filters the side a left join may drop
                return False
        if not self.join_keys:
            return False
        where = join.tree.args.get("where")
        for condition in _conjuncts(where.this) if where is not None else []:
            if not self.place(condition, not optional, self.where_kept):  # in WHERE, it drops a left join's unmatched
                return False
        return True


def join_plan(tree: Any, known: set[str], open_dataset: Callable[[str], Any]) -> Plan | None:
    """The plan for an aggregate over one join, or None."""
    found = _two_datasets(tree, known)
    if found is None:
        return None
    join = _Join(tree, *found, open_dataset)
    classified = aggregates_in(tree, qualified=True)
    if classified is None:
        return None
    aggregates, distinct_counts = classified
    distinct = list(dict.fromkeys(c for columns in distinct_counts for c in columns))
    ref = _aggregated_side(join, aggregates, distinct)
    if ref is None:
        return None
    aggregates = exact_sums(aggregates, join.datasets[join.tables[ref]].schema)
    placed = _Placed(join, ref)
    if not placed.all_placed():
        return None
    keys = _group_keys(join, ref)
    if keys is None:
        return None
    groupings = [(list(dict.fromkeys([*placed.join_keys, *keys, *distinct])), partials_of(aggregates))]
    return Plan(join.tables[ref], _pushed_text(placed.pushed), groupings, _final(join, placed, aggregates),
                joined=(join.tables[placed.other],))


def _two_datasets(tree: Any, known: set[str]) -> tuple[Any, Any, Any] | None:
    """(join, left table, right table) of a query reading one inner or left join of two ``known`` datasets with ON, else
    None."""
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
    return join, left, right


def _aggregated_side(join: _Join, found: dict[str, tuple[str, str]], distinct: list[str]) -> Any:
    """The reference of the dataset every aggregate reads (the larger for ``count(*)`` alone), or None."""
    from sqlglot import exp

    read: set[Any] = set()
    for agg in join.tree.find_all(exp.AggFunc):
        read |= join.sides(agg)
    if not found and not distinct or _OUTER in read or len(read) > 1:
        return None
    if read:
        return read.pop()
    return max(join.tables, key=lambda r: join.datasets[join.tables[r]].shape[0])  # count(*) alone


def _group_keys(join: _Join, ref: Any) -> list[str] | None:
    """The group keys of side ``ref``, or None when a key is no column of either dataset or the final query reads a
    column of ``ref`` that is no key."""
    from sqlglot import exp

    group = join.tree.args.get("group")
    keys: list[str] = []
    for key in group.expressions if group else []:
        if not isinstance(key, exp.Column) or join.side(key) is _OUTER:
            return None
        if join.side(key) == ref:
            keys.append(key.name)
    for column in join.tree.find_all(exp.Column):  # what the final query reads of the aggregated dataset
        if column.find_ancestor(exp.AggFunc, exp.Where, exp.Join) is None and join.side(column) == ref \
                and column.name not in keys:
            return None
    return keys


def _pushed_text(pushed: list[Any]) -> str | None:
    """The conditions the nodes run, as one filter of the aggregated dataset's columns, or None."""
    from sqlglot import exp

    unqualified = [c.copy().transform(_unqualified) for c in pushed]
    return exp.and_(*unqualified).sql(dialect="duckdb") if unqualified else None


def _final(join: _Join, placed: _Placed, found: dict[str, tuple[str, str]]) -> str:
    """The query DuckDB runs over the partials (in the aggregated dataset's place) and the other dataset: the kept
    conditions, each aggregate finished from its partials."""
    from sqlglot import exp

    ref = placed.ref

    def finished(node: Any) -> Any:
        if not isinstance(node, exp.AggFunc) or node.sql() not in found:
            return node
        name, function = found[node.sql()]
        return finish(function, lambda f: exp.column(partial_name(name, f), table=ref, quoted=True),
                      unmatched_count_once=True)  # a row of the other side that matched nothing counts once

    final = join.tree.copy()
    final_join = final.args["joins"][0]
    final_join.set("on", exp.and_(*[c.copy() for c in placed.on_kept]))
    final.set("where", exp.Where(this=exp.and_(*[c.copy() for c in placed.where_kept])) if placed.where_kept else None)
    final = final.transform(finished)
    for table in final.find_all(exp.Table):
        if table.alias_or_name == ref and table.name == join.tables[ref]:
            table.replace(exp.Table(this=exp.to_identifier(PARTIALS),
                                    alias=exp.TableAlias(this=exp.to_identifier(ref))))
            break
    return final.sql(dialect="duckdb")


def _conjuncts(condition: Any) -> list[Any]:
    """``a AND b AND c`` as ``[a, b, c]``."""
    from sqlglot import exp

    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]


def _unqualified(node: Any) -> Any:
    """A column without its table."""
    from sqlglot import exp

    if isinstance(node, exp.Column) and node.table:
        return exp.column(node.name, quoted=node.this.quoted)
    return node
