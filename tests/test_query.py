"""Filters, pruning, aggregates and lazy Polars against three real nodes: only what a query needs moves.

The client plays a host of its own (127.0.0.9), so every partition it
reads is streamed and counted by the node that sends it.
"""

from __future__ import annotations

import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import flightpart as fp

F = pc.field
ROWS = 90_000


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster(3)


@pytest.fixture(scope="module")
def sales(cluster):
    rng = np.random.default_rng(11)
    table = pa.table({"order": np.arange(ROWS), "store": pa.array([f"s{k}" for k in rng.integers(0, 5, ROWS)]),
                      "amount": rng.random(ROWS) * 100, "units": rng.integers(1, 9, ROWS)})
    with fp.connect(cluster.uri) as client:
        client.put("sales", table, tiling=(9, 1))  # row block i holds orders [10,000 i, 10,000 (i + 1))
    return table


def counters(cluster) -> dict[str, int]:
    with fp.connect(cluster.uri) as client:
        per_node = [client.stats(n.uri).values for n in cluster.nodes]
    return {k: sum(s[k] for s in per_node) for k in ("rows_sent", "bytes_sent", "partitions_served")}


def moved(cluster, before: dict[str, int]) -> dict[str, int]:
    after = counters(cluster)
    return {k: after[k] - before[k] for k in after}


def test_a_filtered_read_moves_only_the_matching_rows(cluster, sales):
    expr = (F("order") >= 20_000) & (F("order") < 30_000) & (F("units") > 4)
    want = sales.filter(expr)
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales").filter(expr)
        before = counters(cluster)
        got = ds.to_arrow()
        delta = moved(cluster, before)
    assert got.equals(want)
    assert delta["rows_sent"] == want.num_rows  # not one row more than the answer
    assert delta["partitions_served"] == 1  # the statistics ruled out the eight other row blocks


def test_every_reader_gets_the_same_filtered_rows(cluster, sales):
    expr = (F("amount") > 70) & (F("store") != "s3")
    want = sales.filter(expr)
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales").filter(expr)
        assert pa.table(ds).equals(want)
        assert pa.Table.from_batches(list(ds.to_batches()), want.schema).equals(want)
        assert pl.DataFrame(ds).equals(pl.from_arrow(want))
        assert (duckdb.sql("select count(*), sum(units) from ds").fetchall()
                == [(want.num_rows, pc.sum(want["units"]).as_py())])
        assert ds.to_duckdb().aggregate("count(*)").fetchall() == [(want.num_rows,)]
        assert ds.to_pandas().equals(want.to_pandas())
        assert fp.from_partitioned(ds).equals(want)  # __partitioned__ of a filtered view: shapes counted on the nodes
        assert ds.shape == (want.num_rows, 4) and ds.count_rows() == want.num_rows


def test_a_filter_no_partition_can_match_opens_no_stream(cluster, sales):
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales")
        before = counters(cluster)
        empty = ds.filter(F("order") > 10**9)
        assert empty.to_arrow().num_rows == 0 and empty.to_arrow().schema.equals(sales.schema)
        assert empty.count_rows() == 0 and list(empty.to_batches()) == []
        assert ds.count_rows(F("order") < 30_000) == 30_000  # three row blocks match entirely: the statistics say so
        assert moved(cluster, before)["partitions_served"] == 0
        assert ds.count_rows("order < 35000 and units > 100") == 0


def test_filters_compose_with_select_and_row_slices(cluster, sales):
    expr = F("amount") < 10
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales")
        matching = sales.filter(expr)
        assert ds.filter(expr)[100:2_000].to_arrow().equals(matching[100:2_000])
        assert ds.filter(expr)[100:2_000][10:20].to_arrow().equals(matching[110:120])
        assert ds[15_000:50_000].filter(expr).to_arrow().equals(sales[15_000:50_000].filter(expr))
        assert ds.select(["units", "order"]).filter(expr).to_arrow().equals(matching.select(["units", "order"]))
        assert ds.filter(expr).filter(F("units") == 3).to_arrow().equals(matching.filter(F("units") == 3))
        assert ds.filter("store in ('s1', 's2') and amount >= 99").to_arrow().equals(
            sales.filter(F("store").isin(["s1", "s2"]) & (F("amount") >= 99)))
        assert ds.filter(expr).head(7).equals(matching[:7])
        with pytest.raises(fp.PartitionedError, match="filter first"):
            ds.filter(expr)[0:10].filter(F("units") == 1)


def test_local_partitions_are_filtered_on_their_map(cluster, sales):
    expr = F("units") == 8
    local = cluster.nodes[0]
    with fp.connect(cluster.uri, host=cluster.ips[0]) as client:  # the first node's address
        ds = client.open("sales").filter(expr)
        served = {n.uri: client.stats(n.uri).values["partitions_served"] for n in cluster.nodes}
        assert ds.to_arrow().equals(sales.filter(expr))
        after = {n.uri: client.stats(n.uri).values["partitions_served"] for n in cluster.nodes}
    assert after[local.uri] == served[local.uri]  # its partitions never crossed a socket
    assert sum(after.values()) > sum(served.values())


def test_aggregates_are_computed_next_to_the_data(cluster, sales):
    pairs = [("amount", "sum"), ("amount", "mean"), ("units", "max"), ("order", "count"), ("", "count_all")]
    arrow_pairs = [([], "count_all") if f == "count_all" else (c, f) for c, f in pairs]
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales")
        before = counters(cluster)
        got = ds.aggregate(pairs, by="store").sort_by("store")
        delta = moved(cluster, before)
        want = sales.group_by("store").aggregate(arrow_pairs).sort_by("store")
        filtered = ds.filter(F("units") > 6).aggregate([("amount", "sum")])
    assert got.column_names == want.column_names
    for name in want.column_names:
        a, b = got.column(name).to_pylist(), want.column(name).to_pylist()
        assert a == b or np.allclose(a, b), name
    assert delta["rows_sent"] <= 9 * 5  # a partial row per store and row block, not the data
    assert np.isclose(filtered.column("amount_sum")[0].as_py(), pc.sum(sales.filter(F("units") > 6)["amount"]).as_py())


def test_polars_lazy_pushes_projection_predicate_and_limit(cluster, sales):
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        lf = client.open("sales").to_polars(lazy=True)
        before = counters(cluster)
        got = lf.filter((pl.col("amount") > 90) & (pl.col("units") < 3)).select(["order", "amount"]).collect()
        delta = moved(cluster, before)
        want = pl.from_arrow(sales).filter((pl.col("amount") > 90) & (pl.col("units") < 3)).select(["order", "amount"])
        assert got.equals(want)
        assert delta["rows_sent"] == want.height  # the predicate ran on the nodes
        # order, amount and units (the predicate's): no store
        assert delta["bytes_sent"] <= want.height * (8 + 8 + 8) + 4096
        # what does not translate (a string function) is applied by Polars: same answer
        odd = lf.filter(pl.col("store").str.ends_with("4") & (pl.col("order") < 5_000)).collect()
        assert odd.equals(pl.from_arrow(sales).filter(pl.col("store").str.ends_with("4") & (pl.col("order") < 5_000)))
        before = counters(cluster)
        assert lf.head(5).collect().equals(pl.from_arrow(sales[:5]))
        assert moved(cluster, before)["partitions_served"] <= 2
        assert lf.group_by("store").agg(pl.col("units").sum()).sort("store").collect().equals(
            pl.from_arrow(sales).group_by("store").agg(pl.col("units").sum()).sort("store"))


def test_a_filter_across_column_groups_is_applied_after_reading(cluster):
    table = pa.table({"a": np.arange(20_000), "b": np.arange(20_000) % 7, "c": np.arange(20_000) * 0.5,
                      "d": np.arange(20_000) % 3})
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("wide", table, tiling=(4, 2))  # groups (a, b) and (c, d)
        expr = (F("d") == 1) & (F("a") > 100)
        want = table.filter(expr)
        assert ds.filter(expr).to_arrow().equals(want)
        assert ds.select(["a"]).filter(F("d") == 2).to_arrow().equals(table.filter(F("d") == 2).select(["a"]))
        assert ds.filter(expr).count_rows() == want.num_rows
        assert ds.filter(expr).aggregate([("b", "sum")]).column(0)[0].as_py() == pc.sum(want["b"]).as_py()
        assert ds.select(["c", "d"]).filter(F("d") == 1).to_arrow().equals(table.filter(F("d") == 1).select(["c", "d"]))
        with pytest.raises(fp.PartitionedError, match="column group"):
            _ = ds.filter(expr).__partitioned__


def test_a_plain_flight_client_still_reads_unfiltered_tickets(cluster, sales):
    import pyarrow.flight as flight

    info = flight.connect(cluster.uri).get_flight_info(flight.FlightDescriptor.for_path("sales"))
    endpoint = info.endpoints[3]
    table = flight.connect(endpoint.locations[0].uri.decode()).do_get(endpoint.ticket).read_all()
    assert table.equals(sales[30_000:40_000])


def test_cli_get_streams_columns_and_rows_to_stdout(cluster, sales, tmp_path):
    cmd = [sys.executable, "-m", "flightpart", "get", "sales", "--catalog", cluster.uri, "--client-host", "127.0.0.9"]
    out = subprocess.run(cmd + ["--columns", "order,amount", "--where", "units = 2 and amount > 50", "--limit", "100",
                                "-o", "-"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    got = ipc.open_stream(pa.py_buffer(out.stdout)).read_all()
    want = sales.filter((F("units") == 2) & (F("amount") > 50)).select(["order", "amount"])[:100]
    assert got.equals(want)
    parquet = subprocess.run(cmd + ["--where", "store = 's0'", "-o", "-", "--format", "parquet"], capture_output=True,
                             timeout=120)
    assert parquet.returncode == 0, parquet.stderr.decode()[-2000:]
    assert pq.read_table(pa.BufferReader(parquet.stdout)).equals(sales.filter(F("store") == "s0"))
    csv_file = tmp_path / "s.csv"
    assert subprocess.run(cmd + ["--limit", "10", "-o", str(csv_file)], capture_output=True,
                          timeout=120).returncode == 0
    assert csv_file.read_text().count("\n") == 11
    before = counters(cluster)
    for bad, message in [(["-o", str(tmp_path / "x.xlsx")], "unknown format"),
                         (["-o", str(tmp_path / "no" / "x.csv")], "does not exist"),
                         (["-o", "-", "--where", "units >"], "not a SQL expression"),
                         (["-o", "-", "--columns", "nope"], "nope")]:
        proc = subprocess.run(cmd + bad, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert moved(cluster, before)["partitions_served"] == 0  # refused before reading anything
    assert not list(tmp_path.glob(".*part"))


def test_a_node_refuses_lying_query_tickets_with_a_code_and_keeps_serving(cluster, sales):
    import base64
    import json

    import pyarrow.flight as flight

    from flightpart.query import filters

    from helpers import code_of

    info = flight.connect(cluster.uri).get_flight_info(flight.FlightDescriptor.for_path("sales"))
    endpoint = info.endpoints[0]
    node = flight.connect(endpoint.locations[0].uri.decode())
    base = json.loads(endpoint.ticket.ticket)
    good = filters.Filter.compile(F("units") > 4, sales.schema).substrait
    wrong_type = filters.Filter.compile(F("units") == "4", pa.schema([("units", pa.string())])).substrait
    lies = [
        {"filter": base64.b64encode(b"\x0a\xff\xff\xff\xff\x0f" + good).decode()},  # damaged Substrait
        {"filter": base64.b64encode(good[: len(good) // 2]).decode()},
        {"filter": base64.b64encode(wrong_type).decode()},  # bound to a type the column does not have
        {"filter": base64.b64encode(filters.Filter.compile(F("x") > 1,
                                                           pa.schema([("x", pa.int64())])).substrait).decode()},
        {"aggregate": {"functions": [["nope", "sum"]]}},
        {"aggregate": {"functions": [["store", "mean"]]}},  # the mean of text
        {"filter": base64.b64encode(good).decode(), "matched": [10, 5]},
    ]
    for lie in lies:
        with pytest.raises(flight.FlightError) as raised:
            node.do_get(flight.Ticket(json.dumps({**base, **lie}).encode())).read_all()
        assert code_of(raised.value) == "INVALID_REQUEST", lie
    assert node.do_get(endpoint.ticket).read_all().equals(sales[:10_000])  # the node still serves


def test_a_partition_whose_statistics_were_lost_or_damaged_is_still_committed_and_filtered_right(cluster, sales):
    from flightpart import wire
    from flightpart.io.layout import STATS_SUFFIX

    from helpers import put_raw

    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        nodes = {n.uri: n.node_id for n in client.nodes() if n.alive}
        version = client.call(wire.Begin("unsure")).version
        parts = []
        for k, uri in enumerate(sorted(nodes)):
            put_raw(uri, ["unsure", str(version), str(k), "0"], sales.slice(k * 30_000, 30_000))
            parts.append(wire.CommitPart((k, 0), (k * 30_000, 0), (30_000, 4), (nodes[uri],)))
        sidecars = sorted(p for p in cluster.root.rglob(f"unsure/*/*{STATS_SUFFIX}"))
        assert len(sidecars) == 3
        sidecars[0].write_text('{"rows": 999, "columns": {"order": {"nulls": 0, "min": ')  # cut short by a crash
        sidecars[1].unlink()  # lost
        client.call(wire.Commit("unsure", version, sales.schema, (90_000, 4), (3, 1), tuple(parts)))
        ds = client.open("unsure")
        assert ds.to_arrow().equals(sales)  # rows came from the files, not from the damaged statistics
        expr = (F("order") > 1_000) & (F("order") < 89_000) & (F("units") == 5)
        assert ds.filter(expr).to_arrow().equals(sales.filter(expr))
        assert ds.count_rows(F("order") >= 60_000) == 30_000


def test_pandas_reads_a_dataset_through_from_arrow(cluster, sales):
    import pandas as pd

    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales")
        assert pd.DataFrame.from_arrow(ds).equals(sales.to_pandas())
        assert pd.DataFrame.from_arrow(ds.filter("units = 1")).equals(sales.filter(F("units") == 1).to_pandas())


def test_a_get_killed_mid_write_leaves_no_file_under_the_output_name(cluster, tmp_path):
    import os
    import signal
    import time

    rows = 6_000_000
    big = pa.table({"a": np.arange(rows), "b": np.arange(rows) * 0.5})
    with fp.connect(cluster.uri) as client:
        client.put("tokill", big, tiling=(30, 1))
    out = tmp_path / "copy.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "flightpart", "get", "tokill", "--catalog", cluster.uri,
                             "--client-host", "127.0.0.9", "-o", str(out)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > 0 for p in tmp_path.glob(".copy.parquet.*.part")):
        assert proc.poll() is None and time.monotonic() < deadline, "the get finished before it could be killed"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # a reader of copy.parquet never sees half of it


def test_head_and_get_limit_move_only_the_rows_they_show(cluster, sales):
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("sales")
        before = counters(cluster)
        assert ds.head(5).equals(sales[:5])
        assert moved(cluster, before)["rows_sent"] == 5  # not the 10,000 rows of the first row block
        filtered = ds.filter("units = 3")
        before = counters(cluster)
        assert filtered.head(4).equals(sales.filter(F("units") == 3)[:4])
        assert moved(cluster, before)["rows_sent"] <= 4 * 9  # at most the rows asked of each row block
        with pytest.raises(TypeError, match=r"ds.select\(\['amount'\]\)"):
            ds["amount"]
    before = counters(cluster)
    out = subprocess.run([sys.executable, "-m", "flightpart", "get", "sales", "--catalog", cluster.uri, "--client-host",
                          "127.0.0.9", "--limit", "3", "-o", "-"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert ipc.open_stream(pa.py_buffer(out.stdout)).read_all().equals(sales[:3])
    assert moved(cluster, before)["rows_sent"] == 3
