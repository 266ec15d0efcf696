"""Polars lazy over a dataset: datetime and date ranges, is_in, is_between and string tests reach the nodes (the
nodes' counters say so), and every answer is Polars' own answer over the same table, NaN rows included."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.bench.queries import taxi_table
from flightpart.client.polars_source import to_arrow_expression


@pytest.fixture(scope="module")
def trips(cluster):
    table = taxi_table(120_000, seed=5)
    fare = table.column("fare").to_numpy().copy()
    fare[::97] = float("nan")  # NaN rows: Polars orders NaN above every number
    table = table.set_column(table.schema.get_field_index("fare"), "fare", pa.array(fare))
    with fp.connect(cluster.uri) as writer:
        writer.put("pl-trips", table, tiling=(6, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as reader:
        yield table, reader, reader.open("pl-trips")


def sent(client, cluster) -> int:
    return sum(client.stats(node.uri).values["bytes_sent"] for node in cluster.nodes)


WEEK = (pl.col("pickup_at") >= dt.datetime(2024, 1, 8)) & (pl.col("pickup_at") < dt.datetime(2024, 1, 9))
CASES = {
    "datetime range": WEEK,
    "is_between on datetimes": pl.col("pickup_at").is_between(dt.datetime(2024, 1, 8), dt.datetime(2024, 1, 9),
                                                              closed="left"),
    "date of a cast column": pl.col("pickup_at").cast(pl.Date) == dt.date(2024, 1, 8),
    "is_in with one item": pl.col("pickup_zone").is_in(["Hell's Kitchen"]),
    "is_in on ints": pl.col("rate_code").is_in([6]),
    "starts_with": pl.col("pickup_zone").str.starts_with("Tri"),
    "ends_with": pl.col("dropoff_zone").str.ends_with("Slope"),
    "contains literal": pl.col("pickup_zone").str.contains("Kitch", literal=True),
    "float above a value keeps NaN": pl.col("fare") > 60,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_polars_answers_are_polars_answers_and_selective_predicates_move_little(trips, cluster, name):
    table, client, ds = trips
    predicate = CASES[name]
    want = pl.from_arrow(table).filter(predicate).select(["pickup_zone", "fare", "pickup_at"]).sort("pickup_at")
    before = sent(client, cluster)
    got = (ds.to_polars(lazy=True).filter(predicate).select(["pickup_zone", "fare", "pickup_at"]).collect()
           .sort("pickup_at"))
    moved = sent(client, cluster) - before
    assert got.equals(want), name
    three_columns = sum(table.column(c).nbytes for c in ("pickup_zone", "fare", "pickup_at"))
    if name not in ("date of a cast column", "float above a value keeps NaN"):  # the first is not pushed: Polars casts
        assert moved < 0.2 * three_columns, f"{name}: {moved:,} of {three_columns:,} bytes moved"


def test_nan_rows_are_kept_where_polars_keeps_them(trips):
    table, _client, ds = trips
    got = ds.to_polars(lazy=True).filter(pl.col("fare") > 60).select("fare").collect()
    assert got["fare"].is_nan().sum() == pl.from_arrow(table).filter(pl.col("fare") > 60)["fare"].is_nan().sum() > 0


def test_what_is_pushed_is_what_polars_means():
    schema = pa.schema([("f", pa.float64()), ("s", pa.string()), ("t", pa.timestamp("ns"))])
    assert "is_nan" in str(to_arrow_expression(pl.col("f") > 1.5, schema))  # NaN > 1.5 in Polars
    assert "starts_with" in str(to_arrow_expression(pl.col("s").str.starts_with("a"), schema))
    assert to_arrow_expression(pl.col("s").str.contains("a.", literal=False), schema) is None  # a regex: not pushed
    assert "int64" in str(to_arrow_expression(pl.col("t") >= dt.datetime(2024, 1, 1), schema))  # ns compared exactly


NULLS = pa.table({"k": pa.array([1, 2, None, 3, None, 1], pa.int64()),
                  "s": pa.array(["a", None, "b", None, "c", "a"], pa.large_string())})
NULL_CASES = {
    "is_in with a null, nulls equal": pl.col("k").is_in([1, None], nulls_equal=True),
    "not is_in, nulls equal": ~pl.col("k").is_in([1, 2], nulls_equal=True),
    "strings is_in with a null, nulls equal": pl.col("s").is_in(["a", None], nulls_equal=True),
    "not strings is_in with a null, nulls equal": ~pl.col("s").is_in(["a", None], nulls_equal=True),
    "is_in, nulls not equal": pl.col("k").is_in([1, None]),
    "not is_in": ~pl.col("k").is_in([1, 2]),
    "is_null": pl.col("s").is_null(),
}


@pytest.mark.parametrize("name", sorted(NULL_CASES))
def test_null_rows_are_kept_or_left_as_polars_keeps_or_leaves_them(cluster, name):
    """``is_in(..., nulls_equal=True)`` had been pushed as a plain ``is_in``: the nodes left out the null rows that
    Polars keeps (26 rows of 1,512 on a probe's orders)."""
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("pl-nulls", NULLS, tiling=(2, 1))
        predicate = NULL_CASES[name]
        got = ds.to_polars(lazy=True).filter(predicate).collect()
        assert got.equals(pl.from_arrow(NULLS).filter(predicate)), (name, got)
