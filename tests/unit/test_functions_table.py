"""The table of what the nodes compute (flightpart/query/functions.py) is what every reader uses: the wire accepts
each aggregate it lists and no other, the SQL planner plans each from SQL, the partials combine and DuckDB finishes
them to the answer over the whole table, the translator calls only the scalar functions it lists, pruning decides
exactly those it marks, and docs/querying.md shows it. A new entry needs a row in ``AGGREGATE_ROWS`` or
``SCALAR_ROWS`` below. No cluster needed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from flightpart.errors import RequestRejected
from flightpart.query import aggregates, pruning
from flightpart.query.filters import called_functions
from flightpart.query.functions import (
    AGGREGATE,
    AGGREGATE_FUNCTIONS,
    AGGREGATES,
    DECIDED_BY_STATISTICS,
    ROW_COUNT,
    SCALAR,
    SCALAR_FUNCTIONS,
    markdown,
)
from flightpart.query.predicates import parse_sql_predicate, parse_sql_value
from flightpart.sql.partials import GROUPING, partial_name
from flightpart.sql.pushed import plan
from flightpart.wire import Aggregate, Ticket

ROOT = Path(__file__).resolve().parents[2]

AGGREGATE_ROWS = {
    # name: (SQL the planner answers with it, the type of the column it reads)
    "sum": ("sum(v)", pa.float64()),
    "min": ("min(v)", pa.float64()),
    "max": ("max(v)", pa.float64()),
    "count": ("count(v)", pa.float64()),
    "count_all": ("count(*)", pa.float64()),
    "mean": ("avg(v)", pa.int64()),
    "exact_sum": ("sum(v)", pa.int64()),
}

SCALAR_ROWS = {
    # name: (a text filter or, with "value:", a computed column over SCHEMA whose translation calls it; None: only
    # other engines' expressions or Arrow's simplification call it)
    "eq": "i = 1", "ne": "i <> 1", "lt": "i < 1", "le": "i <= 1", "gt": "i > 1", "ge": "i >= 1",
    "not": "NOT i = 1", "and": "i = 1 AND j = 2", "or": "i = 1 OR j = 2",
    "and_plain": None, "or_plain": None, "true_unless_null": None,
    "in": "s IN ('a', 'b')", "is_null": "s IS NULL", "is_valid": "f >= g", "is_nan": "f > 1",
    "if_else": "s IN ('a', NULL)", "cast": "CAST(n AS BIGINT) > 1",
    "starts_with": "s LIKE 'a%'", "ends_with": "s LIKE '%a'", "contains": "s LIKE '%a%'",
    "is_true": "b IS TRUE",
    "add": "value:i + j", "subtract": "value:i - j", "multiply": "value:i * j", "divide": "value:i / j",
    "negate": "value:-i", "date_trunc": "value:date_trunc('month', t)",
}
SCHEMA = pa.schema([("i", pa.int64()), ("j", pa.int64()), ("n", pa.int32()), ("f", pa.float64()), ("g", pa.float64()),
                    ("s", pa.string()), ("b", pa.bool_()), ("t", pa.timestamp("us"))])


def test_every_entry_has_a_test_row_and_its_name_once():
    assert set(AGGREGATE_ROWS) == set(AGGREGATES) and len(AGGREGATES) == len(AGGREGATE_FUNCTIONS)
    assert set(SCALAR_ROWS) == set(SCALAR) and len(SCALAR) == len(SCALAR_FUNCTIONS)
    for entry in AGGREGATE_FUNCTIONS:
        assert all(AGGREGATE[p].rollup is not None for p in entry.partials), entry.name
    assert not AGGREGATE[ROW_COUNT].reads_column


@pytest.mark.parametrize("name", AGGREGATES)
def test_the_wire_accepts_each_aggregate_of_the_table(name):
    sent = Aggregate((("v", name),), ("k",))
    assert Aggregate.decode(sent.encode()) == sent
    ticket = Ticket("d", 1, (0, 0), aggregate=sent)
    assert Ticket.decode(ticket.encode()).aggregate == sent


def test_the_wire_refuses_an_aggregate_the_table_lacks():
    raw = json.dumps({"functions": [["v", "median"]], "by": []}).encode()
    with pytest.raises(RequestRejected, match="unknown aggregate 'median'") as caught:
        Aggregate.decode(raw)
    assert caught.value.code == "INVALID_REQUEST"


class _Data:
    """A dataset as the planner sees it: its schema and shape."""

    def __init__(self, table: pa.Table):
        self.schema, self.shape = table.schema, (table.num_rows, table.num_columns)


def _table(kind: pa.DataType) -> pa.Table:
    values = [None if k % 7 == 3 else (k % 5) * (0.5 if pa.types.is_floating(kind) else 1) for k in range(40)]
    return pa.table({"k": [f"g{k % 3}" for k in range(40)], "w": [k % 4 for k in range(40)],
                     "v": pa.array(values, kind)})


@pytest.mark.parametrize("name", AGGREGATES)
def test_the_sql_planner_plans_each_aggregate_from_sql(name):
    sql, kind = AGGREGATE_ROWS[name]
    t = _table(kind)
    planned = plan(f"SELECT k, {sql} AS a FROM t GROUP BY k", {"t"}, lambda _name: _Data(t))
    assert planned is not None
    column = "v" if AGGREGATE[name].reads_column else ""
    assert planned.groupings == [(["k"], [(column, name)])]


@pytest.mark.parametrize("name", AGGREGATES)
def test_partials_combined_and_finished_by_duckdb_give_duckdbs_answer_over_the_whole_table(name):
    """Per partition partials (as nodes compute them), combined in Arrow and finished by DuckDB over several
    partial rows a group (the plan of a query with a distinct count), give what DuckDB gives over the table."""
    sql, kind = AGGREGATE_ROWS[name]
    t = _table(kind)
    query = f"SELECT k, count(DISTINCT w) AS d, {sql} AS a FROM t GROUP BY k ORDER BY k"
    planned = plan(query, {"t"}, lambda _name: _Data(t))
    assert planned is not None and any(f == p for _k, pairs in planned.groupings for _c, f in pairs
                                       for p in AGGREGATE[name].partials)
    slices = [t.slice(0, 13), t.slice(13, 14), t.slice(27)]
    tables = []
    for grouping, (keys, pairs) in enumerate(planned.groupings):
        agg = Aggregate(tuple(pairs), tuple(keys))
        parts = [aggregates.partial(s, agg) for s in slices]
        combined = aggregates.combine(parts, agg, t.schema)  # what Dataset.aggregate hands the catalog
        for rows in (pa.concat_tables(parts), combined):
            renamed = rows.rename_columns([*keys, *(partial_name(c, f) for c, f in pairs)])
            tables.append(renamed.append_column(GROUPING, pa.array([grouping] * rows.num_rows, pa.int32())))
    want = duckdb.connect().sql(query).fetchall()
    # the aggregates' grouping as each partition's partial rows or as combined; a distinct count's always combined
    for chosen in ([tables[0], *tables[3::2]], tables[1::2]):
        partials = pa.concat_tables(chosen, promote_options="default")  # noqa: F841 (DuckDB reads it by its name)
        got = duckdb.connect().sql(planned.final).fetchall()
        assert [row[:2] for row in got] == [row[:2] for row in want]
        assert [pytest.approx(float(row[2])) if row[2] is not None else None for row in got] == \
            [float(row[2]) if row[2] is not None else None for row in want]


@pytest.mark.parametrize("name", [n for n, row in SCALAR_ROWS.items() if row is not None])
def test_the_translator_calls_each_scalar_function_of_the_table(name):
    text = SCALAR_ROWS[name]
    if text.startswith("value:"):
        expression = parse_sql_value(text.removeprefix("value:"), SCHEMA)[0]
    else:
        expression = parse_sql_predicate(text, SCHEMA)
    called = called_functions(expression)
    assert SCALAR[name].arrow in called
    assert called <= {s.arrow for s in SCALAR_FUNCTIONS}, called - {s.arrow for s in SCALAR_FUNCTIONS}


def test_pruning_decides_exactly_the_functions_marked_so():
    assert DECIDED_BY_STATISTICS == {s.arrow for s in SCALAR_FUNCTIONS if s.statistics}
    blocks = {0: (5, [{"i": {"nulls": 0, "min": 1, "max": 3}, "j": {"nulls": 0, "min": 1, "max": 3}}])}
    pruner = pruning.Pruner(SCHEMA, blocks)
    assert pruner.cannot_match(parse_sql_predicate("i > 5", SCHEMA)) == {0}  # comparisons: decided
    assert pruner.cannot_match(parse_sql_predicate("i + j > 50", SCHEMA)) == set()  # arithmetic: not decided


def test_no_module_names_a_scalar_functions_arrow_call_or_a_planners_aggregate_itself():
    """Outside the table, the Arrow functions of scalar entries and the aggregates only planners choose
    (``exact_sum``, ``mean``, ``count_all``) are not written as strings: each reader takes them from the table."""
    names = {s.arrow for s in SCALAR_FUNCTIONS if s.arrow != s.name} | {"exact_sum", "mean", "count_all"}
    found = []
    for folder in ("flightpart", "client", "server"):
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if relative in ("flightpart/query/functions.py",) or relative.startswith("flightpart/bench/"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{relative}:{node.lineno} {node.value!r}")
    assert found == []


def test_docs_show_the_table():
    text = (ROOT / "docs" / "querying.md").read_text()
    assert markdown() in text
    for entry in AGGREGATE_FUNCTIONS:
        assert f"| `{entry.name}` |" in text
