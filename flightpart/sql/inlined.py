"""Parts of a query answered first at the catalog, so that what is left of it can run on the nodes.

- An uncorrelated ``x IN (SELECT ...)`` in a WHERE becomes a literal list of its
  distinct values when they are at most :data:`MAX_VALUES`, none NULL, each a
  string, integer or boolean: without a NULL the list answers exactly as the
  subquery, under NOT too.
- A WITH query or derived table the nodes aggregate is answered first and read
  as a table, when the SELECT reading it has no WHERE (DuckDB would push that
  filter into its scan).

A query nothing here applies to is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from .parsed import parsed, parsed_to_read
from .partials import clause

MAX_VALUES = 10_000
"""The most values an ``IN (SELECT ...)`` is replaced by."""
ANSWERED = "flightpart_answered_"
"""The prefix of the names an answered derived table is read under."""


class Answered(NamedTuple):
    """One part answered first: its ``kind`` (``values``: an IN list, ``table``: a CTE or derived table), its SQL, its
    answer's rows and the bytes answering it moved."""

    kind: str
    sql: str
    rows: int
    moved: int


def inline(query: str, known: set[str], values: Callable[[str], pa.Table | None],
           table: Callable[[str, str], pa.Table | None], moved: Callable[[], int] = lambda: 0
           ) -> tuple[str, list[Answered]]:
    """``query`` with the parts the module doc lists answered first, and those parts. ``values(sql)``: a one-column
    answer, or None; ``table(sql, name)``: the nodes' answer, readable as ``name``, or None; ``moved()``: bytes moved so
    far."""
    from sqlglot import exp

    read = parsed_to_read(query)
    if not isinstance(read, exp.Query) or read.find(exp.CTE, exp.Subquery) is None:
        return query, []  # no part to answer first (a copy of the tree to change costs more than this look)
    tree = parsed(query)
    if tree is None:
        return query, []
    done: list[Answered] = []
    lowered = {name.lower() for name in known}
    if any(cte.alias_or_name.lower() in lowered for cte in tree.find_all(exp.CTE)):
        # a WITH query named as a dataset (in any letters) hides it where a part answered alone would not
        return query, []
    with_ = clause(tree, "with")
    if with_ is not None and not with_.args.get("recursive"):
        for cte in list(with_.expressions):
            name = cte.alias_or_name
            if not isinstance(cte.this, exp.Select) or cte.args["alias"].columns \
                    or not all(_read_whole(t) for t in tree.find_all(exp.Table) if t.name.lower() == name.lower()):
                continue  # (``WITH s(a, b) AS ...`` renames its columns: the query is left as written)
            sql = cte.this.sql(dialect="duckdb")
            before = moved()
            answered = table(sql, name)
            if answered is not None:
                cte.pop()
                done.append(Answered("table", f"{name} AS ({sql})", answered.num_rows, moved() - before))
        if not with_.expressions:
            with_.pop()
    for number, derived in enumerate(list(tree.find_all(exp.Subquery))):
        if not isinstance(derived.this, exp.Select) or not derived.alias or not _read_whole(derived):
            continue
        sql = derived.this.sql(dialect="duckdb")
        name = f"{ANSWERED}{number}"
        before = moved()
        answered = table(sql, name)
        if answered is not None:
            derived.replace(exp.Table(this=exp.to_identifier(name), alias=derived.args["alias"].copy()))
            done.append(Answered("table", sql, answered.num_rows, moved() - before))
    for member in list(tree.find_all(exp.In)):
        subquery = member.args.get("query")
        if subquery is None or member.find_ancestor(exp.Where) is None or not isinstance(subquery.this, exp.Select):
            continue
        sql = subquery.this.sql(dialect="duckdb")
        before = moved()
        answered = values(f"SELECT DISTINCT * FROM ({sql}) LIMIT {MAX_VALUES + 1}")
        literals = _literals(answered) if answered is not None and answered.num_columns == 1 else None
        if literals is None:
            continue
        member.replace(exp.In(this=member.this.copy(), expressions=literals) if literals else exp.false())
        done.append(Answered("values", sql, len(literals), moved() - before))
    return (tree.sql(dialect="duckdb") if done else query), done


def _read_whole(source: Any) -> bool:
    """Whether the SELECT reading ``source`` (in its FROM or a JOIN) has no WHERE (see the module doc)."""
    from sqlglot import exp

    select = source.find_ancestor(exp.Select)
    return select is not None and isinstance(source.parent, (exp.From, exp.Join)) and select.args.get("where") is None


def _literals(answer: pa.Table) -> list[Any] | None:
    """A one-column answer's values as SQL literals, or None: more than :data:`MAX_VALUES`, a NULL, or a type not
    string, integer or boolean (decision 0035)."""
    from sqlglot import exp

    column = answer.column(0)
    kind = column.type
    if answer.num_rows > MAX_VALUES or column.null_count or not (
            pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            or pa.types.is_integer(kind) or pa.types.is_boolean(kind)):
        return None
    values = column.to_pylist()
    if pa.types.is_boolean(kind):
        return [exp.true() if v else exp.false() for v in values]
    if pa.types.is_integer(kind):
        return [exp.Literal.number(str(v)) for v in values]
    return [exp.Literal.string(v) for v in values]
