"""flightpart started on the engines users already run: Ray actors, Dask worker plugins."""

from __future__ import annotations

import os
import signal

import dask.dataframe as dd
import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart.runtimes import dask_cluster, ray_cluster

from helpers import dask_workers_on, wait_until


def frame(rows=600) -> pd.DataFrame:
    return pd.DataFrame({"i": np.arange(rows, dtype=np.int64), "x": np.linspace(0, 1, rows)})


# ------------------------------------------------------------------ Ray


def test_ray_start_put_restart_and_stop(ray_session, tmp_path):
    import ray.data

    client = fp.ray.start(data_dir=str(tmp_path), host="127.0.0.1")
    try:
        actors = ray_cluster.actors()
        assert set(actors) == {"flightpart-catalog",
                               "flightpart-node-" + ray_session.get_runtime_context().get_node_id()}
        assert [n.alive for n in client.nodes()] == [True]

        table = pa.table({"a": np.arange(3000), "b": np.arange(3000) * 0.5})
        ds = client.put("from-ray", ray.data.from_arrow([table.slice(0, 1500), table.slice(1500)]))
        assert ds.to_arrow().equals(table)
        assert pa.concat_tables(ray_session.get(fp.ray.read_refs(ds, schema=ds.schema))).equals(table)

        again = fp.ray.start(data_dir=str(tmp_path), host="127.0.0.1")  # idempotent: the same actors
        assert ray_cluster.actors() == actors
        again.close()

        node_name = next(n for n in actors if n.startswith("flightpart-node-"))
        os.kill(actors[node_name], signal.SIGKILL)  # Ray restarts the actor; it re-registers its data
        wait_until(lambda: ray_cluster.actors().get(node_name) not in (None, actors[node_name]), what="actor restart")
        wait_until(lambda: any(n.alive and n.pid != actors[node_name] for n in client.nodes()),
                   what="re-registration")
        assert client.open("from-ray").to_arrow().equals(table)
    finally:
        client.close()
        pids = list(ray_cluster.actors().values())
        fp.ray.stop()
    assert ray_cluster.actors() == {}
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                               for p in pids),
               what="actor processes to exit")


# ------------------------------------------------------------------ Dask


def test_dask_localcluster_gets_one_node_per_host(tmp_path):
    import distributed

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, host="127.0.0.1") as lc, \
            distributed.Client(lc) as dc:
        client = fp.dask.start(dc, data_dir=str(tmp_path))
        try:
            pids = dask_cluster.node_pids(dc)
            assert len(pids) == 1  # two workers, one host, one node
            nodes = client.nodes()
            assert [(n.ip, n.alive) for n in nodes] == [("127.0.0.1", True)]
            assert nodes[0].pid in pids.values()
            df = frame()
            ds = client.put("from-dask", dd.from_pandas(df, npartitions=4))
            pd.testing.assert_frame_equal(ds.to_dask().compute(), df)
            node_uri = nodes[0].uri
        finally:
            client.close()
            fp.dask.stop(dc)
        assert dask_cluster.node_pids(dc) == {}
        with pytest.raises(fp.NodeUnavailable):
            fp.connect(node_uri).stats(node_uri)


@pytest.fixture
def two_host_workers():
    with dask_workers_on(["127.0.0.62", "127.0.0.63"]) as client, client.as_current():
        yield client


def test_two_hosts_two_nodes_and_a_put_that_never_passes_through_the_driver(two_host_workers, tmp_path):
    dc = two_host_workers
    client = fp.dask.start(dc, data_dir=str(tmp_path))
    observer = fp.connect(client.uri)  # node stats through another client: the put's own connections stay visible
    try:
        assert sorted(n.ip for n in client.nodes() if n.alive) == ["127.0.0.62", "127.0.0.63"]
        df = frame(1000)
        ddf = dc.persist(dd.from_pandas(df, npartitions=4))
        holders = [fp.dask.host_of(h[0]) for h in fp.dask.partitioned(ddf, client=dc).holders]
        before = {n.uri: observer.stats(n.uri).values["bytes_received"] for n in client.nodes()}
        assert client.pool.connected() == {client.uri}
        ds = client.put("no-driver-bytes", ddf)
        # each partition went to the node on its holder's host ...
        assert [p["location"][0][0] for _, p in sorted(ds.__partitioned__["partitions"].items())] == holders
        # ... straight from the worker: the driver opened no connection to any node while putting
        assert client.pool.connected() == {client.uri}
        received = sum(observer.stats(u).values["bytes_received"] - b for u, b in before.items())
        assert received >= pa.Table.from_pandas(df, preserve_index=False).nbytes
        # and the reads run where the data is: nothing is streamed
        sent_before = {u: observer.stats(u).values["bytes_sent"] for u in before}
        pd.testing.assert_frame_equal(ds.to_dask().compute(), df)
        assert {u: observer.stats(u).values["bytes_sent"] for u in before} == sent_before
    finally:
        observer.close()
        client.close()
        fp.dask.stop(dc)
