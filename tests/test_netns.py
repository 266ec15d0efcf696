"""Hosts as network namespaces: locality and failover across real sockets, and namespaces that never outlive a test.

The catalog, each node and each client run in a namespace of their own on
a bridge (flightpart.tools.netcluster), so "this host" is decided by real
interfaces, not by FLIGHTPART_HOST.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from flightpart.tools import netcluster

REASON = netcluster.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces here: {REASON}")

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
    assert seen["bytes_mapped"] == 2 * 800_000 and seen["bytes_received"] == 800_000


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
    from flightpart.tools import netcluster
    cluster = netcluster.NetCluster(Path(sys.argv[1]), nodes=1)
    print(json.dumps([[h.namespace for h in cluster.hosts] + [cluster.bridge], [d.pid for d in cluster.daemons]]), flush=True)
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
        node = client.nodes()[0]["uri"]
        def compressed():
            return client.stats(node)["streams_compressed"]
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
