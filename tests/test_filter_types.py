"""Filters over the column types Substrait has no type for, every way they reach the nodes, answer as the reader's
own engine answers over the same table.

A filter travels as Substrait, which has no dictionary, view or narrow decimal type: pyarrow binds a pandas category
or a Polars Enum as its values, a string view as a string and a decimal32 as its raw bytes. Nodes had refused every
such filter ("column 'v' is dictionary ... here, the filter was bound to large_string"), so a pandas user's
``IS NULL`` on a category failed in every path; Polars' float16 literals had been read as their bits (1.0 as 15360.0:
no row matched).
"""

from __future__ import annotations

import decimal

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp

D = decimal.Decimal
ROWS = 600


def table_with(kind: str) -> pa.Table:
    """``id`` and a column ``v`` of ``kind`` with nulls, in four chunks (the put cuts it into three partitions)."""
    words = ["apple", None, "kiwi", "apple", None, "plum"] * (ROWS // 6)
    values = {
        "pandas category": lambda: pa.Table.from_pandas(pd.DataFrame({"v": pd.Categorical(words)})).column("v"),
        "polars enum": lambda: pl.DataFrame({"v": pl.Series(words, dtype=pl.Enum(["apple", "kiwi", "plum"]))})
        .to_arrow().column("v"),
        "string view": lambda: pa.array(words, pa.string_view()),
        "binary view": lambda: pa.array([w.encode() if w else None for w in words], pa.binary_view()),
        "decimal32": lambda: pa.array([None if k % 5 == 1 else D(k) / 4 for k in range(ROWS)], pa.decimal32(9, 2)),
        "decimal64": lambda: pa.array([None if k % 5 == 1 else D(k) / 4 for k in range(ROWS)], pa.decimal64(18, 2)),
    }[kind]()
    return pa.Table.from_batches(pa.table({"id": np.arange(ROWS), "v": values}).to_batches(max_chunksize=ROWS // 4))


KINDS = ["pandas category", "polars enum", "string view", "binary view", "decimal32", "decimal64"]


def local_duckdb(table: pa.Table, where: str) -> list[int]:
    plain = table.cast(pa.schema([("id", pa.int64()), ("v", _plain(table.schema.field("v").type))]))
    con = duckdb.connect()
    con.register("plain", plain)
    return sorted(r[0] for r in con.sql(f"select id from plain where {where}").fetchall())


def _plain(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(kind):
        return kind.value_type
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    return pa.decimal128(kind.precision, kind.scale)


@pytest.fixture(scope="module")
def datasets(cluster):
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        yield client, {kind: client.put(f"typed_{k}", table_with(kind), tiling=(3, 1)) for k, kind in enumerate(KINDS)}


@pytest.mark.parametrize("kind", KINDS)
def test_is_null_reaches_the_nodes_and_answers_in_every_path(datasets, kind):
    client, sets = datasets
    ds, table = sets[kind], table_with(kind)
    # no filter kernel takes a view
    nulls = np.flatnonzero(table.column("v").is_null().to_numpy(zero_copy_only=False)).tolist()
    assert nulls and len(nulls) < ROWS
    assert sorted(ds.filter("v IS NULL").to_arrow()["id"].to_pylist()) == nulls
    assert sorted(ds.filter(pc.field("v").is_null()).to_arrow()["id"].to_pylist()) == nulls
    assert ds.count_rows("v IS NOT NULL") == ROWS - len(nulls)
    assert sorted(client.sql(f"select id from {ds.name} where v is null").to_arrow()["id"].to_pylist()) == nulls
    scanned = duckdb.connect()
    scanned.register("t", ds.duckdb_scan())
    assert sorted(r[0] for r in scanned.sql("select id from t where v is null").fetchall()) == nulls
    if kind not in ("decimal32", "decimal64", "binary view"):  # Polars reads neither narrow decimals nor binary views
        got = ds.to_polars(lazy=True).filter(pl.col("v").is_null()).collect()["id"].to_list()
        assert sorted(got) == nulls


@pytest.mark.parametrize("kind", ["pandas category", "polars enum", "string view"])
def test_text_comparisons_of_categories_and_views_answer_as_duckdb(datasets, kind):
    client, sets = datasets
    ds, table = sets[kind], table_with(kind)
    for where in ("v = 'apple'", "v IN ('kiwi', 'plum')", "NOT (v = 'apple')", "v >= 'kiwi'"):
        want = local_duckdb(table, where)
        assert sorted(ds.filter(where).to_arrow()["id"].to_pylist()) == want, where
        assert sorted(client.sql(f"select id from {ds.name} where {where}").to_arrow()["id"].to_pylist()) == want, where
    lazy = ds.to_polars(lazy=True)
    for predicate in (pl.col("v") == "apple", pl.col("v").is_in(["kiwi"]), pl.col("v").cast(pl.String) >= "kiwi"):
        local = pl.from_arrow(table).filter(predicate)["id"].to_list()
        assert sorted(lazy.filter(predicate).collect()["id"].to_list()) == sorted(local), predicate


@pytest.mark.parametrize("kind", ["decimal32", "decimal64"])
def test_narrow_decimals_compare_as_their_values(datasets, kind):
    _client, sets = datasets
    ds, table = sets[kind], table_with(kind)
    bound = pa.scalar(D("100.25"), pa.decimal128(9 if kind == "decimal32" else 18, 2))
    want = sorted(table.filter(pc.field("v").cast(bound.type) > bound)["id"].to_pylist())
    assert want and sorted(ds.filter(pc.field("v") > bound).to_arrow()["id"].to_pylist()) == want


def test_a_polars_float16_literal_is_its_value_not_its_bits(cluster):
    frame = pl.DataFrame({"id": np.arange(40), "v": pl.Series([None if k % 7 == 1 else k / 2 for k in range(40)],
                                                               dtype=pl.Float16)})
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        lazy = client.put("halves", frame, tiling=(3, 1)).to_polars(lazy=True)
        for predicate in (pl.col("v") == 1.0, pl.col("v") > 15.0, pl.col("v").is_null()):
            assert lazy.filter(predicate).collect().equals(frame.filter(predicate)), predicate


def test_the_top_rows_of_a_dataset_with_string_views_come_from_the_nodes(datasets):
    """No take or sort kernel of Arrow takes a string view: each node's top failed ("no replica could serve it", a
    traceback in its log per partition), and SQL's ORDER BY ... LIMIT ran the whole query in the catalog."""
    client, sets = datasets
    ds, table = sets["string view"], table_with("string view")
    by_id = ds.top(3, by=[("id", "descending")])
    assert by_id.column("id").to_pylist() == [ROWS - 1, ROWS - 2, ROWS - 3]
    assert by_id.schema.field("v").type == pa.string_view() and by_id.column("v").to_pylist() == ["plum", None, "apple"]
    by_text = ds.top(4, by=[("v", "descending"), ("id", "ascending")])
    assert by_text.column("id").to_pylist() == local_duckdb_ordered(table, "v desc nulls last, id", 4)
    answer = client.sql(f"select id, v from {ds.name} order by id desc limit 3").to_arrow()
    assert answer.column("id").to_pylist() == [ROWS - 1, ROWS - 2, ROWS - 3]


def local_duckdb_ordered(table: pa.Table, order: str, limit: int) -> list[int]:
    plain = table.cast(pa.schema([("id", pa.int64()), ("v", pa.string())]))
    con = duckdb.connect()
    con.register("plain", plain)
    return [r[0] for r in con.sql(f"select id from plain order by {order} limit {limit}").fetchall()]


def test_counting_with_a_nan_literal_agrees_with_filtering(cluster):
    """``count_rows(v < NaN)`` had counted 3 rows where a filter keeps none: the statistics of a block from -3 to 5
    were taken to decide it, with NaN ordered as no comparison kernel orders it."""
    table = pa.table({"v": pa.array([1.0, None, float("nan"), 2.0, -3.0, 5.0])})
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("nan_counts", table, tiling=(2, 1))
        computed = pc.Expression._call("subtract", [pc.scalar(float("inf")), pc.scalar(float("inf"))])  # a NaN too
        for expression in (pc.field("v") < float("nan"), pc.field("v") >= float("nan"), pc.field("v") != float("nan"),
                           pc.field("v") < computed, ~(pc.field("v") < computed)):
            kept = table.filter(expression).num_rows
            assert ds.count_rows(expression) == ds.filter(expression).to_arrow().num_rows == kept, expression


def test_polars_reads_fixed_size_lists_with_nulls_from_a_datasets_row_ranges(cluster):
    """A chunk read from a node may hold more list values than its rows; Polars read them as its own and refused
    the dataset ("validity mask length must be equal to the number of values divided by size")."""
    frame = pl.DataFrame({"v": pl.Series([[1, 2, 3], None, [4, 5, 6], [7, 8, 9], None, [1, 1, 1]],
                                         dtype=pl.Array(pl.Int32, 3))})
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        client.put("arrays", frame, tiling=(3, 1))
        appended = client.append("arrays", frame)
        assert appended.to_polars().equals(pl.concat([frame, frame]))
        assert appended.to_polars(lazy=True).filter(pl.col("v").is_not_null()).collect().height == 8


def wide_table() -> pa.Table:
    """A float column beside the types DuckDB cannot import (float16, decimal256, at any depth) and those Substrait
    has no type for (decimal256, duration, large and fixed-size lists)."""
    k = np.arange(60)
    return pa.table({
        "x": k / 2,
        "h": pa.array([None if i % 9 == 4 else i / 4 for i in k], pa.float16()),
        "narrow": pa.array([D(int(i)) / 4 for i in k], pa.decimal256(20, 2)),
        "wide": pa.array([D(int(i)) * 10**30 + D(1) / 4 for i in k], pa.decimal256(45, 2)),
        "hs": pa.array([[i / 2, None] for i in k], pa.list_(pa.float16())),
        "waited": pa.array(k, pa.duration("s")),
        "lots": pa.array([[int(i)] for i in k], pa.large_list(pa.int64())),
        "pair": pa.array([[int(i), int(i)] for i in k], pa.list_(pa.int64(), 2)),
    })


def test_a_dataset_with_types_duckdb_and_substrait_lack_is_filtered_and_queried(cluster):
    """A float16 or decimal256 column anywhere in a dataset had failed every DuckDB query over it, ``count(*)`` too
    ("Unsupported Internal Arrow Type e"), and one Substrait has no type for had refused every filter, on any column
    ("conversion to substrait::Type from decimal256(45, 2)"). DuckDB is shown a float16 as a float32, a decimal256 of
    at most 38 digits as a decimal128 and a wider one as a float64 (as DuckDB reads such a Parquet decimal); a filter
    on another column reaches the nodes, and one on such a column is refused naming it."""
    table = wide_table()
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("wide_types", table, tiling=(3, 1))
        assert sorted(ds.filter(pc.field("x") > 20).to_arrow()["x"].to_pylist()) == [v / 2 for v in range(41, 60)]
        assert ds.count_rows("x <= 3") == 7
        with pytest.raises(fp.PartitionedError, match="'waited'.{0,12}duration"):
            ds.filter(pc.field("waited") > pa.scalar(3, pa.duration("s")))
        with pytest.raises(fp.PartitionedError, match="'lots' of type large_list"):
            ds.filter(pc.field("lots").is_null())

        shown = table.cast(pa.schema([("x", pa.float64()), ("h", pa.float32()), ("narrow", pa.decimal128(20, 2)),
                                      ("wide", pa.float64()), ("hs", pa.list_(pa.float32())),
                                      ("waited", pa.duration("s")), ("lots", pa.large_list(pa.int64())),
                                      ("pair", pa.list_(pa.int64(), 2))]))
        local = duckdb.connect()
        local.register("wide_types", shown)
        scanned = duckdb.connect()
        scanned.register("wide_types", ds.duckdb_scan())
        for query in ("select count(*) from wide_types",
                      "select x, h, narrow, wide, hs from wide_types where h > 3 and narrow < 12 order by x",
                      "select sum(h), max(wide), sum(narrow), sum(hs[1]), count(hs[2]) from wide_types",
                      "select x from wide_types where wide > 5.5e30 and x < 10 order by x"):
            want = local.sql(query).fetchall()
            assert want and scanned.sql(query).fetchall() == want, query
            assert client.sql(query).to_arrow().to_pylist() == local.sql(query).to_arrow_table().to_pylist(), query
        sparse = pa.UnionArray.from_sparse(pa.array([0, 0], pa.int8()), [pa.array([1, 2])])
        dense = pa.UnionArray.from_dense(pa.array([0, 0], pa.int8()), pa.array([0, 1], pa.int32()), [pa.array([1, 2])])
        for k, union in enumerate((sparse, dense)):  # Arrow makes no empty union column: the gateway's plan had failed
            client.put(f"with_union_{k}", pa.table({"x": [1.0, 2.0], "u": union}))  # ("INTERNAL", its log a traceback)
        assert client.sql("select count(*) as n from with_union_0").to_arrow()["n"].to_pylist() == [2]
        with pytest.raises(fp.RequestRejected, match="Union"):  # DuckDB reads no dense union: its own words
            client.sql("select count(*) as n from with_union_1")


def test_polars_reads_decimal256_and_names_the_columns_it_cannot_read(cluster):
    """Polars panicked on every decimal256 ("operator does not support primitive Int256": a ``PanicException``, which
    ``except Exception`` does not catch, and a Rust backtrace) and on a fixed-offset zone or a month-day-nano interval
    in a lazy scan. A decimal256 of at most 38 digits reaches Polars as the decimal128 of the same values, at any
    depth; a column Polars cannot read is refused naming it, before anything is read, eager or lazy."""
    coded = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()),
                                           pa.array([D("1.5"), D("2")], pa.decimal256(9, 1)))
    table = pa.table({"x": [1.0, 2.0, 3.0], "d": pa.array([D("1.5"), None, D("3.25")], pa.decimal256(20, 2)),
                      "l": pa.array([[D(1)], None, [D(2)]], pa.list_(pa.decimal256(10, 0))), "c": coded})
    want = pl.from_arrow(table.cast(pa.schema([("x", pa.float64()), ("d", pa.decimal128(20, 2)),
                                               ("l", pa.list_(pa.decimal128(10, 0))),
                                               ("c", pa.dictionary(pa.int32(), pa.decimal128(9, 1)))])))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("polars_decimals", table, tiling=(2, 1))
        assert ds.to_polars().sort("x").equals(want)
        assert ds.to_polars(lazy=True).filter(pl.col("x") > 1.5).collect().sort("x").equals(
            want.filter(pl.col("x") > 1.5))
        for name, values in {"zoned": pa.array([1, 2], pa.timestamp("us", "+05:30")),
                             "gap": pa.array([None, None], pa.month_day_nano_interval()),
                             "wide": pa.array([D(1), D(2)], pa.decimal256(40, 2))}.items():
            bad = client.put(f"polars_{name}", pa.table({"x": [1, 2], name: values}))
            for read in (bad.to_polars, lambda bad=bad: bad.to_polars(lazy=True).collect()):
                with pytest.raises(fp.SchemaMismatch, match=f"column '{name}' is .*which Polars cannot read"):
                    read()
            assert bad.select(["x"]).to_polars()["x"].to_list() == [1, 2]
