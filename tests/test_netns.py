"""Hosts as network namespaces: locality and failover across real sockets, and namespaces that never outlive a test.

The catalog, each node and each client run in a namespace of their own on
a bridge (flightpart.local.netcluster), so "this host" is decided by real
interfaces, not by FLIGHTPART_HOST.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from flightpart.local import netcluster

REASON = netcluster.unavailable()
pytestmark = [pytest.mark.slow,  # real hosts in namespaces: minutes, run by CI's slow step
              pytest.mark.skipif(REASON is not None, reason=f"no network namespaces here: {REASON}")]

READ = textwrap.dedent("""
    import json, os, sys
    import flightpart as fp
    with fp.connect(os.environ["CATALOG"]) as client:
        before = fp.traffic()
        ds = client.open("shared")
        table = ds.to_arrow()
        after = fp.traffic()
    print(json.dumps({"rows": table.num_rows, "sum": sum(table["k"].to_pylist()),
                      **{k: after[k] - before[k] for k in after}}))
""")


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    with netcluster.NetCluster(tmp_path_factory.mktemp("net"), nodes=3) as cluster:
        client = cluster.add_host()
        put = client.run(textwrap.dedent("""
            import os
            import numpy as np, pyarrow as pa
            import flightpart as fp
            with fp.connect(os.environ["CATALOG"]) as client:
                client.put("shared", pa.table({"k": np.arange(300_000)}), tiling=(3, 1), replicas=2)
        """), env={"CATALOG": cluster.uri})
        assert put.returncode == 0, put.stderr[-2000:]
        yield cluster, client


def read_on(host, uri: str) -> dict:
    done = host.run(READ, env={"CATALOG": uri})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_client_on_a_nodes_host_maps_that_nodes_partitions_and_streams_the_rest(net):
    cluster, _client = net
    _node, host = cluster.node_on(0)
    seen = read_on(host, cluster.uri)
    assert seen["rows"] == 300_000 and seen["sum"] == sum(range(300_000))
    # replicas=2 over 3 nodes: node 1 holds two of the three partitions, read from its files
    # mapped bytes are counted from the files (their size: the data plus a few hundred bytes of IPC framing)
    assert 2 * 800_000 <= seen["bytes_mapped"] <= 2 * 800_000 + 2 * 4096 and seen["bytes_received"] == 800_000


def test_a_client_on_a_host_of_its_own_streams_everything(net):
    cluster, client = net
    seen = read_on(client, cluster.uri)
    assert seen["rows"] == 300_000 and seen["bytes_mapped"] == 0 and seen["bytes_received"] == 2_400_000


def test_reads_fail_over_when_a_node_is_killed(net):
    cluster, client = net
    node, _host = cluster.node_on(2)
    node.kill()
    seen = read_on(client, cluster.uri)
    assert seen["rows"] == 300_000 and seen["sum"] == sum(range(300_000))


OWNER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from flightpart.local import netcluster
    cluster = netcluster.NetCluster(Path(sys.argv[1]), nodes=1)
    print(json.dumps([[h.namespace for h in cluster.hosts] + [cluster.bridge], [d.pid for d in cluster.daemons]]),
          flush=True)
    time.sleep(600)
""")


def test_a_cluster_whose_owner_is_killed_is_swept_away(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    made, daemons = json.loads(owner.stdout.readline())
    assert set(made) <= set(netcluster.namespaces())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert set(made) <= set(netcluster.namespaces())  # kill -9: the owner cleaned nothing up
    swept = netcluster.sweep()
    assert set(made) <= set(swept) and not set(made) & set(netcluster.namespaces())
    time.sleep(0.2)
    for pid in daemons:  # the daemons that ran inside are gone too
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


SLOW_READS = textwrap.dedent("""
    import json, os
    import numpy as np, pyarrow as pa
    import flightpart as fp
    rng = np.random.default_rng(1)
    n = 800_000  # about 14 MB: enough to measure the link
    sales = pa.table({"day": np.sort(rng.integers(0, 365, n)).astype(np.int32),
                      "store": pa.array([f"store-{k % 40:02d}" for k in rng.integers(0, 40, n)]),
                      "quantity": rng.integers(1, 10, n).astype(np.int16)})
    noise = pa.table({"f": rng.random(1_000_000)})
    seen = {}
    with fp.connect(os.environ["CATALOG"]) as client:
        client.put("sales", sales)
        client.put("noise", noise)
        node = client.nodes()[0].uri
        def compressed():
            return client.stats(node).values["streams_compressed"]
        for mode in ("auto", "off"):
            with fp.connect(os.environ["CATALOG"], compression=mode) as reader:
                before = compressed()
                tables = [reader.open("sales").to_arrow() for _ in range(3)]
                seen[mode] = {"compressed": compressed() - before, "equal": all(t.equals(sales) for t in tables)}
        with fp.connect(os.environ["CATALOG"], compression="zstd") as reader:
            before = compressed()
            ok = reader.open("noise").to_arrow().equals(noise)
            seen["noise"] = {"compressed": compressed() - before, "equal": ok}
        from flightpart.io.compression import RATES
        seen["rate"] = RATES.rate(node)
    print(json.dumps(seen))
""")


def test_reads_over_a_slow_link_are_compressed_once_the_link_is_measured(tmp_path):
    with netcluster.NetCluster(tmp_path, nodes=1, rate="200mbit") as cluster:
        client = cluster.add_host()
        done = client.run(SLOW_READS, env={"CATALOG": cluster.uri})
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout)
    # auto: the first read measures the link (uncompressed, about 25 MB/s), the next two ask for ZSTD
    assert seen["auto"] == {"compressed": 2, "equal": True}
    assert 5e6 < seen["rate"] < 50e6
    assert seen["off"] == {"compressed": 0, "equal": True}
    # asked for ZSTD, random floats are sent as they are: a sample did not shrink
    assert seen["noise"] == {"compressed": 0, "equal": True}


DASK_DRIVER = textwrap.dedent("""
    import json, os
    import dask.dataframe as dd, distributed, pandas as pd
    import flightpart as fp
    dc = distributed.Client(scheduler_file=os.environ["SCHEDULER_FILE"], timeout=60)
    dc.wait_for_workers(2, timeout=60)
    client = fp.dask.start(dc, data_dir=os.environ["DATA_DIR"])
    out = {}
    try:
        out["nodes"] = sorted(n.ip for n in client.nodes() if n.alive)
        df = pd.DataFrame({"k": range(4000), "v": [k / 7 for k in range(4000)]})
        ddf = dc.persist(dd.from_pandas(df, npartitions=4))
        out["holders"] = [fp.dask.host_of(h[0]) for h in fp.dask.partitioned(ddf, client=dc).holders]
        ds = client.put("across-hosts", ddf)
        out["placed"] = [p["location"][0][0] for _, p in sorted(ds.__partitioned__["partitions"].items())]
        out["driver_connections"] = sorted(client.pool._clients)
        with fp.connect(client.uri) as observer:
            uris = [n.uri for n in client.nodes()]
            sent = {u: observer.stats(u).values["bytes_sent"] for u in uris}
            back = ds.to_dask().compute()
            out["equal"] = back.reset_index(drop=True).equals(df)
            out["streamed"] = sum(observer.stats(u).values["bytes_sent"] - b for u, b in sent.items())
        out["catalog"] = client.uri
    finally:
        client.close()
        fp.dask.stop(dc)
    print(json.dumps(out))
""")


def test_dask_workers_on_two_hosts_put_and_read_where_the_data_is(tmp_path):
    with netcluster.NetCluster(tmp_path / "net", nodes=0) as cluster:
        scheduler, *workers = cluster.add_host(), cluster.add_host(), cluster.add_host()
        scheduler_file = str(tmp_path / "scheduler.json")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        scheduler.popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", scheduler.ip, "--port", "0",
                         "--scheduler-file", scheduler_file, "--no-dashboard"], **quiet)
        for host in workers:
            host.popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", scheduler_file,
                        "--host", host.ip, "--nthreads", "1", "--no-nanny", "--no-dashboard"], **quiet)
        deadline = time.monotonic() + 60
        while not os.path.exists(scheduler_file) and time.monotonic() < deadline:
            time.sleep(0.2)
        done = scheduler.run(DASK_DRIVER, env={"SCHEDULER_FILE": scheduler_file, "DATA_DIR": str(tmp_path / "data")})
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout)
    # one node per worker host, found from each namespace's own interface
    assert out["nodes"] == sorted(h.ip for h in workers)
    # each partition stored on the host of the worker that held it, sent by that worker: the driver on the
    # scheduler's host talked to the catalog only
    assert out["placed"] == out["holders"] and set(out["placed"]) == {h.ip for h in workers}
    assert out["driver_connections"] == [out["catalog"]]
    # the read ran where the data is: every partition mapped by a worker on its host, none streamed
    assert out["equal"] and out["streamed"] == 0


RAY_DRIVER = textwrap.dedent("""
    import json, os
    import numpy as np, pyarrow as pa, ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    import flightpart as fp
    from flightpart.runtimes import ray as fray
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    nodes = sorted((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])
    client = fp.ray.start(data_dir=os.environ["DATA_DIR"])
    out = {"ray_nodes": [ip for ip, _ in nodes]}
    try:
        out["nodes"] = sorted(n.ip for n in client.nodes() if n.alive)

        @ray.remote(num_cpus=0)
        def block(k):  # 1.6 MB: large enough to live in its node's object store (small ones go to the owner)
            return pa.table({"k": np.arange(k * 200_000, (k + 1) * 200_000)})

        refs = [block.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[k % 2][1], soft=False)).remote(k)
                for k in range(4)]
        rds = ray.data.from_arrow_refs(refs)
        out["holders"] = [nodes[k % 2][0] for k in range(4)]
        out["seen"] = [sorted(ip for ip, _pid in locs) for locs in fray.partitioned(rds).locations]
        ds = client.put("ray-across-hosts", rds)
        out["placed"] = [p["location"][0][0] for _, p in sorted(ds.__partitioned__["partitions"].items())]
        with fp.connect(client.uri) as observer:
            uris = [n.uri for n in client.nodes()]
            received = sum(observer.stats(u).values["bytes_received"] for u in uris)
            sent = {u: observer.stats(u).values["bytes_sent"] for u in uris}
            got = pa.concat_tables(ray.get(fray.read_refs(ds, schema=ds.schema)))
            out["equal"] = got["k"].to_pylist() == list(range(800_000))
            out["streamed"] = sum(observer.stats(u).values["bytes_sent"] - b for u, b in sent.items())
            out["received"] = received
    finally:
        client.close()
        fp.ray.stop()
    print(json.dumps(out))
""")


def test_ray_with_a_second_node_puts_from_tasks_and_reads_where_the_data_is(tmp_path):
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.exists(ray_cli):
        pytest.skip("ray is not installed")
    # a temp dir of its own (short: Ray's socket paths must fit 107 bytes), so `ray start` does not leave its
    # address in /tmp/ray/ray_current_cluster, where every later ray.init() on this machine would find it
    temp = tempfile.mkdtemp(prefix="fpray-", dir="/tmp")
    default_address = "/tmp/ray/ray_current_cluster"
    before = open(default_address).read() if os.path.exists(default_address) else None
    with netcluster.NetCluster(tmp_path / "net", nodes=0) as cluster, contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, temp, True)
        head, worker = cluster.add_host(), cluster.add_host()
        env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        common = ["--num-cpus", "1", "--disable-usage-stats", "--temp-dir", temp]
        for host, args in ((head, ["--head", "--port", "6379", "--include-dashboard", "false"]),
                           (worker, ["--address", f"{head.ip}:6379"])):
            started = host.popen([ray_cli, "start", "--node-ip-address", host.ip, *args, *common], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert started.wait(120) == 0, started.stdout.read()[-3000:]
        done = head.run(RAY_DRIVER, env={**env, "RAY_ADDRESS": f"{head.ip}:6379", "DATA_DIR": str(tmp_path / "data")},
                        timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
    after = open(default_address).read() if os.path.exists(default_address) else None
    assert after == before
    assert out["ray_nodes"] == sorted([head.ip, worker.ip])
    # one flightpart node per Ray node, each on its own host's address
    assert out["nodes"] == out["ray_nodes"]
    # Ray reports each block where it was made (Ray Data may have copied it to the other node too)
    assert all(made in seen for made, seen in zip(out["holders"], out["seen"])), out
    # each block stored on a host whose Ray node holds it, by a task there
    assert all(placed in seen for placed, seen in zip(out["placed"], out["seen"])), out
    assert out["received"] >= 4 * 1_600_000
    # read tasks ran on the holders' nodes and mapped their files: nothing streamed
    assert out["equal"] and out["streamed"] == 0
