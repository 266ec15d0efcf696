"""Dask and Ray as producers and consumers, with real clusters and real nodes."""

from __future__ import annotations

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.runtimes import dask as fdask
from flightpart.runtimes import ray as fray

from helpers import dask_workers_on


def frame(rows: int = 400) -> pd.DataFrame:
    # strings as pandas' NA-string dtype, which Dask keeps as it is
    return pd.DataFrame({
        "i": np.arange(rows, dtype=np.int64),
        "x": np.linspace(0, 1, rows),
        "s": pd.array([f"s{k % 13}" for k in range(rows)], dtype=pd.StringDtype(na_value=pd.NA)),
        "b": np.arange(rows) % 2 == 0,
    })


def sent(client, cluster) -> int:
    return sum(client.stats(n.uri).values["bytes_sent"] for n in cluster.nodes)


def test_round_trip_pandas_dask_put_ray_put_dask_pandas(cluster, dask_client, ray_session):
    df = frame()
    with fp.connect(cluster.uri) as client:
        ds1 = client.put("rt-dask", dd.from_pandas(df, npartitions=4))
        assert ds1.partition_tiling == (4, 1) and ds1.shape == (400, 4)
        ray_ds = client.open("rt-dask").to_ray()
        ds2 = client.put("rt-ray", ray_ds)
        back = client.open("rt-ray").to_dask()
        assert back.npartitions == ds2.partition_tiling[0]
        out = back.compute()
    pd.testing.assert_frame_equal(out, df)


def test_from_partitioned_reads_the_dask_producer(dask_client):
    df = frame(100)
    p = fdask.partitioned(dd.from_pandas(df, npartitions=3))
    d = fp.validate(p, require_pickle=True)
    assert d["partition_tiling"] == (3, 1) and d["get"] == fdask.DaskGather()
    worker_hosts = {fdask.host_of(w) for w in dask_client.scheduler_info()["workers"]}
    worker_pids = set(dask_client.run(__import__("os").getpid).values())
    for part in d["partitions"].values():
        (ip, pid), = part["location"]
        assert ip in worker_hosts and pid in worker_pids
    pd.testing.assert_frame_equal(fp.from_partitioned(p).to_pandas(), df)


def test_from_partitioned_reads_the_ray_producer(ray_session):
    import ray.data

    table = pa.table({"a": np.arange(60), "b": np.arange(60) * 2.0})
    p = fray.partitioned(ray.data.from_arrow([table.slice(0, 20), table.slice(20, 40)]))
    d = fp.validate(p, require_pickle=True)
    assert d["partition_tiling"] == (2, 1) and d["get"] == fray.RayGet()
    for part in d["partitions"].values():
        (ip, pid), = part["location"]
        assert ip == ray_session.util.get_node_ip_address() and pid > 0
    assert fp.from_partitioned(p).equals(table)


def test_a_conforming_object_to_dask_and_ray(dask_client, ray_session):
    table = pa.table({"a": np.arange(30), "b": [f"v{k}" for k in range(30)]})
    obj = fp.partitioned(table, tiling=(3, 2))
    got = fdask.from_partitioned(obj).compute()
    assert got["a"].tolist() == list(range(30)) and got.index.tolist() == list(range(30))
    blocks = fray.from_partitioned(obj).to_arrow_refs()
    assert pa.concat_tables(ray_session.get(list(blocks))).column("b").to_pylist() == table.column("b").to_pylist()


def test_raw_dask_graph_runs_under_dask_get_and_distributed(cluster, dask_client):
    df = frame(90)
    with fp.connect(cluster.uri) as client:
        ds = client.put("graph", df, tiling=(3, 1))
        graph = ds.dask_graph("g")
    assert sorted(graph) == [("g", 0), ("g", 1), ("g", 2)]
    keys = sorted(graph)
    local = dask.get(graph, keys)
    remote = dask_client.get(graph, keys)
    for parts in (local, remote):
        pd.testing.assert_frame_equal(pd.concat(parts), df)


def test_to_dask_has_divisions_and_pushes_the_projection(cluster, dask_client):
    df = frame(300)
    with fp.connect(cluster.uri) as client:
        client.put("projected", df, tiling=(3, 1))
        ddf = client.open("projected").to_dask()
        assert ddf.known_divisions and ddf.divisions == (0, 100, 200, 299)
        before = sent(client, cluster)
        only_x = ddf[["x"]].compute()
        moved = sent(client, cluster) - before
    pd.testing.assert_frame_equal(only_x, df[["x"]])
    assert moved == pa.Table.from_pandas(df[["x"]], preserve_index=False).nbytes


# ------------------------------------------------------------------ two hosts


@pytest.fixture(scope="module")
def two_host_dask(cluster):
    """A scheduler and one worker process on each of 127.0.0.2 and 127.0.0.3."""
    with dask_workers_on(["127.0.0.2", "127.0.0.3"]) as client:
        yield client


def test_reads_run_on_the_partition_host_and_puts_go_from_workers(cluster, two_host_dask):
    df = frame(800)
    nodes = {n.uri: ip for n, ip in zip(cluster.nodes, ("127.0.0.2", "127.0.0.3", "127.0.0.4"))}
    with two_host_dask.as_current(), fp.connect(cluster.uri, host="127.0.0.9") as client:
        ddf = two_host_dask.persist(dd.from_pandas(df, npartitions=4))
        p = fdask.partitioned(ddf, client=two_host_dask)
        holders = [fdask.host_of(h[0]) for h in p.holders]
        received = {u: client.stats(u).values["bytes_received"] for u in nodes}
        ds = client.put("two-hosts", ddf, nodes=["127.0.0.2", "127.0.0.3"])
        d = ds.__partitioned__
        # each partition went to the node on the host of the worker that held it
        assert [d["partitions"][(k, 0)]["location"][0][0] for k in range(4)] == holders
        grown = {u: client.stats(u).values["bytes_received"] - received[u] for u in nodes}
        assert grown[cluster.nodes[2].uri] == 0 and sum(grown.values()) > 0
        # reads: each task runs on the worker of its partition's host and maps the file
        before = {u: client.stats(u).values["bytes_sent"] for u in nodes}
        out = ds.to_dask().compute()
        after = {u: client.stats(u).values["bytes_sent"] for u in nodes}
    pd.testing.assert_frame_equal(out, df)
    assert after == before, "a read streamed a partition instead of running on its host"


def test_every_read_goes_to_the_one_host_that_holds_the_data(cluster, two_host_dask):
    df = frame(600)
    with two_host_dask.as_current(), fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.put("one-host", df, tiling=(6, 1), nodes=["127.0.0.3"])
        assert {p["location"][0][0] for p in ds.__partitioned__["partitions"].values()} == {"127.0.0.3"}
        uri = cluster.nodes[1].uri
        before = client.stats(uri).values["bytes_sent"]
        out = ds.to_dask().compute()
        assert client.stats(uri).values["bytes_sent"] == before, "a read ran on the worker of another host and streamed"
    pd.testing.assert_frame_equal(out, df)


def test_ray_reads_on_the_node_holding_the_partition_send_nothing(ray_session, tmp_path):
    """One machine has one Ray node: a flightpart node on this machine (127.0.0.1)
    is on the read tasks' host, so every read maps its file (0 bytes sent)."""
    from flightpart.local.cluster import Daemon

    node = Daemon(["serve", "--host", "127.0.0.1", "--port", "0", "--node-port", "0", "--data-dir", str(tmp_path / "d"),
                   "--state-dir", str(tmp_path / "s")])
    try:
        table = pa.table({"a": np.arange(3000), "b": np.arange(3000) * 0.25})
        with fp.connect(node.uris["catalog"], host="127.0.0.9") as client:
            ds = client.put("ray-local", table, tiling=(3, 1))
            before = client.stats(node.uris["node"]).values["bytes_sent"]
            refs = fray.read_refs(ds, schema=ds.schema)
            got = pa.concat_tables(ray_session.get(refs))
            assert client.stats(node.uris["node"]).values["bytes_sent"] == before
        assert got.equals(table)
    finally:
        node.stop()
