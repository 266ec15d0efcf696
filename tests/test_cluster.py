"""A real cluster of processes on 127.0.0.2-4: locality, zero-copy, wire format, errors."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import flightpart as fp
from flightpart.io.layout import partition_relpath

from helpers import code_of

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def make_table(rows: int = 60_000, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(rows), "x": rng.random(rows), "y": rng.random(rows),
                     "s": [f"v{k % 97}" for k in range(rows)]})


def sent(client, cluster) -> dict[str, int]:
    return {n.uri: client.stats(n.uri).values["bytes_sent"] for n in cluster.nodes}


@pytest.fixture(scope="module")
def dataset(cluster):
    table = make_table()
    with fp.connect(cluster.uri) as client:
        ds = client.put("locality", table, tiling=(6, 1))
    return table, ds


def test_client_on_node_a_reads_everything_and_a_sends_nothing(cluster, dataset):
    table, _ = dataset
    with fp.connect(cluster.uri, host=A) as client:
        ds = client.open("locality")
        d = fp.validate(ds, require_pickle=True)
        before = sent(client, cluster)
        got = ds.to_arrow()
        after = sent(client, cluster)
        assert got.equals(table)
        node_a, node_b, node_c = (n.uri for n in cluster.nodes)
        assert after[node_a] - before[node_a] == 0
        # B and C sent exactly their partitions' bytes
        for uri, ip in ((node_b, B), (node_c, C)):
            theirs = [p for p in d["partitions"].values() if p["location"][0][0] == ip]
            rows = sum(p["shape"][0] for p in theirs)
            starts = [p["start"][0] for p in theirs]
            want = sum(table.slice(s, p["shape"][0]).nbytes for s, p in zip(starts, theirs))
            assert after[uri] - before[uri] == want and rows > 0


def test_every_location_names_the_node_ip_and_pid(cluster, dataset):
    with fp.connect(cluster.uri) as client:
        d = client.open("locality").__partitioned__
    pids = {f"127.0.0.{2 + k}": n.pid for k, n in enumerate(cluster.nodes)}
    for part in d["partitions"].values():
        (ip, pid), = part["location"]
        assert pids[ip] == pid


def test_sizes_are_each_partitions_own_file_size(cluster, dataset):
    from flightpart.cli.grid_view import grid_json

    with fp.connect(cluster.uri) as client:
        ds = client.open("locality")
        files = {}
        for pos, part in ds.__partitioned__["partitions"].items():
            uri = part["data"].replicas[0][0]
            data_dir = Path(client.pool.action(uri, fp.wire.GetNodeInfo()).data_dir)
            files[pos] = (data_dir / partition_relpath("locality", ds.version, pos)).stat().st_size
    assert ds.partition_nbytes() == files and ds.nbytes == sum(files.values())
    assert {tuple(p["position"]): p["nbytes"] for p in grid_json(ds)["partitions"]} == files
    half = ds[: ds.shape[0] // 2]
    assert 0.4 * ds.nbytes < half.nbytes < 0.6 * ds.nbytes


def _mappings() -> list[tuple[int, int, str]]:
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi, fields[5]))
    return out


def test_local_partitions_are_buffers_inside_the_memory_mapped_file(cluster):
    from flightpart.io.transfer import READ_WHOLE_BYTES

    big = pa.table({"x": np.random.default_rng(3).random(3 * READ_WHOLE_BYTES // 8 * 6)})  # six of 3 MiB
    with fp.connect(cluster.uri, host=A) as client:
        client.put("locality-big", big, tiling=(6, 1))
        d = client.open("locality-big").__partitioned__
        pos, part = next((pos, p) for pos, p in sorted(d["partitions"].items()) if p["location"][0][0] == A)
        before = sent(client, cluster)
        table = d["get"](part["data"])
        assert sent(client, cluster) == before
        assert table.equals(big.slice(part["start"][0], part["shape"][0]))
        info = client.pool.action(cluster.nodes[0].uri, fp.wire.GetNodeInfo())
    path = str(Path(info.data_dir) / partition_relpath("locality-big", part["data"].version, part["data"].position))
    regions = [(lo, hi) for lo, hi, name in _mappings() if name == path]
    assert regions, f"{path} is not memory-mapped in this process"
    for column in table.columns:
        for chunk in column.chunks:
            for buf in chunk.buffers():
                if buf is not None and buf.size:
                    assert any(lo <= buf.address and buf.address + buf.size <= hi for lo, hi in regions)


def test_small_local_partitions_are_read_into_memory_and_hold_no_map(cluster):
    """A partition file of at most 1 MiB is read, not mapped: a reader may keep the tables of 100,000 of them
    without running out of the kernel's maps (vm.max_map_count); nothing crosses the network either way."""
    small = make_table(20_000, seed=4)
    with fp.connect(cluster.uri, host=A) as client:
        client.put("locality-small", small, tiling=(60, 1))
        ds = client.open("locality-small")
        before = sent(client, cluster)
        kept = [ds.to_arrow() for _ in range(3)]
        assert all(t.equals(small) for t in kept)
        assert sent(client, cluster)[cluster.nodes[0].uri] == before[cluster.nodes[0].uri]
        info = client.pool.action(cluster.nodes[0].uri, fp.wire.GetNodeInfo())
    folder = str(Path(info.data_dir) / "datasets" / "locality-small")
    assert not [name for _lo, _hi, name in _mappings() if name.startswith(folder)]


READER = """
import pickle, sys
import flightpart as fp
d = pickle.loads(sys.stdin.buffer.read())
t = fp.from_partitioned(d)
print(t.num_rows, float(t.column("x").to_numpy().sum()))
"""


def test_a_pickled_partitioned_still_reads_in_another_process(cluster, dataset):
    table, _ = dataset
    with fp.connect(cluster.uri) as client:
        blob = pickle.dumps(client.open("locality").__partitioned__)
    out = subprocess.run([sys.executable, "-c", READER], input=blob, capture_output=True, check=True, timeout=120,
                         env={"FLIGHTPART_HOST": "127.0.0.9", "PATH": "/usr/bin:/bin"}).stdout.split()
    assert int(out[0]) == table.num_rows
    assert float(out[1]) == pytest.approx(float(table.column("x").to_numpy().sum()))


def test_a_plain_pyarrow_flight_client_reads_the_dataset(cluster, dataset):
    table, _ = dataset
    catalog = flight.connect(cluster.uri)
    info = catalog.get_flight_info(flight.FlightDescriptor.for_path("locality"))
    meta = json.loads(info.app_metadata)
    assert meta["shape"] == [table.num_rows, 4] and meta["partition_tiling"] == [6, 1]
    assert info.ordered and info.total_records == table.num_rows and info.schema.equals(table.schema)
    pieces, received_batches = [], 0
    def stats():
        return sum(fp.connect(cluster.uri).stats(n.uri).values["batches_sent"] for n in cluster.nodes)

    before = stats()
    for endpoint in info.endpoints:
        em = json.loads(endpoint.app_metadata)
        assert set(em) == {"position", "start", "shape", "location", "nbytes", "stats"}
        assert em["nbytes"] > 0  # the stored file's size
        node = flight.connect(endpoint.locations[0])
        batches = [chunk.data for chunk in node.do_get(endpoint.ticket)]
        received_batches += len(batches)
        pieces.append(pa.Table.from_batches(batches))
    assert pa.concat_tables(pieces).equals(table)
    assert stats() - before == received_batches  # the nodes count what they stream
    assert catalog.get_schema(flight.FlightDescriptor.for_path("locality")).schema.equals(table.schema)
    assert catalog.get_schema(flight.FlightDescriptor.for_path("locality", "1")).schema.equals(table.schema)
    with pytest.raises(pa.ArrowException, match="no dataset named 'no-such-set'"):
        catalog.get_schema(flight.FlightDescriptor.for_path("no-such-set"))
    assert catalog.get_schema(flight.FlightDescriptor.for_path("locality")).schema.equals(table.schema)  # still serving


def test_row_slices_and_projections_move_only_what_they_need(cluster, dataset):
    table, _ = dataset
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("locality")
        before = sent(client, cluster)
        part = ds[25_000:26_000].to_arrow()
        moved = sum(sent(client, cluster).values()) - sum(before.values())
        assert part.equals(table.slice(25_000, 1000))
        assert moved == table.slice(25_000, 1000).nbytes
        before = sent(client, cluster)
        x = ds.select(["x"]).to_arrow()
        moved = sum(sent(client, cluster).values()) - sum(before.values())
        assert x.equals(table.select(["x"]))
        assert moved == table.select(["x"]).nbytes
        both = ds.select(["y", "id"])[10:20].to_pandas()
        pd.testing.assert_frame_equal(both, table.select(["y", "id"]).slice(10, 10).to_pandas())


def test_versions_are_immutable_and_drop_frees_files(cluster):
    with fp.connect(cluster.uri) as client:
        v1 = client.put("versions", pa.table({"a": [1, 2, 3]}))
        v2 = client.put("versions", pa.table({"a": [4, 5, 6, 7]}))
        assert (v1.version, v2.version) == (1, 2)
        assert client.open("versions").to_arrow().column("a").to_pylist() == [4, 5, 6, 7]
        assert v1.to_arrow().column("a").to_pylist() == [1, 2, 3]
        assert client.versions("versions") == [1, 2]
        client.drop("versions", 1)
        with pytest.raises(fp.DatasetNotFound, match="has no version 1"):
            client.open("versions", 1)
        with pytest.raises(fp.DatasetNotFound, match="v1 was dropped"):  # said so, not "no replica could serve it"
            v1.to_arrow()
        client.drop("versions")
        with pytest.raises(fp.DatasetNotFound):
            client.open("versions")


def test_clear_errors_and_the_servers_keep_serving(cluster, dataset):
    table, _ = dataset
    with fp.connect(cluster.uri) as client:
        with pytest.raises(fp.DatasetNotFound, match="no dataset named 'nope'"):
            client.open("nope")
        with pytest.raises(fp.InvalidName, match="invalid dataset name '../x'"):
            client.open("../x")
        with pytest.raises(fp.InvalidName):
            client.put("a/b", table)
        with pytest.raises(fp.NodeUnavailable, match="no live node to put to among"):
            client.put("x", table, nodes=["10.9.9.9"])
        with pytest.raises(ValueError, match="replicas must be between 1 and the 3"):
            client.put("x", table, replicas=4)
    raw_catalog = flight.connect(cluster.uri)
    with pytest.raises(flight.FlightServerError, match="invalid dataset name") as info:
        raw_catalog.get_flight_info(flight.FlightDescriptor.for_path("../../etc"))
    assert code_of(info.value) == "INVALID_NAME"
    node = flight.connect(cluster.nodes[1].uri)
    version = fp.connect(cluster.uri).open("locality").version
    bad_ticket = json.dumps({"dataset": "locality", "version": version, "part": [99, 0]}).encode()
    with pytest.raises(flight.FlightServerError, match=r"partition \(99, 0\) of dataset 'locality'") as info:
        node.do_get(flight.Ticket(bad_ticket)).read_all()
    assert code_of(info.value) == "PARTITION_MISSING"
    with pytest.raises(flight.FlightServerError, match="ticket: not UTF-8 JSON") as info:
        node.do_get(flight.Ticket(b"\x80garbage")).read_all()
    assert code_of(info.value) == "INVALID_REQUEST"
    # wrong schema on put: a second partition of one version with another schema
    def desc(i):
        return flight.FlightDescriptor.for_path("mixed", "1", str(i), "0")

    for j, t in enumerate([pa.table({"a": [1]}), pa.table({"a": ["text"]})]):
        writer, _ = node.do_put(desc(j), t.schema)
        if j == 0:
            writer.write_table(t)
            writer.write_metadata(pa.py_buffer(b'{"rows": 1}'))  # the trailer that completes a put
            writer.close()
        else:
            with pytest.raises(flight.FlightServerError, match=r"schema of mixed v1 \(1, 0\) differs") as info:
                writer.write_table(t)
                writer.close()
            assert code_of(info.value) == "SCHEMA_MISMATCH"
    with fp.connect(cluster.uri, host=A) as client:
        assert client.open("locality").to_arrow().equals(table)


PUBLISHER = """
import sys, numpy as np, pandas as pd
import flightpart as fp
rank, nranks, uri = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
offsets, shape = fp.default_partition(nranks, rank, (100, 2))
rows = np.arange(offsets[0], offsets[0] + shape[0])
frame = pd.DataFrame({"g": rows, "v": rows * 0.5})
print(fp.publish("spmd", frame, rank=rank, nranks=nranks, catalog=uri, host=f"127.0.0.{2 + rank}"))
"""

OPENER = """
import sys, json
import flightpart as fp
rank, nranks, uri = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with fp.connect(uri, host=f"127.0.0.{2 + rank}") as client:
    ds = client.open("spmd", rank=rank, nranks=nranks)
    d = fp.validate(ds, require_pickle=True)
    mine = ds.read_locals()
    print(json.dumps({"locals": [list(p) for p in d["locals"]],
                      "none": sorted(list(p) for p, e in d["partitions"].items() if e["data"] is None),
                      "rows": {str(list(p)): t.column("g").to_pylist()[:1] + [t.num_rows] for p, t in mine.items()}}))
"""


def run_ranks(script: str, nranks: int, uri: str) -> list[str]:
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(nranks), uri], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in range(nranks)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_spmd_publish_with_three_rank_processes_then_spmd_view(cluster):
    outs = run_ranks(PUBLISHER, 3, cluster.uri)
    assert sum("'complete': True" in o for o in outs) >= 1
    with fp.connect(cluster.uri) as client:
        ds = client.open("spmd")
        d = ds.__partitioned__
        assert d["partition_tiling"] == (3, 1)
        assert [d["partitions"][(r, 0)]["start"] for r in range(3)] == [(0, 0), (33, 0), (66, 0)]
        assert [d["partitions"][(r, 0)]["location"][0][0] for r in range(3)] == [A, B, C]
        df = ds.to_pandas()
        assert df["g"].tolist() == list(range(100))
    views = [json.loads(o) for o in run_ranks(OPENER, 3, cluster.uri)]
    for rank, view in enumerate(views):
        assert view["locals"] == [[rank, 0]]
        assert view["none"] == [[r, 0] for r in range(3) if r != rank]
        start, rows = fp.default_partition(3, rank, (100, 2))
        assert view["rows"] == {str([rank, 0]): [start[0], rows[0]]}


def test_a_node_restart_serves_what_it_committed(cluster, new_cluster):
    with new_cluster(1, process=True) as small:
        table = make_table(5000, seed=3)
        with fp.connect(small.uri) as client:
            client.put("durable", table)
        data_dir = small.root / f"node-{small.ips[0]}"
        small.nodes[0].stop()
        small.nodes.clear()
        small.add_node(small.ips[0], data_dir=data_dir)
        with fp.connect(small.uri, host="127.0.0.9") as client:
            assert client.open("durable").to_arrow().equals(table)


def test_copy_to_replicates_a_partition_between_nodes(cluster, dataset):
    table, _ = dataset
    with fp.connect(cluster.uri) as client:
        ds = client.open("locality")
        d = ds.__partitioned__
        pos, part = next((p, e) for p, e in sorted(d["partitions"].items()) if e["location"][0][0] == B)
        ref = part["data"]
        source, target = cluster.nodes[1].uri, cluster.nodes[2].uri
        reply = client.pool.action(source, fp.wire.CopyTo("locality", ds.version, ref.position, target))
        assert reply.copied > 0
        held = client.pool.action(target, fp.wire.Held("locality", ds.version))
        assert ref.position in [h.part for h in held.partitions]
        only_c = dataclasses.replace(ref, replicas=((target, C, cluster.nodes[2].pid),))
        start = part["start"][0]
        assert d["get"](only_c).equals(table.slice(start, part["shape"][0]))


def test_get_tries_the_next_replica_when_one_is_unreachable(cluster, dataset):
    table, _ = dataset
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        ds = client.open("locality")
        assert ds.schema.equals(table.schema) and ds.nbytes > table.nbytes // 2
        d = ds.__partitioned__
        part = d["partitions"][(0, 0)]
        ref = part["data"]
        dead = ("grpc://127.0.0.9:9", "127.0.0.9", 1)
        with_dead_first = dataclasses.replace(ref, replicas=(dead,) + ref.replicas)
        assert d["get"](with_dead_first).equals(table.slice(0, part["shape"][0]))
        only_dead = dataclasses.replace(ref, replicas=(dead,))
        with pytest.raises(fp.NodeUnavailable,
                           match=r"partition \(0, 0\) of 'locality' .*no replica could serve it \(grpc://127.0.0.9:9"):
            d["get"](only_dead)


def test_a_dropped_partition_is_not_kept_mapped_by_a_reader(cluster):
    """A reader must not hold a dropped file open (its disk space is freed only when nobody maps it)."""
    import gc

    table = make_table(20_000, seed=9)
    with fp.connect(cluster.uri, host=A) as client:
        ds = client.put("unmapped", table, tiling=(1, 1), nodes=[A])
        ref = ds.__partitioned__["partitions"][(0, 0)]["data"]
        info = client.pool.action(cluster.nodes[0].uri, fp.wire.GetNodeInfo())
        path = str(Path(info.data_dir) / partition_relpath("unmapped", ds.version, (0, 0)))
        assert ds.to_arrow().equals(table)  # read by memory map
        client.drop("unmapped")
        with pytest.raises(fp.DatasetNotFound, match="was dropped"):
            ds.__partitioned__["get"](ref)
    gc.collect()
    assert not [name for _lo, _hi, name in _mappings() if name.startswith(path)]


def test_the_in_process_test_cluster_streams_over_sockets_like_any_other(new_cluster):
    """The in-process cluster most tests use must not short-cut reads: a reader on another host streams every byte."""
    table = make_table(20_000, 7)
    with new_cluster(2) as c, fp.connect(c.uri, host="127.0.0.9") as client:
        # registered before it returned
        assert sorted(n.ip for n in client.nodes()) == c.ips[:2]
        client.put("over-sockets", table, tiling=(2, 1))
        before = fp.traffic()
        assert client.open("over-sockets").to_arrow().equals(table)
        after = fp.traffic()
        assert after["bytes_received"] - before["bytes_received"] >= table.nbytes
        assert after["bytes_mapped"] == before["bytes_mapped"]
        assert sum(client.stats(n.uri).values["bytes_sent"] for n in c.nodes) >= table.nbytes


def test_reading_a_version_dropped_after_it_was_opened_says_it_was_dropped(cluster):
    with fp.connect(cluster.uri, host="127.0.0.9") as client:
        client.put("dropped-under", make_table(3000, 3), tiling=(3, 1))
        client.put("dropped-under", make_table(300, 4), tiling=(3, 1))
        old = client.open("dropped-under", version=1)
        client.drop("dropped-under", 1)
        with pytest.raises(fp.DatasetNotFound, match="v1 was dropped") as caught:
            old.to_arrow()
        assert caught.value.code == "DATASET_NOT_FOUND"  # not UNAVAILABLE: no replica is down, the version is gone
        latest = client.open("dropped-under")
        client.drop("dropped-under")
        with pytest.raises(fp.DatasetNotFound, match="v2 was dropped"):
            latest.to_arrow()
