"""A dense union whose rows share their values (valid Arrow: offsets may repeat) is put, read and filtered like any
column, by real node processes and a reader on another host.

Arrow's ``nbytes`` of such a column counts a value once for each row pointing at it (2 GB for 300,000 rows sharing
300 strings of 1 KB), and read past a buffer on a batch a put had sent compressed: the node receiving it was killed
with SIGSEGV. Every size of a user's or a peer's rows is now taken by ``frames.size_of``, every empty table made by
``frames.empty_table`` (Arrow makes no empty dense union); and a dense union's slices
and filtered rows carry its children whole, so its streams are not bounded by the stored bytes
(``frames.sent_unlike_stored``), where an honest node's filter would have been refused as sending too much.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightpart as fp

ROWS = 300_000
READER = "127.0.0.99"


def shared_values_table() -> pa.Table:
    """``k`` and a dense union ``u`` whose every thousand rows point at one of 300 strings of 1 KB."""
    values = pa.array([f"{k:04d}" + "y" * 1020 for k in range(ROWS // 1000)])
    union = pa.UnionArray.from_dense(pa.array(np.zeros(ROWS, np.int8)),
                                     pa.array((np.arange(ROWS) // 1000).astype(np.int32)), [values])
    return pa.table({"k": np.arange(ROWS), "u": union})


@pytest.fixture(scope="module")
def cluster(make_cluster):
    cluster = make_cluster(2, process=True)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_dense_union_of_shared_values_is_put_read_and_filtered_without_killing_a_node(cluster):
    table = shared_values_table()
    want = table.column("u").combine_chunks()
    with fp.connect(cluster.uri, host=READER) as client:  # every read streams; a remote link may be compressed
        ds = client.put("shared_union", table, tiling=(2, 1))
        got = client.open("shared_union").to_arrow()
        assert got.column("k").to_pylist() == table.column("k").to_pylist()
        assert got.column("u").combine_chunks().equals(want)
        kept = ds.filter((pc.field("k") < 5000) | (pc.field("k") >= 200_000)).to_arrow()  # a node's filtered rows
        rows = [*range(5000), *range(200_000, ROWS)]                                          # carry the children whole
        assert kept.column("k").to_pylist() == rows
        assert kept.column("u").combine_chunks().equals(want.take(pa.array(rows)))
        ranged = ds[1000:250_000].to_arrow()
        assert ranged.column("u").combine_chunks().equals(want.slice(1000, 249_000))
        first = ds.top(3, [("k", "descending")])
        assert first.column("k").to_pylist() == [ROWS - 1, ROWS - 2, ROWS - 3]
        # Arrow makes no empty dense union (Schema.empty_table): a repartition had failed as INTERNAL, an aggregate
        # of another column, a filter keeping no row too
        assert ds.aggregate([("k", "sum")]).column("k_sum").to_pylist() == [ROWS * (ROWS - 1) // 2]
        assert ds.filter(pc.field("k") < 0).to_arrow().num_rows == 0
        for tiling in ((3, 1), (2, 2)):  # two column groups: the columns each stores are found without an empty table
            moved = client.repartition("shared_union", tiling)
            assert moved.partition_tiling == tiling
            assert moved.to_arrow().column("u").combine_chunks().equals(want)
    assert all(node.proc.poll() is None for node in cluster.nodes), "a node died"
