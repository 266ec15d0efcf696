"""Frames in and out of Arrow; grids cut and assembled; indexes kept."""

from __future__ import annotations

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from flightpart import frames


def sample_pandas(index=None):
    df = pd.DataFrame(
        {"a": np.arange(12, dtype=np.int64), "b": np.linspace(0, 1, 12), "c": [f"s{k}" for k in range(12)],
         "d": [True, False] * 6}
    )
    if index is not None:
        df.index = index
    return df


@pytest.mark.parametrize(
    "index",
    [None, pd.Index([f"k{k}" for k in range(12)], name="key"), pd.RangeIndex(100, 124, 2),
     pd.MultiIndex.from_arrays([list(range(12)), list("abcdefghijkl")], names=["n", "l"])],
    ids=["range", "named", "stepped-range", "multi"],
)
@pytest.mark.parametrize("grid", [(1, 1), (3, 1), (4, 2), (2, 4)])
def test_pandas_round_trip_through_a_grid_keeps_the_index(index, grid):
    df = sample_pandas(index)
    table = frames.to_arrow(df)
    parts = frames.split_grid(table, grid)
    back = frames.to_pandas(frames.assemble(parts, grid))
    pd.testing.assert_frame_equal(back, df)


def test_frame_shape_ignores_index_columns():
    table = frames.to_arrow(sample_pandas(pd.Index(list("abcdefghijkl"), name="k")))
    assert frames.frame_shape(table) == (12, 4)
    assert "k" in table.column_names


def test_polars_round_trip():
    df = pl.DataFrame({"x": [1, 2, 3], "y": ["a", "b", None]})
    table = frames.to_arrow(df)
    assert frames.to_polars(frames.assemble(frames.split_grid(table, (2, 2)), (2, 2))).equals(df)


def test_polars_output_drops_pandas_index_columns():
    df = sample_pandas(pd.Index(list("abcdefghijkl"), name="k"))
    assert frames.to_polars(frames.to_arrow(df)).columns == ["a", "b", "c", "d"]


def test_pyarrow_passes_through_without_copy():
    table = pa.table({"x": [1, 2, 3]})
    assert frames.to_arrow(table) is table
    batch = table.to_batches()[0]
    assert frames.to_arrow(batch).column(0).chunk(0).buffers()[1].address == batch.column(0).buffers()[1].address


class StreamOnly:
    """Any object speaking the Arrow PyCapsule stream interface."""

    def __init__(self, table):
        self._table = table

    def __arrow_c_stream__(self, requested_schema=None):
        return self._table.__arrow_c_stream__(requested_schema)


def test_arrow_c_stream_objects():
    table = pa.table({"x": [1.5, 2.5]})
    assert frames.to_arrow(StreamOnly(table)).equals(table)


class InterchangeOnly:
    def __init__(self, df):
        self._df = df

    def __dataframe__(self, nan_as_null=False, allow_copy=True):
        return self._df.__dataframe__(nan_as_null=nan_as_null, allow_copy=allow_copy)


def test_dataframe_interchange_objects():
    df = pa.table({"x": [1, 2, 3]})
    assert frames.to_arrow(InterchangeOnly(df)).column("x").to_pylist() == [1, 2, 3]


def test_numpy_columns_are_named_by_global_position():
    table = frames.to_arrow(np.ones((3, 2)), column_offset=4)
    assert table.column_names == ["4", "5"]


def test_unknown_types_get_a_clear_error():
    with pytest.raises(TypeError, match="cannot read a builtins.set"):
        frames.to_arrow({1, 2})


def test_rechunk_targets_batch_bytes_without_copying():
    table = pa.table({"x": np.arange(1 << 20, dtype=np.float64)})  # 8 MiB in one chunk
    out = frames.rechunk(table, 1 << 20)
    assert out.column(0).num_chunks == 8
    assert out.column(0).chunk(3).buffers()[1].address == table.column(0).chunk(0).buffers()[1].address
    assert out.equals(table)
