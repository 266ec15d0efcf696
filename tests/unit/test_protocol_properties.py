"""Property tests: random grids through partitioned / validate / from_partitioned / pickle."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import flightpart as fp

grids = st.tuples(st.integers(0, 40), st.integers(1, 6)).flatmap(
    lambda rc: st.tuples(st.just(rc), st.integers(1, 5), st.integers(1, rc[1]))
)


def make_table(rows: int, cols: int) -> pa.Table:
    data = {f"c{k}": np.arange(rows, dtype=np.int64) * (k + 1) for k in range(cols - 1)}
    data[f"s{cols - 1}"] = [f"r{r}" for r in range(rows)]
    return pa.table(data)


@settings(max_examples=60, deadline=None)
@given(grids)
def test_partitioned_round_trip_and_pickle(grid):
    (rows, cols), p, q = grid
    table = make_table(rows, cols)
    obj = fp.partitioned(table, tiling=(p, q))
    d = fp.validate(obj, require_pickle=True)
    assert d["shape"] == (rows, cols) and d["partition_tiling"] == (p, q)
    assert fp.from_partitioned(obj).equals(table)
    assert fp.from_partitioned(pickle.loads(pickle.dumps(d))).equals(table)


@settings(max_examples=60, deadline=None)
@given(grids, st.data())
def test_any_shifted_start_is_refused(grid, data):
    (rows, cols), p, q = grid
    d = fp.validate(fp.partitioned(make_table(rows, cols), tiling=(p, q)))
    pos = data.draw(st.sampled_from(sorted(d["partitions"])))
    axis = data.draw(st.integers(0, 1))
    delta = data.draw(st.sampled_from([-1, 1]))
    start = list(d["partitions"][pos]["start"])
    start[axis] += delta
    if start[axis] < 0:
        return
    d["partitions"][pos]["start"] = tuple(start)
    try:
        fp.validate(d)
    except fp.PartitionedError:
        return
    raise AssertionError(f"shifted start of {pos} along {axis} was accepted")


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.sampled_from(["shape", "partition_tiling", "partitions", "get", "locals", "start", "data",
                                       "location"]) | st.tuples(st.integers(0, 2), st.integers(0, 2)),
                      inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(junk)
def test_validate_never_raises_anything_but_partitioned_error(value):
    try:
        fp.validate(value)
    except fp.PartitionedError:
        pass


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4))
def test_pandas_and_polars_inputs_round_trip(rows, p):
    df = pd.DataFrame({"x": np.arange(rows, dtype=np.float64), "y": [str(r) for r in range(rows)]})
    out = fp.from_partitioned(fp.partitioned(df, tiling=(p, 2))).to_pandas()
    pd.testing.assert_frame_equal(out, df)
    pdf = pl.DataFrame({"x": np.arange(rows)})
    assert pl.from_arrow(fp.from_partitioned(fp.partitioned(pdf, tiling=(p, 1)))).equals(pdf)


def test_partitions_are_zero_copy_slices():
    table = pa.table({"x": np.arange(1000, dtype=np.int64)})
    d = fp.partitioned(table, tiling=(4, 1)).__partitioned__
    base = table.column("x").chunk(0).buffers()[1].address
    part = d["partitions"][(2, 0)]["data"].column("x").chunk(0)
    assert part.buffers()[1].address == base
    assert part.offset == d["partitions"][(2, 0)]["start"][0]


def test_from_partitioned_columns_projection_and_unknown_column():
    table = make_table(10, 3)
    obj = fp.partitioned(table, tiling=(2, 3))
    assert fp.from_partitioned(obj, columns=["s2", "c0"]).column_names == ["s2", "c0"]
    try:
        fp.from_partitioned(obj, columns=["nope"])
    except fp.PartitionedError as exc:
        assert "columns: unknown column 'nope'" in str(exc)
    else:
        raise AssertionError("unknown column accepted")
