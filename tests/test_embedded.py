"""fp.connect() with no address: a node and catalog in this process."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import flightpart as fp


@pytest.fixture(scope="module")
def client():
    with fp.connect() as c:
        yield c


def test_pandas_round_trip_keeps_index_and_dtypes(client):
    df = pd.DataFrame({"a": np.arange(50, dtype=np.int32), "b": np.linspace(0, 1, 50),
                       "c": [f"s{k}" for k in range(50)]},
                      index=pd.Index([f"k{k}" for k in range(50)], name="key"))
    ds = client.put("frame", df, tiling=(3, 2))
    assert ds.shape == (50, 3) and ds.partition_tiling == (3, 2)
    pd.testing.assert_frame_equal(ds.to_pandas(), df)
    pd.testing.assert_frame_equal(ds.select(["c"]).to_pandas(), df[["c"]])


def test_polars_and_pyarrow_inputs(client):
    pdf = pl.DataFrame({"x": [1, 2, 3, 4], "y": ["a", "b", "c", None]})
    assert client.put("pl", pdf, tiling=(2, 1)).to_polars().equals(pdf)
    table = pa.table({"z": [1.5, 2.5]})
    assert client.put("pa", table).to_arrow().equals(table)


def test_same_process_get_returns_the_stored_table(client):
    table = pa.table({"v": np.arange(1000)})
    ds = client.put("same", table, tiling=(2, 1))
    d = fp.validate(ds, require_pickle=True)
    parts = d["get"]([p["data"] for p in d["partitions"].values()])
    assert [p.num_rows for p in parts] == [500, 500]
    node_uri = d["partitions"][(0, 0)]["data"].replicas[0][0]
    assert client.stats(node_uri).values["bytes_sent"] == 0


def test_partitioned_dict_is_small_when_pickled(client):
    ds = client.put("many", pa.table({"v": np.arange(2000)}), tiling=(200, 1))
    size = len(pickle.dumps(ds.__partitioned__))
    assert size / 200 < 300


def test_from_partitioned_reads_a_dataset(client):
    table = pa.table({"a": [1, 2, 3, 4, 5]})
    ds = client.put("generic", table, tiling=(2, 1))
    assert fp.from_partitioned(ds).equals(table)
    assert fp.from_partitioned(ds, columns=["a"]).equals(table)


def test_list_and_nodes(client):
    client.put("listed", pa.table({"a": [1]}))
    names = {d.name for d in client.list()}
    assert "listed" in names
    (node,) = client.nodes()
    assert node.alive and node.ip == "127.0.0.1"


def test_empty_slices_and_bad_slices(client):
    ds = client.put("sliced", pa.table({"a": list(range(10))}), tiling=(3, 1))
    assert ds[3:3].to_arrow().num_rows == 0
    assert ds[-3:].to_arrow().column("a").to_pylist() == [7, 8, 9]
    assert ds[2:8][1:3].to_arrow().column("a").to_pylist() == [3, 4]
    with pytest.raises(TypeError, match="step 1"):
        ds[::2]
    with pytest.raises(KeyError, match="has no column 'nope'"):
        ds.select(["nope"])


def test_selected_column_order_survives_slicing_across_column_groups(client):
    table = pa.table({"a": np.arange(10), "b": np.arange(10) * 2, "c": np.arange(10) * 3, "d": np.arange(10) * 4})
    ds = client.put("ordered", table, tiling=(2, 2))
    view = ds.select(["d", "a"])
    assert view.to_arrow().column_names == ["d", "a"]
    assert view[2:5].to_arrow().equals(table.select(["d", "a"]).slice(2, 3))
    assert view[2:5][1:2].to_pandas().columns.tolist() == ["d", "a"]
