"""A Dataset as an Arrow stream: DuckDB, Polars and pyarrow read it directly, with memory bounded by a window.

The memory tests run the reader or writer in a subprocess and compare its
peak resident memory (VmHWM) with the size of the data it moved.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tqdm import tqdm

import flightpart as fp

from helpers import MemoryCap

MB = 1 << 20


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster(3)


def sales(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"order": np.arange(rows), "store": pa.array([f"s{k}" for k in rng.integers(0, 40, rows)]),
                     "amount": rng.random(rows) * 100, "units": rng.integers(1, 9, rows)})


def test_duckdb_polars_and_pyarrow_read_a_dataset_directly(cluster):
    table = sales(60_000, 1)
    with fp.connect(cluster.uri, host=cluster.ips[0]) as client:  # one node's partitions are local, the rest streamed
        ds = client.put("sales", table, tiling=(6, 2))
        whole = ds.to_arrow()
        assert whole.equals(table)
        assert pa.table(ds).equals(whole)
        assert pa.RecordBatchReader.from_stream(ds).read_all().equals(whole)
        assert pa.Table.from_batches(list(ds.to_batches())).equals(whole)
        assert pl.DataFrame(ds).equals(pl.from_arrow(whole))
        assert (duckdb.sql("select count(*), sum(units) from ds").fetchall()
                == [(60_000, pa.compute.sum(table["units"]).as_py())])
        got = duckdb.sql("select store, sum(amount) as total from ds group by store order by store").to_arrow_table()
        want = duckdb.sql("select store, sum(amount) as total from whole group by "
                          "store order by store").to_arrow_table()
        assert got.column("store").equals(want.column("store"))
        assert np.allclose(got.column("total").to_numpy(), want.column("total").to_numpy())
        view = ds.select(["units", "order"])[1000:50_000]
        assert pa.table(view).equals(view.to_arrow())
        assert pa.table(view).column_names == ["units", "order"]


def test_a_stream_put_cuts_partitions_as_it_reads(cluster):
    table = sales(50_000, 2)
    with fp.connect(cluster.uri) as client:
        ds = client.put("streamed", table.to_reader(max_chunksize=7_000), rows_per_partition=12_000)
        assert ds.partition_tiling == (5, 1) and ds.to_arrow().equals(table)
        source = table  # noqa: F841  (DuckDB finds it by name)
        relation = duckdb.sql("select * from source where units > 4")
        filtered = client.put("from-duckdb", relation)
        assert filtered.to_arrow().sort_by("order").equals(relation.to_arrow_table().sort_by("order"))
        frame = pl.from_arrow(table)
        stored = client.put("from-polars", frame)  # a frame: cut by tiling
        assert stored.partition_tiling == (3, 1) and pl.DataFrame(stored).equals(frame)
        empty = client.put("empty", pa.RecordBatchReader.from_batches(table.schema, []))
        assert empty.shape == (0, 4) and empty.to_arrow().num_rows == 0
        with pytest.raises(ValueError, match="rows_per_partition"):
            client.put("bad", table.to_reader(), tiling=(2, 1))


def test_a_frame_put_with_rows_per_partition_is_cut_as_a_stream_would_be(cluster):
    table = sales(50_000, 2)
    with fp.connect(cluster.uri) as client:
        for frame in (table, table.to_pandas(), pl.from_arrow(table)):
            ds = client.put("frame-rows", frame, rows_per_partition=12_000)
            blocks = [p["shape"][0] for p in sorted(ds.__partitioned__["partitions"].values(),
                                                    key=lambda p: p["start"][0])]
            assert blocks == [12_000] * 4 + [2_000], blocks
            assert ds.to_arrow().cast(table.schema).equals(table)  # pandas: large_string
        appended = client.append("frame-rows", table.slice(0, 25_000), rows_per_partition=10_000)
        assert appended.shape == (75_000, 4) and appended.partition_tiling == (5 + 3, 1)
        assert client.put("frame-rows", table.slice(0, 0), rows_per_partition=10).shape == (0, 4)
        with pytest.raises(ValueError, match="pass one of them"):
            client.put("frame-rows", table, tiling=(2, 1), rows_per_partition=100)
        with pytest.raises(ValueError, match="positive integer"):
            client.put("frame-rows", table, rows_per_partition=0)


def test_puts_and_reads_report_their_bytes_as_they_move_to_a_function_or_a_tqdm_bar(cluster):
    table = sales(1_000_000, 6)
    sent: list[tuple[int, int]] = []
    with fp.connect(cluster.uri, host="127.0.0.99") as client:  # every partition remote
        ds = client.put("progressed", table, tiling=(4, 1), progress=lambda done, total: sent.append((done, total)))
        assert len(sent) >= 16, sent  # batch by batch (about 1 MiB each), not one jump per partition
        assert [d for d, _ in sent] == sorted(d for d, _ in sent) and sent[-1][0] == sent[-1][1] >= table.nbytes * 0.9
        read: list[tuple[int, int]] = []
        assert ds.to_arrow(progress=lambda done, total: read.append((done, total))).equals(table)
        assert read[-1] == (ds.nbytes, ds.nbytes) and len(read) == 4
        with tqdm(unit="B", file=io.StringIO()) as bar:
            batches = list(ds.filter("units > 0").to_batches(window=1 * MB, progress=bar))
            assert pa.Table.from_batches(batches).equals(table)
            assert bar.n >= table.nbytes * 0.9 and bar.total is None  # a filtered view's total is not known
        with tqdm(unit="B", file=io.StringIO()) as bar:
            assert pa.Table.from_batches(list(ds.to_batches(window=1 * MB, progress=bar))).equals(table)
            assert bar.n == bar.total == ds.nbytes
        with pytest.raises(TypeError, match="tqdm"):
            ds.to_arrow(progress="yes")


PEAK = """
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
"""

READ = PEAK + """
import json, sys
import duckdb
import flightpart as fp

uri, how = sys.argv[1], sys.argv[2]
name = sys.argv[3] if len(sys.argv) > 3 else "big"
window = {"window": int(sys.argv[4])} if len(sys.argv) > 4 else {}
with fp.connect(uri, host="127.0.0.99") as client:
    ds = client.open(name)
    before = peak_mb()
    if how == "batches":
        rows = sum(b.num_rows for b in ds.to_batches(**window))
    elif how == "duckdb":
        rows = duckdb.sql("select count(*) from ds").fetchall()[0][0]
    else:
        rows = ds.to_arrow().num_rows
print(json.dumps({"rows": rows, "growth_mb": peak_mb() - before}))
"""

PUT = PEAK + """
import json, sys
import pyarrow.dataset as pds
import flightpart as fp

uri, folder = sys.argv[1], sys.argv[2]
with fp.connect(uri) as client:
    before = peak_mb()
    ds = client.put("from-parquet", pds.dataset(folder), rows_per_partition=500_000)
    print(json.dumps({"tiling": list(ds.partition_tiling), "growth_mb": peak_mb() - before}))
"""


def run(script: str, *args: str, cap: MemoryCap | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600,
                          preexec_fn=cap.preexec if cap is not None else None)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode} (a memory cap?)"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def big(cluster) -> int:
    """A dataset of about 915 MB on three nodes; returns its size in bytes."""
    rows = 30_000_000  # 4 float/int columns
    rng = np.random.default_rng(3)
    table = pa.table({"a": np.arange(rows), "b": rng.random(rows), "c": rng.random(rows), "d": np.arange(rows) % 97})
    with fp.connect(cluster.uri) as client:
        client.put("big", table, tiling=(60, 1))
    return table.nbytes


@pytest.mark.slow
def test_reading_a_dataset_larger_than_the_window_keeps_memory_flat(cluster, big):
    rows = 30_000_000
    size_mb = big / MB
    streamed = run(READ, cluster.uri, "batches")
    queried = run(READ, cluster.uri, "duckdb")
    materialized = run(READ, cluster.uri, "to_arrow")
    assert streamed["rows"] == queried["rows"] == materialized["rows"] == rows
    assert materialized["growth_mb"] > 0.9 * size_mb  # the contrast: to_arrow holds everything
    assert streamed["growth_mb"] < size_mb / 5, streamed  # a few row blocks in flight, whatever the dataset's size
    assert queried["growth_mb"] < size_mb / 2.5, queried  # DuckDB adds its own buffers to the window


@pytest.mark.slow
def test_partitions_larger_than_the_window_are_read_in_row_ranges_that_fit_it(cluster):
    """Two partitions of 192 MB: the reader holds the window (bytes), not whole partitions ahead of the consumer."""
    rows = 12_000_000
    rng = np.random.default_rng(5)
    table = pa.table({"a": np.arange(rows), "b": rng.random(rows), "c": rng.random(rows), "d": np.arange(rows) % 97})
    partition_mb = table.nbytes / 2 / MB
    with fp.connect(cluster.uri) as client:
        client.put("two-big", table, tiling=(2, 1))
    del table
    window = 32 * MB
    tight = run(READ, cluster.uri, "batches", "two-big", str(window))
    default = run(READ, cluster.uri, "batches", "two-big")
    queried = run(READ, cluster.uri, "duckdb", "two-big")
    assert tight["rows"] == default["rows"] == queried["rows"] == rows
    # the window, the range being consumed (a quarter of it), and the process's own buffers: far below a partition
    assert tight["growth_mb"] < window / MB + 8 + 64 < partition_mb / 1.5, tight
    assert default["growth_mb"] < 128 + 32 + 64 < partition_mb * 1.3, default
    assert queried["growth_mb"] < 128 + 32 + 128, queried  # DuckDB adds its own buffers


@pytest.mark.slow
@pytest.mark.parametrize("how, cap_mb", [("batches", 300), ("duckdb", 400)])
def test_a_reader_capped_well_below_the_dataset_reads_it_all(cluster, big, how, cap_mb):
    """The kernel enforces the cap (a memory cgroup): a reader over it is killed, as to_arrow() is."""
    cap = MemoryCap(cap_mb * MB)
    if cap.unavailable:
        pytest.skip(cap.unavailable)
    try:
        assert big > 2.2 * cap.limit
        proc = subprocess.run([sys.executable, "-c", READ, cluster.uri, how], capture_output=True, text=True,
                              timeout=600, preexec_fn=cap.preexec)
        assert proc.returncode == 0, (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                                      else proc.stderr[-2000:])
        assert json.loads(proc.stdout.strip().splitlines()[-1])["rows"] == 30_000_000
        whole = subprocess.run([sys.executable, "-c", READ, cluster.uri, "to_arrow"], capture_output=True, text=True,
                               timeout=600, preexec_fn=cap.preexec)
        assert whole.returncode == -9  # the same cap stops a reader that holds everything
    finally:
        cap.remove()


@pytest.mark.slow
def test_putting_parquet_larger_than_the_window_keeps_memory_flat(cluster, tmp_path):
    rows = 24_000_000  # about 730 MB of columns
    rng = np.random.default_rng(4)
    folder = tmp_path / "parquet"
    folder.mkdir()
    for k in range(4):  # four files, about 180 MB of columns each
        n = rows // 4
        part = pa.table({"a": np.arange(k * n, (k + 1) * n), "b": rng.random(n), "c": rng.random(n),
                         "d": rng.integers(0, 9, n)})
        pq.write_table(part, folder / f"part-{k}.parquet", row_group_size=250_000)
    size_mb = rows * 32 / MB
    cap = MemoryCap(300 * MB)  # the writer's memory, enforced by the kernel where a memory cgroup can be made
    try:
        result = run(PUT, cluster.uri, str(folder), cap=None if cap.unavailable else cap)
    finally:
        cap.remove()
    assert result["tiling"] == [48, 1]
    # the Parquet reader's own buffers and a few partitions in flight
    assert result["growth_mb"] < size_mb / 2.5, result
    with fp.connect(cluster.uri) as client:
        back = client.open("from-parquet")
        assert back.shape == (rows, 4)
        expected = pq.read_table(folder)
        assert back.to_arrow().equals(expected)  # in file order: the stream keeps the order it read
