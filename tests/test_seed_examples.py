"""The draft spec's three examples, rewritten with real objects and a picklable get."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import flightpart as fp
from flightpart.runtimes.dask import DaskGather
from flightpart.runtimes.ray import RayGet


def test_ray_example_1d_four_partitions(ray_session):
    ray = ray_session
    blocks = [np.arange(16 * k, 16 * (k + 1), dtype=np.float64) for k in range(4)]
    refs = [ray.put(b) for b in blocks]
    ip = ray.util.get_node_ip_address()
    d = {
        "shape": (64,),
        "partition_tiling": (4,),
        "partitions": {
            (k,): {"start": (16 * k,), "shape": (16,), "data": refs[k], "location": [(ip, os.getpid())]}
            for k in range(4)
        },
        "get": RayGet(),
    }
    fp.validate(d, require_pickle=True)
    table = fp.from_partitioned(d)
    np.testing.assert_array_equal(table.column("0").to_numpy(), np.arange(64.0))
    assert pickle.loads(pickle.dumps(d))["get"] == RayGet()


def test_dask_example_2d_block_cyclic(dask_client):
    full = np.arange(64, dtype=np.int64).reshape(8, 8)
    workers = sorted(dask_client.scheduler_info()["workers"])
    pids = dask_client.run(os.getpid)
    parts = {}
    for n, (i, j) in enumerate([(1, 1), (1, 0), (0, 1), (0, 0)]):
        worker = workers[n % 2]
        future = dask_client.scatter(full[4 * i : 4 * i + 4, 4 * j : 4 * j + 4], workers=[worker])
        host = worker.split("://")[1].rsplit(":", 1)[0]
        parts[(i, j)] = {"start": (4 * i, 4 * j), "shape": (4, 4), "data": future, "location": [(host, pids[worker])]}
    d = {"shape": (8, 8), "partition_tiling": (2, 2), "partitions": parts, "get": DaskGather()}
    fp.validate(d, require_pickle=True)
    table = fp.from_partitioned(d)
    got = np.column_stack([table.column(str(c)).to_numpy() for c in range(8)])
    np.testing.assert_array_equal(got, full)


def mpi_view(rank: int) -> dict:
    """The spec's row-block-cyclic MPI example as rank ``rank`` sees it (2 ranks, 4 parts)."""
    full = np.arange(64.0).reshape(8, 8)
    parts = {}
    for k in range(4):
        owner = k % 2
        parts[(k, 0)] = {
            "start": (2 * k, 0),
            "shape": (2, 8),
            "data": full[2 * k : 2 * k + 2] if owner == rank else None,
            "location": [(f"10.1.1.{owner + 1}", 1000 + owner, "kDLCPU")],
        }
    return {
        "shape": (8, 8),
        "partition_tiling": (4, 1),
        "partitions": parts,
        "get": fp.IdentityGet(),
        "locals": [(k, 0) for k in range(4) if k % 2 == rank],
    }


@pytest.mark.parametrize("rank", [0, 1])
def test_mpi_example_validates_on_each_rank(rank):
    d = fp.validate(mpi_view(rank), require_pickle=True)
    assert d["locals"] == [(rank, 0), (rank + 2, 0)]


def test_mpi_example_refuses_reading_non_local_parts():
    with pytest.raises(fp.PartitionedError,
                       match=r"partitions\[\(1, 0\)\].data: is None: the part is not local to this rank"):
        fp.from_partitioned(mpi_view(0))


def test_mpi_example_reads_when_locals_cover_everything():
    d = mpi_view(0)
    full = np.arange(64.0).reshape(8, 8)
    for k in (1, 3):
        d["partitions"][(k, 0)]["data"] = full[2 * k : 2 * k + 2]
    d["locals"] = [(k, 0) for k in range(4)]
    table = fp.from_partitioned(d)
    assert table.num_rows == 8 and table.column("7").to_pylist()[-1] == 63.0


def test_consumer_raises_on_devices_it_cannot_read():
    d = mpi_view(0)
    d["partitions"][(0, 0)]["location"] = [("10.1.1.1", 1000, "kDLOneAPI:0")]
    with pytest.raises(fp.PartitionedError, match=r"device 'kDLOneAPI:0' is not supported"):
        fp.from_partitioned(d)


def test_consumer_raises_on_data_types_it_cannot_read():
    d = mpi_view(0)
    d["locals"] = [(k, 0) for k in range(4)]
    for k in range(4):
        d["partitions"][(k, 0)]["data"] = {"rows": k}
    with pytest.raises(fp.PartitionedError, match=r"partitions\[\(0, 0\)\].data: get returned a builtins.dict"):
        fp.from_partitioned(d)


def test_consumer_checks_declared_shapes():
    d = mpi_view(0)
    d["locals"] = [(k, 0) for k in range(4)]
    for k in range(4):
        d["partitions"][(k, 0)]["data"] = np.zeros((3, 8))
    with pytest.raises(fp.PartitionedError,
                       match=r"partitions\[\(0, 0\)\].shape: declared \(2, 8\), but its data has shape \(3, 8\)"):
        fp.from_partitioned(d)
