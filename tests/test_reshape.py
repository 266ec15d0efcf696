"""The Dist RFC's operations done by the nodes: repartition, halos, append, rebalance.

Each test asserts what a user sees (equal data, a new version, nothing
through the client) and what the nodes did (their counters, their files).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.client import reshape
from flightpart.io.layout import partition_relpath
from flightpart.regrid import balanced, near_placement, pieces_of
from flightpart.tiling import halo_sources
from flightpart.wire import Assemble, AssemblePart, AssembleReply, HeldPartition, NodeRow

from helpers import code_of, wait_until

N = 10_000

PROCESS_CLUSTER = True  # tests here freeze the shared cluster's nodes (SIGSTOP)


def table(n: int = N, offset: int = 0) -> pa.Table:
    k = np.arange(offset, offset + n)
    return pa.table({"id": k, "x": k * 0.5, "name": [f"row-{v}" for v in k], "flag": k % 3 == 0})


def node_stats(client) -> dict[str, dict]:
    return {n.uri: client.stats(n.uri).values for n in client.nodes() if n.alive}


def delta(after: dict, before: dict, key: str) -> dict[str, int]:
    return {uri: after[uri][key] - before.get(uri, {}).get(key, 0) for uri in after}


def held_rows(client, name: str, version: int) -> dict[str, int]:
    """Rows of ``version`` each node holds (once per partition it holds)."""
    out: dict[str, int] = {}
    for p in client.info(name, version).parts:
        for uri, _ip, _pid in p.replicas:
            out[uri] = out.get(uri, 0) + p.shape[0]
    return out


@pytest.fixture(scope="module")
def client(cluster):
    with fp.connect(cluster.uri) as c:
        yield c


# ---------------------------------------------------------------------- repartition


def test_repartition_is_done_by_the_nodes_and_nothing_passes_through_the_client(client):
    source = table()
    client.put("rp", source, tiling=(4, 1))
    before_stats, before = node_stats(client), fp.traffic()
    wide = client.repartition("rp", tiling=(6, 2))
    moved = {k: fp.traffic()[k] - before[k] for k in before}
    assert moved == {"bytes_sent": 0, "bytes_received": 0, "bytes_mapped": 0}
    assert wide.partition_tiling == (6, 2) and wide.shape == (N, 4)
    assert wide.to_arrow().equals(source)
    after = node_stats(client)
    # each target row needs one source column group (the source has one): a node gathered exactly the rows it holds
    assert delta(after, before_stats, "assembled_rows") == {u: held_rows(client, "rp", wide.version).get(u, 0)
                                                            for u in after}
    assert sum(delta(after, before_stats, "pulled_bytes").values()) > 0
    assert sum(delta(after, before_stats, "bytes_received").values()) == 0  # no put: nothing came from a client

    before_stats = after
    narrow = client.repartition("rp", tiling=(3, 1))
    assert narrow.partition_tiling == (3, 1) and narrow.to_arrow().equals(source)
    after = node_stats(client)
    # now every target row is gathered from both source column groups
    assert delta(after, before_stats, "assembled_rows") == {u: 2 * held_rows(client, "rp", narrow.version).get(u, 0)
                                                            for u in after}
    assert client.open("rp", wide.version).to_arrow().equals(source)  # the source version is untouched


def test_repartition_keeps_pandas_index_columns_and_replicas(client):
    frame = pd.DataFrame({"a": np.arange(30), "b": np.arange(30) * 2.0, "c": list("xyz") * 10},
                         index=pd.Index(np.arange(100, 130), name="key"))
    client.put("rp-pandas", frame, tiling=(2, 3))
    ds = client.repartition("rp-pandas", tiling=(5, 2), replicas=2)
    assert all(len(p.replicas) == 2 for p in client.info("rp-pandas", ds.version).parts)
    pd.testing.assert_frame_equal(ds.to_pandas(), frame)
    back = client.repartition("rp-pandas", tiling=(1, 1))
    pd.testing.assert_frame_equal(back.to_pandas(), frame)


def test_repartition_refuses_a_tiling_it_cannot_make_and_publishes_nothing(client):
    client.put("rp-bad", table(100), tiling=(2, 1))
    versions = client.versions("rp-bad")
    for tiling in [(0, 1), (2, 5), (2,), "4x1"]:
        with pytest.raises(ValueError):
            client.repartition("rp-bad", tiling=tiling)
    with pytest.raises(fp.DatasetNotFound):
        client.repartition("no-such-dataset", tiling=(2, 1))
    assert client.versions("rp-bad") == versions


def test_repartition_reads_from_another_replica_when_a_holder_is_frozen(cluster, client):
    source = table(3000)
    client.put("rp-frozen", source, tiling=(3, 1), replicas=2)
    frozen, *others = cluster.nodes
    live = [n.uri for n in client.nodes() if n.uri != frozen.uri]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        ds = client.repartition("rp-frozen", tiling=(4, 1), nodes=live, replicas=1)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert ds.to_arrow().equals(source)
    assert {uri for p in client.info("rp-frozen", ds.version).parts for uri, _ip, _pid in p.replicas} <= set(live)


@pytest.mark.slow  # a long fault test: behind the marker CI still runs
def test_a_target_node_killed_mid_repartition_publishes_nothing(new_cluster):
    with new_cluster(3, process=True) as c, fp.connect(c.uri) as client:
        source = table(3000)
        client.put("rp-killed", source, tiling=(3, 1), replicas=2)
        versions = client.versions("rp-killed")
        c.nodes[1].kill()  # the catalog still counts it alive for a while: orders go to it and fail
        with pytest.raises(fp.NodeUnavailable):
            client.repartition("rp-killed", tiling=(6, 1), replicas=1)
        assert client.versions("rp-killed") == versions  # aborted: nothing published
        assert client.open("rp-killed").to_arrow().equals(source)  # and the current version reads from its replicas
        for ip in (c.ips[0], c.ips[2]):  # the survivors keep no file of the aborted version
            root = c.root / f"node-{ip}" / "datasets" / "rp-killed"
            wait_until(lambda root=root: sorted(p.name for p in root.glob("v*")) == [f"v{versions[-1]}"],
                       what=f"the aborted version gone from {ip}")


@pytest.mark.slow  # a full-disk fault: in the slow tier, which CI runs
def test_a_repartition_onto_a_full_disk_is_refused_and_leaves_nothing(tmp_path, small_disk, new_cluster):
    with new_cluster(1, process=True, root=tmp_path / "c") as c:
        small = c.add_node(c.ips[1], data_dir=small_disk / "node")
        with fp.connect(c.uri) as client:
            wait_until(lambda: sum(n.alive for n in client.nodes()) == 2, 20, "both nodes")
            source = pa.table({"x": np.random.default_rng(1).random(10 << 20)})  # 80 MB into a 64 MB disk
            client.put("rp-full", source, tiling=(4, 1), nodes=[c.ips[0]])
            versions = client.versions("rp-full")
            with pytest.raises(fp.StorageFull, match="disk full"):
                client.repartition("rp-full", tiling=(2, 1), nodes=[c.ips[1]])
            assert client.versions("rp-full") == versions
            assert client.stats(small.uri).values["storage_full_refusals"] >= 1
            assert "the disk is full" in small.log()
            assert client.open("rp-full").to_arrow().equals(source)
            assert not list((small_disk / "node").rglob(".tmp-*"))  # no half-written partition
            wait_until(lambda: not list((small_disk / "node").rglob("*.arrow")), 10, "the aborted version's files gone")


# ---------------------------------------------------------------------- lying orders


def test_lying_assemble_orders_are_refused_and_the_node_keeps_serving(cluster, client):
    source = table(100)
    ds = client.put("rp-lie", source, tiling=(2, 1))
    node = cluster.nodes[0].uri
    pending = client.call(fp.wire.Begin("rp-lie")).version
    lies = {
        "rows past the end": Assemble("rp-lie", ds.version, pending, 1, (AssemblePart((0, 0), (0, 101)),)),
        "reversed rows": Assemble("rp-lie", ds.version, pending, 1, (AssemblePart((0, 0), (50, 10)),)),
        "no column group": Assemble("rp-lie", ds.version, pending, 0, (AssemblePart((0, 0), (0, 10)),)),
        "more groups than columns": Assemble("rp-lie", ds.version, pending, 9, (AssemblePart((0, 0), (0, 10)),)),
        "a group outside the grid": Assemble("rp-lie", ds.version, pending, 2, (AssemblePart((0, 2), (0, 10)),)),
        "the source itself": Assemble("rp-lie", ds.version, ds.version, 1, (AssemblePart((0, 0), (0, 10)),)),
    }
    for what, order in lies.items():
        with pytest.raises(flight.FlightError) as err:
            next(flight.connect(node).do_action(flight.Action(Assemble.ACTION, order.encode())))
        assert code_of(err.value) == "INVALID_REQUEST", what
    with pytest.raises(flight.FlightError) as err:
        order = Assemble("rp-lie", 99, pending, 1, (AssemblePart((0, 0), (0, 10)),))
        next(flight.connect(node).do_action(flight.Action(Assemble.ACTION, order.encode())))
    assert code_of(err.value) == "DATASET_NOT_FOUND"
    committed = client.put("rp-lie", source, tiling=(2, 1)).version
    with pytest.raises(flight.FlightError) as err:  # a committed version takes no new partition
        order = Assemble("rp-lie", ds.version, committed, 1, (AssemblePart((0, 0), (0, 10)),))
        next(flight.connect(node).do_action(flight.Action(Assemble.ACTION, order.encode())))
    assert code_of(err.value) == "VERSION_CONFLICT"
    with pytest.raises(flight.FlightError) as err:
        next(flight.connect(node).do_action(flight.Action(Assemble.ACTION, b'{"dataset": "rp-lie", "source": "1"}')))
    assert code_of(err.value) == "INVALID_REQUEST"
    client.call(fp.wire.Abort("rp-lie", pending))
    assert client.open("rp-lie").to_arrow().equals(source)  # the node serves on


class LyingNode(flight.FlightServerBase):
    """Answers every assemble order with receipts it makes up: none, or one with the wrong row count."""

    def __init__(self, receipts):
        super().__init__("grpc://127.0.0.1:0")
        self.receipts = receipts

    def do_action(self, context, action):
        yield flight.Result(pa.py_buffer(AssembleReply(self.receipts, 0).encode()))


@pytest.mark.parametrize("receipts, message", [
    ((), "acknowledged 0 of 1 partitions"),
    ((HeldPartition("d", 2, (0, 0), rows=7),), "built partition \\(0, 0\\) with 7 rows, planned 10"),
])
def test_receipts_that_do_not_match_the_plan_fail_the_operation(client, receipts, message):
    source = client.info("rp-receipts", client.put("rp-receipts", table(10), tiling=(1, 1)).version)
    with LyingNode(receipts) as liar:
        node = NodeRow("liar", f"grpc://127.0.0.1:{liar.port}", "127.0.0.1", 0)
        with pytest.raises(fp.RequestRejected, match=message):
            reshape.assemble_on_nodes(client.pool, source, 2, 1, {(0, 0): (0, 10)}, {(0, 0): [node]})


# ---------------------------------------------------------------------- halos


@pytest.mark.parametrize("halo,periodic", [((1, 1), False), ((2, 0), False), ((1, 1), True), ((2, 0), True)])
def test_halos_are_the_neighbours_rows_and_local_neighbours_are_mapped(cluster, halo, periodic):
    name = "halo"
    source = table(23)
    host = "127.0.0.2"  # this process plays the host of the first node
    with fp.connect(cluster.uri, host=host) as c:
        if name not in [d.name for d in c.list()]:
            c.put(name, source, tiling=(5, 1))
        info = c.info(name)
        sizes = [p.shape[0] for p in info.parts]
        starts = [p.start[0] for p in info.parts]
        local_node = next(uri for p in info.parts for uri, ip, _pid in p.replicas if ip == host)
        expected = halo_sources(sizes, *halo, periodic=periodic)
        mapped_before, served_before = fp.traffic()["bytes_mapped"], c.stats(local_node).values["partitions_served"]
        for rank in range(5):
            ds = c.open(name, rank=rank, nranks=5, halo=halo, periodic=periodic)
            parts = ds.parts_of()
            assert list(parts) == [(rank, 0)]
            left, local, right = parts[(rank, 0)]
            want = {side: [source.slice(starts[p.owner] + p.start, p.stop - p.start) for p in expected[rank]
                           if p.side == side]
                    for side in ("left", "right")}
            assert left.equals(pa.concat_tables(want["left"]) if want["left"] else source.schema.empty_table())
            assert right.equals(pa.concat_tables(want["right"]) if want["right"] else source.schema.empty_table())
            assert local.equals(source.slice(starts[rank], sizes[rank]))
            # and by plain index arithmetic: the rows just before and after, wrapping when periodic
            ids = [i % 23 if periodic else i for i in range(starts[rank] - halo[0], starts[rank])]
            assert left["id"].to_pylist() == [i for i in ids if 0 <= i < 23]
        # the first node's partitions (neighbours of other ranks included) were mapped, never streamed
        assert c.stats(local_node).values["partitions_served"] == served_before
        assert fp.traffic()["bytes_mapped"] > mapped_before


def test_halos_travel_as_distarray_padding(cluster):
    with fp.connect(cluster.uri) as c:
        source = pa.table({"v": np.arange(20, dtype=np.float64), "w": np.arange(20, dtype=np.float64) * 2})
        c.put("halo-dap", source, tiling=(4, 1))
        ds = c.open("halo-dap", rank=1, nranks=4, halo=(2, 1))
        d = ds.__distarray__()
        row = d["dim_data"][0]
        assert row["padding"] == (2, 1) and (row["start"], row["stop"]) == (3, 11)  # 0.10: the buffer's extent
        np.testing.assert_array_equal(d["buffer"][:, 0], np.arange(3, 11))
        d9 = c.open("halo-dap", rank=0, nranks=4, halo=(1, 1), periodic=True).__distarray__(version="0.9.0")
        assert d9["dim_data"][0]["periodic"] is True and d9["dim_data"][0]["padding"] == (1, 1)
        np.testing.assert_array_equal(d9["buffer"][:, 0], [19, 0, 1, 2, 3, 4, 5])
        with pytest.raises(fp.PartitionedError, match="0.9.0"):
            c.open("halo-dap", rank=0, nranks=4, halo=(1, 1), periodic=True).__distarray__()
        with pytest.raises(ValueError, match="halo"):
            c.open("halo-dap", halo=(1, 1))
        with pytest.raises(ValueError, match="halo"):
            c.open("halo-dap", rank=0, nranks=4, halo=(-1, 1))
        with pytest.raises(ValueError, match="wider than the dataset's 20 rows"):
            c.open("halo-dap", rank=0, nranks=4, halo=(21, 0), periodic=True)


# ---------------------------------------------------------------------- append


def test_append_writes_only_the_new_rows_and_shares_the_old_files(cluster, client):
    first = table(6000)
    old = client.put("app", first, tiling=(3, 1))
    reader = client.open("app", old.version)
    more = table(900, offset=6000)
    before = node_stats(client)
    new = client.append("app", more)
    after = node_stats(client)
    assert new.version > old.version and new.shape == (6900, 4)
    assert new.to_arrow().equals(pa.concat_tables([first, more]))
    assert reader.to_arrow().equals(first)  # a reader of the old version sees no change
    received = sum(delta(after, before, "bytes_received").values())
    assert 0 < received <= more.nbytes * 1.05  # only the new rows travelled
    assert sum(delta(after, before, "pulled_bytes").values()) == 0
    assert sum(delta(after, before, "partitions_linked").values()) == 3
    info = client.info("app", new.version)
    for p in info.parts[:3]:  # the old partitions are the very same files (one inode, two names)
        (uri, ip, _pid), = p.replicas
        root = cluster.root / f"node-{ip}"
        a = os.stat(root / partition_relpath("app", old.version, p.position))
        b = os.stat(root / partition_relpath("app", new.version, p.position))
        assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev) and b.st_nlink == 2
    client.drop("app", old.version)
    assert new.to_arrow().equals(pa.concat_tables([first, more]))  # dropping the old version leaves the new one whole
    assert client.open("app").to_arrow().equals(pa.concat_tables([first, more]))


def test_append_of_a_stream_into_column_groups_and_of_nothing(client):
    first = table(500)
    client.put("app-groups", first, tiling=(2, 2))
    more = table(250, offset=500)
    ds = client.append("app-groups", pa.RecordBatchReader.from_batches(more.schema, more.to_batches(max_chunksize=40)),
                       rows_per_partition=100)
    assert ds.partition_tiling == (5, 2)  # 2 + three blocks of at most 100 rows
    assert ds.to_arrow().equals(pa.concat_tables([first, more]))
    same = client.append("app-groups", more.slice(0, 0))
    assert same.partition_tiling == (5, 2) and same.to_arrow().equals(pa.concat_tables([first, more]))


def test_append_of_other_columns_is_refused_and_publishes_nothing(client):
    client.put("app-bad", table(100))
    versions = client.versions("app-bad")
    with pytest.raises(fp.SchemaMismatch, match="columns"):
        client.append("app-bad", table(10).drop_columns(["flag"]))
    with pytest.raises(fp.SchemaMismatch, match="'x'"):
        client.append("app-bad", table(10).set_column(1, "x", pa.array(["a"] * 10)))
    assert client.versions("app-bad") == versions


# ---------------------------------------------------------------------- rebalance


def test_rebalance_after_a_node_joins(new_cluster):
    with new_cluster(2, process=True) as c, fp.connect(c.uri) as client:
        source = table(8000)
        old = client.put("rb", source, tiling=(8, 1))
        assert client.rebalance("rb").version == old.version  # balanced already: nothing moves
        c.add_node(c.ips[2])
        fp_nodes = lambda: [n for n in client.nodes() if n.alive]  # noqa: E731
        import time

        deadline = time.monotonic() + 30
        while len(fp_nodes()) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = node_stats(client)
        new = client.rebalance("rb")
        after = node_stats(client)
        assert new.version > old.version and new.to_arrow().equals(source)
        parts = client.info("rb", new.version).parts
        load: dict[str, int] = {}
        for p in parts:
            for uri, _ip, _pid in p.replicas:
                load[uri] = load.get(uri, 0) + p.nbytes
        assert len(load) == 3 and max(load.values()) - min(load.values()) <= max(p.nbytes for p in parts)
        moved = sum(delta(after, before, "partitions_assembled").values())
        linked = sum(delta(after, before, "partitions_linked").values())
        assert moved + linked == 8 and 2 <= moved <= 3  # the newcomer takes its share; the rest stay, linked
        client.drop("rb", old.version)
        assert client.open("rb").to_arrow().equals(source)


# ---------------------------------------------------------------------- the plan, alone


def test_pieces_take_each_column_once_from_the_first_group_that_stores_it():
    pieces = pieces_of((2, 7), ["a", "b", "idx"], [3, 3, 3], [["a", "idx"], ["b", "idx"]])
    assert [[(p.source, p.rows, p.columns) for p in block] for block in pieces] == [
        [((0, 0), (2, 3), ("a", "idx")), ((0, 1), (2, 3), ("b",))],
        [((1, 0), (0, 3), ("a", "idx")), ((1, 1), (0, 3), ("b",))],
        [((2, 0), (0, 1), ("a", "idx")), ((2, 1), (0, 1), ("b",))],
    ]
    assert pieces_of((4, 4), ["a"], [3, 3], [["a"]]) == []


def test_balanced_moves_little_and_leaves_at_most_one_partition_of_gap():
    rng = np.random.default_rng(7)
    for _ in range(200):
        sizes = {(k, 0): int(s) for k, s in enumerate(rng.integers(1, 100, rng.integers(1, 30)))}
        nodes = [f"n{k}" for k in range(rng.integers(1, 6))]
        holders = {pos: [nodes[rng.integers(len(nodes))]] for pos in sizes}
        placed = balanced(sizes, holders, nodes)
        load = dict.fromkeys(nodes, 0)
        for pos, h in placed.items():
            assert len(h) == 1
            load[h[0]] += sizes[pos]
        assert max(load.values()) - min(load.values()) <= max(sizes.values())
    assert balanced({(0, 0): 5, (1, 0): 5}, {(0, 0): ["a"], (1, 0): ["b"]},
                    ["a", "b"]) == {(0, 0): ["a"], (1, 0): ["b"]}


def test_near_placement_prefers_local_bytes_within_each_nodes_share():
    weights = [{"a": 100}, {"a": 90}, {"a": 80}, {"b": 10}]
    chosen = near_placement(weights, ["a", "b"], replicas=1)
    assert chosen == [["a"], ["a"], ["b"], ["b"]]  # "a" is full after its share of two
    assert all(len(set(c)) == 2 for c in near_placement(weights, ["a", "b", "c"], replicas=2))
