"""Counts, min and max without keys are answered from the partitions' statistics (no byte from the nodes) where
they say the answer exactly, and from the nodes otherwise; every answer is DuckDB's over the same rows."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp

ROWS = 60_000


def source_table() -> pa.Table:
    rng = np.random.default_rng(5)
    v = rng.integers(0, 1_000, ROWS)
    words = pa.array(["a", None, "b", "c"])  # a null among the dictionary's values, and null indices
    indices = pa.array(rng.integers(0, 4, ROWS), pa.int8(), mask=rng.random(ROWS) < 0.05)
    return pa.table({
        "k": np.arange(ROWS, dtype=np.int64),
        "v": pa.array(v, pa.int64(), mask=rng.random(ROWS) < 0.1),  # nulls: no recorded bounds
        "f": rng.normal(0, 1, ROWS),
        "s": pa.array([f"w{k % 97:03d}" for k in range(ROWS)]),
        "d": pa.DictionaryArray.from_arrays(indices, words),
    })


@pytest.fixture(scope="module")
def sql(make_cluster):
    cluster = make_cluster(2)
    table = source_table()
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        client.put("facts", table, tiling=(6, 1))
        yield client, table


def answered(client, table: pa.Table, query: str) -> int:
    """Asserts ``query``'s answer is DuckDB's over ``table``; the bytes the nodes sent for it."""
    got = client.sql(query).to_arrow()
    facts = table  # noqa: F841 - DuckDB reads the local by its name
    want = duckdb.sql(query).to_arrow_table()
    assert got.to_pylist() == want.to_pylist(), query
    return next(q["bytes_from_nodes"] for q in client.queries().recent if q["text"] == query)


@pytest.mark.parametrize("query", [
    "SELECT count(*) AS n FROM facts",
    "SELECT count(*) AS n FROM facts WHERE v IS NULL",
    "SELECT count(*) AS n FROM facts WHERE v IS NOT NULL",
    "SELECT count(v) AS n, count(*) AS m, min(k) AS lo, max(k) AS hi FROM facts",
    "SELECT min(s) AS lo, max(s) AS hi, max(f) AS top FROM facts",
    "SELECT count(*) AS n FROM facts WHERE k >= 0",  # every row, by the bounds
])
def test_what_statistics_say_exactly_is_answered_without_the_nodes(sql, query):
    client, table = sql
    assert answered(client, table, query) == 0


@pytest.mark.parametrize("query", [
    "SELECT count(*) AS n FROM facts WHERE d IS NULL",  # a dictionary's null value is no null of its indices
    "SELECT count(d) AS n FROM facts",
    "SELECT min(v) AS lo, max(v) AS hi FROM facts",  # a column with nulls has no recorded bounds
    "SELECT sum(k) AS total, count(*) AS n FROM facts",
    "SELECT count(*) AS n FROM facts WHERE k < 12345",  # some partitions wholly, one in part
    "SELECT count(v) AS n FROM facts WHERE k < 12345",
])
def test_what_statistics_do_not_say_is_asked_of_the_nodes_and_answered_the_same(sql, query):
    client, table = sql
    assert answered(client, table, query) > 0


def test_a_row_range_of_a_partition_is_not_answered_by_its_whole_partitions_bounds(sql):
    client, table = sql
    ds = client.open("facts")
    part = ds[10:25_000]  # cuts into the first and third partitions
    got = part.aggregate([("k", "min"), ("k", "max"), ("v", "count"), ("k", "count_all")])
    want = table.slice(10, 24_990)
    assert got.column("k_min")[0].as_py() == 10 and got.column("k_max")[0].as_py() == 24_999
    assert got.column("v_count")[0].as_py() == want.column("v").length() - want.column("v").null_count
    assert got.column("count_all")[0].as_py() == 24_990
    nulls = ds.filter(pc.field("v").is_null())
    assert nulls.count_rows() == table.column("v").null_count
