"""Computed columns (the SQL expressions nodes evaluate before they aggregate): DuckDB's value on every row of random
tables, or a refusal; and the SQL plans that read them in place of the expressions."""

from __future__ import annotations

import datetime as dt
import random

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp
from flightpart.query import aggregates
from flightpart.query.filters import Filter, apply, parse_where
from flightpart.sql.pushed import plan
from flightpart.wire import Aggregate

BASE = dt.datetime(2023, 12, 29, 23, 59, 59)


def random_table(rng: random.Random, rows: int = 200) -> pa.Table:
    def maybe(value):
        return None if rng.random() < 0.1 else value

    moments = [maybe(BASE + dt.timedelta(seconds=rng.randint(-90 * 86400, 400 * 86400),
                                         microseconds=rng.randint(0, 999_999)))
               for _ in range(rows)]
    return pa.table({
        "i": pa.array([maybe(rng.randint(-1000, 1000)) for _ in range(rows)], pa.int32()),
        "big": pa.array([maybe(rng.randint(-(10**12), 10**12)) for _ in range(rows)], pa.int64()),
        "small": pa.array([maybe(rng.randint(-100, 100)) for _ in range(rows)], pa.int8()),
        "u": pa.array([maybe(rng.randint(0, 60_000)) for _ in range(rows)], pa.uint16()),
        "f": pa.array([maybe(rng.choice([-1.5, 0.0, 2.25, 1e9, rng.uniform(-50, 50)])) for _ in range(rows)],
                      pa.float64()),
        "ts": pa.array(moments, pa.timestamp("us")),
        "tns": pa.array(moments, pa.timestamp("ns")),
        "tms": pa.array([m.replace(microsecond=0) if m else None for m in moments], pa.timestamp("ms")),
        "d": pa.array([m.date() if m else None for m in moments], pa.date32()),
    })


UNITS = ["year", "quarter", "month", "week", "day", "hour", "minute", "second", "millisecond", "microsecond"]


def random_expression(rng: random.Random, depth: int = 0) -> str:
    if depth < 2 and rng.random() < 0.5:
        op = rng.choice(["+", "-", "*", "/"])
        return f"({random_expression(rng, depth + 1)} {op} {random_expression(rng, depth + 1)})"
    if rng.random() < 0.3:
        return rng.choice(["2", "7", "-3", "100", "0.5", "1e3"])
    return rng.choice(["i", "big", "small", "u", "f", "-i", "CAST(i AS BIGINT)", "CAST(small AS INTEGER)"])


def computed_by_nodes(table: pa.Table, text: str) -> pa.Array:
    agg = Aggregate((("value", "count"),), (), (("value", text),))
    return aggregates.with_computed(table, agg).column("value").combine_chunks()


def test_random_arithmetic_gives_duckdbs_values_or_a_refusal():
    rng = random.Random(5)
    con = duckdb.connect()
    checked = refused = 0
    for round_ in range(60):
        table = random_table(rng)
        con.register("t", table)
        for _ in range(12):
            text = random_expression(rng)
            try:
                aggregates.evaluated(text, table.schema)
            except fp.InvalidExpression:
                refused += 1
                continue
            try:
                want = con.sql(f"SELECT {text} AS v FROM t").to_arrow_table().column("v").combine_chunks()
                duck_error = None
            except duckdb.Error as exc:
                want, duck_error = None, exc
            try:
                got = computed_by_nodes(table, text)
            except fp.InvalidExpression:
                refused += 1  # an overflow or a value that is not finite: the nodes refuse, DuckDB answers the query
                continue
            assert duck_error is None, f"{text}: DuckDB refused ({duck_error}), the nodes computed {got}"
            if pa.types.is_floating(want.type):
                assert pa.types.is_floating(got.type), (text, got.type, want.type)
                assert pc.all(pc.equal(pc.is_null(got), pc.is_null(want))).as_py(), text
                for a, b in zip(got.to_pylist(), want.cast(got.type).to_pylist()):  # DuckDB may reassociate: an ulp
                    assert a == b or (a is not None and b is not None
                                      and abs(a - b) <= 1e-12 * max(abs(a), abs(b))), text
            else:
                assert got.cast(want.type).equals(want), (text, round_, got, want)
            checked += 1
    assert checked > 300 and refused > 30, (checked, refused)


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("column", ["ts", "tms", "d"])
def test_date_trunc_gives_duckdbs_timestamps(unit, column):
    table = random_table(random.Random(hash((unit, column)) & 0xFFFF), rows=500)
    con = duckdb.connect()
    con.register("t", table)
    text = f"date_trunc('{unit}', {column})"
    want = con.sql(f"SELECT {text} AS v FROM t").to_arrow_table().column("v").combine_chunks()
    got = computed_by_nodes(table, text)
    assert got.type == want.type == pa.timestamp("us")
    assert got.equals(want)


@pytest.mark.parametrize("text, says", [
    ("f2 * 2", "FLOAT"),                              # DuckDB computes in FLOAT
    ("i * 1.5", "DECIMAL"),                           # DuckDB computes a DECIMAL
    ("sqrt(f)", "not supported"),
    ("date_trunc('decade', ts)", "'decade'"),
    ("date_trunc('month', tz)", "time zone"),
    ("1 + 2", "literals alone"),
    ("date_trunc('day', tns)", "nanoseconds"),       # DuckDB rounds to microseconds first
    ("u + 1", "unsigned"),                            # DuckDB mixes unsigned and signed in wider types
    ("(i * i) * 0", "literal 0"),                     # Arrow folds it to 0 where DuckDB may overflow
    ("i + 99999999999999999999", "does not fit"),     # past 64 bits
    ("CAST(ts AS DATE)", "numbers only"),
    ("ts", "only by date_trunc"),
    ("nope", "no column"),
    ("(" * 1500 + "i" + ")" * 1500, "nested too deeply"),
    ("+".join(["i"] * 40), "more than the 64"),       # the work a ticket may buy on every row
    ("date_trunc(month, ts)", "string literal"),      # DuckDB reads month as a column
])
def test_what_is_not_computed_exactly_is_refused(text, says):
    schema = pa.schema([("i", pa.int32()), ("f", pa.float64()), ("f2", pa.float32()), ("ts", pa.timestamp("us")),
                        ("tz", pa.timestamp("us", tz="UTC")), ("tns", pa.timestamp("ns")), ("u", pa.uint16())])
    with pytest.raises(fp.InvalidExpression, match=says) as caught:
        aggregates.spec([("v", "sum")], [], schema, {"v": text})
    assert caught.value.code == "INVALID_EXPRESSION"


def test_integers_are_computed_in_the_type_duckdb_computes_them_in():
    """An untyped literal takes the other side's type when it fits it, else INTEGER or BIGINT; a CAST literal keeps
    its type; two columns the wider type: an overflow is refused where DuckDB refuses it, and nowhere else."""
    table = pa.table({"a": pa.array([100], pa.int8()), "b": pa.array([1000], pa.int16()),
                      "c": pa.array([30000], pa.int16())})
    con = duckdb.connect()
    con.register("t", table)
    for text in ["a * b", "c * 100000", "a * 2", "a * 1000", "c * 2", "b + 32000", "-a", "a - 1",
                 "a + CAST(100 AS INTEGER)", "a * 2::BIGINT", "a + CAST(1 AS SMALLINT)", "a + CAST(NULL AS SMALLINT)"]:
        try:
            want = con.sql(f"SELECT {text} AS v FROM t").to_arrow_table().column("v").combine_chunks()
        except duckdb.OutOfRangeException:
            with pytest.raises(fp.InvalidExpression, match="overflow"):
                computed_by_nodes(table, text)
            continue
        got = computed_by_nodes(table, text)
        assert got.type == want.type and got.equals(want), text


def test_a_filter_nested_too_deeply_is_an_invalid_filter_not_a_recursion_error():
    with pytest.raises(fp.InvalidFilter, match="nested too deeply"):
        parse_where("(" * 1500 + "i > 1" + ")" * 1500, pa.schema([("i", pa.int32())]))


class Opened:
    """What :func:`plan` needs of a dataset: its schema."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema


SCHEMA = pa.schema([("pickup", pa.timestamp("us")), ("fare", pa.float64()), ("n", pa.int32()), ("f32", pa.float32()),
                    ("zone", pa.string())])


@pytest.mark.parametrize("sql", [
    "SELECT date_trunc('month', pickup) AS m, sum(fare * 100) FROM trips GROUP BY 1 ORDER BY 1",
    "SELECT date_trunc('month', pickup) AS m, zone, avg(n + 1) FROM trips GROUP BY m, zone HAVING avg(n + 1) > 3",
    "SELECT date_trunc('month', pickup), count(*) FROM trips GROUP BY date_trunc('month', pickup)",
    "SELECT zone, max(n * 2), min(fare - 1) FROM trips WHERE fare * 2 > 3 GROUP BY zone",
])
def test_expressions_of_keys_and_aggregates_become_columns_the_nodes_compute(sql):
    planned = plan(sql, {"trips"}, lambda name: Opened(SCHEMA))
    assert planned is not None and planned.computed, sql
    names = set(planned.computed)
    assert any(k in names for keys, _ in planned.groupings for k in keys) or \
        any(c in names for _, aggs in planned.groupings for c, _f in aggs)
    assert "date_trunc" not in planned.final.lower() and "fare * 100" not in planned.final
    if "WHERE" in sql:
        assert planned.where == "fare * 2 > 3"  # the WHERE runs on the nodes as written, before anything is computed


@pytest.mark.parametrize("sql", [
    "SELECT date_trunc('day', pickup), count(*) FROM trips GROUP BY date_trunc('month', pickup)",  # not a key
    "SELECT sum(f32 * 2) FROM trips",                    # FLOAT arithmetic
    "SELECT sum(n * 1.5) FROM trips",                    # a DECIMAL in DuckDB
    "SELECT upper(zone), count(*) FROM trips GROUP BY 1",  # a function not translated
    "SELECT date_trunc(zone, pickup), count(*) FROM trips GROUP BY 1",  # the unit read from a column, row by row
])
def test_expressions_the_nodes_cannot_compute_exactly_leave_the_query_whole(sql):
    assert plan(sql, {"trips"}, lambda name: Opened(SCHEMA)) is None


def test_an_alias_named_like_a_column_leaves_the_query_whole():
    """DuckDB's HAVING binds a select alias before a column of the same name; a computed column reads the column."""
    schema = pa.schema([("n", pa.int32()), ("m", pa.int32())])
    assert plan("SELECT m AS n, count(*) AS c FROM t GROUP BY m, n + 1 HAVING n + 1 > 3", {"t"},
                lambda name: Opened(schema)) is None
    assert plan("SELECT m AS k, count(*) AS c FROM t GROUP BY m, n + 1 HAVING n + 1 > 3", {"t"},
                lambda name: Opened(schema)).computed


def test_a_filter_keeps_arithmetic_duckdb_folds_away():
    """DuckDB moves a filter's constants across its comparison and never computes a product that would overflow:
    the filter answers as DuckDB does."""
    table = pa.table({"s": pa.array([30000, 5], pa.int16())})
    con = duckdb.connect()
    con.register("t", table)
    want = con.sql("SELECT count(*) FROM t WHERE s * 100000 > 1000000").fetchall()[0][0]
    kept = apply(table, Filter.compile(parse_where("s * 100000 > 1000000", table.schema), table.schema).substrait)
    assert kept.num_rows == want == 1


def test_an_alias_named_like_a_column_in_other_letters_groups_by_the_column_as_in_duckdb():
    planned = plan("SELECT date_trunc('month', pickup) AS PICKUP, count(*) FROM trips GROUP BY PICKUP", {"trips"},
                   lambda name: Opened(SCHEMA))
    assert planned is None or not planned.computed


def test_a_ubigint_never_meets_a_signed_value_in_a_filter():
    """int64 cannot hold both (2**63 would wrap negative): refused, and DuckDB filters those rows itself."""
    schema = pa.schema([("u", pa.uint64()), ("i", pa.int32())])
    for text in ("u > -3", "u = i", "u + i > 0"):
        with pytest.raises(fp.InvalidFilter, match="UBIGINT"):
            parse_where(text, schema)
    table = pa.table({"u": pa.array([2**63, 1], pa.uint64()), "i": pa.array([1, 2], pa.int32())})
    assert apply(table, Filter.compile(parse_where("u > 3", schema), schema).substrait).num_rows == 1
