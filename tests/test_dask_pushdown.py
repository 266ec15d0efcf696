"""Dask over a dataset: ``ddf[ddf.fare > 60]`` reaches the nodes (their counters say so) and every answer, index
included, is the one Dask gives by filtering the unfiltered read. Real Dask workers, every partition remote."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp
from flightpart.bench.queries import taxi_table


@pytest.fixture(scope="module")
def trips(cluster, dask_client):
    table = taxi_table(120_000, seed=7)
    fare = table.column("fare").to_numpy().copy()
    fare[::97] = float("nan")
    table = table.set_column(table.schema.get_field_index("fare"), "fare", pa.array(fare))
    with fp.connect(cluster.uri) as writer:
        writer.put("dask-trips", table, tiling=(6, 1))
    with fp.connect(cluster.uri, host="127.0.0.9") as reader:
        ddf = reader.open("dask-trips").to_dask()
        yield table, reader, ddf, ddf.compute()


def sent(client, cluster) -> int:
    return sum(client.stats(node.uri).values["bytes_sent"] for node in cluster.nodes)


PUSHED = {
    "fare above a value (NaN rows dropped as pandas drops them)": lambda d: d.fare > 60,
    "a datetime range":
        lambda d: (d.pickup_at >= pd.Timestamp("2024-01-08")) & (d.pickup_at < pd.Timestamp("2024-01-09")),
    "a name with a quote": lambda d: d.pickup_zone == "Hell's Kitchen",
    "either of two": lambda d: (d.rate_code == 6) | (d.fare > 95),
    "a constant on the left": lambda d: 95 < d.fare,
}
KEPT_IN_DASK = {
    "not equal (a missing value is True in pandas, null in Arrow)": lambda d: d.fare != 5,
    "isin": lambda d: d.rate_code.isin([5, 6]),
    "a column against a column": lambda d: d.fare > d.tip,
}


@pytest.mark.parametrize("name", sorted(PUSHED))
def test_a_pushed_filter_gives_dasks_answer_and_moves_little(trips, cluster, name):
    table, client, ddf, whole = trips
    predicate = PUSHED[name]
    want = whole[predicate(whole)]
    before = sent(client, cluster)
    got = ddf[predicate(ddf)].compute()
    moved = sent(client, cluster) - before
    pd.testing.assert_frame_equal(got, want)
    assert 0 < len(got) < len(whole) / 5, name
    assert moved < 0.25 * table.nbytes, f"{name}: {moved:,} of {table.nbytes:,} bytes moved"


@pytest.mark.parametrize("name", sorted(KEPT_IN_DASK))
def test_a_filter_that_cannot_be_pushed_exactly_stays_in_dask_with_the_same_answer(trips, cluster, name):
    table, client, ddf, whole = trips
    predicate = KEPT_IN_DASK[name]
    before = sent(client, cluster)
    got = ddf[predicate(ddf)].compute()
    moved = sent(client, cluster) - before
    pd.testing.assert_frame_equal(got, whole[predicate(whole)])
    assert moved > 0.8 * table.nbytes, f"{name}: only {moved:,} bytes moved, so something was pushed"


def test_pushdown_keeps_the_projection_and_the_global_index(trips, cluster):
    table, client, ddf, whole = trips
    before = sent(client, cluster)
    got = ddf[ddf.fare > 90][["fare", "pickup_zone"]].compute()
    moved = sent(client, cluster) - before
    want = whole[whole.fare > 90][["fare", "pickup_zone"]]
    pd.testing.assert_frame_equal(got, want)
    assert np.array_equal(got.index.to_numpy(), np.flatnonzero(np.nan_to_num(table.column("fare").to_numpy()) > 90))
    two_columns = table.column("fare").nbytes + table.column("pickup_zone").nbytes
    assert moved < 0.25 * two_columns


def test_a_view_filtered_before_to_dask_reads_only_its_rows(trips, cluster):
    table, client, _ddf, whole = trips
    ds = client.open("dask-trips").filter(pc.field("fare") > 90)  # Arrow's comparison (SQL text would keep NaN)
    before = sent(client, cluster)
    got = ds.to_dask().compute()
    moved = sent(client, cluster) - before
    want = whole[whole.fare > 90].reset_index(drop=True)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want)
    assert moved < 0.25 * table.nbytes


def test_a_pandas_frame_read_by_dask_is_the_frame_that_was_put(cluster, dask_client):
    """A column with a null somewhere was cast, in every block, to the dtype pandas gives a column of nulls alone
    without the frame's pandas metadata: a categorical with a null came back as all NaN (no categories), ``Int64``,
    ``UInt8`` and ``Float64`` as float64, ``boolean`` as text. Only NumPy integers (float64 with a null) and bools
    (object) change with nulls, as pandas changes them. A RangeIndex with a start, a step and a name came back as
    the row positions, unnamed."""
    frame = pd.DataFrame({
        "k": [1, 2, 3, 4, 5, 6],
        "c": pd.Categorical(["a", None, "b", "a", "b", "a"], categories=["b", "a", "unused"], ordered=True),
        "i": pd.array([1, None, 3, 4, 5, 6], "Int64"), "u": pd.array([1, 2, None, 4, 5, 6], "UInt8"),
        "f": pd.array([1.5, None, 3.5, 4.5, 5.5, 6.5], "Float64"),
        "b": pd.array([True, None, False, True, True, False], "boolean"),
        "n": [1, 2, 3, 4, None, 6],  # a NumPy integer with a null: float64, in the blocks without one too
    }, index=pd.RangeIndex(100, 112, 2, name="r"))
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ddf = client.put("dask-frame", frame, tiling=(3, 1)).to_dask()
        got = ddf.compute()
        pd.testing.assert_frame_equal(got, frame)
        assert ddf.divisions == (100, 104, 108, 110)
        kept = ddf[ddf.k > 3].compute()
        pd.testing.assert_frame_equal(kept, frame[frame.k > 3])
        # where the stored range no longer spans the rows read, the index is what to_pandas() gives: positions
        ds = client.open("dask-frame")
        for view in (ds[1:4], ds.filter("k > 2")):
            pd.testing.assert_frame_equal(view.to_dask().compute(), view.to_pandas(), check_dtype=False)
        grown = client.append("dask-frame", frame.iloc[:2])
        assert list(grown.to_dask().compute().index) == list(grown.to_pandas().index) == list(range(8))
