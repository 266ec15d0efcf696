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
