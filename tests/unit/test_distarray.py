"""__distarray__: the seed's examples, conformance cases, export and import."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import flightpart as fp
from flightpart import distarray


def assemble_numpy(obj) -> np.ndarray:
    """The global array rebuilt from a __partitioned__ of NumPy parts."""
    d = fp.validate(obj)
    out = None
    for entry in d["partitions"].values():
        data = d["get"](entry["data"])
        if out is None:
            out = np.zeros(d["shape"], dtype=data.dtype)
        out[tuple(slice(s, s + n) for s, n in zip(entry["start"], entry["shape"]))] = data
    return out


def block_dim(size, procs, rank, start, stop, **extra):
    return {"dist_type": "b", "size": size, "proc_grid_size": procs, "proc_grid_rank": rank, "start": start,
            "stop": stop, **extra}


# --------------------------------------------------------------------- the seed's examples


def test_seed_block_no_distribution():
    a = np.random.default_rng(0).random((2, 10))
    daps = [
        {"__version__": "0.9.0", "buffer": a[r : r + 1],
         "dim_data": (block_dim(2, 2, r, r, r + 1), {"size": 10, "dist_type": "n"})}
        for r in range(2)
    ]
    imported = distarray.to_partitioned(daps)
    assert imported.__partitioned__["partition_tiling"] == (2, 1)
    np.testing.assert_array_equal(assemble_numpy(imported), a)


def test_seed_block_with_padding_maps_to_halos():
    a = np.arange(18.0)
    daps = [
        {"__version__": "0.9.0", "buffer": a[0:10], "dim_data": (block_dim(18, 2, 0, 0, 9, padding=(1, 1)),)},
        {"__version__": "0.9.0", "buffer": a[8:18], "dim_data": (block_dim(18, 2, 1, 9, 18, padding=(1, 1)),)},
    ]
    imported = distarray.to_partitioned(daps)
    d = imported.__partitioned__
    assert [d["partitions"][(k,)]["start"] for k in range(2)] == [(0,), (9,)]
    assert [d["partitions"][(k,)]["shape"] for k in range(2)] == [(9,), (9,)]
    np.testing.assert_array_equal(assemble_numpy(imported), a)
    # boundary padding is part of the data; communication padding becomes a halo
    assert imported.halos == {(0,): ((0, 1),), (1,): ((1, 0),)}
    # the parts are views of the ranks' buffers
    assert np.shares_memory(d["partitions"][(1,)]["data"], daps[1]["buffer"])


def test_seed_unstructured():
    a = np.arange(30.0) * 10
    idx = [
        [19, 1, 0, 12, 2, 15, 4],
        [6, 13, 3],
        [10, 25, 5, 21, 7, 18, 11, 26, 29, 24, 23, 28, 14, 20, 9, 16, 27, 8, 17, 22],
    ]
    daps = [
        {"__version__": "0.9.0", "buffer": a[np.array(i)],
         "dim_data": ({"size": 30, "dist_type": "u", "proc_grid_rank": r, "proc_grid_size": 3,
                       "indices": np.array(i)},)}
        for r, i in enumerate(idx)
    ]
    for dap in daps:
        distarray.validate(dap)
    imported = distarray.to_partitioned(daps)
    np.testing.assert_array_equal(assemble_numpy(imported), a)
    owners = {pos: e["start"] for pos, e in imported.__partitioned__["partitions"].items()}
    assert len(owners) > 3  # runs, not one part per rank


def test_unstructured_duplicates_are_refused():
    daps = [
        {"__version__": "0.9.0", "buffer": np.zeros(2),
         "dim_data": ({"size": 3, "dist_type": "u", "proc_grid_rank": 0, "proc_grid_size": 2,
                       "indices": np.array([0, 1])},)},
        {"__version__": "0.9.0", "buffer": np.zeros(2),
         "dim_data": ({"size": 3, "dist_type": "u", "proc_grid_rank": 1, "proc_grid_size": 2,
                       "indices": np.array([1, 2])},)},
    ]
    with pytest.raises(fp.PartitionedError, match="sections do not tile the index space: .*overlap"):
        distarray.to_partitioned(daps)
    daps[1]["dim_data"][0]["indices"] = np.array([0, 1])
    with pytest.raises(fp.PartitionedError, match="both hold global block"):
        distarray.to_partitioned(daps)


# --------------------------------------------------------------------- conformance cases


def grid_2x2(a: np.ndarray) -> list[dict]:
    n, m = a.shape
    daps = []
    for r in range(4):
        gi, gj = divmod(r, 2)
        rs, cs = (0, n // 2) if gi == 0 else (n // 2, n), (0, m // 2) if gj == 0 else (m // 2, m)
        daps.append({
            "__version__": "0.10.0",
            "buffer": a[rs[0] : rs[1], cs[0] : cs[1]],
            "dim_data": (block_dim(n, 2, gi, *rs), block_dim(m, 2, gj, *cs)),
        })
    return daps


@pytest.mark.parametrize("dtype", [np.float64, np.uint8, np.complex128])
def test_16x16_on_a_2x2_grid(dtype):
    a = (np.arange(256) % 200).astype(dtype).reshape(16, 16)
    imported = distarray.to_partitioned(grid_2x2(a))
    assert imported.__partitioned__["partition_tiling"] == (2, 2)
    np.testing.assert_array_equal(assemble_numpy(imported), a)


def cyclic_daps(a: np.ndarray, procs: int, block_size: int | None) -> list[dict]:
    bs = block_size or 1
    daps = []
    for r in range(procs):
        rows = [g for g in range(a.shape[0]) if (g // bs) % procs == r]
        dim = {"dist_type": "c", "size": a.shape[0], "proc_grid_size": procs, "proc_grid_rank": r, "start": r * bs}
        if block_size:
            dim["block_size"] = block_size
        # {}: 0.10's undistributed dimension
        daps.append({"__version__": "0.10.0", "buffer": a[rows], "dim_data": (dim, {})})
    return daps


@pytest.mark.parametrize("block_size", [None, 1, 3, 4])
def test_cyclic_and_block_cyclic(block_size):
    a = np.arange(16 * 16, dtype=np.float64).reshape(16, 16)
    imported = distarray.to_partitioned(cyclic_daps(a, 4, block_size))
    d = imported.__partitioned__
    bs = block_size or 1
    assert d["partition_tiling"] == (-(-16 // bs), 1)
    np.testing.assert_array_equal(assemble_numpy(imported), a)
    # blocks are owned round-robin by the ranks
    assert d["partitions"][(1, 0)]["data"].base is not None


def test_uneven_20_by_30():
    a = np.arange(20 * 30, dtype=np.int32).reshape(20, 30)
    cuts = [(0, 7), (7, 20)]
    daps = [
        {"__version__": "0.9.0", "buffer": a[s:e],
         "dim_data": (block_dim(20, 2, r, s, e), {"dist_type": "n", "size": 30})}
        for r, (s, e) in enumerate(cuts)
    ]
    imported = distarray.to_partitioned(daps)
    assert [e["shape"] for e in imported.__partitioned__["partitions"].values()] == [(7, 30), (13, 30)]
    np.testing.assert_array_equal(assemble_numpy(imported), a)


def test_empty_local_sections_are_valid():
    dap = {"__version__": "0.9.0", "buffer": np.zeros((0, 3)),
           "dim_data": (block_dim(5, 2, 1, 5, 5), {"dist_type": "n", "size": 3})}
    distarray.validate(dap)


# --------------------------------------------------------------------- bad dicts


def good() -> dict:
    return {"__version__": "0.9.0", "buffer": np.zeros((4, 3)),
            "dim_data": (block_dim(8, 2, 0, 0, 4), {"dist_type": "n", "size": 3})}


def with_dim0(**changes):
    def mutate(d):
        dim = dict(d["dim_data"][0])
        dim.update(changes)
        for k in [k for k, v in changes.items() if v is None]:
            del dim[k]
        d["dim_data"] = (dim, d["dim_data"][1])
        return d

    return mutate


BAD = [
    ("no version", lambda d: {k: v for k, v in d.items() if k != "__version__"}, "missing key '__version__'"),
    ("bad version", lambda d: {**d, "__version__": "2.0.0"}, "__version__: 2.0.0 is not supported"),
    ("version format", lambda d: {**d, "__version__": "0.9"}, "expected 'major.minor.patch'"),
    ("extra key", lambda d: {**d, "x": 1}, "unexpected key 'x'"),
    ("buffer not a buffer", lambda d: {**d, "buffer": [1, 2]}, "does not support the buffer protocol"),
    ("dims mismatch", lambda d: {**d, "dim_data": d["dim_data"][:1]}, "buffer: has 2 dimensions, dim_data describes 1"),
    ("dist_type", with_dim0(dist_type="x"), "dim_data[0].dist_type: expected one of"),
    ("missing stop", with_dim0(stop=None), "dim_data[0]: missing key 'stop' for dist_type 'b'"),
    ("start after stop", with_dim0(start=5, stop=4), "expected 0 <= start <= stop <= size"),
    ("stop past size", with_dim0(start=0, stop=9), "expected 0 <= start <= stop <= size"),
    ("rank past grid", with_dim0(proc_grid_rank=2), "proc_grid_rank: 2 is not below proc_grid_size 2"),
    ("grid size zero", with_dim0(proc_grid_size=0), "proc_grid_size: expected an integer >= 1"),
    ("padding not pair", with_dim0(padding=(1,)), "padding: expected a pair"),
    ("padding negative", with_dim0(padding=(0, -1)), "padding[1]: expected an integer >= 0"),
    ("extent mismatch", with_dim0(stop=3), "buffer: extent 4 along dimension 0, dim_data[0] implies 3"),
    ("periodic not bool", with_dim0(periodic="yes"), "periodic: expected a bool"),
]


@pytest.mark.parametrize("case,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_bad_distarray_dicts(case, mutate, message):
    with pytest.raises(fp.PartitionedError) as info:
        distarray.validate(mutate(good()))
    assert message in str(info.value)


def test_cyclic_block_size_and_unstructured_uniqueness():
    dim = {"dist_type": "c", "size": 8, "proc_grid_size": 2, "proc_grid_rank": 0, "start": 0, "block_size": 0}
    with pytest.raises(fp.PartitionedError, match="block_size: expected an integer >= 1"):
        distarray.validate({"__version__": "0.9.0", "buffer": np.zeros(4), "dim_data": (dim,)})
    dim = {"dist_type": "u", "size": 8, "proc_grid_size": 2, "proc_grid_rank": 0, "indices": np.array([1, 1])}
    with pytest.raises(fp.PartitionedError, match="indices: values must be locally unique"):
        distarray.validate({"__version__": "0.9.0", "buffer": np.zeros(2), "dim_data": (dim,)})


def test_non_adjacent_blocks_and_grid_product_are_checked():
    a, b = good(), good()
    b["dim_data"] = (block_dim(8, 2, 1, 5, 8), b["dim_data"][1])
    b["buffer"] = np.zeros((3, 3))
    with pytest.raises(fp.PartitionedError, match="block ranges are not adjacent"):
        distarray.validate_all([a, b])
    with pytest.raises(fp.PartitionedError, match="product over distributed dimensions is 2, but 1 ranks"):
        distarray.validate_all([a])


def test_padding_all_or_nothing():
    a = good()
    b = {"__version__": "0.9.0", "buffer": np.zeros((5, 3)),
         "dim_data": (block_dim(8, 2, 1, 4, 8, padding=(1, 0)), {"dist_type": "n", "size": 3})}
    with pytest.raises(fp.PartitionedError, match="padding: must be present on all ranks or on none"):
        distarray.validate_all([a, b])


# --------------------------------------------------------------------- export


def test_export_single_dtype_pandas_is_zero_copy():
    df = pd.DataFrame(np.arange(12.0).reshape(6, 2), columns=["x", "y"])
    dap = distarray.export_local(df, rank=1, nranks=3, start=6, global_rows=18)
    assert dap["__version__"] == "0.10.0"
    assert dap["dim_data"][0] == block_dim(18, 3, 1, 6, 12)
    assert dap["dim_data"][1] == block_dim(2, 1, 0, 0, 2)  # 0.10 has no 'n': a block over one process
    assert distarray.export_local(df, rank=1, nranks=3, start=6, global_rows=18, version="0.9.0")["dim_data"][1] == {
        "dist_type": "n", "size": 2}
    assert np.shares_memory(dap["buffer"], df["x"].to_numpy())


def test_export_single_arrow_column_is_zero_copy():
    table = pa.table({"x": np.arange(5.0)})
    dap = distarray.export_local(table, rank=0, nranks=1, start=0, global_rows=5)
    assert dap["buffer"].shape == (5, 1)
    assert dap["buffer"].ctypes.data == table.column(0).chunk(0).buffers()[1].address


def test_export_refuses_non_numeric_columns():
    with pytest.raises(fp.PartitionedError, match="column 's': .* is not numeric"):
        distarray.export_local(pa.table({"s": ["a"]}), rank=0, nranks=1, start=0, global_rows=1)


def test_export_then_import_round_trip():
    full = np.arange(30.0).reshape(10, 3)
    daps = []
    for r in range(3):
        (off,), (n,) = (lambda o, s: ((o[0],), (s[0],)))(*fp.default_partition(3, r, (10, 3)))
        daps.append(distarray.export_local(pa.table({str(c): full[off : off + n, c] for c in range(3)}), rank=r,
                                           nranks=3, start=off, global_rows=10))
    table = fp.from_partitioned(distarray.to_partitioned(daps))
    np.testing.assert_array_equal(np.column_stack([table.column(str(c)).to_numpy() for c in range(3)]), full)


# --------------------------------------------------------------------- versions


@pytest.mark.parametrize("version", ["0.10.0", "0.9.0"])
def test_halo_rows_export_as_padding_by_the_rules_of_each_version(version):
    full = np.arange(40.0).reshape(20, 2)
    cuts, (left, right) = [(0, 7), (7, 13), (13, 20)], (2, 1)
    daps = []
    for r, (s, e) in enumerate(cuts):
        lo, hi = (left if r > 0 else 0), (right if r < 2 else 0)  # no halo past the global edges
        daps.append(distarray.export_local(pa.table({"a": full[s - lo : e + hi, 0], "b": full[s - lo : e + hi, 1]}),
                                           rank=r, nranks=3, start=s, global_rows=20, padding=(lo, hi),
                                           version=version))
    middle = daps[1]["dim_data"][0]
    assert middle["padding"] == (2, 1)
    # 0.10: the buffer's extent
    assert (middle["start"], middle["stop"]) == ((5, 14) if version == "0.10.0" else (7, 13))
    imported = distarray.to_partitioned(daps)
    assert imported.halos[(1, 0)] == ((2, 1), (0, 0))
    np.testing.assert_array_equal(assemble_numpy(imported), full)


def test_version_rules_differ_where_the_spec_does():
    a = np.arange(10.0)
    padded = {"dist_type": "b", "size": 18, "proc_grid_size": 2, "proc_grid_rank": 0, "start": 0, "stop": 10,
              "padding": (0, 1)}
    assert distarray.validate({"__version__": "0.10.0", "buffer": a, "dim_data": (padded,)})  # stop - start == 10
    with pytest.raises(fp.PartitionedError, match="extent 10 along dimension 0"):
        # 0.9: 10 owned + 1 padding = 11
        distarray.validate({"__version__": "0.9.0", "buffer": a, "dim_data": (padded,)})
    undistributed = {"dist_type": "n", "size": 10}
    assert distarray.validate({"__version__": "1.0.0", "buffer": a, "dim_data": (undistributed,)})  # 1.0.x reads as 0.9
    with pytest.raises(fp.PartitionedError, match="0.10 writes an undistributed dimension as {}"):
        distarray.validate({"__version__": "0.10.0", "buffer": a, "dim_data": (undistributed,)})
    with pytest.raises(fp.PartitionedError, match="in version 0.9, got None"):
        distarray.validate({"__version__": "0.9.0", "buffer": a, "dim_data": ({},)})  # {} is 0.10's alias only
    extra = {**padded, "padding": (0, 0), "stop": 10, "size": 10, "proc_grid_size": 1, "comment": "ignored"}
    assert distarray.validate({"__version__": "0.10.0", "buffer": a, "dim_data": (extra,)})  # unknown keys are ignored
    scalar = {"__version__": "0.10.0", "buffer": np.array(3.5), "dim_data": ()}
    assert distarray.validate(scalar) is scalar  # 0-d is valid DAP
    with pytest.raises(fp.PartitionedError,
                       match="a 0-d array .* is valid, but __partitioned__ describes at least one"):
        distarray.to_partitioned([scalar])


def test_the_empty_dict_alias_of_an_undistributed_dimension_imports_by_its_buffer():
    for buffer, expected in ((b"", []), (b"abc", [97, 98, 99])):
        imported = distarray.to_partitioned([{"__version__": "0.10.0", "buffer": buffer, "dim_data": ({},)}])
        part = imported.__partitioned__
        assert part["shape"] == (len(expected),) and part["partition_tiling"] == (1,)
        assert np.asarray(part["partitions"][(0,)]["data"]).tolist() == expected


def test_padding_of_a_periodic_block_over_one_process_is_owned_data_not_a_gap():
    dim = {"dist_type": "b", "size": 10, "proc_grid_size": 1, "proc_grid_rank": 0, "start": 0, "stop": 10,
           "padding": (2, 2), "periodic": True}
    imported = distarray.to_partitioned([{"__version__": "0.10.0", "buffer": np.arange(10.0), "dim_data": (dim,)}])
    part = imported.__partitioned__
    assert part["shape"] == (10,) and np.asarray(part["partitions"][(0,)]["data"]).tolist() == list(np.arange(10.0))
    assert imported.halos[(0,)] == ((0, 0),)  # nothing of it is a neighbour's
