"""A frame of no rows reads back as the frame that was put: its categories too, through a reader on another host
and a local map.

A table of no rows gives no record batch (``to_batches()``, a stream of the table), so the put stored no dictionary
and the node streamed none: an empty pandas categorical came back with no categories, an empty Polars Enum read into
pandas too. One batch of no rows now carries the dictionary both ways.
"""

from __future__ import annotations

import pandas as pd
import polars as pl
import pyarrow as pa

import flightpart as fp


def test_an_empty_categorical_keeps_its_categories_remote_and_local(cluster):
    frame = pd.DataFrame({"k": pd.Series([], dtype="int64"),
                          "c": pd.Categorical([], categories=["a", "b"], ordered=True)})
    enum = pl.DataFrame({"e": pl.Series([], dtype=pl.Enum(["x", "y"]))})
    want = pa.Table.from_pandas(frame).to_pandas()  # what pandas and pyarrow give without flightpart
    with fp.connect(cluster.uri) as writer:
        writer.put("empty-categorical", frame, tiling=(2, 1))
        writer.put("empty-enum", enum)
    for host in ("127.0.0.9", "127.0.0.2"):  # another host (streamed), a node's own host (mapped)
        with fp.connect(cluster.uri, host=host) as client:
            got = client.open("empty-categorical").to_pandas()
            pd.testing.assert_frame_equal(got, want)
            assert list(got["c"].cat.categories) == ["a", "b"] and got["c"].cat.ordered
            shown = client.open("empty-enum").to_pandas()["e"]
            assert list(shown.cat.categories) == ["x", "y"], host
            assert client.open("empty-enum").to_polars().schema == enum.schema
            # DuckDB's and Polars' way in
            streamed = client.open("empty-categorical").to_reader().read_all().to_pandas()
            assert list(streamed["c"].cat.categories) == ["a", "b"], host


def test_nested_categories_of_no_rows_survive_a_put(cluster):
    """A list of categories (a dictionary inside a list) is a dictionary too: it had lost its categories."""
    listed = pa.table({"tags": pa.array([], pa.list_(pa.dictionary(pa.int32(), pa.string())))})
    words = pa.array(["red", "blue"]).dictionary_encode()
    listed = pa.Table.from_arrays([pa.ListArray.from_arrays(pa.array([0], pa.int32()), words).slice(0, 0)],
                                  schema=listed.schema)
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        client.put("empty-tags", listed)
        got = client.open("empty-tags").to_arrow().column("tags")
        assert got.num_chunks and got.chunk(0).values.dictionary.to_pylist() == ["red", "blue"]
