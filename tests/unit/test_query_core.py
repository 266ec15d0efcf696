"""Filters, statistics, pruning and two-step aggregates, without a cluster.

Pruning is checked against the data itself: for random partitions and
random filters, every block said to have no match has none, and every
block said to match entirely does.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp
from flightpart.query import aggregates, filters
from flightpart.query.pruning import Pruner
from flightpart.query.statistics import StatsBuilder, guarantee

F = pc.field


def test_a_filter_travels_bound_to_the_columns_it_reads_only():
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
    f = filters.Filter.compile((F("c") > 1.5) & (F("a") == 3), schema)
    assert f.columns == ("a", "c")
    # a partition with other columns, in another order, still evaluates it
    table = pa.table({"z": [1, 2, 3], "c": [1.0, 2.0, 3.0], "a": [3, 3, 4]})
    assert filters.apply(table, f.substrait).to_pydict() == {"z": [2], "c": [2.0], "a": [3]}


def test_a_filter_that_cannot_travel_or_names_no_column_is_a_clear_error():
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    with pytest.raises(fp.PartitionedError, match="nope"):
        filters.Filter.compile(F("nope") > 1, schema)
    with pytest.raises(fp.PartitionedError, match="cannot be sent"):
        filters.Filter.compile(pc.utf8_length(F("s")) > 1, schema)
    with pytest.raises(TypeError):
        filters.Filter.compile("a > 1", schema)  # type: ignore[arg-type]


def test_a_node_refuses_filters_that_do_not_fit_its_partition():
    schema = pa.schema([("a", pa.int64())])
    raw = filters.Filter.compile(F("a") > 1, schema).substrait
    with pytest.raises(fp.RequestRejected, match="does not have"):
        filters.apply(pa.table({"b": [1]}), raw)
    with pytest.raises(fp.RequestRejected, match="bound to int64"):
        filters.apply(pa.table({"a": ["x"]}), raw)
    for junk in [b"", b"\x00" * 10, raw[: len(raw) // 2], b"\x0a\xff\xff\xff\xff\x0f" + raw]:
        with pytest.raises(fp.RequestRejected) as info:
            filters.apply(pa.table({"a": [1]}), junk)
        assert info.value.field == "ticket.filter"
    non_boolean = filters.serialize(F("a") + 1, schema)
    with pytest.raises(fp.RequestRejected):
        filters.apply(pa.table({"a": [1]}), non_boolean)
    twice = filters.serialize(pc.field(0) > 1, pa.schema([("a", pa.int64()), ("a", pa.int64())]))
    with pytest.raises(fp.RequestRejected, match="names a column twice"):
        filters.apply(pa.table({"a": [1, 2]}), twice)


@pytest.mark.parametrize("text, expected", [
    ("a > 2", [3, 4]),
    ("a >= 2 and s = 'y'", [2, 3]),
    ("a < 2 OR s == 'z'", [1, 4]),
    ("not a < 3", [3, 4]),
    ("s in ('x', 'z')", [1, 4]),
    ("s not in ('x')", [2, 3, 4]),
    ("a * 2 > 5", [3, 4]),
    ("n is null", [2]),
    ("n IS NOT NULL AND a != 1", [3, 4]),
    ('"odd name" = 1', [1]),
])
def test_where_text_is_sql_parsed_without_evaluation(text, expected):
    table = pa.table({"a": [1, 2, 3, 4], "s": ["x", "y", "y", "z"], "n": [1.0, None, 3.0, 4.0],
                      "odd name": [1, 0, 0, 0]})
    expr = filters.parse_where(text, table.column_names)
    assert table.filter(expr).column("a").to_pylist() == expected


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "a.b > 1", "f(a)", "a > ", "zz > 1", "a is 3",
                                  "lambda: 1", "[x for x in a]"])
def test_where_text_refuses_anything_but_columns_literals_and_comparisons(text):
    with pytest.raises(fp.InvalidFilter):
        filters.parse_where(text, ["a", "s"])


def test_statistics_record_only_what_bounds_every_row():
    schema = pa.schema([("i", pa.int32()), ("f", pa.float64()), ("s", pa.string()), ("t", pa.timestamp("ms")),
                        ("d", pa.date32()), ("n", pa.int64()), ("nan", pa.float64()), ("big", pa.string()),
                        ("l", pa.list_(pa.int8())), ("inf", pa.float64())])
    b = StatsBuilder(schema)
    for k in range(2):
        b.add(pa.record_batch([
            pa.array([k, 5 + k], pa.int32()), pa.array([0.5 * k, -1.0]), pa.array(["b", "a" * (k + 1)]),
            pa.array([dt.datetime(2020, 1, 1 + k), dt.datetime(2021, 1, 1)], pa.timestamp("ms")),
            pa.array([dt.date(2020, 1, 1), dt.date(2020 + k, 5, 1)], pa.date32()),
            pa.array([None, k], pa.int64()), pa.array([math.nan, 1.0]), pa.array(["x" * 300, "y"]),
            pa.array([[1], [2]], pa.list_(pa.int8())), pa.array([math.inf, 1.0])], schema=schema))
    s = b.result()
    assert s["i"] == {"nulls": 0, "min": 0, "max": 6}
    assert s["f"] == {"nulls": 0, "min": -1.0, "max": 0.5}
    assert s["s"] == {"nulls": 0, "min": "a", "max": "b"}
    assert s["n"] == {"nulls": 2} and s["nan"] == {"nulls": 0} and s["big"] == {"nulls": 0}
    assert s["l"] == {"nulls": 0} and s["inf"] == {"nulls": 0}
    g = guarantee(s, schema, rows=4)
    t_lo = pa.scalar(dt.datetime(2020, 1, 1), pa.timestamp("ms"))
    assert "2020-01-01" in str(g) and t_lo.as_py() == dt.datetime(2020, 1, 1)


def _random_partition(rng: np.random.Generator, rows: int) -> pa.Table:
    base = int(rng.integers(0, 100))
    x = rng.integers(base, base + int(rng.integers(1, 30)), rows)
    y = pa.array(rng.random(rows) * 10)
    s = pa.array([f"k{v}" for v in rng.integers(0, 4, rows)])
    n = pa.array([None if rng.random() < 0.3 else float(v) for v in rng.integers(0, 5, rows)]) if rng.random() < 0.5 \
        else pa.nulls(rows, pa.float64())
    return pa.table({"x": x, "y": y, "s": s, "n": n})


FILTERS = [F("x") > 60, F("x") == 42, (F("x") >= 10) & (F("x") < 20), F("x").isin([3, 77]), ~(F("x") < 50),
           (F("y") > 9.5) | (F("x") < 5), F("s") == "k2", F("s") > "k9", F("n").is_null(), F("n") > 2,
           F("n").is_valid(), (F("x") > 30) & F("n").is_null(), pc.scalar(True), F("x") != 50]


def test_pruning_never_skips_a_matching_block_and_all_match_is_exact():
    rng = np.random.default_rng(7)
    tables = {i: _random_partition(rng, int(rng.integers(0, 40))) for i in range(60)}
    schema = tables[0].schema
    stats = {}
    for i, t in tables.items():
        b = StatsBuilder(schema)
        for batch in t.to_batches(max_chunksize=7):
            b.add(batch)
        stats[i] = (t.num_rows, [b.result()])
    pruner = Pruner(schema, stats)
    pruned_some = all_some = False
    for expr in FILTERS:
        none, every = pruner.cannot_match(expr), pruner.all_match(expr)
        for i, t in tables.items():
            kept = t.filter(expr).num_rows
            if i in none:
                assert kept == 0, (expr, i)
            if i in every:
                assert kept == t.num_rows, (expr, i)
        pruned_some |= bool(none - {i for i, t in tables.items() if t.num_rows == 0})
        all_some |= bool(every)
    assert pruned_some and all_some  # the statistics do prune


def test_aggregates_in_two_steps_equal_pyarrow_on_the_whole_table():
    rng = np.random.default_rng(3)
    n = 5_000
    table = pa.table({"g": rng.choice(["a", "b", "c"], n), "x": rng.integers(-50, 50, n),
                      "y": pa.array([None if v < 0.1 else v for v in rng.random(n)])})
    pairs = [("x", "sum"), ("y", "mean"), ("x", "min"), ("y", "max"), ("y", "count"), ("", "count_all")]
    for by in ([], ["g"]):
        agg = aggregates.spec(pairs, by, table.column_names)
        partials = [aggregates.partial(table.slice(k, 700), agg) for k in range(0, n, 700)]
        got = aggregates.combine(partials, agg, table.schema)
        want = table.group_by(by).aggregate([([], "count_all") if f == "count_all" else (c, f) for c, f in pairs])
        if by:
            got, want = got.sort_by("g"), want.sort_by("g")
        assert got.column_names == want.column_names
        for name in want.column_names:
            a, b = got.column(name).to_pylist(), want.column(name).to_pylist()
            assert a == b or np.allclose(a, b), name
    empty = aggregates.combine([], aggregates.spec([("x", "sum"), ("", "count_all")], [], table.column_names),
                               table.schema)
    assert empty.to_pylist() == [{"x_sum": None, "count_all": 0}]
    with pytest.raises(fp.PartitionedError, match="median"):
        aggregates.spec([("x", "median")], [], table.column_names)
    with pytest.raises(fp.PartitionedError, match="zz"):
        aggregates.spec([("zz", "sum")], [], table.column_names)


def test_an_exact_sum_of_integers_does_not_wrap_and_a_mean_of_them_does_not_either():
    """Arrow's int64 sum wraps around past 2**63 without a word; ``exact_sum`` sums integers and booleans as a
    decimal128(38, 0) (SQL's HUGEINT), other types as ``sum``; a mean's partial sums are exact."""
    from decimal import Decimal

    table = pa.table({"g": ["a", "a", "a", "b"], "x": pa.array([2**62, 2**62, 2**62, 7], pa.int64()),
                      "b": [True, True, False, True], "f": [0.5, 1.0, 2.0, 4.0]})
    agg = aggregates.spec([("x", "exact_sum"), ("b", "exact_sum"), ("f", "exact_sum"), ("x", "mean"), ("x", "sum")],
                          ["g"], table.column_names)
    partials = [aggregates.partial(table.slice(k, 1), agg) for k in range(4)]
    got = aggregates.combine(partials, agg, table.schema).sort_by("g").to_pylist()
    assert got[0]["x_exact_sum"] == Decimal(3 * 2**62) and got[0]["b_exact_sum"] == 2 and got[0]["f_exact_sum"] == 3.5
    assert got[0]["x_mean"] == pytest.approx(2**62)
    assert got[1] == {"g": "b", "x_exact_sum": 7, "b_exact_sum": 1, "f_exact_sum": 4.0, "x_mean": 7.0, "x_sum": 7}
    empty = aggregates.combine([], agg, table.schema)
    assert empty.schema.field("x_exact_sum").type == pa.decimal128(38, 0) and empty.num_rows == 0


def test_an_exact_sum_is_exact_whether_a_partition_adds_it_up_as_int64_or_as_a_decimal():
    """A partition whose values cannot pass int64's range in any sum adds up in int64 (quicker), one whose values
    could adds up as a decimal; both give decimal128(38, 0) partials of the exact sums."""
    from decimal import Decimal

    small = pa.table({"g": ["a", "b", "a"], "x": pa.array([5, -7, 9], pa.int64()),
                      "u": pa.array([1, 2, 3], pa.uint8())})
    large = pa.table({"g": ["a", "a", "b"], "x": pa.array([2**62, 2**62, -(2**63)], pa.int64()),
                      "u": pa.array([1, 2, 3], pa.uint8())})
    agg = aggregates.spec([("x", "exact_sum"), ("u", "exact_sum")], ["g"], small.column_names)
    for table, want in ((small, {"a": 14, "b": -7}), (large, {"a": 2**63, "b": -(2**63)})):
        partial = aggregates.partial(table, agg)
        assert partial.schema.field("p0").type == pa.decimal128(38, 0) == partial.schema.field("p1").type
        assert dict(zip(partial.column("g").to_pylist(), partial.column("p0").to_pylist())) == \
            {g: Decimal(v) for g, v in want.items()}
    nulls = pa.table({"g": ["a"], "x": pa.array([None], pa.int64()), "u": pa.array([None], pa.uint8())})
    assert aggregates.partial(nulls, agg).column("p0").to_pylist() == [None]


def test_partials_are_refused_for_a_group_twice_in_one_not_for_one_group_in_two():
    """The groups of every partial are counted in one grouping: a group twice within one partial is a lie, the same
    group in two partials (two partitions) is the usual case, also for a key named like the check's own column."""
    for key in ("store", "flightpart partial"):
        schema = pa.schema([(key, pa.string()), ("amount", pa.float64())])
        agg = aggregates.spec([("amount", "sum")], [key], schema)
        one = aggregates.partial(pa.table({key: ["a", "b"], "amount": [1.0, 2.0]}), agg)
        expected = aggregates.partial_schema(agg, schema)
        assert aggregates.checked_partials([one, one, one], agg, expected, 100) == [one, one, one]
        with pytest.raises(fp.ServerError, match="a group appears more than once"):
            aggregates.checked_partials([one, pa.concat_tables([one, one.slice(1)]), one], agg, expected, 100)


def test_a_filter_too_large_to_read_safely_is_refused_before_it_is_read():
    """An is_in of 20,000 values is read by Arrow with a recursion that overflowed a thread's stack (the SQL
    gateway's, through a filter DuckDB pushed): refused by its size before anything reads it."""
    from flightpart.query.filters import MAX_FILTER_BYTES, Filter

    schema = pa.schema([("a", pa.int64())])
    assert Filter.compile(pc.field("a").isin(list(range(1000))), schema).columns == ("a",)
    with pytest.raises(fp.PartitionedError, match=f"more than the {MAX_FILTER_BYTES:,} sent to the nodes"):
        Filter.compile(pc.field("a").isin(list(range(20_000))), schema)
